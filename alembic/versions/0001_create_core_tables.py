"""Create the core tables: models, queries, text vectors, import batches, evaluations.

Dialect-aware since issue 14 (PostgreSQL): there the vectors are real[] (DuckDB's FLOAT is 4 bytes, PostgreSQL's
FLOAT is 8) and the `arg_max` aggregates the registry's SQL uses are created (DuckDB has them built in). What this
revision does on DuckDB is unchanged, statement for statement.

Revision ID: 0001
Revises:
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateSequence, DropSequence, Sequence

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _seq_id(name: str) -> sa.Column:
    return sa.Column("id", sa.Integer, server_default=sa.text(f"nextval('{name}')"), primary_key=True)


def _created() -> sa.Column:
    return sa.Column("created", sa.DateTime, server_default=sa.func.now(), nullable=False)


def upgrade() -> None:
    for name in ("models_id_seq", "queries_id_seq", "import_batches_id_seq"):
        op.execute(CreateSequence(Sequence(name)))
    op.create_table(
        "models", _seq_id("models_id_seq"),
        sa.Column("name", sa.String, nullable=False, unique=True),
        sa.Column("family", sa.String), sa.Column("provider", sa.String),
        sa.Column("params_b", sa.Double), sa.Column("cost", sa.Double),
        sa.Column("open_weights", sa.Boolean), sa.Column("tags", sa.JSON), _created())
    op.create_table(
        "queries", _seq_id("queries_id_seq"),
        sa.Column("external_id", sa.String, nullable=False, unique=True),
        sa.Column("source", sa.String), sa.Column("category", sa.String),
        sa.Column("text", sa.String, nullable=False), sa.Column("content_hash", sa.String, nullable=False),
        _created())
    op.create_table(
        "text_vectors",
        sa.Column("content_hash", sa.String, primary_key=True),
        sa.Column("text_encoder", sa.String, primary_key=True),
        sa.Column("vector", sa.ARRAY(sa.Float).with_variant(postgresql.ARRAY(sa.REAL), "postgresql"),
                  nullable=False), _created())
    op.create_table(
        "import_batches", _seq_id("import_batches_id_seq"),
        sa.Column("files", sa.JSON, nullable=False), sa.Column("row_counts", sa.JSON, nullable=False),
        sa.Column("digest", sa.String, nullable=False), _created())
    op.create_table(
        "evaluations",
        sa.Column("model_id", sa.Integer, nullable=False), sa.Column("query_id", sa.Integer, nullable=False),
        sa.Column("correct", sa.Boolean, nullable=False), sa.Column("batch_id", sa.Integer, nullable=False),
        _created())
    if op.get_bind().dialect.name == "postgresql":
        op.execute(PG_AGGREGATES)


# arg_max(value, key): the value of the row with the largest key (rows with a NULL key are skipped), as DuckDB's.
# The state is [key, value] as integers (a boolean as 0/1), one overload per value type the registry uses.
PG_AGGREGATES = """
CREATE FUNCTION registry_arg_max_step(s integer[], v integer, k integer) RETURNS integer[]
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS
    $$ BEGIN IF k IS NULL THEN RETURN s; END IF;
             IF s IS NULL OR k > s[1] THEN RETURN ARRAY[k, v]; END IF; RETURN s; END $$;
CREATE FUNCTION registry_arg_max_step(s integer[], v boolean, k integer) RETURNS integer[]
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS
    $$ BEGIN IF k IS NULL THEN RETURN s; END IF;
             IF s IS NULL OR k > s[1] THEN RETURN ARRAY[k, v::integer]; END IF; RETURN s; END $$;
CREATE FUNCTION registry_arg_max_int(s integer[]) RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT s[2] $$;
CREATE FUNCTION registry_arg_max_bool(s integer[]) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT s[2]::boolean $$;
CREATE AGGREGATE arg_max(integer, integer) (SFUNC = registry_arg_max_step, STYPE = integer[],
                                            FINALFUNC = registry_arg_max_int);
CREATE AGGREGATE arg_max(boolean, integer) (SFUNC = registry_arg_max_step, STYPE = integer[],
                                            FINALFUNC = registry_arg_max_bool);
"""


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP AGGREGATE arg_max(boolean, integer); DROP AGGREGATE arg_max(integer, integer); "
                   "DROP FUNCTION registry_arg_max_bool(integer[]); DROP FUNCTION registry_arg_max_int(integer[]); "
                   "DROP FUNCTION registry_arg_max_step(integer[], boolean, integer); "
                   "DROP FUNCTION registry_arg_max_step(integer[], integer, integer)")
    for table in ("evaluations", "import_batches", "text_vectors", "queries", "models"):
        op.drop_table(table)
    for name in ("import_batches_id_seq", "queries_id_seq", "models_id_seq"):
        op.execute(DropSequence(Sequence(name)))
