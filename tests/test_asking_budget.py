"""Asking endpoints over HTTP runs outside the writer, in one server-wide budget: a verify against an upstream that
answers in 30 s leaves registrations and reads their speed, a client that hangs up stops its asking, a third asking
request while two run is refused (429), and SIGTERM stops the server within seconds."""
from __future__ import annotations

import threading
import time

import duckdb
import httpx
import pytest

from registry import Registry

from . import verify_fakes as vf
from .conftest import start_server
from .http_tools import ChatUpstream

pytestmark = pytest.mark.slow

X = "gpt-4o-2024-05-13"
AUTH = {"authorization": "Bearer t0ken"}
LARGEST = {"n": 2048, "repeat": 256, "concurrency": 16, "deadline": 120.0}     # the schema's largest values


@pytest.fixture
def slow_server(db_copy):
    b = vf.books(db_copy, [X])
    slow = ChatUpstream(vf.case(b, "faithful", X, seed=1), latency=30)
    with Registry(db_copy) as reg:
        reg.claim(X, slow.url, name=f"{X}@slow")
    proc, origin = start_server(db_copy, token="t0ken")
    yield slow, proc, origin
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    slow.close()


def verify_in_background(origin: str, timeout: float = 600) -> threading.Thread:
    def go():
        try:
            httpx.post(f"{origin}/models/{X}/verify", json=LARGEST, headers=AUTH, timeout=timeout)
        except httpx.HTTPError:
            pass
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def rows(small_data, n: int = 80) -> list[dict]:
    con = duckdb.connect()
    got = con.execute(f"SELECT question_id::VARCHAR, correct FROM read_csv('{small_data}/evaluations.csv.gz') "
                      f"WHERE model = ? ORDER BY question_id LIMIT {n}", [X]).fetchall()
    con.close()
    return [{"question_id": q, "correct": int(c)} for q, c in got]


def test_writes_and_reads_keep_their_speed_and_a_third_asking_request_is_refused(slow_server, small_data):
    slow, proc, origin = slow_server
    verify_in_background(origin)
    verify_in_background(origin)
    deadline = time.monotonic() + 30
    while slow.requests < 16 and time.monotonic() < deadline:       # both are asking now
        time.sleep(0.2)
    assert slow.requests >= 16
    t0 = time.monotonic()
    r = httpx.post(f"{origin}/models", json={"name": "while-asking", "evaluations": rows(small_data)}, headers=AUTH,
                   timeout=60)
    took = time.monotonic() - t0
    assert r.status_code == 200 and took < 5, (r.status_code, r.text[:300], took)      # (the writer is free)
    t0 = time.monotonic()
    assert httpx.get(f"{origin}/models", timeout=30).status_code == 200
    assert httpx.get(f"{origin}/", timeout=30).status_code == 200
    assert time.monotonic() - t0 < 5
    third = httpx.post(f"{origin}/models/{X}/verify", json={"n": 8}, headers=AUTH, timeout=30)
    assert third.status_code == 429 and third.headers["retry-after"] and "send this one again" in third.json()["detail"]
    health = httpx.get(f"{origin}/health", timeout=30).json()
    assert health["ready"]
    t0 = time.monotonic()
    proc.terminate()                    # SIGTERM with two asking requests under way
    proc.wait(timeout=30)
    assert time.monotonic() - t0 < 5


def test_a_client_that_hangs_up_stops_its_asking(slow_server):
    slow, proc, origin = slow_server
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{origin}/models/{X}/verify", json=LARGEST, headers=AUTH, timeout=3)
    time.sleep(5)                       # (within 5 s of the hang-up, nothing more is sent)
    sent = slow.requests
    assert 0 < sent <= 32
    time.sleep(4)
    assert slow.requests == sent
    try:                                # its slot was freed: another is taken (and asks: it times out here)
        r = httpx.post(f"{origin}/models/{X}/verify", json={"n": 8, "repeat": 0}, headers=AUTH, timeout=3)
        assert r.status_code != 429, r.text
    except httpx.ReadTimeout:
        pass
