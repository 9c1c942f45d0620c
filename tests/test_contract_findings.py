"""What schemathesis found at 100 examples per operation (bench/probe_contract.py), each now kept: in the routing
proxy, route options in the body and in the query string together (the body's trade-off wins, as its options always
did), a content part whose text is no string (was a 500), and `auto` without a user text, which the schema now
refuses as the server does; a fingerprint's rows that contradict each other are a 409, as a registration's are (was
a 400 for a schema-valid body). The real app (TestClient), a fake upstream on loopback."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from registry import Registry
from registry.serve.app import create_app

from .http_tools import FakeUpstream

TOKEN = "pr0xy"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def proxied(db_copy):
    """Every model with an endpoint on a fake upstream; a text the registry holds (routing it runs no MiniLM).
    -> (client, upstream, text)"""
    upstream = FakeUpstream()
    with Registry(db_copy) as reg:
        for m in reg.models():
            reg.set_endpoint(m.name, upstream.base, upstream_model=f"up-{m.name}")
        with reg.store.tx() as tx:
            text = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]
    try:
        with TestClient(create_app(str(db_copy), token=TOKEN), raise_server_exceptions=False) as c:
            yield c, upstream, text
    finally:
        upstream.close()


def chat(content, **extra) -> dict:
    return {"model": "auto", "messages": [{"role": "user", "content": content}], **extra}


def test_the_body_s_trade_off_wins_over_the_query_s(proxied):
    c, upstream, text = proxied
    r = c.post("/v1/chat/completions", params={"cost_weight": 0}, json=chat(text, min_prob=0.0, cost_by="params"),
               headers=AUTH)
    assert r.status_code == 200 and r.headers["x-registry-model"], r.text
    r = c.post("/v1/chat/completions", params={"cost_weight": 0, "min_prob": 0.5}, json=chat(text), headers=AUTH)
    assert r.status_code == 400 and "not both" in r.json()["error"]["message"]    # both in one place: refused


def test_auto_without_a_user_text_is_a_400_and_the_schema_says_so(proxied):
    c, upstream, _ = proxied
    for content in ([{"type": "text", "text": 5}], [{"type": "image_url"}], "   ", None):
        r = c.post("/v1/chat/completions", json=chat(content), headers=AUTH)
        assert r.status_code == 400 and "no user message with text" in r.json()["error"]["message"], r.text
    assert upstream.seen == []
    schema = c.get("/openapi.json").json()
    body = schema["components"]["schemas"]["ChatRequest"]
    assert body["if"]["properties"]["model"] == {"const": "auto"}
    (options,) = [p for p in schema["paths"]["/v1/chat/completions"]["post"]["parameters"] if p["in"] == "query"]
    assert options["style"] == "form" and options["explode"] is True
    assert options["schema"]["not"] == {"required": ["cost_weight", "min_prob"]}


def test_contradicting_rows_to_fingerprint_are_a_409_as_for_a_registration(db_copy):
    with Registry(db_copy) as reg:
        with reg.store.tx() as tx:
            qid = tx.sql("SELECT external_id FROM queries ORDER BY id LIMIT 1")[0][0]
    rows = [{"question_id": qid, "correct": 1}, {"question_id": qid, "correct": 0}]
    with TestClient(create_app(str(db_copy), token=TOKEN)) as c:
        r = c.post("/fingerprint", json={"evaluations": rows})
        assert r.status_code == 409 and "appears twice with different results" in r.json()["detail"], r.text
        r = c.post("/models", json={"name": "twice", "evaluations": rows}, headers=AUTH)
        assert r.status_code == 409, r.text
