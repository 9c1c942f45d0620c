"""`registry endpoints add` and `registry verify` against fake upstreams on loopback that the tests start, each built
from a registered model's real MMLU-Pro answers (tests/verify_fakes.py): faithful, degraded, substituted, mixed,
and slow, failing and rate-limited ones; the verdicts' tests on their own; every key rule of `ask`."""
from __future__ import annotations

import json
import socket

import duckdb
import numpy as np
import pytest
from click.testing import CliRunner

from registry.api import Registry
from registry.asking import verdicts
from registry.cli import cli
from registry.core.errors import Conflict, NotFound
from registry.core.keys import KeyRefused, UpstreamKeys

from . import verify_fakes as vf

X, SUB, CHEAP = "gpt-4o-2024-05-13", "gemini-1.5-pro-002", "Meta-Llama-3_1-8B-Instruct"


def count(db, sql: str, params=()):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def x_evaluations(db) -> int:
    return count(db, "SELECT count(*) FROM evaluations e JOIN models m ON m.id = e.model_id WHERE m.name = ?",
                 [X])[0][0]


def test_claims_are_kept_as_aliases_are(db_copy, upstreams):
    u, v = upstreams(lambda t: "A"), upstreams(lambda t: "B")
    with Registry(db_copy) as reg:
        a = reg.claim(X, u.url, name=f"{X}@one", reference=True)
        assert (a.model, a.reference, a.watched, a.base_url) == (X, True, True, u.url)
        b = reg.claim(X, v.url, name=f"{X}@two", reference=True)     # the reference mark moves
        assert b.reference
        with reg.store.tx() as tx:
            from registry.asking import claims
            now = {c.endpoint: c.reference for c in claims.of_model(tx, X)}
            assert now == {f"{X}@one": False, f"{X}@two": True}
            claims.withdraw(tx, f"{X}@one")
            assert [c.endpoint for c in claims.of_model(tx, X)] == [f"{X}@two"]
        assert {m.model: m.available for m in reg.availability()}[f"{X}@two"] is False   # never routed in X's place
        for bad, error in ((dict(name=X), Conflict), (dict(name=SUB), Conflict)):
            with pytest.raises(error):
                reg.claim(X, u.url, **bad)
        with pytest.raises(NotFound):
            reg.claim("no-such-model", u.url)
    rows = count(db_copy, "SELECT count(*), count(claims) FROM model_claims")[0]
    assert rows == (4, 3)                             # appended, never updated: the newest row counts


def test_endpoints_add_on_the_command_line(db_copy, upstreams):
    u = upstreams(lambda t: "A")
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "endpoints", "add", X, "--base-url", u.url, "--name",
                                 f"{X}@cli", "--reference", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["reference"] is True
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "endpoints", "add", "nope", "--base-url", u.url])
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "nope" in r.output


@pytest.mark.slow
def test_each_case_gets_its_verdict_and_asking_again_sends_nothing(db_copy, upstreams):
    b = vf.books(db_copy, [X, SUB, CHEAP])
    cases = {"reference": None, "faithful": None, "degraded": CHEAP, "substituted": SUB, "mixed": CHEAP}
    ups = {k: upstreams(vf.case(b, k, X, other=o, seed=i, degrade=0.25, mix=0.5))
           for i, (k, o) in enumerate(cases.items())}
    before = x_evaluations(db_copy)
    with Registry(db_copy) as reg:
        for k, u in ups.items():
            reg.claim(X, u.url, name=f"{X}@{k}", reference=k == "reference")
        r = reg.verify(X, n=128, repeat=32)
        got = {e.endpoint.split("@")[1]: e.verdict for e in r.endpoints}
        assert got["faithful"]["verdict"] == "faithful", got["faithful"]
        assert got["degraded"]["verdict"] == "degraded" and got["degraded"]["drop_ci"][0] > 0, got["degraded"]
        assert got["substituted"]["verdict"] == "substituted" and got["substituted"]["substitute"] == SUB
        assert got["mixed"]["verdict"] not in ("faithful", "not conclusive"), got["mixed"]
        assert r.reference == f"{X}@reference" and not r.across_prompts and not r.faithful
        for e in r.endpoints:
            assert e.answered == e.asked and e.asked >= 128 + 32 and e.already == 0
        sent = {k: u.requests for k, u in ups.items()}
        again = reg.verify(X, n=128, repeat=32)
        assert {k: u.requests for k, u in ups.items()} == sent          # nothing already answered is asked again
        assert [e.verdict["verdict"] for e in again.endpoints] == [e.verdict["verdict"] for e in r.endpoints]
        assert all(e.asked == 0 and e.already == 160 for e in again.endpoints)
        reg.verify(X, n=140, repeat=32)                                  # a longer plan asks only its new questions
        assert all(u.requests - sent[k] <= 12 * 2 + 12 for k, u in ups.items())
    assert x_evaluations(db_copy) == before            # the endpoints' answers never enter X's own results
    stored = count(db_copy, """SELECT count(DISTINCT batch_id), count(*) FROM asked_answers a JOIN models m
                               ON m.id = a.model_id WHERE m.name LIKE ?""", [f"{X}@%"])[0]
    assert stored[0] >= 2 and stored[1] >= 5 * 160


@pytest.mark.slow
def test_an_upstream_naming_another_model_or_billing_double_is_flagged_on_its_first_answer(db_copy, upstreams):
    b = vf.books(db_copy, [X])
    honest = vf.case(b, "faithful", X, seed=1)
    ups = {"honest": upstreams(honest, bill=1.0), "dated": upstreams(honest, served_model=X + "-2024-06-01"),
           "renamed": upstreams(honest, served_model="gpt-4o-mini"), "double": upstreams(honest, bill=2.0)}
    with Registry(db_copy) as reg:
        for k, u in ups.items():
            reg.claim(X, u.url, name=f"{X}@{k}", upstream_model=X)
        r = reg.verify(X, n=1, repeat=0)          # one question: one answer each
    flags = {e.endpoint.split("@")[1]: e.flags for e in r.endpoints}
    assert flags["honest"] == [] and flags["dated"] == [], flags
    assert len(flags["renamed"]) == 1 and "answered as 'gpt-4o-mini'" in flags["renamed"][0], flags
    assert len(flags["double"]) == 1 and "2.0 times" in flags["double"][0], flags
    assert all(e.answered == 1 for e in r.endpoints) and not r.faithful


@pytest.mark.slow
def test_verify_watch_the_page_and_http_give_one_verdict(db_copy, upstreams):
    import re

    from fastapi.testclient import TestClient

    from registry.serve.app import create_app

    b = vf.books(db_copy, [X, SUB])
    ups = {k: upstreams(vf.case(b, k, X, other=o, seed=i)) for i, (k, o) in
           enumerate((("faithful", None), ("substituted", SUB)))}
    with Registry(db_copy) as reg:
        for k, u in ups.items():
            reg.claim(X, u.url, name=f"{X}@{k}")
        r = reg.verify(X, n=96, repeat=16)
        said = {e.endpoint: e.verdict["verdict"] for e in r.endpoints}
        assert said[f"{X}@substituted"] == "substituted", said
        assert {e: v["verdict"] for e, v in reg.endpoint_verdicts(X).items()} == said
        before = {k: u.requests for k, u in ups.items()}
        w = reg.watch(n=32)
        rounds = {x.endpoint: x.verdict for x in w.rounds}
        now = {e: v["verdict"] for e, v in reg.endpoint_verdicts(X).items()}
        assert rounds == now, (rounds, now)
        with reg.store.tx() as tx:         # watch asked only fresh questions: none answered three times
            assert tx.sql("""SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM asked_answers
                             GROUP BY model_id, query_id)""")[0][0] <= 2
        assert all(u.requests - before[k] <= 2 * 32 for k, u in ups.items())
    with TestClient(create_app(str(db_copy))) as c:
        over_http = {e: v["verdict"] for e, v in c.get(f"/models/{X}/verdicts").json().items()}
        html = c.get(f"/ui/endpoints/{X}").text
    on_page = dict(re.findall(r'<td class="verdict-now" data-endpoint="([^"]+)">([^<]*)</td>', html))
    assert over_http == now and on_page == now, (over_http, on_page, now)


@pytest.mark.slow
def test_the_command_line_exits_non_zero_when_one_is_not_faithful(db_copy, upstreams):
    b = vf.books(db_copy, [X, SUB])
    good, bad = upstreams(vf.case(b, "faithful", X, seed=1)), upstreams(vf.case(b, "substituted", X, other=SUB))
    with Registry(db_copy) as reg:
        reg.claim(X, good.url, name=f"{X}@good")
    args = ["--db", str(db_copy), "verify", X, "-n", "96", "--repeat", "16"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "registered results" in r.output and "faithful" in r.output    # no reference: across prompts, said
    with Registry(db_copy) as reg:
        reg.claim(X, bad.url, name=f"{X}@bad")
    r = CliRunner().invoke(cli, args + ["--json"])
    assert r.exit_code == 3, r.output
    out = json.loads(r.stdout)
    assert out["faithful"] is False and out["across_prompts"] is True
    assert {e["endpoint"]: e["verdict"]["verdict"] for e in out["endpoints"]} == {
        f"{X}@good": "faithful", f"{X}@bad": "substituted"}


@pytest.mark.slow
def test_slow_failing_and_rate_limited_endpoints(db_copy, upstreams):
    b = vf.books(db_copy, [X])
    slow = upstreams(vf.case(b, "faithful", X, seed=2), latency=0.05)
    busy = upstreams(vf.case(b, "faithful", X, seed=3), throttle=3, retry_after="0")
    failing = upstreams(lambda t: "ERROR")
    with socket.socket() as sock:                     # a port nothing listens at
        sock.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with Registry(db_copy) as reg:
        for name, url in (("slow", slow.url), ("busy", busy.url), ("failing", failing.url), ("nowhere", nowhere)):
            reg.claim(X, url, name=f"{X}@{name}")
        r = reg.verify(X, n=64, repeat=8, retries=3, backoff=0.01, deadline=5)
    got = {e.endpoint.split("@")[1]: e for e in r.endpoints}
    assert got["slow"].verdict["verdict"] == "faithful" and got["busy"].verdict["verdict"] == "faithful"
    assert got["busy"].retries == 3 and got["busy"].unanswered == 0     # however the 429s fall: answered
    for name in ("failing", "nowhere"):
        e = got[name]
        assert e.answered == 0 and e.verdict["verdict"] == "not conclusive" and e.failures, e
    assert failing.requests <= 4 * 72                  # retried three times per question, no more


@pytest.mark.slow
def test_every_key_rule_of_ask_holds(db_copy, upstreams, monkeypatch):
    u = upstreams(lambda t: "The answer is (A)")
    monkeypatch.setenv("VERIFY_TEST_KEY", "sk-verify-123")
    monkeypatch.delenv("VERIFY_UNSET_KEY", raising=False)
    with Registry(db_copy) as reg:
        reg.claim(X, u.url, name=f"{X}@keyed", api_key_env="VERIFY_TEST_KEY")
        # a server's bindings: a variable not bound, or bound to another origin, is refused before anything is sent
        for keys in (UpstreamKeys.parse([]), UpstreamKeys.parse(["VERIFY_TEST_KEY=https://api.example.com"])):
            with pytest.raises(KeyRefused):
                reg.verify(X, n=32, repeat=0, keys=keys)
        assert u.requests == 0
        reg.claim(X, u.url, name=f"{X}@unset", api_key_env="VERIFY_UNSET_KEY")
        with pytest.raises(KeyRefused, match="VERIFY_UNSET_KEY"):      # a keyed endpoint is never called keyless
            reg.verify(X, n=32, repeat=0)
        assert u.requests == 0
        r = reg.verify(X, n=32, repeat=0, endpoints=[f"{X}@keyed"])
    assert r.endpoints[0].answered == r.endpoints[0].asked >= 32 and set(u.auth) == {"Bearer sk-verify-123"}
    assert b"sk-verify-123" not in db_copy.read_bytes()


def test_the_tests_on_their_own():
    rng = np.random.default_rng(0)
    x = rng.random(256) < 0.7
    ref, flip = x.copy(), rng.random(256) < 0.02
    faithful = x ^ flip
    v = verdicts.judge(verdicts.Sides(faithful, ref, (1, 32)))
    assert v.verdict == "faithful" and v.p_disagreement > 0.002 and v.drop_ci[0] <= v.tolerance
    worse = faithful & ~(x & (rng.random(256) < 0.15))
    v = verdicts.judge(verdicts.Sides(worse, ref, (1, 32)))
    assert v.verdict == "degraded" and v.drop > 0.05 and v.drop_ci[0] > v.tolerance, v
    v = verdicts.judge(verdicts.Sides(faithful[:20], ref[:20], (0, 8)))
    assert v.verdict == "not conclusive" and v.more_questions == 12
    # another configuration: 12% of the answers flipped both ways (same accuracy), where its repeats never differ
    other = x ^ (rng.random(256) < 0.12)
    v = verdicts.judge(verdicts.Sides(other, ref, (0, 32)))
    assert v.verdict == "configuration" and abs(v.drop) < 0.05, v
    # a drop of 5 answers in 256 (2 points) is within the tolerance: never degraded on its point estimate
    small = faithful.copy()
    small[np.flatnonzero(faithful)[:5]] = False
    assert verdicts.judge(verdicts.Sides(small, ref, (1, 32))).verdict != "degraded"
    # another registered model explains the answers: substituted, named; half of them: mixed
    y = np.where(rng.random(256) < 0.7, 1, 0).astype(np.int8)
    pool = {f"m{i}": np.where(rng.random(256) < 0.7, 1, 0).astype(np.int8) for i in range(5)}
    served = pool["m3"].astype(bool) ^ (rng.random(256) < 0.03)
    v = verdicts.judge(verdicts.Sides(served, y.astype(bool), (0, 32)), verdicts.Others(y, pool))
    assert v.verdict == "substituted" and v.substitute == "m3", v
    half = np.where(rng.random(256) < 0.5, pool["m1"], y).astype(bool)
    v = verdicts.judge(verdicts.Sides(half, y.astype(bool), (0, 32)), verdicts.Others(y, pool))
    assert v.verdict in ("mixed", "substituted") and "m1" in (v.leaning, v.substitute), v
    assert verdicts.sign_p(10, 10) < 0.001 and verdicts.sign_p(0, 0) == 1.0
    assert verdicts.wilson(0, 10)[0] == 0.0 and verdicts.flip_rate(2 * 0.02 * 0.98) == pytest.approx(0.02)


@pytest.mark.slow
def test_on_either_database(any_db, upstreams):
    """claims, verify and watch through the command line on DuckDB and on PostgreSQL alike."""
    with Registry(any_db) as reg:
        b = vf.books_from(reg, [X, SUB])
    good, bad = upstreams(vf.case(b, "faithful", X, seed=5)), upstreams(vf.case(b, "substituted", X, other=SUB))
    run = lambda *args: CliRunner().invoke(cli, ["--db", any_db, *args])      # noqa: E731
    for name, u in (("good", good), ("bad", bad)):
        r = run("endpoints", "add", X, "--base-url", u.url, "--name", f"{X}@{name}")
        assert r.exit_code == 0, r.output
    r = run("verify", X, "-n", "64", "--repeat", "8", "--json")
    assert r.exit_code == 3, r.output
    got = {e["endpoint"]: e["verdict"]["verdict"] for e in json.loads(r.stdout)["endpoints"]}
    assert got == {f"{X}@good": "faithful", f"{X}@bad": "substituted"}
    r = run("watch", "--once", "-n", "16")
    assert r.exit_code in (0, 3), r.output
    r = run("watch", "--status", "--json")
    assert r.exit_code == 0 and len(json.loads(r.stdout)["rounds"]) == 2, r.output
