"""The routing state a process built, saved so the next one routes without refitting it (routing/saved_state.py).

Revision ID: 0009
Revises: 0008
"""
import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "routing_states",
        sa.Column("key", sa.String, primary_key=True), sa.Column("encoder_id", sa.Integer, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False))


def downgrade() -> None:
    op.drop_table("routing_states")
