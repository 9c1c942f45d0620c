"""Serving safely by default: HTTP errors name what the client sent, /docs works offline, an open network bind
and unbounded bodies are refused, an impossible port is one line."""
from __future__ import annotations

from registry import Registry
from tests.helpers import run

Q = "What is the derivative of x^2 with respect to x?"


def known_text(db) -> str:
    """A query text the registry already holds: routed from its stored vector, without MiniLM."""
    with Registry(db) as reg, reg.store.tx() as tx:
        return tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]


def test_http_errors_and_offline_docs(db_copy):
    from fastapi.testclient import TestClient

    from registry.serve.app import create_app

    with TestClient(create_app(str(db_copy), token="s3cret")) as c:
        auth = {"Authorization": "Bearer s3cret"}
        r = c.post("/models", json={"name": "m", "evaluations": [{"question_id": "nope", "correct": 1}]},
                   headers=auth)
        assert r.status_code == 404 and r.json()["detail"].startswith("evaluations[0]: unknown query id")
        assert "/tmp" not in r.text and ".jsonl" not in r.text
        missing = c.post("/availability/unavailable", json={"models": ["Yi-6B"]})
        wrong = c.post("/availability/unavailable", json={"models": ["Yi-6B"]},
                       headers={"Authorization": "Bearer nope"})
        assert missing.status_code == wrong.status_code == 401
        assert missing.json()["detail"] != wrong.json()["detail"] and "wrong token" in wrong.json()["detail"]
        docs = c.get("/docs")
        assert docs.status_code == 200 and "/static/swagger/swagger-ui-bundle.js" in docs.text
        assert "http://" not in docs.text and "https://" not in docs.text
        assert c.get("/static/swagger/swagger-ui-bundle.js").status_code == 200
        assert c.get("/static/swagger/swagger-ui.css").status_code == 200


def test_serve_refuses_an_open_network_bind_and_bounds_bodies(db_copy):
    from fastapi.testclient import TestClient

    from registry.serve import app

    out = run(db_copy, "serve", "--host", "0.0.0.0", env={"REGISTRY_TOKEN": ""})
    assert out.exit_code == 2 and "refusing to serve 0.0.0.0 without a token" in out.output
    assert len(out.output.strip().splitlines()) == 1
    assert app.is_loopback("127.0.0.1") and app.is_loopback("::1") and app.is_loopback("localhost")
    assert not app.is_loopback("0.0.0.0") and not app.is_loopback("10.1.2.3")
    with TestClient(app.create_app(str(db_copy), token="t")) as c:
        big = c.post("/models/x/evaluations", content=b"q" * (app.MAX_BODY + 1),
                     headers={"Authorization": "Bearer t", "Content-Type": "text/csv"})
        assert big.status_code == 413 and "request body over" in big.json()["detail"]
        bad = c.post("/route", content=b"{not json", headers={"Content-Type": "application/json"})
        assert bad.status_code == 400 and bad.json()["detail"].startswith("bad JSON")
        typed = c.post("/route", json={"text": ["a list"]})
        assert typed.status_code == 422 and "text" in typed.json()["detail"]


def test_serve_refuses_a_port_that_cannot_exist(db_copy):
    out = run(db_copy, "serve", "--port", "99999")
    assert out.exit_code == 2 and "99999 is not in the range 1<=x<=65535" in out.output, out.output
