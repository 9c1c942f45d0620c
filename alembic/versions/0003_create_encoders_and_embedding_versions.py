"""Create encoders (LOCUS checkpoints), their activations, append-only embedding versions, and the onboarding
job outbox with its results.

Dialect-aware since issue 14: on PostgreSQL the vector is real[] with a CHECK of its length (DuckDB's FLOAT[128]
checks it itself). What this revision does on DuckDB is unchanged, statement for statement.

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateSequence, DropSequence, Sequence

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

SEQUENCES = ("encoders_id_seq", "encoder_activations_id_seq", "embedding_versions_id_seq", "onboarding_jobs_id_seq")


class FixedVector(sa.types.UserDefinedType):
    """FLOAT[n] (a copy, not an import of the ORM's: a released migration must not change when the ORM does)."""
    cache_ok = True

    def __init__(self, dim: int):
        self.dim = dim

    def get_col_spec(self, **kw):
        return f"FLOAT[{self.dim}]"


def _seq_id(name: str) -> sa.Column:
    return sa.Column("id", sa.Integer, server_default=sa.text(f"nextval('{name}')"), primary_key=True)


def _created(name: str = "created") -> sa.Column:
    return sa.Column(name, sa.DateTime, server_default=sa.func.now(), nullable=False)


def upgrade() -> None:
    for name in SEQUENCES:
        op.execute(CreateSequence(Sequence(name)))
    op.create_table(
        "encoders", _seq_id("encoders_id_seq"),
        sa.Column("name", sa.String, nullable=False, unique=True),
        sa.Column("text_encoder", sa.String, nullable=False),
        sa.Column("config", sa.JSON, nullable=False), sa.Column("meta", sa.JSON, nullable=False),
        sa.Column("weights", sa.LargeBinary, nullable=False), sa.Column("weights_sha256", sa.String, nullable=False),
        _created())
    op.create_table(
        "encoder_activations", _seq_id("encoder_activations_id_seq"),
        sa.Column("encoder_id", sa.Integer, nullable=False), _created())
    op.create_table(
        "embedding_versions", _seq_id("embedding_versions_id_seq"),
        sa.Column("model_id", sa.Integer, nullable=False), sa.Column("version", sa.Integer, nullable=False),
        sa.Column("encoder_id", sa.Integer, nullable=False),
        sa.Column("vector", FixedVector(128).with_variant(postgresql.ARRAY(sa.REAL), "postgresql"),
                  nullable=False),
        sa.Column("n_evaluations", sa.Integer, nullable=False), sa.Column("digest", sa.String, nullable=False),
        sa.Column("through_batch", sa.Integer, nullable=False),
        sa.Column("reason", sa.String, nullable=False), sa.Column("batch_id", sa.Integer),
        sa.Column("stability", sa.Double), _created(),
        sa.UniqueConstraint("model_id", "version"))
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE embedding_versions ADD CONSTRAINT embedding_versions_vector_dim "
                   "CHECK (array_ndims(vector) = 1 AND array_length(vector, 1) = 128)")
    op.create_table(
        "onboarding_jobs", _seq_id("onboarding_jobs_id_seq"),
        sa.Column("model_id", sa.Integer, nullable=False), sa.Column("reason", sa.String, nullable=False),
        sa.Column("batch_id", sa.Integer), sa.Column("encoder_id", sa.Integer), _created())
    op.create_table(
        "onboarding_results",
        sa.Column("job_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("outcome", sa.String, nullable=False), sa.Column("version_id", sa.Integer),
        _created("finished"))


def downgrade() -> None:
    for table in ("onboarding_results", "onboarding_jobs", "embedding_versions", "encoder_activations", "encoders"):
        op.drop_table(table)
    for name in reversed(SEQUENCES):
        op.execute(DropSequence(Sequence(name)))
