"""`registry ask` against fake OpenAI-compatible upstreams on loopback that the tests start: one answering as a
registered model did, one at random, one that answers 429 before it succeeds, one with unparseable text, one that
hangs."""
from __future__ import annotations

import json
import random
import time

import duckdb
import pytest
from click.testing import CliRunner

from registry.api import Registry
from registry.asking import grading, prompt
from registry.cli import cli
from registry.core.errors import EndpointFailed

LETTERS = "ABCDEFGHIJ"


def as_model(db, model: str):
    """Replies as `model`'s stored results say: the gold letter where it was right, another letter where wrong."""
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("""SELECT q.text, g.answer, e.correct FROM evaluations e
                          JOIN queries q ON q.id = e.query_id JOIN models m ON m.id = e.model_id
                          JOIN query_answers g ON g.query_id = q.id WHERE m.name = ?""", [model]).fetchall()
    con.close()
    book = {t: a if ok else LETTERS[(LETTERS.index(a) + 1) % 4] for t, a, ok in rows}
    return lambda text: f"Let me think. The answer is ({book[text]})." if text in book else "The answer is (A)."


def test_extraction_reads_the_usual_forms():
    for text, letter in [("The answer is (C)", "C"), ("Answer: C", "C"), ("**C**", "C"), ("C", "C"),
                         ("so the answer is D.", "D"), ("(B) because", "B"), ("I cannot tell", None), ("", None)]:
        assert grading.extract_letter(text) == letter, text
    assert grading.grade(None, "A", "letter") is False
    assert grading.grade("hello", "Hello", "exact") is True


@pytest.mark.slow
def test_import_stores_gold_answers_with_their_grading(db_copy):
    con = duckdb.connect(str(db_copy), read_only=True)
    kinds = con.execute("SELECT grading, count(*) FROM query_answers GROUP BY 1").fetchall()
    queries = con.execute("SELECT count(*) FROM queries").fetchone()[0]
    con.close()
    assert dict(kinds) == {"letter": queries}


@pytest.mark.slow
def test_an_endpoint_answering_as_a_registered_model_is_same_as_it(db_copy, upstreams):
    u = upstreams(as_model(db_copy, "Qwen1.5-72B-Chat"))
    with Registry(db_copy) as reg:
        r = reg.ask("mystery", base_url=u.url, upstream_model="m", n=128, plan="fingerprint")
        assert (r.asked, r.answered, r.unanswered, r.unparseable) == (128, 128, 0, 0)
        assert r.verdict["verdict"] == "same" and r.verdict["match"] == "Qwen1.5-72B-Chat"
        assert r.batch_id is not None and r.registration["version"] is not None
        assert r.prompt_tokens == 1280 and r.completion_tokens == 256
        assert len(r.next_questions) > 0
        sent = u.requests
        again = reg.ask("mystery", n=128)           # the endpoint is now recorded: asked again, nothing is sent
        assert again.asked == 0 and again.already == 128 and u.requests == sent
        more = reg.ask("mystery", n=140)
        assert more.asked == 12 and u.requests == sent + 12
    con = duckdb.connect(str(db_copy), read_only=True)
    rows = con.execute("""SELECT count(*), count(DISTINCT batch_id), min(template), count(response)
                          FROM asked_answers""").fetchone()
    con.close()
    assert rows == (140, 2, prompt.TEMPLATE_VERSION, 0)        # raw text only with keep_responses


@pytest.mark.slow
def test_an_endpoint_right_at_random_is_not_called_same(db_copy, upstreams):
    rng = random.Random(3)
    u = upstreams(lambda text: f"Answer: {rng.choice('ABCD')}")
    with Registry(db_copy) as reg:
        r = reg.ask("coin", base_url=u.url, n=128, plan="random")
    assert r.answered == 128 and r.verdict["verdict"] != "same"


def test_429_is_retried_and_the_run_completes(db_copy, upstreams):
    # fewer 429s than one question's attempts: however they fall among the questions, every one is answered
    u = upstreams(lambda text: "**B**", throttle=4, retry_after="0")
    with Registry(db_copy) as reg:
        r = reg.ask("busy", base_url=u.url, n=20, plan="random", concurrency=2, backoff=0.01)
    assert r.answered == 20 and r.retries == 4 and u.requests == 24
    with Registry(db_copy) as reg:
        again = reg.ask("busy", n=20)                 # its endpoint recorded: nothing left to ask, nothing sent
    assert (again.asked, again.already, u.requests) == (0, 20, 24)


@pytest.mark.slow
def test_unparseable_answers_are_counted_and_graded_wrong(db_copy, upstreams):
    u = upstreams(lambda text: "I would rather not say.")
    with Registry(db_copy) as reg:
        r = reg.ask("shy", base_url=u.url, n=16, plan="random", keep_responses=True)
    assert (r.answered, r.unparseable, r.correct) == (16, 16, 0)
    con = duckdb.connect(str(db_copy), read_only=True)
    stored = con.execute("""SELECT count(*), sum(e.correct::INT), count(a.response) FROM asked_answers a
                            JOIN evaluations e USING (model_id, query_id)""").fetchone()
    con.close()
    assert stored == (16, 0, 16)


def test_a_hanging_upstream_is_given_up_and_its_questions_left_unanswered(db_copy, upstreams):
    u = upstreams(lambda text: None)
    started = time.perf_counter()
    with Registry(db_copy) as reg:
        with pytest.raises(EndpointFailed, match="answered none of the 1 question.*deadline"):
            reg.ask("stuck", base_url=u.url, n=4, plan="random", deadline=0.3, retries=1, backoff=0.01)
    assert time.perf_counter() - started < 10
    con = duckdb.connect(str(db_copy), read_only=True)
    stored = con.execute("SELECT count(*) FROM models WHERE name = 'stuck'").fetchone()[0]
    con.close()
    assert stored == 0                                # nothing answered: not even the model was written


@pytest.mark.slow
def test_a_trickling_upstream_is_given_up_at_the_deadline_of_the_whole_reply(db_copy, upstreams):
    u = upstreams(lambda text: "TRICKLE")
    started = time.perf_counter()
    with Registry(db_copy) as reg:
        with pytest.raises(EndpointFailed, match="answered none of the 1 question.*deadline"):
            reg.ask("trickler", base_url=u.url, n=2, plan="random", deadline=1.0, retries=0)
    assert time.perf_counter() - started < 8          # a per-read timeout alone would wait the 30 s out


def test_an_address_nothing_listens_at_is_given_up_at_once(db_copy):
    import socket

    with socket.socket() as sock:                     # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    started = time.perf_counter()
    with Registry(db_copy) as reg:
        with pytest.raises(EndpointFailed, match="answered none of the 1 question.*unreachable"):
            reg.ask("nowhere", base_url=f"http://127.0.0.1:{port}", n=32, plan="random", concurrency=2)
    assert time.perf_counter() - started < 10         # not 32 questions x 5 attempts with backoff


def test_the_key_is_read_from_the_environment_and_never_stored(db_copy, upstreams, monkeypatch):
    monkeypatch.setenv("ASK_TEST_KEY", "sk-secret-123")
    u = upstreams(lambda text: "C")
    result = CliRunner().invoke(cli, ["--db", str(db_copy), "ask", "keyed", "--base-url", u.url, "-n", "8",
                                      "--plan", "random", "--api-key-env", "ASK_TEST_KEY", "--json"])
    assert result.exit_code == 0, result.output
    assert set(u.auth) == {"Bearer sk-secret-123"}
    assert "sk-secret-123" not in result.output and json.loads(result.stdout)["answered"] == 8
    assert b"sk-secret-123" not in db_copy.read_bytes()


@pytest.mark.slow
def test_over_http_asking_needs_the_token(db_copy, upstreams):
    import httpx

    from .conftest import start_server

    u = upstreams(lambda text: "The answer is (A)")
    proc, origin = start_server(db_copy, token="t0ken")
    try:
        body = {"base_url": u.url, "n": 8, "plan": "random"}
        assert httpx.post(f"{origin}/models/web-asked/ask", json=body, timeout=60).status_code == 401
        assert u.requests == 0
        r = httpx.post(f"{origin}/models/web-asked/ask", json=body, timeout=120,
                       headers={"authorization": "Bearer t0ken"})
        assert r.status_code == 200, r.text
        assert r.json()["answered"] == 8 and u.requests == 8
        assert httpx.get(f"{origin}/models/web-asked", timeout=30).json()["evaluations"] == 8
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.slow
def test_over_http_asking_cannot_send_an_unregistered_environment_variable(db_copy, upstreams, monkeypatch):
    import httpx

    from .conftest import start_server

    u = upstreams(lambda text: "The answer is (A)")
    monkeypatch.setenv("SOME_CLOUD_SECRET", "do-not-send")
    proc, origin = start_server(db_copy, token="t0ken")
    try:
        body = {"base_url": u.url, "n": 4, "plan": "random", "api_key_env": "SOME_CLOUD_SECRET"}
        r = httpx.post(f"{origin}/models/web-asked/ask", json=body, timeout=60,
                       headers={"authorization": "Bearer t0ken"})
        assert r.status_code == 409 and "SOME_CLOUD_SECRET" in r.json()["detail"], r.text
        assert u.requests == 0 and u.auth == []
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_key_variable_that_is_not_set_is_one_line_naming_it_and_nothing_is_sent_or_kept(db_copy, upstreams,
                                                                                          monkeypatch):
    from .conftest import snapshot

    u = upstreams(lambda text: "The answer is (A)")
    monkeypatch.delenv("ASK_TEST_UNSET_KEY", raising=False)
    before = snapshot(db_copy)
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "ask", "keyless", "--base-url", u.url, "-n", "4",
                                 "--plan", "random", "--api-key-env", "ASK_TEST_UNSET_KEY"])
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "ASK_TEST_UNSET_KEY" in r.output, r.output
    assert u.requests == 0 and snapshot(db_copy) == before
