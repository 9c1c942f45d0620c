"""Create the watch rounds: one row per claiming endpoint per `registry watch` round (its answers are an import
batch of their own), with the round's figures against the reference, the sequential test's state and any event.

Revision ID: 0011
Revises: 0010
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import CreateSequence, DropSequence, Sequence

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(CreateSequence(Sequence("watch_rounds_id_seq")))
    op.create_table(
        "watch_rounds",
        sa.Column("id", sa.Integer, server_default=sa.text("nextval('watch_rounds_id_seq')"), primary_key=True),
        sa.Column("model_id", sa.Integer, nullable=False), sa.Column("claims", sa.Integer, nullable=False),
        sa.Column("batch_id", sa.Integer), sa.Column("n", sa.Integer, nullable=False),
        sa.Column("correct", sa.Integer, nullable=False), sa.Column("reference_correct", sa.Integer, nullable=False),
        sa.Column("disagreements", sa.Integer, nullable=False), sa.Column("worse", sa.Integer, nullable=False),
        sa.Column("better", sa.Integer, nullable=False), sa.Column("statistic", sa.Float, nullable=False),
        sa.Column("verdict", sa.String, nullable=False), sa.Column("event", sa.String),
        sa.Column("evidence", sa.JSON, nullable=False),
        sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False))


def downgrade() -> None:
    op.drop_table("watch_rounds")
    op.execute(DropSequence(Sequence("watch_rounds_id_seq")))
