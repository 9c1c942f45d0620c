"""Create the append-only model endpoints (where the routing proxy forwards a model's requests).

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import CreateSequence, DropSequence, Sequence

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(CreateSequence(Sequence("model_endpoints_id_seq")))
    op.create_table(
        "model_endpoints",
        sa.Column("id", sa.Integer, server_default=sa.text("nextval('model_endpoints_id_seq')"), primary_key=True),
        sa.Column("model_id", sa.Integer, nullable=False), sa.Column("base_url", sa.String),
        sa.Column("upstream_model", sa.String), sa.Column("api_key_env", sa.String),
        sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False))


def downgrade() -> None:
    op.drop_table("model_endpoints")
    op.execute(DropSequence(Sequence("model_endpoints_id_seq")))
