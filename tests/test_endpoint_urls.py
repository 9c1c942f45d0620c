"""Base URLs are parsed before anything is stored (data/endpoints.parse_base_url: http(s), a host, a port from 1 to
65535, no credentials, query or fragment), and the HTTP schema's pattern says exactly what it takes; `ask` writes
nothing until its endpoint has answered (an endpoint that answers nothing is an error, 502 over HTTP, and leaves no
model or endpoint behind), and over HTTP never replaces a model's recorded endpoint (409); the proxy answers an
endpoint it cannot build a request for with a 502 in OpenAI's shape. Real DuckDB copies, the real app (TestClient)
and the real CLI, fake upstreams on loopback."""
from __future__ import annotations

import re
import socket

import duckdb
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from registry.api import Registry
from registry.cli import cli
from registry.core.errors import EndpointFailed, InputError
from registry.core.keys import origin
from registry.data.endpoints import MAX_URL, parse_base_url
from registry.serve.app import create_app
from registry.serve.http import shapes

from .http_tools import ChatUpstream

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BAD = ["http://]bad", "http://[::1", "http://[::g]/v1", "http://user:pw@example.org/v1", "http://k@example.org",
       "http://example.org/v1?key=1", "http://example.org/v1#frag", "http://example.org/v1?", "http://:8000/v1",
       "http:///v1", "http://example.org:0/v1", "http://example.org:70000", "http://example.org:/v1",
       "http://example.org:08/v1", "ftp://example.org", "http://exa mple.org", "http://example.org/a b",
       "http://example.org/\x00", "http://1.2.3.999/v1", "http://1.2.3", "http://" + "a" * 3000]


def dead_port() -> int:
    """A loopback port that was free a moment ago: nothing listens there."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(db, sql: str, params=()) -> list:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def endpoint_rows(db) -> list:
    return rows(db, "SELECT model_id, base_url, upstream_model, api_key_env FROM model_endpoints ORDER BY id")


def a_model(db) -> str:
    return rows(db, "SELECT name FROM models ORDER BY id LIMIT 1")[0][0]


def test_a_base_url_is_parsed_before_it_is_stored():
    for url in BAD:
        with pytest.raises(InputError) as err:
            parse_base_url(url)
        assert "\n" not in str(err.value), url
        assert len(url) > MAX_URL or not re.search(shapes.BASE_URL, url), url      # the schema refuses it too
    assert parse_base_url("  http://LocalHost:8000/v1/ ") == "http://localhost:8000/v1"
    assert parse_base_url("https://api.example.org/v1") == "https://api.example.org/v1"
    assert parse_base_url("http://[::1]:9/v1") == "http://[::1]:9/v1"
    assert origin("https://API.example.org/v1") == "https://api.example.org:443"
    assert origin("http://127.0.0.1/v1") == "http://127.0.0.1:80"
    assert origin("http://[::1]:9/v1") == "http://[::1]:9"


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.from_regex(shapes.BASE_URL, fullmatch=True))
def test_every_base_url_the_schema_allows_is_taken(url):
    """What /openapi.json promises (schemathesis sends such URLs) is what the library takes: no schema-valid body is
    refused as bad input."""
    import httpx

    httpx.Request("POST", parse_base_url(url) + "/chat/completions")        # and the clients can send to it


def test_an_unparseable_base_url_is_a_400_and_nothing_is_stored(db_copy):
    model, before = a_model(db_copy), endpoint_rows(db_copy)
    with TestClient(create_app(str(db_copy), token=TOKEN)) as c:
        r = c.put(f"/endpoints/{model}", json={"base_url": "http://]bad"}, headers=AUTH)
        assert r.status_code == 400 and set(r.json()) == {"detail"} and "http://]bad" in r.json()["detail"], r.text
        r = c.put(f"/endpoints/{model}", json={"base_url": "http://user:pw@example.org/v1"}, headers=AUTH)
        assert r.status_code in (400, 422), r.text
        r = c.post("/models/00/ask", json={"base_url": "http://]bad", "n": 4, "plan": "random"}, headers=AUTH)
        assert r.status_code == 400 and set(r.json()) == {"detail"}, r.text
        assert c.get("/models/00").status_code == 404
    assert endpoint_rows(db_copy) == before
    result = CliRunner().invoke(cli, ["--db", str(db_copy), "endpoints", "set", model, "--base-url", "http://]bad"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert endpoint_rows(db_copy) == before


def test_ask_of_an_endpoint_that_answers_nothing_fails_and_leaves_nothing(db_copy):
    """Issue 51: `registry ask ghost --base-url` at an address nothing listens at exited 0 ('0 answered') and left
    model `ghost` behind."""
    before = rows(db_copy, "SELECT count(*) FROM models")[0][0], endpoint_rows(db_copy)
    url = f"http://127.0.0.1:{dead_port()}/v1"
    result = CliRunner().invoke(cli, ["--db", str(db_copy), "ask", "ghost", "--base-url", url, "-n", "8", "--plan",
                                      "random", "--json"])      # (no progress bar)
    assert result.exit_code == 1, result.output
    assert len(result.output.strip().splitlines()) == 1 and "answered none" in result.output, result.output
    assert "nothing was stored" in result.output
    assert (rows(db_copy, "SELECT count(*) FROM models")[0][0], endpoint_rows(db_copy)) == before
    assert rows(db_copy, "SELECT count(*) FROM models WHERE name = 'ghost'")[0][0] == 0


def test_ask_of_a_model_that_exists_does_not_rewrite_its_endpoint_when_nothing_answers(db_copy):
    model = a_model(db_copy)
    with Registry(db_copy) as reg:
        reg.set_endpoint(model, "http://127.0.0.1:1/v1", upstream_model="up")
    before = endpoint_rows(db_copy)
    with Registry(db_copy) as reg:
        with pytest.raises(EndpointFailed, match="answered none"):
            reg.ask(model, base_url=f"http://127.0.0.1:{dead_port()}/v1", n=4, plan="random")
    assert endpoint_rows(db_copy) == before


@pytest.mark.slow
def test_over_http_an_endpoint_that_answers_nothing_is_a_502_and_ask_never_replaces_an_endpoint(db_copy):
    model = a_model(db_copy)
    up = ChatUpstream(lambda text: "The answer is (A)")
    try:
        with Registry(db_copy) as reg:
            reg.set_endpoint(model, up.url + "/v1", upstream_model="up")
        before = endpoint_rows(db_copy)
        with TestClient(create_app(str(db_copy), token=TOKEN)) as c:
            dead = f"http://127.0.0.1:{dead_port()}/v1"
            r = c.post("/models/ghost/ask", json={"base_url": dead, "n": 4, "plan": "random"}, headers=AUTH)
            assert r.status_code == 502 and set(r.json()) == {"detail"} and "answered none" in r.json()["detail"]
            assert c.get("/models/ghost").status_code == 404
            # another base URL for a model with an endpoint: refused, asked nowhere
            r = c.post(f"/models/{model}/ask", json={"base_url": dead, "n": 4, "plan": "random"}, headers=AUTH)
            assert r.status_code == 409 and "PUT /endpoints" in r.json()["detail"], r.text
            r = c.post(f"/models/{model}/ask", json={"base_url": up.url + "/v1", "upstream_model": "other", "n": 4,
                                                     "plan": "random"}, headers=AUTH)
            assert r.status_code == 409 and up.requests == 0, r.text
            # its own endpoint (named again, or not at all): asked, and its row is not rewritten
            r = c.post(f"/models/{model}/ask", json={"base_url": up.url + "/v1/", "n": 4, "plan": "random"},
                       headers=AUTH)
            assert r.status_code == 200 and r.json()["answered"] == 4 and up.requests == 4, r.text
            r = c.post(f"/models/{model}/ask", json={"n": 8, "plan": "random"}, headers=AUTH)
            assert r.status_code == 200 and r.json()["asked"] == 4, r.text
        assert endpoint_rows(db_copy) == before
    finally:
        up.close()


def test_the_proxy_answers_an_endpoint_it_cannot_build_a_request_for_with_a_502(db_copy):
    """A row written before base URLs were checked: the proxy (and ask) refuse it in one line, not a 500."""
    model = a_model(db_copy)
    con = duckdb.connect(str(db_copy))
    con.execute("INSERT INTO model_endpoints (id, model_id, base_url) SELECT nextval('model_endpoints_id_seq'), id, "
                "'http://]bad' FROM models WHERE name = ?", [model])
    con.close()
    with TestClient(create_app(str(db_copy), token=TOKEN), raise_server_exceptions=False) as c:
        r = c.post("/v1/chat/completions", headers=AUTH,
                   json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_failed", r.text
        assert "Traceback" not in r.text
        r = c.post(f"/models/{model}/ask", json={"n": 4, "plan": "random"}, headers=AUTH)
        assert r.status_code == 409 and "endpoints set" in r.json()["detail"], r.text


def test_the_document_declares_what_ask_and_a_stop_answer(db_copy):
    with TestClient(create_app(str(db_copy), token=TOKEN)) as c:
        doc = c.get("/openapi.json").json()
    ask = doc["paths"]["/models/{name}/ask"]["post"]
    assert {"400", "409", "502", "503"} <= set(ask["responses"])
    assert ask["responses"]["502"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    assert all("503" in op["responses"] for item in doc["paths"].values() for op in item.values())
    body = doc["components"]["schemas"]["EndpointBody"]["properties"]["base_url"]
    assert body["pattern"] == shapes.BASE_URL and body["maxLength"] == MAX_URL
    chat = doc["components"]["schemas"]["ChatRequest"]
    assert chat["if"]["properties"]["model"] == {"const": "auto"} and "contains" in chat["then"]["properties"][
        "messages"]


def test_the_space_characters_the_rules_name_are_every_one_python_strips():
    """The schema's patterns and the base-URL rule name space by a scan that stops early: it must find every code
    point str.isspace() takes, in this Python's Unicode."""
    import sys

    from registry.data import endpoints

    every = tuple(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())
    assert endpoints.space_chars() == every and len(every) >= 25
