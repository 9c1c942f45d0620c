"""Create the append-only model aliases (a model registered under another name: its answers or its user say so).

Revision ID: 0007
Revises: 0006
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import CreateSequence, DropSequence, Sequence

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(CreateSequence(Sequence("model_aliases_id_seq")))
    op.create_table(
        "model_aliases",
        sa.Column("id", sa.Integer, server_default=sa.text("nextval('model_aliases_id_seq')"), primary_key=True),
        sa.Column("model_id", sa.Integer, nullable=False), sa.Column("alias_of", sa.Integer),
        sa.Column("source", sa.String, nullable=False),
        sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False))


def downgrade() -> None:
    op.drop_table("model_aliases")
    op.execute(DropSequence(Sequence("model_aliases_id_seq")))
