"""Create the watch deliveries: one row per event `registry watch` raised for a webhook, kept undelivered until the
webhook takes it (a 2xx answer within the deadline), so an event a failing webhook missed is sent again next round.

Revision ID: 0012
Revises: 0011
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import CreateSequence, DropSequence, Sequence

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(CreateSequence(Sequence("watch_deliveries_id_seq")))
    op.create_table(
        "watch_deliveries",
        sa.Column("id", sa.Integer, server_default=sa.text("nextval('watch_deliveries_id_seq')"), primary_key=True),
        sa.Column("url", sa.String, nullable=False), sa.Column("event", sa.JSON, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("last_error", sa.String), sa.Column("delivered", sa.DateTime),
        sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False))


def downgrade() -> None:
    op.drop_table("watch_deliveries")
    op.execute(DropSequence(Sequence("watch_deliveries_id_seq")))
