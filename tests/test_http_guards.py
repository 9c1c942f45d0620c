"""`registry serve` on a network, probed as an attacker and a clumsy client would, against real server processes on
loopback: bodies are counted as they arrive and a write without the token is refused before its body is read; the
proxy spends the endpoints' keys only for the token's holders; only the server's own Host and Origin may write;
every response carries the pages' security headers; every upstream attempt has deadlines (fallback for `auto`, 504
for a named model); connections that never send a request, and bodies that stop half-way, are cut off; SIGTERM
stops a server whose upstream trickles; every bad input is one line."""
from __future__ import annotations

import shutil
import signal
import socket
import threading
import time

import httpx
import pytest

from registry import Registry, RouteOptions

from .conftest import start_server
from .http_tools import FakeUpstream, chunked_post, raw_request, read_answer, rss_mib, wait_for

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
KEY_ENV = "HTTP_GUARDS_UPSTREAM_KEY"
MiB = 1 << 20


def _setup(db, upstream) -> tuple[str, list[str]]:
    """Endpoints on the fake upstream for the model a known text routes to and the next two of its chain:
    -> (the text, [choice, first fallback, second fallback])."""
    with Registry(db) as reg:
        with reg.store.tx() as tx:          # a text the registry holds: routing it runs no MiniLM
            text = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]
        choice = reg.route(text, RouteOptions(log=False)).model
        models = [choice] + [link.model for link in reg.fallback(choice, k=3).chain][:2]
        for m in models:
            reg.set_endpoint(m, upstream.base, upstream_model=f"up-{m}", api_key_env=KEY_ENV)
    return text, models


@pytest.fixture(scope="module")
def served(base_db, tmp_path_factory):
    """A server with a token, an extra allowed name, short upstream deadlines, endpoints on a fake upstream whose key
    is in the environment. -> (process, origin, upstream, text, models)."""
    upstream = FakeUpstream(gap=1.5)
    db = tmp_path_factory.mktemp("guards") / "registry.duckdb"
    shutil.copy(base_db, db)
    text, models = _setup(db, upstream)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, "sk-upstream-secret")
        proc, origin = start_server(db, TOKEN, ("--allowed-host", "registry.example", "--upstream-deadline",
                                                "first-byte=3", "--upstream-deadline", "between=0.6",
                                                "--upstream-key", f"{KEY_ENV}={upstream.base}"))
    yield proc, origin, upstream, text, models
    proc.terminate()
    proc.wait(timeout=30)
    upstream.close()


@pytest.fixture(scope="module")
def open_server(base_db, tmp_path_factory):
    """A tokenless server on loopback (writes open to its own machine)."""
    db = tmp_path_factory.mktemp("open") / "registry.duckdb"
    shutil.copy(base_db, db)
    proc, origin = start_server(db)
    yield proc, origin
    proc.terminate()
    proc.wait(timeout=30)


def chat(text: str, model: str = "auto", **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], **extra}


# --- bodies and the token --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_chunked_write_without_the_token_is_refused_before_its_body_is_read(served):
    proc, origin, *_ = served
    before = rss_mib(proc.pid)
    status, headers, body, sent = chunked_post(origin, "/models", 256 * MiB)
    assert status == 401 and b"token" in body and headers.get("connection") == "close"
    assert sent < 8 * MiB                      # answered on the head: the body was not waited for
    status, _, body, _ = chunked_post(origin, "/v1/chat/completions", 256 * MiB)
    assert status == 401 and b'"error"' in body                     # the proxy's (OpenAI's) shape
    assert rss_mib(proc.pid) - before < 128


@pytest.mark.slow
def test_a_chunked_body_over_the_limit_is_refused_as_it_arrives(served):
    proc, origin, *_ = served
    status, headers, body, sent = chunked_post(origin, "/route", 200 * MiB, AUTH)
    assert status == 413 and b"64 MiB" in body and headers.get("connection") == "close"
    assert 64 * MiB <= sent < 200 * MiB                    # read up to the limit, then refused
    # without the token the limit is 1 MiB: an anonymous caller cannot make the server read more
    status, headers, body, sent = chunked_post(origin, "/route/batch", 200 * MiB)
    assert status == 413 and b"1 MiB without the server token" in body and headers.get("connection") == "close"
    assert 1 * MiB <= sent < 16 * MiB
    status, _, body, _ = chunked_post(origin, "/v1/chat/completions", 200 * MiB, AUTH)
    assert status == 413 and b'"error"' in body
    # a declared length over the limit: refused before anything is read
    status, _ = raw_request(origin, f"POST /fingerprint HTTP/1.1\r\nHost: x\r\nContent-Length: {65 * MiB}\r\n"
                                    f"Content-Type: application/json\r\n\r\n".encode())
    assert status == 421
    status, answer = raw_request(origin, f"POST /fingerprint HTTP/1.1\r\nHost: localhost\r\nContent-Length: "
                                         f"{65 * MiB}\r\nContent-Type: application/json\r\n\r\n".encode())
    assert status == 413 and b"1 MiB" in answer
    status, answer = raw_request(origin, f"POST /fingerprint HTTP/1.1\r\nHost: localhost\r\nContent-Length: "
                                         f"{65 * MiB}\r\nAuthorization: {AUTH['Authorization']}\r\n"
                                         f"Content-Type: application/json\r\n\r\n".encode())
    assert status == 413 and b"64 MiB" in answer
    assert httpx.get(origin + "/health").status_code == 200


@pytest.mark.slow
def test_a_route_batch_is_bounded_before_it_is_routed(served):
    """A batch's size is bounded by who sends it (texts, and texts never seen, which cost a MiniLM pass each): a
    million texts without the token is refused at the head, and the largest allowed batch is answered whole."""
    from registry.serve import routes_routing as rr

    proc, origin, _, text, _ = served
    r = httpx.post(origin + "/route/batch", json={"texts": ["what is entropy"] * 1_000_000})
    assert r.status_code == 413 and "without the server token" in r.json()["detail"]
    r = httpx.post(origin + "/route/batch", json={"texts": [text] * (rr.BATCH_TEXTS[1] + 1)})
    assert r.status_code == 413 and f"at most {rr.BATCH_TEXTS[1]}" in r.json()["detail"], r.text
    new = [f"a text nobody routed before, number {i}" for i in range(rr.BATCH_NEW_TEXTS[1] + 1)]
    r = httpx.post(origin + "/route/batch", json={"texts": new})
    assert r.status_code == 413 and "not seen" in r.json()["detail"], r.text
    r = httpx.post(origin + "/route/batch", json={"texts": new * 200}, headers=AUTH)     # repeats count once
    assert r.status_code == 413 and f"at most {rr.BATCH_TEXTS[0]}" in r.json()["detail"], r.text
    before = rss_mib(proc.pid)
    r = httpx.post(origin + "/route/batch", json={"texts": [text] * rr.BATCH_TEXTS[0], "top": 0}, headers=AUTH,
                   timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out) == rr.BATCH_TEXTS[0] and len({d["model"] for d in out}) == 1 and out[0]["model"]
    assert rss_mib(proc.pid) - before < 100
    r = httpx.post(origin + "/route/batch", json={"texts": [text], "cost_weight": -1}, headers=AUTH)
    assert r.status_code in (400, 422), r.text          # a bad option is still an error, not a broken stream


# --- the proxy, the log and log_text need the token -------------------------------------------------------------

def test_the_proxy_without_the_token_never_reaches_the_upstream(served):
    _, origin, upstream, text, models = served
    seen = len(upstream.seen)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = httpx.post(origin + "/v1/chat/completions", json=chat(text, models[0]), headers=headers)
        assert r.status_code == 401 and "error" in r.json(), r.text
    assert len(upstream.seen) == seen                                  # the key was never spent
    r = httpx.post(origin + "/v1/chat/completions", json=chat(text, models[0]), headers=AUTH)
    assert r.status_code == 200 and r.json()["model"] == f"up-{models[0]}"
    assert upstream.seen[-1] == (f"up-{models[0]}", "Bearer sk-upstream-secret")


def test_the_log_and_a_logged_text_need_the_token(served):
    _, origin, _, text, _ = served
    assert httpx.get(origin + "/log").status_code == 401
    r = httpx.post(origin + "/route", json={"text": text, "log_text": True})
    assert r.status_code == 401 and "log_text" in r.json()["detail"]
    assert httpx.post(origin + "/route", json={"text": text}).status_code == 200
    assert httpx.get(origin + "/log", headers=AUTH).json()[0]["text"] is None


# --- Host, Origin and the pages' headers ------------------------------------------------------------------------

@pytest.mark.slow
def test_a_foreign_host_cannot_write_even_without_a_token(open_server):
    _, origin = open_server
    rebind = {"Host": "rebind.attacker.example", "Origin": "http://rebind.attacker.example"}
    for path, body in (("/models", {"name": "x", "evaluations": [{"question_id": "1", "correct": 1}]}),
                       ("/availability/unavailable", {"models": ["Yi-6B"]})):
        r = httpx.post(origin + path, json=body, headers=rebind)
        assert r.status_code == 421 and "--allowed-host" in r.json()["detail"]
    assert httpx.get(origin + "/models", headers={"Host": "rebind.attacker.example"}).status_code == 421
    # the server's own name, but a write from another site's page
    r = httpx.post(origin + "/availability/unavailable", json={"models": ["Yi-6B"]},
                   headers={"Origin": "http://evil.example"})
    assert r.status_code == 403 and "origin" in r.json()["detail"]
    port = origin.rsplit(":", 1)[1]
    r = httpx.post(origin + "/availability/unavailable", json={"models": ["Yi-6B"]},
                   headers={"Origin": f"http://localhost:{int(port) + 1}"})      # another local site
    assert r.status_code == 403
    assert "Yi-6B" not in down(origin)                                      # nothing was written
    for host in ("localhost", f"localhost:{port}", f"127.0.0.1:{port}"):
        assert httpx.get(origin + "/health", headers={"Host": host}).status_code == 200
    r = httpx.post(origin + "/availability/unavailable", json={"models": ["Yi-6B"]},
                   headers={"Origin": origin})                               # its own page
    assert r.status_code == 200 and "Yi-6B" in down(origin)


def down(origin: str) -> set[str]:
    return {a["model"] for a in httpx.get(origin + "/availability").json() if not a["available"]}


@pytest.mark.slow
def test_an_allowed_host_is_served_and_every_response_carries_the_security_headers(served):
    _, origin, *_ = served
    assert httpx.get(origin + "/health", headers={"Host": "registry.example:8443"}).status_code == 200
    assert httpx.get(origin + "/health", headers={"Host": "registry.example.attacker.example"}).status_code == 421
    for path in ("/", "/docs", "/models", "/no-such-page", "/static/web/web.js"):
        r = httpx.get(origin + path)
        assert "default-src 'self'" in r.headers["content-security-policy"], path
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "no-referrer"
    page = httpx.get(origin + "/").text
    assert "<script>" not in page and " style=" not in page           # nothing the policy would block
    assert "<script>" not in httpx.get(origin + "/docs").text


# --- deadlines on the upstreams ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_trickling_upstream_falls_back_for_auto_and_is_504_when_named(served):
    _, origin, upstream, text, models = served
    upstream.modes[f"up-{models[0]}"] = "trickle"
    try:
        t0 = time.time()
        r = httpx.post(origin + "/v1/chat/completions", json=chat(text), headers=AUTH, timeout=30)
        assert r.status_code == 200 and r.headers["x-registry-fallback"] == "true", r.text
        assert r.headers["x-registry-model"] == models[1] and time.time() - t0 < 5
        t0 = time.time()
        r = httpx.post(origin + "/v1/chat/completions", json=chat(text, models[0]), headers=AUTH, timeout=30)
        assert r.status_code == 504 and "stalled" in r.json()["error"]["message"] and time.time() - t0 < 5
        t0 = time.time()       # a stream asked of an upstream that answers in one JSON body, stalled: a 504
        r = httpx.post(origin + "/v1/chat/completions", json=chat(text, models[0], stream=True), headers=AUTH,
                       timeout=30)
        assert r.status_code == 504 and "stalled" in r.json()["error"]["message"] and time.time() - t0 < 5
        upstream.modes[f"up-{models[0]}"] = "trickle-stream"
        t0 = time.time()       # a stream that stalls once begun: it ends (short), and is not held open
        r = httpx.post(origin + "/v1/chat/completions", json=chat(text, models[0], stream=True), headers=AUTH,
                       timeout=30)
        assert r.headers["x-registry-model"] == models[0] and len(r.content) < 1000 and time.time() - t0 < 5
        assert wait_for(lambda: upstream.open == 0, 5)       # the proxy hung up on every trickle
    finally:
        upstream.modes.clear()


def test_a_200_that_is_not_json_is_an_upstream_failure(served):
    _, origin, upstream, text, models = served
    upstream.modes[f"up-{models[0]}"] = "notjson"
    try:
        r = httpx.post(origin + "/v1/chat/completions", json=chat(text), headers=AUTH)
        assert r.status_code == 200 and r.headers["x-registry-model"] == models[1]
        r = httpx.post(origin + "/v1/chat/completions", json=chat(text, models[0]), headers=AUTH)
        assert r.status_code == 502 and "not JSON" in r.json()["error"]["message"]
    finally:
        upstream.modes.clear()


def test_a_bad_upstream_deadline_or_a_blank_token_is_one_line(db_copy):
    from click.testing import CliRunner

    from registry.cli import cli

    for spec, says in (("between", "NAME=SECONDS"), ("forever=3", "NAME=SECONDS"), ("total=-1", "positive"),
                       ("m:first-byte=abc", "positive")):
        out = CliRunner().invoke(cli, ["--db", str(db_copy), "serve", "--port", "1", "--upstream-deadline", spec])
        assert out.exit_code == 1 and says in out.output and len(out.output.strip().splitlines()) == 1, out.output
    out = CliRunner().invoke(cli, ["--db", str(db_copy), "serve", "--port", "1", "--token", " "])
    assert out.exit_code == 1 and "the token is blank" in out.output and len(out.output.strip().splitlines()) == 1


def test_deadlines_parse_per_model():
    from registry.serve.http.connections import Deadlines, UpstreamDeadlines

    d = UpstreamDeadlines.parse(["llama3:8b:total=600", "between=5"])
    assert d.of("other") == Deadlines(between=5.0)
    assert d.of("llama3:8b") == Deadlines(between=5.0, total=600.0)     # a name may hold ':'


# --- every failure one line -------------------------------------------------------------------------------------

def test_bad_inputs_are_one_line_4xx(served):
    _, origin, _, text, models = served
    r = httpx.post(origin + "/route", content=b'{"text": "\\ud800 x"}', headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid Unicode" in r.json()["detail"]
    r = httpx.post(origin + "/route/batch", content=b'{"texts": ["ok", "\\udfff"]}',
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    deep = "[" * 1000 + "]" * 1000
    r = httpx.post(origin + "/v1/chat/completions", content='{"model": "auto", "messages": ' + deep + "}",
                   headers=AUTH)
    # (the chat body is a declared schema: JSON it cannot parse as one, however deep, is a one-line 422)
    assert r.status_code == 422 and len(r.json()["error"]["message"].splitlines()) == 1, r.text
    assert httpx.post(origin + "/route", content='{"text": ' + deep + "}").status_code in (400, 422)
    r = httpx.post(origin + "/route?cost_weight=abc", json={"text": text})
    assert r.status_code == 400 and "cost_weight" in r.json()["detail"]
    r = httpx.post(origin + "/route", json={"text": text, "cost_weight": "abc"})
    assert r.status_code == 422 and "cost_weight" in r.json()["detail"]
    r = httpx.post(origin + "/v1/chat/completions?cost_weight=abc", json=chat(text), headers=AUTH)
    assert r.status_code == 422 and "cost_weight" in r.json()["error"]["message"], r.text
    r = httpx.post(origin + "/v1/chat/completions", json=chat(text, cost_weight="abc"), headers=AUTH)
    assert r.status_code == 422 and "cost_weight" in r.json()["error"]["message"], r.text
    assert httpx.get(origin + "/health").status_code == 200


# --- slow: the real defaults ------------------------------------------------------------------------------------

@pytest.fixture
def trickling(db_copy):
    """A server with the default deadlines whose chosen model's upstream trickles a byte every 45 s."""
    upstream = FakeUpstream(gap=45)
    text, models = _setup(db_copy, upstream)
    upstream.modes[f"up-{models[0]}"] = "trickle"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KEY_ENV, "sk-upstream-secret")
        proc, origin = start_server(db_copy, args=("--upstream-key", f"{KEY_ENV}={upstream.base}"))
    yield proc, origin, upstream, text, models
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    upstream.close()


@pytest.mark.slow
def test_with_default_deadlines_a_trickle_is_given_up_within_a_minute(trickling):
    _, origin, upstream, text, models = trickling
    t0 = time.time()
    r = httpx.post(origin + "/v1/chat/completions", json=chat(text), timeout=90)
    auto_s = time.time() - t0
    assert r.status_code == 200 and r.headers["x-registry-model"] == models[1] and 25 < auto_s < 60, (r.text, auto_s)
    t0 = time.time()
    r = httpx.post(origin + "/v1/chat/completions", json=chat(text, models[0]), timeout=90)
    assert r.status_code == 504 and time.time() - t0 < 60


@pytest.mark.slow
def test_sigterm_stops_the_server_while_an_upstream_trickles(trickling):
    proc, origin, upstream, text, models = trickling
    waiting = threading.Thread(target=lambda: httpx.post(origin + "/v1/chat/completions", timeout=120,
                                                         json=chat(text, models[0])), daemon=True)
    waiting.start()
    assert wait_for(lambda: upstream.open == 1, 10)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert time.time() - t0 < 10


@pytest.mark.slow
def test_connections_that_never_send_a_request_are_closed(open_server):
    _, origin = open_server
    port = int(origin.rsplit(":", 1)[1])
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(400)]
    slow = socket.create_connection(("127.0.0.1", port))        # a head sent a byte at a time
    slow.sendall(b"GET /health HTTP/1.1\r\nX-Slow: ")
    t0 = time.time()
    try:
        while time.time() - t0 < 13:
            try:
                slow.sendall(b"a")
            except OSError:
                break
            time.sleep(1)
        assert time.time() - t0 < 13                              # the slow head was cut off
        closed = 0
        for s in idle:
            s.settimeout(1)
            try:
                closed += s.recv(1) == b""
            except (TimeoutError, ConnectionResetError):
                closed += 0
        assert closed == 400
        assert httpx.get(origin + "/health").status_code == 200    # and the server still answers
    finally:
        for s in idle + [slow]:
            s.close()


@pytest.mark.slow
def test_a_body_that_stops_half_way_is_refused(open_server):
    _, origin = open_server
    port = int(origin.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"POST /route HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"tex\r\n")          # then nothing more
        t0 = time.time()
        answer = read_answer(s)
    assert answer.startswith(b"HTTP/1.1 408") and b"stalled" in answer and 25 < time.time() - t0 < 40
