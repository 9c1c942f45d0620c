"""Issue 14, bar 1: the same slice of MMLU-Pro imported into DuckDB and into PostgreSQL gives the same answers
(`stats`, `similar`, `route`, `history`, the CLI, and `registry serve`), and what PostgreSQL itself must enforce."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from registry import Registry
from registry.cli import cli
from registry.core.store import Store, head_revision

from .conftest import start_server

pytestmark = pytest.mark.slow     # PostgreSQL: the full suite runs it, the fast tier stays on DuckDB

MODELS = ("gpt-4o-2024-05-13", "gemma-7b", "Llama-2-7b-hf", "DeepSeek-Coder-V2")


@pytest.fixture
def pair(db_copy, pg_server, pg_base):
    """(DuckDB registry, PostgreSQL registry), each imported from the same files by `registry import`."""
    url = pg_server.create_db("same_answers", template=pg_base)
    with Registry(db_copy) as duck, Registry(url) as pg:
        yield duck, pg
    pg_server.admin('DROP DATABASE "same_answers"')


def known_texts(reg, n=5) -> list[str]:
    with reg.store.tx() as tx:
        return [r[0] for r in tx.sql("SELECT text FROM queries ORDER BY external_id LIMIT ?", [n])]


def test_same_answers_on_duckdb_and_postgres(pair):
    duck, pg = pair
    a, b = duck.stats(), pg.stats()
    assert (a.models, a.queries, a.evaluations, a.evaluation_rows, a.text_vectors, a.import_batches, a.splits) == \
        (b.models, b.queries, b.evaluations, b.evaluation_rows, b.text_vectors, b.import_batches, b.splits)
    assert b.path.startswith("postgresql://") and b.evaluations > 4000
    assert [(m.name, m.evaluations, m.accuracy, m.version, m.status, m.tags) for m in duck.models()] == \
        [(m.name, m.evaluations, m.accuracy, m.version, m.status, m.tags) for m in pg.models()]
    for name in MODELS:
        ha, hb = duck.history(name), pg.history(name)
        assert [(v.version, v.n_evaluations, v.digest, v.reason, v.stability) for v in ha.versions] == \
            [(v.version, v.n_evaluations, v.digest, v.reason, v.stability) for v in hb.versions]
        sa, sb = duck.similar(name, k=5), pg.similar(name, k=5)
        assert [(n.model, n.shared_queries, n.disagreement) for n in sa] == \
            [(n.model, n.shared_queries, n.disagreement) for n in sb]
        np.testing.assert_allclose([n.distance for n in sa], [n.distance for n in sb], atol=1e-4)
        assert duck.show(name).per_category == pg.show(name).per_category
    texts = known_texts(duck)
    assert texts == known_texts(pg)
    for ra, rb in zip(duck.route_batch(texts), pg.route_batch(texts)):
        assert ra.model == rb.model and [c.model for c in ra.candidates] == [c.model for c in rb.candidates]
        np.testing.assert_allclose([c.prob for c in ra.candidates], [c.prob for c in rb.candidates], atol=1e-5)
    assert len(pg.routing_log(limit=100)) == len(duck.routing_log(limit=100)) == len(texts)


def test_cli_on_postgres(pg_url, small_data):
    run = lambda *args: CliRunner().invoke(cli, ["--db", pg_url, *args])   # noqa: E731
    up = run("db", "upgrade")
    assert up.exit_code == 0 and head_revision() in up.output and "postgresql://" in up.output
    out = run("import", str(small_data), "--json")
    assert out.exit_code == 0, out.output
    stats = json.loads(run("stats", "--json").output)
    assert stats["models"] == 31 and stats["evaluations"] > 4000
    similar = json.loads(run("similar", "gemma-7b", "-k", "3", "--json").output)
    assert len(similar["neighbours"]) == 3
    assert json.loads(run("history", "gemma-7b", "--json").output)["versions"][0]["version"] == 1
    missing = run("show", "no-such-model")
    assert missing.exit_code == 1 and "unknown model 'no-such-model'" in missing.output


def test_postgres_refuses_a_vector_of_the_wrong_length(pg_url):
    import psycopg

    store = Store(pg_url)
    with pytest.raises(psycopg.errors.CheckViolation, match="embedding_versions_vector_dim"):
        with store.tx() as tx:
            tx.sql("""INSERT INTO embedding_versions (model_id, version, encoder_id, vector, n_evaluations, digest,
                      through_batch, reason) VALUES (1, 1, 1, ?, 1, 'd', 1, 'manual')""", [[0.5] * 127])
    store.close()


def test_unreachable_database_is_one_line(pg_server):
    from registry.core.errors import RegistryError

    with pytest.raises(RegistryError) as err:
        Registry(pg_server.url("no_such_database"))
    assert "\n" not in str(err.value) and "no_such_database" in str(err.value)


@pytest.mark.slow
def test_serve_on_postgres_answers_as_the_registry_does(pair, pg_server, pg_base):
    duck, _ = pair
    url = pg_server.create_db("served", template=pg_base)
    proc, origin = start_server(url)
    try:
        import httpx

        with httpx.Client(base_url=origin, timeout=60) as client:
            health = client.get("/health").json()
            assert health["ok"] and health["db"].startswith("postgresql://")
            assert len(client.get("/models").json()) == 31
            got = client.get("/models/gemma-7b/similar", params={"k": 5}).json()
            assert [n["model"] for n in got] == [n.model for n in duck.similar("gemma-7b", k=5)]
            text = known_texts(duck, 1)[0]
            routed = client.post("/route", json={"text": text})
            assert routed.status_code == 200, routed.text
            assert routed.json()["model"] == duck.route(text).model
            assert [v["version"] for v in client.get("/models/gemma-7b/history").json()["versions"]] == [1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_placeholders_and_urls_as_psycopg_and_people_read_them():
    import numpy as np

    from registry.core import dialect

    sql, params = dialect.pg_statement("SELECT '?' || ?, 'a%b' LIKE ?, \"we?ird\" FROM t WHERE x = ?",
                                       ["x", "a%", np.int64(3)])
    assert sql == "SELECT '?' || %s, 'a%%b' LIKE %s, \"we?ird\" FROM t WHERE x = %s"
    assert params == ["x", "a%", 3] and type(params[2]) is int
    assert dialect.pg_statement("SELECT 100 % 7", None) == ("SELECT 100 % 7", None)   # no params: sent as is
    assert dialect.display_url("postgresql://bob:secret@db:5432/reg") == "postgresql://bob:***@db:5432/reg"
    assert dialect.engine_url("postgres://bob@db/reg") == "postgresql+psycopg://bob@db/reg"
    assert dialect.is_url("postgresql://x/y") and not dialect.is_url("registry.duckdb")


@pytest.mark.slow   # trains (two steps)
def test_every_command_runs_on_postgres(pg_server, pg_base, small_data, tmp_path, monkeypatch):
    """Item 1 of issue 14: every command of the README on a PostgreSQL registry, each answered (exit 0)."""
    import duckdb

    url = pg_server.create_db("every_command", template=pg_base)
    rows = duckdb.sql(f"""SELECT question_id, correct FROM read_csv('{small_data}/evaluations.csv.gz')
                          WHERE model = 'gemma-7b' ORDER BY 1 LIMIT 100""").fetchall()
    evals = tmp_path / "flip.csv"
    evals.write_text("question_id,correct\n" + "".join(f"{q},{1 - c}\n" for q, c in rows))
    commands = [
        ["models"], ["show", "gemma-7b"], ["stats"], ["history", "gemma-7b"], ["encoders"], ["log"],
        ["register", "gemma-flip", "--evals", str(evals), "--family", "x"],
        ["register", "gemma-7b", "--evals", str(evals), "--update"], ["diff", "gemma-7b"],
        ["similar", "gemma-7b"], ["similar", "--evals", str(evals)], ["fingerprint", "--evals", str(evals)],
        ["fingerprint", "--calibration"], ["fingerprint", "--plan", "-n", "8"],
        ["probe", "gemma-flip", "-n", "4", "--out", str(tmp_path / "probe.csv")],
        ["fallback", "gemma-7b"], ["fallback", "--all"], ["portfolio", "-k", "3"],
        ["portfolio", "-k", "3", "--method", "routing"], ["geometry"], ["map", "--out", str(tmp_path / "map.png")],
        ["mark-unavailable", "gemma-7b"], ["mark-available", "gemma-7b"],
        ["endpoints", "set", "gemma-7b", "--base-url", "http://127.0.0.1:9/v1"], ["endpoints"],
        ["endpoints", "remove", "gemma-7b"],
        ["vectors", "export", str(tmp_path / "v.parquet")], ["vectors", "import", str(tmp_path / "v.parquet")],
        ["evaluate"],
        ["route", "--frontier", "--split", "test", "--cost-by", "params", "--out", str(tmp_path / "f.png")],
        ["draw-splits", "--by", "category", "--test-categories", "math"], ["onboard"],
        ["train", "--steps", "2", "--epochs", "1"],
        ["db", "current"], ["db", "downgrade", "0005", "--yes"], ["db", "upgrade"],
    ]
    for args in commands:
        out = CliRunner().invoke(cli, ["--db", url, *args])
        assert out.exit_code == 0, (args, out.output[-500:], out.exception)


def test_bulk_reads_come_whole_and_in_order(pg_url):
    """dialect.copy_out_fixed (one COPY row of arrays) gives the rows a plain fetch gives, in a statement's own order,
    none for no rows, and declines (None) a NULL: the caller then reads row by row."""
    import psycopg

    from registry.core import dialect

    with psycopg.connect(pg_url) as conn:
        stmt = ("SELECT g AS id, g * 0.5::float8 AS half, g % 3 = 0 AS third, (g * 7919 % 1000)::bigint AS mixed "
                "FROM generate_series(1, 5000) g ORDER BY mixed DESC, id")
        got = dialect.copy_out_fixed(conn, stmt, None)
        want = conn.execute(stmt).fetchall()
        assert got.num_rows == 5000 and list(zip(*(got.column(c).to_pylist() for c in got.column_names))) == want
        assert str(got.schema.field("third").type) == "bool" and str(got.schema.field("mixed").type) == "int64"
        empty = dialect.copy_out_fixed(conn, "SELECT g FROM generate_series(1, 3) g WHERE g > %s", [5])
        assert empty.num_rows == 0 and str(empty.schema.field("g").type) == "int32"
        assert dialect.copy_out_fixed(conn, "SELECT NULLIF(g, 2) AS g FROM generate_series(1, 3) g", None) is None
        assert dialect.copy_out_fixed(conn, "SELECT 'text' AS t", None) is None
