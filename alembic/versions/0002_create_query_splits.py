"""Create query_splits: which queries are train, validation and test.

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "query_splits",
        sa.Column("query_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("split", sa.String, nullable=False))


def downgrade() -> None:
    op.drop_table("query_splits")
