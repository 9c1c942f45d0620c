"""A query may have a gold answer and the kind of grading it needs; answers an endpoint gave when the registry
asked it (`registry ask`) are kept with their provenance.

Revision ID: 0008
Revises: 0007
"""
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # a table of its own, not columns of queries: a downgrade then leaves the queries exactly as they were
    op.create_table(
        "query_answers",
        sa.Column("query_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("answer", sa.String, nullable=False), sa.Column("grading", sa.String, nullable=False))
    op.create_table(
        "asked_answers",
        sa.Column("model_id", sa.Integer, nullable=False), sa.Column("query_id", sa.Integer, nullable=False),
        sa.Column("batch_id", sa.Integer, nullable=False), sa.Column("base_url", sa.String, nullable=False),
        sa.Column("upstream_model", sa.String), sa.Column("template", sa.String, nullable=False),
        sa.Column("extracted", sa.String), sa.Column("correct", sa.Boolean, nullable=False),
        sa.Column("response_hash", sa.String, nullable=False), sa.Column("response", sa.String),
        sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False))


def downgrade() -> None:
    op.drop_table("asked_answers")
    op.drop_table("query_answers")
