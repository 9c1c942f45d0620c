"""SIGTERM with requests in flight: the server leaves within its grace (serve/http/listener.py, GRACEFUL_SHUTDOWN),
and each request still running then is answered 503 in its route's error shape ({"detail": ...}; OpenAI's on
/v1/...), not uvicorn's plain-text 500, and the server's log holds no traceback. A real `registry serve` process,
slow requests held open by a fake upstream that trickles and a client that sends its upload slowly."""
from __future__ import annotations

import signal
import socket
import threading
import time

import httpx
import pytest

from registry import Registry
from registry.serve.http.listener import GRACEFUL_SHUTDOWN

from .conftest import start_server
from .http_tools import FakeUpstream, read_answer, wait_for

TOKEN = "st0p"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.slow
def test_requests_running_at_sigterm_are_answered_503_in_their_shape_with_no_traceback(db_copy):
    upstream = FakeUpstream(gap=1.0)
    with Registry(db_copy) as reg:
        model = reg.models()[0].name
        reg.set_endpoint(model, upstream.base, upstream_model="slow")
    upstream.modes["slow"] = "trickle"          # headers at once, then a byte a second: a request that runs on
    proc, origin = start_server(db_copy, TOKEN)
    host, port = origin.removeprefix("http://").split(":")
    answers, upload = [], None
    try:
        def chat():
            answers.append(httpx.post(origin + "/v1/chat/completions", headers=AUTH, timeout=60, json={
                "model": model, "messages": [{"role": "user", "content": "hi"}]}))
        threads = [threading.Thread(target=chat, daemon=True) for _ in range(5)]
        for t in threads:
            t.start()
        # an upload whose body comes slowly (under the 30 s a body may pause): a running request off the proxy
        upload = socket.create_connection((host, int(port)), timeout=30)
        upload.sendall(f"POST /models/slow-upload/evaluations HTTP/1.1\r\nHost: {host}:{port}\r\n"
                       f"Authorization: Bearer {TOKEN}\r\nContent-Type: text/csv\r\n"
                       f"Transfer-Encoding: chunked\r\n\r\n".encode() + b"14\r\nquestion_id,correct\n\r\n")
        assert wait_for(lambda: upstream.open == 5, 30), upstream.open
        time.sleep(0.5)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        left_after = time.time() - t0
        for t in threads:
            t.join(30)
        uploaded = read_answer(upload)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        if upload is not None:
            upload.close()
        upstream.close()
    assert left_after < GRACEFUL_SHUTDOWN + 5, left_after
    assert len(answers) == 5 and all(r.status_code == 503 for r in answers), [(r.status_code, r.text) for r in answers]
    for r in answers:
        assert r.headers["content-type"] == "application/json"
        error = r.json()["error"]
        assert error["code"] == "server_stopping" and error["type"] == "server_error"
        assert "stopping" in error["message"] and "\n" not in error["message"]
    head, _, body = uploaded.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), uploaded[:300]
    assert b'{"detail":"the server is stopping' in body, body
    assert "Traceback" not in out and "Internal Server Error" not in out, out[-3000:]
