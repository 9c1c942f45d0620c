"""Routing through the Python API and the CLI, on a real registry copy with real MiniLM vectors: choices, cost-aware
options, availability and fallbacks, the routing log, batch files, the frontier, and bad input."""
from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest

from registry import Registry, RouteOptions
from registry.core.errors import InputError, NotFound
from tests.helpers import run

Q = "What is the derivative of x^2 with respect to x?"


@pytest.fixture
def reg(any_db):
    """The session's registry on each backend (DuckDB file, PostgreSQL database)."""
    r = Registry(any_db)
    yield r
    r.close()


@pytest.fixture
def known(reg) -> str:
    """A query text the registry already holds: routed from its stored vector, without MiniLM."""
    with reg.store.tx() as tx:
        return tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]


def test_route_gives_every_candidate_and_logs(reg, known):
    Q = known
    d = reg.route(Q)
    names = {m.name for m in reg.models()}
    assert {c.model for c in d.candidates} == names and len(d.candidates) == 31
    probs = [c.prob for c in d.candidates]
    assert probs == sorted(probs, reverse=True) and all(0 <= p <= 1 for p in probs)
    assert d.model == d.candidates[0].model and d.fallback is False
    assert set(d.versions) == names and d.encoder
    reg.route(Q, RouteOptions(log_text=False))
    log = reg.routing_log(oldest=True)
    assert [e.text for e in log] == [Q, None] and log[0].query_hash == log[1].query_hash == d.query_hash
    assert log[0].model == d.model and len(log[0].candidates) == 5
    # the row keeps the versions behind what it records (its candidates and the choice), not every model's
    assert log[0].versions == {m: d.versions[m] for m in [c["model"] for c in log[0].candidates] + [d.model]}
    assert [e.text for e in reg.routing_log()] == [None, Q]              # newest first by default
    assert [e.text for e in reg.routing_log(limit=1)] == [None]          # --limit keeps the newest
    assert reg.routing_log(since="2999-01-01") == []
    with pytest.raises(InputError, match="not a timestamp"):
        reg.routing_log(since="yesterday-ish")


def test_cost_is_price_and_size_only_when_asked(reg, known, tmp_path):
    """Price and size are kept apart: no price, no cost-aware routing by price; by size only with cost_by=params,
    over the models that have a size, and the decision names the basis."""
    Q = known
    base = reg.route(Q, RouteOptions(log=False))
    assert base.cost_basis is None and all(c.cost is None for c in base.candidates)
    with pytest.raises(InputError, match="needs a price for every candidate.*--cost-by params"):
        reg.route(Q, RouteOptions(cost_weight=0.01, log=False))
    sized = [c for c in base.candidates if c.params_b is not None]
    # size dominates: a smallest model wins (the weight is on the candidates' size range: 1000 outweighs any P)
    heavy = reg.route(Q, RouteOptions(cost_weight=1000.0, cost_by="params", log=False))
    assert heavy.cost_basis == "params_b" and "without a parameter count left out" in heavy.note
    assert next(c for c in heavy.candidates if c.model == heavy.model).params_b == min(c.params_b for c in sized)
    p = sorted(c.prob for c in sized)[len(sized) // 2]
    d = reg.route(Q, RouteOptions(min_prob=p, cost_by="params", log=False))
    chosen = next(c for c in d.candidates if c.model == d.model)
    assert chosen.prob >= p and chosen.params_b == min(c.params_b for c in sized if c.prob >= p)
    # with a price for every model, cost-aware routing ranks by price, never by size
    prices = tmp_path / "prices.csv"
    prices.write_text("model,cost\n" + "".join(f"{c.model},{1.0 if c.model == 'Llama-2-70b-hf' else 5.0}\n"
                                                for c in base.candidates))
    reg.import_files(models=str(prices))
    priced = reg.route(Q, RouteOptions(cost_weight=10.0, log=False))
    assert priced.cost_basis == "cost" and priced.model == "Llama-2-70b-hf"
    assert reg.route(Q, RouteOptions(min_prob=1.0, log=False)).model == base.model   # none reaches it: the most likely
    with pytest.raises(InputError, match="not both"):
        reg.route(Q, RouteOptions(cost_weight=0.1, min_prob=0.5))
    with pytest.raises(InputError):
        reg.route(Q, RouteOptions(min_prob=1.5))


def test_unavailable_fallback_and_persistent_flags(reg, known):
    Q = known
    d = reg.route(Q, RouteOptions(log=False))
    top, second = d.candidates[0].model, d.candidates[1].model
    f = reg.route(Q, RouteOptions(unavailable=[top]))
    assert f.model == second and f.fallback is True
    assert reg.routing_log()[0].fallback is True
    reg.mark_unavailable([top], reason="outage")
    assert reg.route(Q, RouteOptions(log=False)).model == second
    assert [a.model for a in reg.availability() if not a.available] == [top]
    reg.mark_available([top])
    assert reg.route(Q, RouteOptions(log=False)).model == top
    with pytest.raises(NotFound, match="unknown model 'no-such-model'"):
        reg.route(Q, RouteOptions(unavailable=["no-such-model"]))
    with pytest.raises(NotFound):
        reg.mark_unavailable(["no-such-model"])
    everyone = [m.name for m in reg.models()]
    none = reg.route(Q, RouteOptions(unavailable=everyone))                  # a well-defined answer, not an error
    assert none.model is None and none.fallback is True and "all 31 candidates are unavailable" in none.note


@pytest.mark.slow
def test_batch_equals_single_and_cache_follows_new_versions(reg, small_data):
    texts = [Q, "Which enzyme unwinds DNA?", "What is the capital of France?"]
    batch = reg.route_batch(texts)
    for t, b in zip(texts, batch):
        s = reg.route(t, RouteOptions(log=False))
        assert s.model == b.model
        assert np.allclose([c.prob for c in s.candidates], [c.prob for c in b.candidates], atol=1e-5)
    assert len(reg.routing_log()) == 3
    # a newly registered model shows up at once (the cached z matrix is invalidated by the new version)
    con = duckdb.connect()
    evals = small_data / "yi.csv"
    # (a model of its own: Yi-6B's answers with every fourth flipped; an exact copy is recorded as Yi-6B's alias)
    con.execute(f"""COPY (SELECT 'Yi-clone' AS model, question_id,
                           CASE WHEN row_number() OVER (ORDER BY question_id) % 4 = 0 THEN NOT correct::BOOLEAN
                                ELSE correct::BOOLEAN END::INT AS correct
                    FROM read_csv('{small_data}/evaluations.csv.gz') WHERE model = 'Yi-6B') TO '{evals}' (HEADER)""")
    con.close()
    reg.register("Yi-clone", str(evals), params_b=6)
    assert "Yi-clone" in {c.model for c in reg.route(Q, RouteOptions(log=False)).candidates}


@pytest.mark.slow
def test_stored_vectors_match_fresh_encoding(reg):
    """A registered query reuses its stored vector; encoding it afresh gives the same decision."""
    with reg.store.tx() as tx:
        texts = [r[0] for r in tx.sql("SELECT text FROM queries ORDER BY id LIMIT 8")]
    a = reg.route_batch(texts, RouteOptions(log=False))
    b = reg.route_batch(texts, RouteOptions(log=False), reuse_vectors=False)
    for x, y in zip(a, b):
        assert np.allclose([c.prob for c in x.candidates], [c.prob for c in y.candidates], atol=1e-3)


@pytest.mark.slow
def test_bad_queries(reg):
    with pytest.raises(InputError, match="empty query"):
        reg.route("   ")
    with pytest.raises(InputError, match="query 2: empty query"):
        reg.route_batch(["fine", ""])
    huge = "Explain photosynthesis. " + "x" * (1 << 20)            # 1 MB: routed on the part MiniLM reads
    d = reg.route(huge, RouteOptions(log=False))
    assert d.model and "routed on its first" in d.note
    assert [c.prob for c in d.candidates] == [c.prob for c in
                                              reg.route(huge[:40_000], RouteOptions(log=False)).candidates]


@pytest.mark.slow
def test_cli_route_file_log_and_errors(db_copy, tmp_path):
    r = run(db_copy, "route", Q)
    assert r.exit_code == 0, r.output
    assert "P(correct)" in r.output and len([ln for ln in r.output.splitlines() if "0." in ln]) >= 5
    r = run(db_copy, "route", Q, "--json", "--no-log-text", "--cost-weight", "0.01", "--cost-by", "params")
    d = json.loads(r.stdout)
    assert {"model", "fallback", "candidates", "encoder", "versions"} <= set(d) and len(d["candidates"]) == 31
    queries = tmp_path / "q.jsonl"
    queries.write_text('{"id": "a", "text": "What is 2+2?"}\n\n{"question": "Capital of Peru?", '
                       '"options": ["Lima", "Quito"]}\n"a bare string query"\n')
    out = tmp_path / "routes.jsonl"
    r = run(db_copy, "route", "--file", str(queries), "--out", str(out), "--unavailable", "gpt-4o-2024-05-13")
    assert r.exit_code == 0, r.output
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [x["id"] for x in rows] == ["a", "2", "3"]
    assert all(x["model"] != "gpt-4o-2024-05-13" for x in rows)
    csv_in = tmp_path / "q.csv"
    csv_in.write_text("id,text\nx1,What is entropy?\nx2,Who wrote Hamlet?\n")
    r = run(db_copy, "route", "--file", str(csv_in), "--out", str(tmp_path / "r.csv"))
    assert r.exit_code == 0 and (tmp_path / "r.csv").read_text().count("\n") == 3
    r = run(db_copy, "log", "--json")
    log = json.loads(r.stdout)
    assert len(log) == 7 and log[5]["text"] is None and log[6]["text"] == Q   # newest first
    assert run(db_copy, "mark-unavailable", "Yi-6B").exit_code == 0
    assert "Yi-6B" in run(db_copy, "mark-unavailable", "Yi-34B").output
    # bad input: one clear line each, exit 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json}\n')
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    for args, message in [(["route", ""], "empty query"),
                          (["route", "--file", str(bad)], "bad.jsonl: line 2: not JSON"),
                          (["route", "--file", str(latin)], "latin.jsonl: line 2: not UTF-8"),
                          (["route", Q, "--unavailable", "nope"], "unknown model 'nope'"),
                          (["route", "--file", str(tmp_path / "missing.jsonl")], "no such file"),
                          (["log", "--since", "soon"], "not a timestamp")]:
        r = run(db_copy, *args)
        assert r.exit_code == 1 and message in r.output and len(r.output.strip().splitlines()) == 1, (args, r.output)
    everyone = ",".join(m["name"] for m in json.loads(run(db_copy, "models", "--json").output))
    r = run(db_copy, "route", Q, "--unavailable", everyone)
    assert r.exit_code == 1 and "no model available" in r.output


@pytest.mark.slow
def test_frontier(db_copy, tmp_path):
    png = tmp_path / "f.png"
    r = run(db_copy, "route", "--frontier", "--split", "test", "--out", str(png))
    assert r.exit_code == 0, r.output
    assert png.stat().st_size > 10_000 and "single model" in r.output
    with Registry(db_copy) as reg:
        f = reg.frontier(split="test")
    assert f.queries > 0 and all(not np.isnan(p) for p in [x.accuracy for x in f.router])
    assert len(f.single) == len(f.models) and f.router[0].cost_weight == 0.0
    # L = 0 is plain routing; the heaviest weight sends every query to a cheapest model
    assert f.router[-1].mean_cost == min(p.mean_cost for p in f.single)
    with pytest.raises(InputError, match="no queries in split"):
        Registry(db_copy).frontier(split="nope")


def test_top_lists_the_most_likely_and_the_choice_with_their_versions(reg, known):
    """`top` bounds what an answer lists: the most likely candidates in order, plus the chosen model wherever it
    ranks (here pushed down by a cost weight), and only their versions; 0 lists every model; a bad value is one line."""
    full = reg.route(known, RouteOptions(log=False))
    three = reg.route(known, RouteOptions(log=False, top=3))
    assert [c.model for c in three.candidates] == [c.model for c in full.candidates[:3]]
    assert set(three.versions) == {c.model for c in three.candidates}
    assert three.model == full.model and len(reg.route(known, RouteOptions(log=False, top=0)).candidates) == 31
    cheap = reg.route(known, RouteOptions(log=False, top=1, cost_by="params", cost_weight=1.0))
    ranked = [c.model for c in reg.route(known, RouteOptions(log=False, cost_by="params", cost_weight=1.0)).candidates]
    assert cheap.model != ranked[0]                            # the cost weight chose a lower-ranked model
    assert [c.model for c in cheap.candidates] == [ranked[0], cheap.model]
    with pytest.raises(InputError, match="top must be"):
        reg.route(known, RouteOptions(log=False, top=-1))
