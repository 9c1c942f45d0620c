"""The schema that the migrations build equals the ORM's; migrations go down and up again without losing data."""
from __future__ import annotations

import duckdb
import pytest
from sqlalchemy import create_engine

from registry import Registry, SchemaOutdated
from registry.core.schema import Base
from registry.core.store import Store, head_revision

from .conftest import any_snapshot


def catalog(path) -> dict:
    con = duckdb.connect(str(path), read_only=True)
    try:
        cols = con.execute("""SELECT table_name, column_name, data_type, is_nullable, column_default
                              FROM duckdb_columns() WHERE table_name <> 'alembic_version'
                              ORDER BY table_name, column_index""").fetchall()
        cons = con.execute("""SELECT table_name, constraint_type, constraint_column_names::VARCHAR
                              FROM duckdb_constraints() WHERE table_name <> 'alembic_version'
                              ORDER BY ALL""").fetchall()
        seqs = con.execute("SELECT sequence_name FROM duckdb_sequences() ORDER BY 1").fetchall()
        return {"columns": cols, "constraints": cons, "sequences": seqs}
    finally:
        con.close()


def test_migrated_schema_equals_orm_metadata(tmp_path):
    migrated = tmp_path / "migrated.duckdb"
    Store(migrated).close()
    from_orm = tmp_path / "orm.duckdb"
    engine = create_engine(f"duckdb:///{from_orm}")
    Base.metadata.create_all(engine)
    engine.dispose()
    a, b = catalog(migrated), catalog(from_orm)
    assert a["columns"] == b["columns"]
    assert a["constraints"] == b["constraints"]
    assert a["sequences"] == b["sequences"]
    assert len(a["columns"]) > 20


def pg_catalog(url) -> dict:
    """Columns, constraints (with CHECK definitions) and sequences as PostgreSQL's catalog holds them."""
    import psycopg

    with psycopg.connect(url) as conn:
        cols = conn.execute("""SELECT table_name, column_name, data_type, udt_name, is_nullable, column_default
                               FROM information_schema.columns
                               WHERE table_schema = current_schema() AND table_name <> 'alembic_version'
                               ORDER BY table_name, ordinal_position""").fetchall()
        cons = conn.execute("""SELECT c.conrelid::regclass::text, c.conname, c.contype, pg_get_constraintdef(c.oid)
                               FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
                               WHERE n.nspname = current_schema() AND c.conrelid::regclass::text <> 'alembic_version'
                               ORDER BY 1, 2""").fetchall()
        seqs = conn.execute("""SELECT sequence_name, data_type, start_value, increment FROM information_schema.sequences
                               WHERE sequence_schema = current_schema() ORDER BY 1""").fetchall()
        return {"columns": cols, "constraints": cons, "sequences": seqs}


@pytest.mark.slow
def test_migrated_schema_equals_orm_metadata_on_postgres(pg_server):
    migrated = pg_server.create_db("schema_migrated")
    Store(migrated).close()
    from_orm = pg_server.create_db("schema_orm")
    engine = create_engine(from_orm.replace("postgresql://", "postgresql+psycopg://"))
    Base.metadata.create_all(engine)
    engine.dispose()
    a, b = pg_catalog(migrated), pg_catalog(from_orm)
    assert a["columns"] == b["columns"]
    assert a["constraints"] == b["constraints"]
    assert a["sequences"] == b["sequences"]
    assert len(a["columns"]) > 20
    types = {(t, c): u for t, c, _, u, _, _ in a["columns"]}
    assert types[("embedding_versions", "vector")] == types[("text_vectors", "vector")] == "_float4"   # real[]
    assert any(name == "embedding_versions_vector_dim" for _, name, _, _ in a["constraints"])


def test_downgrade_and_upgrade_keep_data(any_db):
    before = any_snapshot(any_db)
    assert before["evaluations"][0] > 0
    store = Store(any_db)
    store.downgrade("0001")
    assert store.current_revision() == "0001"
    with pytest.raises(SchemaOutdated, match="registry db upgrade"):
        Store(any_db)
    store.upgrade("head")
    store.close()
    after = any_snapshot(any_db)
    # the tables that 0001 holds keep every row across the round trip
    for table in ("models", "queries", "evaluations", "text_vectors", "import_batches"):
        assert after[table] == before[table], table
    with Registry(any_db) as reg:
        assert reg.stats().evaluations > 0


def test_new_file_is_migrated_to_head(tmp_path):
    store = Store(tmp_path / "new.duckdb")
    assert store.current_revision() == head_revision()
    store.close()
