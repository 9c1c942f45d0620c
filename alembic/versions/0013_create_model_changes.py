"""Create the model changes: one row per model deleted or renamed (`registry delete`, `registry rename`), append-only.
A deleted model's row leaves `models` (so it leaves every list and answer) and is kept here whole (`record`), while
its versions, results and claims stay in their tables under its id, readable for audits (`registry history NAME`).

Revision ID: 0013
Revises: 0012
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import CreateSequence, DropSequence, Sequence

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(CreateSequence(Sequence("model_changes_id_seq")))
    op.create_table(
        "model_changes",
        sa.Column("id", sa.Integer, server_default=sa.text("nextval('model_changes_id_seq')"), primary_key=True),
        sa.Column("model_id", sa.Integer, nullable=False), sa.Column("change", sa.String, nullable=False),
        sa.Column("name", sa.String, nullable=False), sa.Column("new_name", sa.String),
        sa.Column("record", sa.JSON), sa.Column("reason", sa.String),
        sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False))


def downgrade() -> None:
    op.drop_table("model_changes")
    op.execute(DropSequence(Sequence("model_changes_id_seq")))
