"""Issue 14, bar 4: `registry db copy DEST` is lossless. A registry with rows in every table is copied DuckDB ->
PostgreSQL -> DuckDB and compared with the original table by table, row by row (ordered by primary key), with every
version's digest and vector, and `similar` / `route` answer alike; ids go on from the same place on every copy. A
destination with rows is refused and left as it was; a copy that fails half-way leaves its destination empty."""
from __future__ import annotations

import hashlib
import json
import shutil

import duckdb
import numpy as np
import pytest
from click.testing import CliRunner

from registry import Registry
from registry.answers import catalog, tidying
from registry.asking import claims
from registry.cli import cli
from registry.core import dbcopy
from registry.core.errors import InputError, RegistryError
from registry.core.schema import Base
from registry.core.store import Store
from registry.traffic import requests

from .conftest import any_snapshot, snapshot

pytestmark = pytest.mark.slow     # PostgreSQL: the full suite runs it, the fast tier stays on DuckDB

MODELS = ("gpt-4o-2024-05-13", "gemma-7b", "Llama-2-7b-hf")


def known_texts(reg, n=4) -> list[str]:
    with reg.store.tx() as tx:
        return [r[0] for r in tx.sql("SELECT text FROM queries ORDER BY external_id LIMIT ?", [n])]


def traffic(reg, folder) -> None:
    """Feedback as a served registry takes it: requests recorded as the proxy's writer appends them, their outcomes
    landed by `Registry.feedback` (production queries, evaluations, a re-embedding), every one wrong where routing
    predicted 0.9 on one model's category (the drift test raises an event), and a source's setting."""
    model = MODELS[0]
    with reg.store.tx() as tx:
        category = tx.sql("SELECT category FROM queries WHERE category IS NOT NULL ORDER BY id LIMIT 1")[0][0]
        vecs = np.random.default_rng(0).standard_normal((12, 384)).astype(np.float32)
        recs = [requests.Record(requests.new_id(), model, model, category, hashlib.sha256(b"%d" % i).hexdigest(), None,
                                requests.vector_bytes(v / np.linalg.norm(v)), 0.9, 12, 2, None, None)
                for i, v in enumerate(vecs)]
        requests.append(tx, recs)
    path = folder / "outcomes.jsonl"
    path.write_text("".join(json.dumps({"request_id": r.id, "outcome": 0 if i < 10 else 0.75,
                                        "source": "grader" if i < 10 else "thumbs"}) + "\n"
                            for i, r in enumerate(recs)))
    out = reg.feedback(str(path))
    assert out.outcomes == 12 and [(e.model, e.category) for e in out.events] == [(model, category)]
    reg.feedback_source("thumbs", weight=0.5)


@pytest.fixture
def full_db(db_copy, tmp_path):
    """The session's registry with rows in every table: routes logged, a model marked down and up, an endpoint, an
    alias, a rename, feedback on proxied requests with a drift event."""
    with Registry(db_copy) as reg:
        traffic(reg, tmp_path)
        reg.route_batch(known_texts(reg))
        reg.mark_unavailable(["gemma-7b"], reason="maintenance")
        reg.mark_available(["gemma-7b"])
        reg.set_endpoint("gpt-4o-2024-05-13", "https://api.example.com/v1", "gpt-4o", "OPENAI_API_KEY")
        with reg.store.tx() as tx:          # (an alias row, as a user's --alias-of writes one)
            catalog.set_alias(tx, "Meta-Llama-3_1-8B-Instruct", "Meta-Llama-3_1-70B-Instruct", "user")
            # (an answer an endpoint gave, as `registry ask` keeps one)
            tx.sql("""INSERT INTO asked_answers (model_id, query_id, batch_id, base_url, upstream_model, template,
                                                 extracted, correct, response_hash, response)
                      SELECT m.id, q.id, b.id, 'http://127.0.0.1:9/v1', 'gpt-4o', 'mc-letter/1', 'C', true, 'ab12',
                             'The answer is (C).'
                      FROM models m, queries q, import_batches b ORDER BY m.id, q.id, b.id LIMIT 1""")
            # (an endpoint claiming a model, and a watch round of it, as `registry endpoints add` and `watch` write)
            claims.add(tx, "gpt-4o-2024-05-13", "https://other.example/v1", name="gpt-4o-2024-05-13@other")
            tx.sql("""INSERT INTO watch_rounds (model_id, claims, batch_id, n, correct, reference_correct,
                      disagreements, worse, better, statistic, verdict, event, evidence)
                      SELECT c.id, m.id, NULL, 64, 46, 47, 3, 1, 0, 0.2, 'faithful', NULL, '{"s_drop": 0.36}'
                      FROM models m, models c WHERE m.name = 'gpt-4o-2024-05-13'
                      AND c.name = 'gpt-4o-2024-05-13@other'""")
            # (an event kept for a webhook that has not taken it yet, as `watch --webhook` keeps it)
            tidying.rename(tx, "Yi-6b-Chat", "yi-6b-chat", "a rename, as `registry rename` keeps it")
            tx.sql("""INSERT INTO watch_deliveries (url, event, attempts, last_error)
                      VALUES ('https://hooks.example/x?k=1', '{"change": "faithful -> unreachable"}', 3, 'HTTP 500')
                      RETURNING id""")
    return db_copy


def rows(path) -> dict[str, list[tuple]]:
    """Every table of a DuckDB registry, each row as Python values, ordered by primary key (then every column)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        out = {}
        for (table,) in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall():
            columns = [r[0] for r in con.execute(f"DESCRIBE \"{table}\"").fetchall()]
            meta = Base.metadata.tables.get(table)
            keys = [c.name for c in meta.primary_key.columns] if meta is not None else []
            order = keys + [c for c in columns if c not in keys]
            out[table] = con.execute(f'SELECT * FROM "{table}" ORDER BY {", ".join(order)}').fetchall()
        return out
    finally:
        con.close()


def versions(reg) -> list[tuple]:
    """Every embedding version: (model, version, digest, vector as float32 bytes)."""
    with reg.store.tx() as tx:
        res = tx.arrow("""SELECT m.name, v.version, v.digest, v.vector FROM embedding_versions v
                          JOIN models m ON m.id = v.model_id ORDER BY m.name, v.version""").to_pylist()
    return [(r["name"], r["version"], r["digest"], np.asarray(r["vector"], dtype=np.float32).tobytes())
            for r in res]


def answers(reg, texts) -> tuple:
    similar = [[(n.model, n.distance, n.shared_queries, n.disagreement) for n in reg.similar(m, k=5)]
               for m in MODELS]
    routes = [(r.model, [(c.model, c.prob) for c in r.candidates]) for r in reg.route_batch(texts)]
    return similar, routes


def test_round_trip_duckdb_postgres_duckdb_is_lossless(full_db, pg_url, tmp_path, monkeypatch):
    monkeypatch.setattr(dbcopy, "BATCH_ROWS", 1000)     # several batches per large table, both ways
    back = tmp_path / "back.duckdb"
    before = rows(full_db)
    assert all(before[t] for t in before), f"every table must have rows: {[t for t in before if not before[t]]}"
    assert set(before) == set(Base.metadata.tables) | {"alembic_version"}

    with Registry(full_db) as reg:
        to_pg = reg.db_copy(pg_url)
    assert to_pg.tables == {t: len(r) for t, r in before.items() if t != "alembic_version"}
    with Registry(pg_url) as reg:
        back_result = reg.db_copy(str(back))
    assert back_result.tables == to_pg.tables
    assert back_result.sequences == to_pg.sequences and to_pg.sequences["queries_id_seq"] == len(before["queries"])

    after = rows(back)
    assert list(after) == list(before)
    for table in before:   # one table at a time, so a failure names it
        assert after[table] == before[table], f"table {table} differs after the round trip"

    with Registry(full_db) as orig, Registry(pg_url) as pg, Registry(back) as copy:
        assert versions(orig) == versions(pg) == versions(copy)
        assert len(versions(orig)) == len(before["embedding_versions"])
        for name in MODELS:
            assert [(v.version, v.digest, v.n_evaluations, v.stability) for v in orig.history(name).versions] == \
                [(v.version, v.digest, v.n_evaluations, v.stability) for v in copy.history(name).versions]
        # feedback reads alike on all three: the drift events with their evidence, the sources with their outcomes
        events = [[(e.id, e.model, e.category, e.drop, e.evidence) for e in r.drift()] for r in (orig, pg, copy)]
        assert events[0] == events[1] == events[2] and len(events[0]) == 1
        assert [vars(s) for s in orig.feedback_sources()] == [vars(s) for s in pg.feedback_sources()] == \
            [vars(s) for s in copy.feedback_sources()]
        texts = known_texts(orig)
        a, c = answers(orig, texts), answers(copy, texts)
        assert a == c                                    # the same answers, to the last bit
        p = answers(pg, texts)                           # PostgreSQL computes some sums in another order
        assert [[(n[0], n[2], n[3]) for n in s] for s in a[0]] == [[(n[0], n[2], n[3]) for n in s] for s in p[0]]
        assert [(m, [x[0] for x in cands]) for m, cands in a[1]] == [(m, [x[0] for x in cands]) for m, cands in p[1]]

        # ids go on from where the original's do: the same write gets the same new ids on all three
        for reg in (orig, pg, copy):
            reg.mark_unavailable(["Llama-2-7b-hf"])
        with orig.store.tx() as t0, pg.store.tx() as t1, copy.store.tx() as t2:
            q = "SELECT id, model_id, available FROM model_availability ORDER BY id"
            assert t0.sql(q) == [tuple(r) for r in t1.sql(q)] == t2.sql(q)
            assert t0.sql(q)[-1][0] == len(before["model_availability"]) + 1
            q = "SELECT max(id) FROM routing_log"
            assert t0.sql(q) == t1.sql(q) == t2.sql(q)


def test_duckdb_to_duckdb_on_the_command_line(full_db, tmp_path):
    dest = tmp_path / "sub" / "copy.duckdb"
    dest.parent.mkdir()
    res = CliRunner().invoke(cli, ["--db", str(full_db), "db", "copy", str(dest), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    before = rows(full_db)
    assert out["tables"] == {t: len(r) for t, r in before.items() if t != "alembic_version"}
    assert out["rows"] == sum(out["tables"].values()) and out["dest"] == str(dest)
    assert "evaluations" in res.stderr and "rows" in res.stderr          # progress, one line per table
    assert rows(dest) == before
    assert snapshot(dest) == snapshot(full_db)
    # an empty registry at an older revision is empty too: migrated to head, then filled
    older = tmp_path / "older.duckdb"
    store = Store(older, migrate=False)
    store.upgrade("0005")
    store.close()
    res = CliRunner().invoke(cli, ["--db", str(full_db), "db", "copy", str(older)])
    assert res.exit_code == 0 and res.stdout.startswith(f"copied {len(out['tables'])} tables"), res.output
    assert rows(older) == before


def test_a_destination_with_another_table_is_refused(full_db, tmp_path):
    dest = tmp_path / "other.duckdb"
    con = duckdb.connect(str(dest))
    con.execute("CREATE TABLE notes (line VARCHAR)")
    con.close()
    with Registry(full_db) as reg, pytest.raises(InputError, match="holds table notes, which is not the registry's"):
        reg.db_copy(str(dest))
    assert list(snapshot(dest)) == ["notes"]


def test_a_destination_with_rows_is_refused_and_unchanged(any_db, base_db, tmp_path):
    source = tmp_path / "source.duckdb"
    shutil.copy(base_db, source)
    with Registry(source) as reg:      # a source that differs from the destination
        reg.mark_unavailable(["gemma-7b"])
    before = any_snapshot(any_db)
    with Registry(source) as reg, pytest.raises(InputError) as err:
        reg.db_copy(any_db)
    msg = str(err.value)
    assert "not empty" in msg and "\n" not in msg
    assert msg.startswith(str(any_db) if not any_db.startswith("postgresql") else "postgresql://")
    assert any_snapshot(any_db) == before
    res = CliRunner().invoke(cli, ["--db", str(source), "db", "copy", any_db])
    assert res.exit_code == 1 and res.output.count("\n") == 1 and "not empty" in res.output, res.output
    assert any_snapshot(any_db) == before


def test_copy_onto_itself_is_refused(full_db):
    with Registry(full_db) as reg, pytest.raises(InputError, match="another database"):
        reg.db_copy(str(full_db))


def test_a_failed_copy_leaves_the_destination_empty_and_ready(full_db, pg_url):
    """PostgreSQL refuses a NUL character in text, DuckDB stores it: the copy fails at routing_log, after the
    tables before it went in, and the destination keeps none of them; the fixed source then copies into it."""
    con = duckdb.connect(str(full_db))
    con.execute("UPDATE routing_log SET text = 'a\x00b' WHERE id = (SELECT max(id) FROM routing_log)")
    con.close()
    with Registry(full_db) as reg, pytest.raises(RegistryError) as err:
        reg.db_copy(pg_url)
    assert "routing_log" in str(err.value) and "\n" not in str(err.value)
    counts = {t: n for t, (n, _) in any_snapshot(pg_url).items()}
    assert counts.pop("alembic_version") == 1 and set(counts.values()) == {0}, counts
    con = duckdb.connect(str(full_db))
    con.execute("UPDATE routing_log SET text = 'ab' WHERE text = 'a\x00b'")
    con.close()
    with Registry(full_db) as reg:
        result = reg.db_copy(pg_url)
    assert result.tables["routing_log"] == len(rows(full_db)["routing_log"])


def test_a_postgres_source_written_to_meanwhile_is_copied_as_it_stood(full_db, pg_url, tmp_path):
    """The copy reads one snapshot: a write committed by another connection while the copy runs (here: between its
    first table and model_availability) is not in the copy."""
    with Registry(full_db) as reg:
        reg.db_copy(pg_url)
    writes = []

    def write_meanwhile(table, rows):
        if not writes:
            with Registry(pg_url) as other:
                writes.append(other.mark_unavailable(["gemma-7b"], reason="during the copy"))

    back = tmp_path / "back.duckdb"
    with Registry(pg_url) as reg:
        result = reg.db_copy(str(back), progress=write_meanwhile)
    assert writes and list(result.tables).index("model_availability") > 0
    assert rows(back)["model_availability"] == rows(full_db)["model_availability"]
    with Registry(pg_url) as reg, reg.store.tx() as tx:      # the write itself went in
        assert tx.sql("SELECT count(*) FROM model_availability")[0][0] == len(rows(full_db)["model_availability"]) + 1
