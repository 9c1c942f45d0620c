"""Keep each embedding version's stability estimate in a table of its own, written just after the version.

The estimate embeds two random halves of the version's evaluations: as much encoder work again as the version itself.
Kept apart, onboarding writes and indexes a new vector without waiting for it, and the estimate follows in the next
transaction of the same command (a crash in between leaves it pending; the next onboarding makes it). Estimates made
before this revision are copied over; the column embedding_versions.stability stays, no longer written.

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "version_stability",
        sa.Column("version_id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("stability", sa.Double, nullable=False),
        sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False))
    op.execute("""INSERT INTO version_stability (version_id, stability, created)
                  SELECT id, stability, created FROM embedding_versions WHERE stability IS NOT NULL""")


def downgrade() -> None:
    op.drop_table("version_stability")
