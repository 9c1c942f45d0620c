"""Create what the router learns from its own traffic: one row per request the proxy routed and answered (its id,
the model that answered, the query's hash and vector, what routing predicted for that model, tokens and cost; the
text only where the owner keeps texts), one row per outcome sent back for such a request (at most one each), the
feedback sources' settings (append-only: the newest row per name counts), and the drift events raised on the
outcomes.

Revision ID: 0014
Revises: 0013
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import CreateSequence, DropSequence, Sequence

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "proxy_requests",
        sa.Column("id", sa.String, primary_key=True),
        sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False),
        sa.Column("model", sa.String), sa.Column("chosen", sa.String), sa.Column("category", sa.String),
        sa.Column("query_hash", sa.String, nullable=False), sa.Column("text", sa.String),
        sa.Column("vector", sa.LargeBinary), sa.Column("predicted", sa.Double),
        sa.Column("prompt_tokens", sa.Integer), sa.Column("completion_tokens", sa.Integer),
        sa.Column("cost", sa.Double), sa.Column("encoder_id", sa.Integer))
    op.create_table(
        "feedback",
        sa.Column("request_id", sa.String, primary_key=True),
        sa.Column("model_id", sa.Integer, nullable=False), sa.Column("query_id", sa.Integer, nullable=False),
        sa.Column("batch_id", sa.Integer, nullable=False), sa.Column("source", sa.String, nullable=False),
        sa.Column("outcome", sa.Double, nullable=False), sa.Column("correct", sa.Boolean, nullable=False),
        sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False))
    op.execute(CreateSequence(Sequence("feedback_sources_id_seq")))
    op.create_table(
        "feedback_sources",
        sa.Column("id", sa.Integer, server_default=sa.text("nextval('feedback_sources_id_seq')"),
                  primary_key=True),
        sa.Column("name", sa.String, nullable=False), sa.Column("weight", sa.Double, nullable=False),
        sa.Column("threshold", sa.Double, nullable=False), sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False))
    op.execute(CreateSequence(Sequence("drift_events_id_seq")))
    op.create_table(
        "drift_events",
        sa.Column("id", sa.Integer, server_default=sa.text("nextval('drift_events_id_seq')"), primary_key=True),
        sa.Column("model", sa.String, nullable=False), sa.Column("category", sa.String, nullable=False),
        sa.Column("drop", sa.Double, nullable=False), sa.Column("statistic", sa.Double, nullable=False),
        sa.Column("evidence", sa.JSON, nullable=False),
        sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False))


def downgrade() -> None:
    op.drop_table("drift_events")
    op.execute(DropSequence(Sequence("drift_events_id_seq")))
    op.drop_table("feedback_sources")
    op.execute(DropSequence(Sequence("feedback_sources_id_seq")))
    op.drop_table("feedback")
    op.drop_table("proxy_requests")
