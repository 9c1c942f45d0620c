"""Create the append-only model claims: an endpoint registered as a model of its own (X@provider) that claims to
serve a registered model X, whether it is X's reference (the official API) and whether it is watched.

Revision ID: 0010
Revises: 0009
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import CreateSequence, DropSequence, Sequence

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(CreateSequence(Sequence("model_claims_id_seq")))
    op.create_table(
        "model_claims",
        sa.Column("id", sa.Integer, server_default=sa.text("nextval('model_claims_id_seq')"), primary_key=True),
        sa.Column("model_id", sa.Integer, nullable=False), sa.Column("claims", sa.Integer),
        sa.Column("reference", sa.Boolean, nullable=False), sa.Column("watched", sa.Boolean, nullable=False),
        sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False))


def downgrade() -> None:
    op.drop_table("model_claims")
    op.execute(DropSequence(Sequence("model_claims_id_seq")))
