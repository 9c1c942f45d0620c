"""Create the core tables: models, queries, text vectors, import batches, evaluations.

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import CreateSequence, DropSequence, Sequence

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _seq_id(name: str) -> sa.Column:
    return sa.Column("id", sa.Integer, server_default=sa.text(f"nextval('{name}')"), primary_key=True)


def _created() -> sa.Column:
    return sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False)


def upgrade() -> None:
    for name in ("models_id_seq", "queries_id_seq", "import_batches_id_seq"):
        op.execute(CreateSequence(Sequence(name)))
    op.create_table(
        "models", _seq_id("models_id_seq"),
        sa.Column("name", sa.String, nullable=False, unique=True),
        sa.Column("family", sa.String), sa.Column("provider", sa.String),
        sa.Column("params_b", sa.Double), sa.Column("cost", sa.Double),
        sa.Column("open_weights", sa.Boolean), sa.Column("tags", sa.JSON), _created())
    op.create_table(
        "queries", _seq_id("queries_id_seq"),
        sa.Column("external_id", sa.String, nullable=False, unique=True),
        sa.Column("source", sa.String), sa.Column("category", sa.String),
        sa.Column("text", sa.String, nullable=False), sa.Column("content_hash", sa.String, nullable=False),
        _created())
    op.create_table(
        "text_vectors",
        sa.Column("content_hash", sa.String, primary_key=True),
        sa.Column("text_encoder", sa.String, primary_key=True),
        sa.Column("vector", sa.ARRAY(sa.Float), nullable=False), _created())
    op.create_table(
        "import_batches", _seq_id("import_batches_id_seq"),
        sa.Column("files", sa.JSON, nullable=False), sa.Column("row_counts", sa.JSON, nullable=False),
        sa.Column("digest", sa.String, nullable=False), _created())
    op.create_table(
        "evaluations",
        sa.Column("model_id", sa.Integer, nullable=False), sa.Column("query_id", sa.Integer, nullable=False),
        sa.Column("correct", sa.Boolean, nullable=False), sa.Column("batch_id", sa.Integer, nullable=False),
        _created())


def downgrade() -> None:
    for table in ("evaluations", "import_batches", "text_vectors", "queries", "models"):
        op.drop_table(table)
    for name in ("import_batches_id_seq", "queries_id_seq", "models_id_seq"):
        op.execute(DropSequence(Sequence(name)))
