"""With a token, the server spends its endpoints' API keys only for callers holding it, shows its log (routed texts)
only to them, and keeps no anonymous caller's text; a blank token is refused."""
from __future__ import annotations

import pytest

AUTH = {"Authorization": "Bearer s3cret"}


@pytest.fixture
def client(db_copy, monkeypatch):
    from fastapi.testclient import TestClient

    from registry import Registry
    from registry.serve.app import create_app

    monkeypatch.setenv("UPSTREAM_KEY_FOR_TEST", "sk-secret")
    with Registry(db_copy) as reg:
        reg.set_endpoint("gpt-4o-2024-05-13", "http://127.0.0.1:9/v1", "gpt-4o", "UPSTREAM_KEY_FOR_TEST")
        with reg.store.tx() as tx:          # a text the registry holds: routing it runs no MiniLM
            text = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]
    with TestClient(create_app(str(db_copy), token="s3cret")) as c:
        yield c, text


def test_the_proxy_needs_the_token_before_any_upstream_is_called(client):
    c, _ = client
    body = {"model": "gpt-4o-2024-05-13", "messages": [{"role": "user", "content": "hi"}]}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = c.post("/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 401, r.text
        assert "error" in r.json()           # the OpenAI error shape
        assert c.get("/v1/models", headers=headers).status_code == 401
    # with the token it goes on to the upstream (nothing listens on port 9: an upstream failure, not a 401)
    r = c.post("/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code not in (401, 403), r.text
    assert c.get("/v1/models", headers=AUTH).status_code == 200


def test_the_log_needs_the_token_and_anonymous_texts_are_not_kept(client):
    c, text = client
    assert c.post("/route", json={"text": text}).status_code == 200
    r = c.post("/route", json={"text": text, "log_text": True})
    assert r.status_code == 401 and "log_text" in r.json()["detail"]
    assert c.get("/log").status_code == 401
    entries = c.get("/log", headers=AUTH).json()
    assert entries and entries[0]["text"] is None                   # the anonymous route: logged without its text
    assert c.post("/route", json={"text": text, "log_text": True}, headers=AUTH).status_code == 200
    assert c.get("/log", headers=AUTH).json()[0]["text"] == text


def test_a_blank_token_is_refused(db_copy):
    from click.testing import CliRunner

    from registry.cli import cli
    from registry.core.errors import InputError
    from registry.serve.app import create_app

    with pytest.raises(InputError, match="blank"):
        create_app(str(db_copy), token="  ")
    out = CliRunner().invoke(cli, ["--db", str(db_copy), "serve", "--token", " ", "--port", "1"])
    assert out.exit_code == 1 and "the token is blank" in out.output, out.output
