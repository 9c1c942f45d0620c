"""Create the routing log and the append-only model availability flags.

Revision ID: 0004
Revises: 0003
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import CreateSequence, DropSequence, Sequence

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

SEQUENCES = ("model_availability_id_seq", "routing_log_id_seq")


def _seq_id(name: str) -> sa.Column:
    return sa.Column("id", sa.Integer, server_default=sa.text(f"nextval('{name}')"), primary_key=True)


def _created(name: str = "created") -> sa.Column:
    return sa.Column(name, sa.DateTime, server_default=sa.func.now(), nullable=False)


def upgrade() -> None:
    for name in SEQUENCES:
        op.execute(CreateSequence(Sequence(name)))
    op.create_table(
        "model_availability", _seq_id("model_availability_id_seq"),
        sa.Column("model_id", sa.Integer, nullable=False), sa.Column("available", sa.Boolean, nullable=False),
        sa.Column("reason", sa.String), _created())
    op.create_table(
        "routing_log", _seq_id("routing_log_id_seq"), _created(),
        sa.Column("query_hash", sa.String, nullable=False), sa.Column("text", sa.String),
        sa.Column("model", sa.String), sa.Column("fallback", sa.Boolean, nullable=False),
        sa.Column("candidates", sa.JSON, nullable=False), sa.Column("encoder_id", sa.Integer),
        sa.Column("versions", sa.JSON, nullable=False), sa.Column("options", sa.JSON))


def downgrade() -> None:
    for table in ("routing_log", "model_availability"):
        op.drop_table(table)
    for name in reversed(SEQUENCES):
        op.execute(DropSequence(Sequence(name)))
