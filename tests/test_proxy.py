"""The OpenAI-compatible routing proxy (issue 13, item 4) against a small fake upstream that the test starts on
loopback (a real uvicorn server on a free port) and that fails on demand: routing, fallback along the chain, named
models, streaming pass-through, keys from the environment, endpoints through the CLI."""
from __future__ import annotations

import json

import jsonschema_rs
import pytest
from click.testing import CliRunner
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.testclient import TestClient

from registry import Registry, RouteOptions
from registry.cli import cli
from registry.core.keys import UpstreamKeys
from registry.serve.app import create_app

from .http_tools import serving


@pytest.fixture(scope="module")
def upstream():
    """A fake OpenAI upstream: answers "from <model>", fails with 500 for the models in `failing`, records the
    requests it got (model, Authorization header)."""
    app = FastAPI()
    state = {"failing": set(), "seen": [], "ignore_stream": False}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        state["seen"].append((body["model"], request.headers.get("authorization")))
        if body["model"] in state["failing"]:
            return JSONResponse({"error": "down"}, status_code=500)
        if body.get("stream") and not state["ignore_stream"]:
            def events():
                for word in ("from", body["model"]):
                    yield f"data: {json.dumps({'choices': [{'delta': {'content': word}}]})}\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")
        return {"id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": f"from {body['model']}"}}]}

    with serving(app) as origin:
        yield f"{origin}/v1", state


def known_text(reg) -> str:
    with reg.store.tx() as tx:
        return tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]


def test_proxy_routes_falls_back_and_streams(db_copy, upstream, monkeypatch):
    base, state = upstream
    with Registry(db_copy) as reg:
        text = known_text(reg)
        choice = reg.route(text, RouteOptions(log=False)).model
        chain = [link.model for link in reg.fallback(choice, k=3).chain]
        for m in [choice] + chain[:2]:
            reg.set_endpoint(m, base, upstream_model=f"up-{m}", api_key_env="FAKE_UPSTREAM_KEY")
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", "sk-test")
    keys = UpstreamKeys.parse([f"FAKE_UPSTREAM_KEY={base}"])        # the owner lets the key reach this upstream
    with TestClient(create_app(str(db_copy), keys=keys)) as c:
        ids = [m["id"] for m in c.get("/v1/models").json()["data"]]
        assert ids[0] == "auto" and set(ids[1:]) == {choice, *chain[:2]}
        msg = {"model": "auto", "messages": [{"role": "system", "content": "be brief"},
                                             {"role": "user", "content": text}]}
        r = c.post("/v1/chat/completions", json=msg)
        assert r.status_code == 200 and r.headers["x-registry-model"] == choice
        assert r.headers["x-registry-fallback"] == "false" and r.json()["model"] == f"up-{choice}"
        assert state["seen"][-1] == (f"up-{choice}", "Bearer sk-test")     # the key from the environment
        state["failing"].add(f"up-{choice}")                              # the chosen model's upstream fails
        r = c.post("/v1/chat/completions", json=msg)
        assert r.status_code == 200 and r.headers["x-registry-model"] == chain[0]
        assert r.headers["x-registry-fallback"] == "true"
        state["failing"].update({f"up-{m}" for m in chain[:2]})           # every upstream fails: a clear 502
        r = c.post("/v1/chat/completions", json=msg)
        assert r.status_code == 502 and "every model in the chain failed" in r.json()["error"]["message"]
        state["failing"].clear()
        r = c.post("/v1/chat/completions", json={**msg, "model": chain[1]})  # named: forwarded as is
        assert r.headers["x-registry-model"] == chain[1] and r.json()["model"] == f"up-{chain[1]}"
        with c.stream("POST", "/v1/chat/completions", json={**msg, "stream": True}) as s:
            body = "".join(s.iter_text())
        assert s.headers["x-registry-model"] == choice and body.count("data: ") == 3 and "[DONE]" in body
        assert c.post("/v1/chat/completions", json={**msg, "model": "no-endpoint"}).status_code == 404
        bad = c.post("/v1/chat/completions", json={"model": "auto", "messages": []})
        assert bad.status_code == 422 and "messages" in bad.json()["error"]["message"]
        log = c.get("/log", params={"limit": 1}).json()[0]
        assert log["text"] is None                                        # the prompt's hash only


def test_a_stream_asked_of_an_upstream_that_ignores_stream_still_streams(db_copy, upstream):
    base, state = upstream
    with Registry(db_copy) as reg:
        text = known_text(reg)
        choice = reg.route(text, RouteOptions(log=False)).model
        reg.set_endpoint(choice, base, upstream_model=f"up-{choice}")
    state["ignore_stream"], state["failing"] = True, set()
    try:
        with TestClient(create_app(str(db_copy))) as c:
            msg = {"model": "auto", "stream": True, "messages": [{"role": "user", "content": text}]}
            with c.stream("POST", "/v1/chat/completions", json=msg) as s:
                body = "".join(s.iter_text())
                kind = s.headers["content-type"]
            documented = c.get("/openapi.json").json()["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]
    finally:
        state["ignore_stream"] = False
    events = [ln.removeprefix("data: ") for ln in body.split("\n\n") if ln]
    assert kind.startswith("text/event-stream") and events[-1] == "[DONE]" and len(events) == 2, body
    # each event as the contract describes one (an object of SSE fields, as schemathesis reads a stream)
    event_schema = jsonschema_rs.validator_for(documented["content"]["text/event-stream"]["schema"])
    assert all(event_schema.is_valid({"data": e}) for e in events) and not event_schema.is_valid(events[0])
    chunk = json.loads(events[0])
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["choices"][0]["delta"]["content"] == f"from up-{choice}"


def test_endpoints_cli(db_copy):
    run = lambda *a: CliRunner().invoke(cli, ["--db", str(db_copy), *a])  # noqa: E731
    r = run("endpoints", "set", "Yi-6B", "--base-url", "http://127.0.0.1:9/v1/", "--api-key-env", "YI_KEY")
    assert r.exit_code == 0 and "Yi-6B -> http://127.0.0.1:9/v1 as Yi-6B" in r.output
    assert json.loads(run("endpoints", "--json").output) == [
        {"model": "Yi-6B", "base_url": "http://127.0.0.1:9/v1", "upstream_model": "Yi-6B", "api_key_env": "YI_KEY"}]
    bad = run("endpoints", "set", "Yi-6B", "--base-url", "ftp://x")
    assert bad.exit_code == 1 and "must start with http" in bad.output
    key = run("endpoints", "set", "Yi-6B", "--base-url", "http://x/v1", "--api-key-env", "sk-live-123")
    assert key.exit_code == 1 and "NAME of an environment variable" in key.output
    assert run("endpoints", "remove", "Yi-6B").exit_code == 0
    assert json.loads(run("endpoints", "--json").output) == []
    assert "no endpoint" in run("endpoints", "remove", "Yi-6B").output
    with Registry(db_copy) as reg, reg.store.tx() as tx:   # the key's value is never stored
        assert not tx.sql("SELECT 1 FROM model_endpoints WHERE api_key_env LIKE 'sk-%'")


def test_auto_says_why_no_model_with_an_endpoint_can_be_chosen(db_copy, tmp_path):
    """Endpoints only on models on probation: `auto` names them and why, not "all candidates are unavailable"."""
    with Registry(db_copy) as reg:
        text = known_text(reg)
        with reg.store.tx() as tx:
            rows = tx.sql("""SELECT q.external_id, e.correct::INT FROM evaluations e JOIN queries q ON q.id = e.query_id
                             JOIN query_splits s ON s.query_id = q.id WHERE s.split = 'train' AND e.model_id =
                             (SELECT min(id) FROM models) ORDER BY q.id LIMIT 40""")
        names = ["newbie-a", "newbie-b"]
        for j, m in enumerate(names):   # (answers of their own: a copy would be recorded as the model's alias)
            path = tmp_path / f"{m}.csv"
            path.write_text("question_id,correct\n" + "".join(f"{q},{c if i % (3 + j) else 1 - c}\n"
                                                                for i, (q, c) in enumerate(rows)))
            assert reg.register(m, str(path)).warning                 # 40 answers: on probation
            reg.set_endpoint(m, "http://127.0.0.1:9/v1")
    with TestClient(create_app(str(db_copy))) as c:
        r = c.post("/v1/chat/completions", json={"model": "auto", "messages": [{"role": "user", "content": text}]})
    message = r.json()["error"]["message"]
    assert r.status_code == 409 and "on probation" in message and all(m in message for m in names), message
    assert "unavailable" not in message


def test_a_keyed_endpoint_whose_variable_is_unset_is_never_called_keyless(db_copy, upstream, monkeypatch):
    base, state = upstream
    with Registry(db_copy) as reg:
        model = reg.models()[0].name
        reg.set_endpoint(model, base, upstream_model="keyless-check", api_key_env="PROXY_TEST_UNSET_KEY")
    monkeypatch.delenv("PROXY_TEST_UNSET_KEY", raising=False)
    keys = UpstreamKeys.parse([f"PROXY_TEST_UNSET_KEY={base}"])
    seen = len(state["seen"])
    with TestClient(create_app(str(db_copy), keys=keys)) as c:
        r = c.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 502 and "PROXY_TEST_UNSET_KEY" in r.json()["error"]["message"], r.text
    assert len(state["seen"]) == seen                       # the upstream was never called without its key
