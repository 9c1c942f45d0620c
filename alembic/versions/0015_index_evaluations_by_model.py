"""Index the evaluations by model on PostgreSQL. Every read of a registry's answers names its models (a model's
page, onboarding's chunks of models, the answer index's batches), and without an index PostgreSQL scans the whole
table for each: at 10^8 rows, a hundred scans of 5 GB for one bulk onboarding. A B-tree on model_id alone (PostgreSQL
keeps a model's thousands of row pointers as one deduplicated entry: about 6 bytes a row). DuckDB keeps no index: its
storage blocks carry each column's min and max, and rows lie in import order, so a model's rows are found without
one (and an index there would slow every import).

Building it on a registry that already holds many rows takes a while (a few minutes at 10^8 evaluations).

Revision ID: 0015
Revises: 0014
"""
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("evaluations_by_model", "evaluations", ["model_id"])


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("evaluations_by_model", table_name="evaluations")
