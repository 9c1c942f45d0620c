"""`registry watch` against fake upstreams on loopback built from a registered model's real answers: a faithful
endpoint raises no event, a switch (faithful for 4 rounds, then degraded) raises one with its evidence, printed as a
JSON line and POSTed to the owner's webhook; `--status` shows the timeline; the sequential test's thresholds hold
their false-alarm rate."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from click.testing import CliRunner

from registry.api import Registry
from registry.asking import sequential
from registry.cli import cli
from registry.core.errors import Conflict, InputError

from . import verify_fakes as vf
from .http_tools import ChatUpstream

X = "gpt-4o-2024-05-13"


class Hook:
    """A webhook that records every JSON body POSTed to it; it answers with `statuses` in turn (then 204), or, with
    `drip`, sends a byte every 0.5 s and never finishes."""

    def __init__(self, statuses: list[int] | None = None, drip: bool = False):
        self.bodies, self.taken = [], []       # every body POSTed; those answered 2xx
        self.statuses = list(statuses or [])
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                hook.bodies.append(body)
                if drip:
                    self.send_response(200)
                    self.send_header("content-length", "1000")
                    self.end_headers()
                    for _ in range(60):
                        try:
                            self.wfile.write(b" ")
                            self.wfile.flush()
                        except OSError:
                            return
                        time.sleep(0.5)
                    return
                status = hook.statuses.pop(0) if hook.statuses else 204
                if 200 <= status < 300:
                    hook.taken.append(body)
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("location", "http://127.0.0.1:9/elsewhere")
                self.send_header("content-length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fakes(db_copy):
    b = vf.books(db_copy, [X])
    faithful, switch = vf.case(b, "faithful", X, seed=1), vf.case(b, "switch", X, seed=2, degrade=0.4)
    ups = [ChatUpstream(faithful), ChatUpstream(switch)]
    hook = Hook()
    with Registry(db_copy) as reg:
        reg.claim(X, ups[0].url, name=f"{X}@steady")
        reg.claim(X, ups[1].url, name=f"{X}@switch")
    yield switch, ups, hook
    for u in ups:
        u.close()
    hook.close()


@pytest.mark.slow
def test_a_switch_is_an_event_and_a_faithful_endpoint_raises_none(db_copy, fakes):
    switch, ups, hook = fakes
    events, printed = [], []
    for t in range(1, 9):
        switch.degrading = t > 4
        r = CliRunner().invoke(cli, ["--db", str(db_copy), "watch", "--once", "-n", "16", "--webhook", hook.url])
        assert r.exit_code in (0, 3), r.output
        printed += [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
        assert (r.exit_code == 3) == any(e["round"] == t for e in printed)
    events = [e for e in printed]
    assert [e["endpoint"] for e in events] == [f"{X}@switch"], events      # none from the steady one
    e = events[0]
    assert 5 <= e["round"] <= 7 and e["change"] == "faithful -> degraded"
    assert e["evidence"]["verdict"]["drop"] > 0.1 and e["evidence"]["s_drop"] > e["evidence"]["h_drop"]
    assert [b["endpoint"] for b in hook.bodies] == [f"{X}@switch"] and hook.bodies[0]["round"] == e["round"]
    with Registry(db_copy) as reg:
        status = reg.watch(status=True)
    assert len(status.rounds) == 16 and [x.endpoint for x in status.events] == [f"{X}@switch"]
    mine = [x for x in status.rounds if x.endpoint == f"{X}@switch"]
    # each round says the verdict on the answers so far: the first 16 are too few for one
    assert set(x.verdict for x in mine[:e["round"] - 1]) <= {"faithful", "not conclusive"}, mine
    assert mine[-1].verdict == "degraded" and sum(x.worse_held for x in mine[4:]) > sum(x.worse_held for x in mine[:4])
    assert all(x.n == 16 and len(x.accuracy_ci) == 2 for x in status.rounds)
    # every round its own import batches, every question fresh
    import duckdb
    con = duckdb.connect(str(db_copy), read_only=True)
    per = con.execute("""SELECT m.name, count(*), count(DISTINCT a.query_id), count(DISTINCT a.batch_id)
                         FROM asked_answers a JOIN models m ON m.id = a.model_id GROUP BY 1 ORDER BY 1""").fetchall()
    con.close()
    for name, answers, questions, batches in per:
        assert questions == 8 * 16 and batches >= 8, (name, answers, questions, batches)
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "watch", "--status"])
    assert r.exit_code == 0 and "faithful -> degraded" in r.output
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "watch", "--status", "--json"])
    assert len(json.loads(r.stdout)["rounds"]) == 16


def test_watch_needs_a_watched_endpoint_and_sane_options(db_copy):
    with Registry(db_copy) as reg:
        with pytest.raises(Conflict, match="no endpoint is watched"):
            reg.watch(n=16)
        with pytest.raises(InputError):
            reg.watch(n=2)
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "watch", "--once", "--every", "1h"])
    assert r.exit_code == 2
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "watch", "--every", "soon"])
    assert r.exit_code == 2 and "--every" in r.output


@pytest.mark.slow
def test_the_thresholds_hold_their_false_alarm_rate():
    """Simulated faithful runs (held disagreements Poisson(lam) per side) pass the threshold in at most ALPHA of
    HORIZON-round runs, and a drop of 3 per round passes it within 4 rounds."""
    lam = 0.2
    rng = np.random.default_rng(7)
    fired = 0
    for _ in range(2000):
        s = sequential.State(calm_questions=10_000, calm_held=int(2 * lam / 64 * 10_000))
        for _ in range(sequential.HORIZON):
            s, alarm, _ = sequential.step(s, int(rng.poisson(lam)), int(rng.poisson(lam)), 64)
            if alarm:
                fired += 1
                break
    assert fired / 2000 <= 2 * sequential.ALPHA
    s = sequential.State()
    for t in range(1, 5):     # noqa: B007 (t is read after the loop)
        s, alarm, _ = sequential.step(s, 3, 0, 64)
        if alarm:
            break
    assert alarm == "drop" and t <= 4


@pytest.mark.slow
def test_over_http_with_the_token_through_the_writer_and_the_web_page(db_copy, monkeypatch):
    import httpx

    from .conftest import start_server

    b = vf.books(db_copy, [X])
    steady = ChatUpstream(vf.case(b, "faithful", X, seed=4))
    monkeypatch.setenv("WATCH_TEST_SECRET", "do-not-send")
    proc, origin = start_server(db_copy, token="t0ken")
    auth = {"authorization": "Bearer t0ken"}
    try:
        body = {"base_url": steady.url, "name": f"{X}@http"}
        assert httpx.post(f"{origin}/models/{X}/claims", json=body, timeout=30).status_code == 401
        r = httpx.post(f"{origin}/models/{X}/claims", json={**body, "api_key_env": "WATCH_TEST_SECRET"},
                       headers=auth, timeout=30)
        assert r.status_code == 409 and "WATCH_TEST_SECRET" in r.json()["detail"]     # not bound: refused
        assert httpx.get(f"{origin}/models/{X}@http", timeout=30).status_code == 404  # nothing written
        r = httpx.post(f"{origin}/models/{X}/claims", json={**body, "reference": True}, headers=auth, timeout=30)
        assert r.status_code == 403 and "the owner's" in r.json()["detail"]          # the reference mark: not here
        assert httpx.get(f"{origin}/models/{X}@http", timeout=30).status_code == 404
        r = httpx.post(f"{origin}/models/{X}/claims", json=body, headers=auth, timeout=30)
        assert r.status_code == 200 and r.json()["endpoint"] == f"{X}@http", r.text
        assert httpx.post(f"{origin}/models/{X}/verify", json={"n": 64}, timeout=30).status_code == 401
        r = httpx.post(f"{origin}/models/{X}/verify", json={"n": 64, "repeat": 8}, headers=auth, timeout=120)
        assert r.status_code == 200 and r.json()["faithful"] is True, r.text
        assert httpx.post(f"{origin}/watch", json={"n": 16}, timeout=30).status_code == 401
        for _ in range(2):
            r = httpx.post(f"{origin}/watch", json={"n": 16}, headers=auth, timeout=120)
            assert r.status_code == 200 and r.json()["events"] == [], r.text
        rounds = httpx.get(f"{origin}/watch", timeout=30).json()["rounds"]
        assert [x["round"] for x in rounds] == [1, 2] and rounds[0]["endpoint"] == f"{X}@http"
        page = httpx.get(f"{origin}/ui/endpoints/{X}", timeout=30)
        assert page.status_code == 200 and f"{X}@http: timeline" in page.text and "faithful" in page.text
        assert httpx.get(f"{origin}/ui/endpoints/no-such-model", timeout=30).status_code == 404
        assert steady.auth and set(steady.auth) == {None}          # no key was ever sent
    finally:
        proc.terminate()
        proc.wait(30)
        steady.close()


@pytest.mark.slow
def test_an_outage_is_one_unreachable_event_never_degraded_and_every_event_reaches_the_webhook(db_copy, fakes):
    """The steady endpoint down for 6 rounds: its rounds say unreachable, one event says so, none says degraded,
    and coming back is one event. The webhook answers 500 five times, then 200: the outage event, kept undelivered
    after its round's three tries, goes in the next round, and each event arrives once."""
    switch, ups, _ = fakes
    switch.degrading = False
    hook = Hook(statuses=[500] * 5)
    steady = f"{X}@steady"
    rounds, events = [], []
    try:
        with Registry(db_copy) as reg:
            for t in range(1, 11):
                if t == 3:
                    ups[0].down()
                if t == 9:
                    ups[0].up()
                r = reg.watch(n=16, webhook=hook.url, retries=0)
                rounds += [x for x in r.rounds if x.endpoint == steady]
                events += [e for e in r.events if e.endpoint == steady]
    finally:
        hook.close()
    verdicts = [x.verdict for x in rounds]
    assert verdicts[2:8] == ["unreachable"] * 6 and "degraded" not in verdicts, verdicts
    assert all("answered none" in x.note for x in rounds[2:8]), [x.note for x in rounds]
    assert [e.change for e in events] == ["faithful -> unreachable", "unreachable -> faithful"], events
    taken = [(b["endpoint"], b["change"]) for b in hook.taken]
    assert taken == [(steady, "faithful -> unreachable"), (steady, "unreachable -> faithful")], hook.bodies
    assert len({b["delivery"] for b in hook.taken}) == 2
    assert len(hook.bodies) == 3 + 3 + 1          # 3 tries in round 3, 3 in round 4 (the third taken), 1 for the last
    with Registry(db_copy) as reg, reg.store.tx() as tx:
        assert tx.sql("SELECT count(*) FROM watch_deliveries WHERE delivered IS NULL")[0][0] == 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["drip", "redirect", "refused"])
def test_a_webhook_that_does_not_take_an_event_keeps_it_and_never_stalls(db_copy, kind):
    from registry.asking import webhook

    hook = Hook(drip=True) if kind == "drip" else Hook(statuses=[302] * 9) if kind == "redirect" else None
    url = hook.url if hook else "http://127.0.0.1:9/hook"
    try:
        with Registry(db_copy) as reg:
            with reg.store.tx() as tx:
                tx.sql("INSERT INTO watch_deliveries (url, event) VALUES (?, ?) RETURNING id",
                       [url, json.dumps({"endpoint": "e", "change": "faithful -> degraded"})])
            t0 = time.monotonic()
            failures = webhook.deliver(reg.store, url, budget=2.0)
            took = time.monotonic() - t0
            with reg.store.tx() as tx:
                kept = tx.sql("SELECT attempts, last_error FROM watch_deliveries WHERE delivered IS NULL")
    finally:
        if hook:
            hook.close()
    assert took < 3.5, took
    assert len(failures) == 1 and "kept, and sent again next round" in failures[0], failures
    assert len(kept) == 1 and kept[0][0] >= 1
    assert {"drip": "no answer within", "redirect": "redirected (HTTP 302)", "refused": "ConnectError"}[kind] in \
        failures[0], failures


def test_a_webhook_url_may_carry_a_query_but_nothing_odd():
    from registry.data.endpoints import parse_webhook_url

    assert parse_webhook_url("https://Hooks.Example.com/services/T1?token=abc&x=1") == \
        "https://hooks.example.com/services/T1?token=abc&x=1"
    for bad, why in [("https://h.example/x#frag", "fragment"), ("https://h.example/x?", "query is empty"),
                     ("https://h.example/x?a b", "spaces"), ("ftp://h.example/x?a=1", "http:// or https://"),
                     ("https://user:pw@h.example/x?a=1", "credentials")]:
        with pytest.raises(InputError) as caught:
            parse_webhook_url(bad)
        assert why in str(caught.value), (bad, str(caught.value))
