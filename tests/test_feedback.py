"""The router learning from its own traffic: the proxy's request ids, outcomes in over HTTP and from a file (all or
nothing, refusals in one line), production queries and their evaluations, sources on and off, re-embedding with a
new version, traffic's corrections in the routes, and the drift test and its events. Real DuckDB copies, the real
proxy through FastAPI's TestClient, a fake upstream on loopback answering right or wrong on demand."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from registry import Registry
from registry.serve.app import create_app
from registry.traffic import drift, requests

from .helpers import run, run_json
from .http_tools import serving


@pytest.fixture(scope="module")
def upstream():
    """A fake OpenAI upstream: every model answers "(A)", or "(B)" for the models in `wrong`."""
    app = FastAPI()
    state = {"wrong": set()}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        letter = "B" if body["model"] in state["wrong"] else "A"
        return {"id": "upstream-id", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": f"({letter})"}}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 2}}

    with serving(app) as origin:
        yield f"{origin}/v1", state


def texts_of(db, n: int, category: str | None = None) -> list[str]:
    with Registry(db) as reg, reg.store.tx() as tx:
        # (`? IS NULL` is not asked: PostgreSQL cannot type a parameter only tested for NULL)
        return [t for (t,) in tx.sql(f"""SELECT q.text FROM queries q JOIN query_splits s ON s.query_id = q.id
                                         WHERE s.split = 'test' {'' if category is None else 'AND q.category = ?'}
                                         ORDER BY q.id LIMIT ?""", ([] if category is None else [category]) + [n])]


def with_endpoints(db, base: str) -> None:
    with Registry(db) as reg:
        for m in reg.models():
            reg.set_endpoint(m.name, base)


def ask(c, text: str):
    r = c.post("/v1/chat/completions", json={"model": "auto", "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r


def rows(db, sql: str) -> list:
    with Registry(db) as reg, reg.store.tx() as tx:
        return tx.sql(sql)


@pytest.mark.slow   # (an app with a fake upstream, onboarding: seconds)
def test_ids_outcomes_and_refusals(db_copy, upstream):
    base, _ = upstream
    with_endpoints(db_copy, base)
    texts = texts_of(db_copy, 3)
    with TestClient(create_app(str(db_copy), traffic={"window_s": 3600})) as c:
        answers = [ask(c, t) for t in texts]
        ids = [r.headers["x-registry-request-id"] for r in answers]
        assert all(r.json()["id"] == i for r, i in zip(answers, ids)) and len(set(ids)) == 3
        r = c.post("/v1/feedback", json={"outcomes": [{"request_id": ids[0], "outcome": 1, "source": "grader"},
                                                      {"request_id": ids[1], "outcome": 0.3, "source": "thumbs"}]})
        assert r.status_code == 200, r.text
        assert r.json()["stored"] == 2 and r.json()["correct"] == 1 and r.json()["queries_added"] == 2
        # refused, each in one line, and the whole landing with it: a used id, an id never issued, one twice
        refusals = [
            ({"request_id": ids[0], "outcome": 1}, 409, "already has an outcome"),
            ({"outcomes": [{"request_id": ids[2], "outcome": 1},
                           {"request_id": "req-000000000000000000000000", "outcome": 1}]}, 404,
             "outcome 2: request req-000000000000000000000000 was not answered"),
            ({"outcomes": [{"request_id": ids[2], "outcome": 1}, {"request_id": ids[2], "outcome": 0}]}, 409,
             "outcome 2: request"),
            ({"request_id": ids[2], "outcome": 2}, 400, "outcome must be 0 or 1, or a score from 0 to 1"),
            ({"request_id": "nope", "outcome": 1}, 400, "request_id must be an id the proxy returned"),
        ]
        for body, status, says in refusals:
            r = c.post("/v1/feedback", json=body)
            msg = r.json()["error"]["message"]
            assert r.status_code == status and says in msg and "\n" not in msg, (body, r.status_code, msg)
        sources = {s["name"]: s for s in c.get("/feedback/sources").json()}
        assert sources["grader"]["outcomes"] == 1 and sources["thumbs"]["outcomes"] == 1
    stored = rows(db_copy, "SELECT request_id, outcome, correct, source FROM feedback ORDER BY source")
    assert [(r[0], r[1], r[2], r[3]) for r in stored] == [(ids[0], 1.0, True, "grader"), (ids[1], 0.3, False, "thumbs")]
    assert rows(db_copy, "SELECT count(*) FROM query_splits WHERE split = 'production'")[0][0] == 2
    # the outcomes are evaluations of the model that answered, on the production queries; the text is not kept
    assert rows(db_copy, """SELECT count(*) FROM evaluations e JOIN queries q ON q.id = e.query_id
                            WHERE q.external_id LIKE 'production:%'""")[0][0] == 2
    kept = rows(db_copy, "SELECT text, vector IS NOT NULL, predicted, prompt_tokens FROM proxy_requests")
    assert len(kept) == 3 and all(t is None and v and p is not None and n == 12 for t, v, p, n in kept)


@pytest.mark.slow   # (an app with a fake upstream, onboarding: seconds)
def test_window_and_kept_texts(db_copy, upstream):
    base, _ = upstream
    with_endpoints(db_copy, base)
    text = texts_of(db_copy, 1)[0]
    with TestClient(create_app(str(db_copy), traffic={"window_s": 1e-6, "keep_texts": True})) as c:
        rid = ask(c, text).headers["x-registry-request-id"]
        r = c.post("/v1/feedback", json={"request_id": rid, "outcome": 1})
        assert r.status_code == 409 and "past its feedback window" in r.json()["error"]["message"]
    assert rows(db_copy, "SELECT text FROM proxy_requests")[0][0] == text
    assert rows(db_copy, "SELECT count(*) FROM feedback")[0][0] == 0


@pytest.mark.slow   # (an app with a fake upstream, onboarding: seconds)
def test_cli_file_reembeds_and_sources_switch(db_copy, upstream, tmp_path):
    base, _ = upstream
    with_endpoints(db_copy, base)
    texts = texts_of(db_copy, 4)
    with TestClient(create_app(str(db_copy))) as c:
        answered = [(r.headers["x-registry-request-id"], r.headers["x-registry-model"]) for r in
                    (ask(c, t) for t in texts)]
    model = answered[0][1]
    path = tmp_path / "outcomes.jsonl"
    path.write_text("".join(json.dumps({"request_id": i, "outcome": 0, "source": "tests"}) + "\n"
                            for i, _ in answered))
    versions = lambda: rows(db_copy, f"""SELECT count(*) FROM embedding_versions v JOIN models m ON m.id = v.model_id
                                         WHERE m.name = '{model}'""")[0][0]      # noqa: E731
    v0 = versions()
    got = run_json(db_copy, "feedback", "--file", path)
    assert got["outcomes"] == 4 and model in got["reembedded"] and versions() == v0 + 1
    again = run(db_copy, "feedback", "--file", path)
    assert again.exit_code == 1 and "outcomes.jsonl, line 1: request" in again.output
    assert "already has an outcome" in again.output and len(again.output.strip().splitlines()) == 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"request_id": "nope", "outcome": 1}\nnot json\n')
    said = run(db_copy, "feedback", "--file", bad)
    assert said.exit_code == 1 and "bad.jsonl, line 1: request_id must be an id" in said.output
    # a source switched off: its evaluations leave the embedding (a new version without them)
    assert run(db_copy, "feedback-source", "tests", "--off").exit_code == 0
    assert versions() == v0 + 2
    with Registry(db_copy) as reg:
        assert [s.enabled for s in reg.feedback_sources() if s.name == "tests"] == [False]
    assert run_json(db_copy, "drift") == [] and run_json(db_copy, "feedback-source", "tests")[0]["outcomes"] == 4
    # history says where each version's evidence came from: the version after the file read its outcomes, the one
    # after the source went off does not; the text, --json and the server give the same figure
    mine = sum(1 for _, m in answered if m == model)
    hist = run_json(db_copy, "history", model)["versions"]
    assert hist[-2]["evidence"]["feedback:tests"] == mine and set(hist[-1]["evidence"]) == {"imported"}
    assert all(sum(v["evidence"].values()) == v["n_evaluations"] for v in hist)
    assert hist[-2]["evidence"]["imported"] == hist[-1]["evidence"]["imported"] == hist[0]["n_evaluations"]
    assert f"imported {hist[-2]['evidence']['imported']:,}, tests {mine}" in run(db_copy, "history", model).output
    with TestClient(create_app(str(db_copy))) as c:
        served = c.get(f"/models/{model}/history").json()["versions"]
    assert [v["evidence"] for v in served] == [v["evidence"] for v in hist]


def test_drift_test_fires_on_a_drop_and_rarely_without():
    rng = np.random.default_rng(1)
    p = np.full(400, 0.8)
    steady = (rng.random(400) < 0.8).astype(float)
    assert drift.cusum(p, steady, np.ones(400)) is None
    dropped = steady.copy()
    dropped[200:] = (rng.random(200) < 0.3).astype(float)
    fired, start, _ = drift.cusum(p, dropped, np.ones(400))
    assert 200 <= fired < 260 and 180 <= start <= 215
    assert drift.false_alarm_rate(p, runs=50) < 1.0       # per 10,000 outcomes, predictions right


@pytest.mark.slow   # (an app with a fake upstream, onboarding: seconds)
def test_a_dropped_model_is_caught_and_routed_around(db_copy, upstream):
    """One model turns wrong on a category: the outcomes raise an event naming it and that category, and routing
    moves that category's requests to other models."""
    base, state = upstream
    with_endpoints(db_copy, base)
    with Registry(db_copy) as reg, reg.store.tx() as tx:
        category = tx.sql("""SELECT q.category FROM queries q JOIN query_splits s ON s.query_id = q.id
                             WHERE s.split = 'test' GROUP BY 1 ORDER BY count(*) DESC LIMIT 1""")[0][0]
    found = texts_of(db_copy, 40, category)
    texts = (found * 24)[:24]           # (the small registry holds a few per category: asked again, as traffic is)
    with TestClient(create_app(str(db_copy))) as c:
        first = ask(c, texts[0]).headers["x-registry-model"]
        state["wrong"].add(first)
        try:
            events, chosen = [], []
            for _ in range(3):
                answered = [ask(c, t) for t in texts]
                chosen.append([r.headers["x-registry-model"] for r in answered])
                r = c.post("/v1/feedback", json={"outcomes": [
                    {"request_id": a.headers["x-registry-request-id"], "outcome": int(
                        a.json()["choices"][0]["message"]["content"] == "(A)"), "source": "grader"}
                    for a in answered]})
                assert r.status_code == 200, r.text
                events += r.json()["events"]
        finally:
            state["wrong"].clear()
        shown = c.get("/drift").json()
    assert (first, category) in {(e["model"], e["category"]) for e in events}
    assert [(e["model"], e["category"]) for e in shown] == [(e["model"], e["category"]) for e in events]
    assert chosen[0].count(first) > len(texts) / 2 and chosen[-1].count(first) < chosen[0].count(first) / 2


@pytest.mark.slow
def test_the_shell_routes_with_the_corrections_the_server_routes_with(db_copy, upstream):
    """After outcomes and a drift event, `registry route` from the shell reads traffic's corrections as saved with
    the landing, and answers each text as the server does; without them it would answer otherwise."""
    base, state = upstream
    with_endpoints(db_copy, base)
    with Registry(db_copy) as reg, reg.store.tx() as tx:
        category = tx.sql("""SELECT q.category FROM queries q JOIN query_splits s ON s.query_id = q.id
                             WHERE s.split = 'test' GROUP BY 1 ORDER BY count(*) DESC LIMIT 1""")[0][0]
    texts = (texts_of(db_copy, 40, category) * 24)[:24]
    with TestClient(create_app(str(db_copy))) as c:
        first = ask(c, texts[0]).headers["x-registry-model"]
        state["wrong"].add(first)
        try:
            events = []
            for _ in range(3):
                answered = [ask(c, t) for t in texts]
                r = c.post("/v1/feedback", json={"outcomes": [
                    {"request_id": a.headers["x-registry-request-id"], "outcome": int(
                        a.json()["choices"][0]["message"]["content"] == "(A)")} for a in answered]})
                events += r.json()["events"]
        finally:
            state["wrong"].clear()
        served = {t: c.post("/route", json={"text": t}).json()["model"] for t in set(texts)}
    assert (first, category) in {(e["model"], e["category"]) for e in events}
    shell = {t: run_json(db_copy, "route", t)["model"] for t in served}
    assert shell == served and first not in shell.values()
    # the same registry without the saved corrections: the shell routes some of those texts back to the model
    rows(db_copy, "DELETE FROM routing_states WHERE key LIKE 'traffic-corrections/%'")
    assert first in {run_json(db_copy, "route", t)["model"] for t in served}


@pytest.mark.slow
def test_feedback_on_postgres(pg_server, pg_base, upstream, tmp_path):
    """The loop on PostgreSQL: ids from the proxy, outcomes in over HTTP and from a file, read back as rows,
    evaluations, sources, drift events and history's evidence; a used id refused in one line, nothing stored."""
    url = pg_server.create_db("feedback", template=pg_base)
    try:
        base, _ = upstream
        with_endpoints(url, base)
        texts = texts_of(url, 4)
        with TestClient(create_app(url, traffic={"window_s": 3600})) as c:
            answered = [ask(c, t) for t in texts]
            ids = [r.headers["x-registry-request-id"] for r in answered]
            r = c.post("/v1/feedback", json={"outcomes": [{"request_id": ids[0], "outcome": 1, "source": "grader"},
                                                          {"request_id": ids[1], "outcome": 0.25, "source": "thumbs"}]})
            assert r.status_code == 200 and r.json()["stored"] == 2 and r.json()["correct"] == 1, r.text
            r = c.post("/v1/feedback", json={"outcomes": [{"request_id": ids[2], "outcome": 1},
                                                          {"request_id": ids[0], "outcome": 0}]})
            assert r.status_code == 409 and "outcome 2: request" in r.json()["error"]["message"]
            assert {s["name"]: s["outcomes"] for s in c.get("/feedback/sources").json()} == {"grader": 1, "thumbs": 1}
            assert c.get("/drift").json() == [] and c.get("/drift", params={"model": "gemma-7b"}).json() == []
        path = tmp_path / "outcomes.jsonl"
        path.write_text("".join(json.dumps({"request_id": i, "outcome": o, "source": "file"}) + "\n"
                                for i, o in ((ids[2], 1), (ids[3], False))))
        got = run_json(url, "feedback", "--file", path)
        assert got["outcomes"] == 2 and got["reembedded"]
        stored = [tuple(r) for r in rows(url, "SELECT request_id, outcome, correct, source FROM feedback")]
        assert sorted(stored) == sorted([(ids[0], 1.0, True, "grader"), (ids[1], 0.25, False, "thumbs"),
                                         (ids[2], 1.0, True, "file"), (ids[3], 0.0, False, "file")])
        assert rows(url, """SELECT count(*) FROM evaluations e JOIN query_splits s ON s.query_id = e.query_id
                            WHERE s.split = 'production'""")[0][0] == 4
        model = answered[3].headers["x-registry-model"]
        mine = sum(1 for a in answered[2:] if a.headers["x-registry-model"] == model)
        assert run_json(url, "history", model)["versions"][-1]["evidence"]["feedback:file"] == mine
        assert run_json(url, "drift") == [] and run_json(url, "drift", "--model", model) == []
        # twelve wrong outcomes where routing predicted 0.9 (records as the proxy's writer appends them): an event
        with Registry(url) as reg, reg.store.tx() as tx:
            vecs = np.random.default_rng(0).standard_normal((12, 384)).astype(np.float32)
            recs = [requests.Record(requests.new_id(), model, model, "math", hashlib.sha256(b"%d" % i).hexdigest(),
                                    None, requests.vector_bytes(v / np.linalg.norm(v)), 0.9)
                    for i, v in enumerate(vecs)]
            requests.append(tx, recs)
        path.write_text("".join(json.dumps({"request_id": r.id, "outcome": 0}) + "\n" for r in recs))
        assert [(e["model"], e["category"]) for e in run_json(url, "feedback", "--file", path)["events"]] == \
            [(model, "math")]
        shown = run_json(url, "drift", "--model", model)
        assert len(shown) == 1 and shown[0]["evidence"]["outcomes"] >= 10 and shown[0]["drop"] > 0.5
    finally:
        pg_server.admin('DROP DATABASE "feedback"')
