"""`registry serve --token` probed as an attacker would, over loopback, on a copy of a registry; prints each case.

1. Cost bounded before it is paid: a million texts to POST /route/batch without the token (declared length, and
   chunked), then the largest batch each caller may send (known texts; new texts, which MiniLM encodes), each with
   /health polled every 20 ms and a 4-client route load (separate processes, known texts) beside it: /health's
   p50/p99/max, the server's RSS growth (its own process; with the text encoder's process), the load's answers.
2. Keys go only where the owner bound them: every way a token holder could point a key at their own address
   (PUT /endpoints, ask with a new or an existing model, a base URL moved to another port, rows written before
   serving, an upstream echoing its key): how many requests reached the other address carrying a key, of how many.
3. Bad input is one line: the server's answers to the cases of a lone surrogate in a name, an unparseable base URL,
   and the database's content hash before and after.

    .venv/bin/python bench/server_probe.py [--db registry.duckdb] [--rounds 3] [--json]
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry import Registry  # noqa: E402
from registry.serve import routes_routing as rr  # noqa: E402
from tests.conftest import start_server  # noqa: E402
from tests.http_tools import FakeUpstream, chunked_post, rss_mib  # noqa: E402

TOKEN = "probe-t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BOUND, OTHER = "PROBE_BOUND_KEY", "PROBE_OTHER_SECRET"
SECRETS = {BOUND: "sk-probe-bound-0123456789", OTHER: "probe-cloud-secret-98765"}
MiB = 1 << 20


def tree_rss_mib(pid: int) -> float:
    """The process's resident memory and its children's (the text encoder runs in one)."""
    total = rss_mib(pid)
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        kids = []
    return total + sum(tree_rss_mib(int(k)) for k in kids)


def _route_client(origin: str, texts: list[str], stop_at: float, out) -> None:
    """One client of the route load: known texts, one at a time on a keep-alive connection, until stop_at."""
    host, port = origin.removeprefix("http://").split(":")
    con = http.client.HTTPConnection(host, int(port), timeout=30)
    ok, bad, lat, i = 0, [], [], 0
    while time.time() < stop_at:
        body = json.dumps({"text": texts[i % len(texts)]})
        i += 1
        t0 = time.perf_counter()
        try:
            con.request("POST", "/route", body, {"Content-Type": "application/json"})
            r = con.getresponse()
            r.read()
            if r.status == 200:
                ok += 1
                lat.append(time.perf_counter() - t0)
            else:
                bad.append(r.status)
        except (OSError, http.client.HTTPException) as exc:
            bad.append(type(exc).__name__)
            con = http.client.HTTPConnection(host, int(port), timeout=30)
    out.put((ok, bad, lat))


def _watch_health(origin: str, pid: int, stop, out) -> None:
    """/health every 20 ms and the server's RSS, from a process of its own (a thread beside the request would share
    the sender's GIL, and time the client's JSON work as the server's)."""
    health, rss, tree = [], [], []
    with httpx.Client(timeout=30) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            c.get(origin + "/health")
            health.append(time.perf_counter() - t0)
            rss.append(rss_mib(pid))
            tree.append(tree_rss_mib(pid))
            time.sleep(0.02)
    out.put((health, rss, tree))


def under_watch(proc, origin: str, send, repeat: int = 5) -> dict:
    """Run `send()` (the heavy request) `repeat` times, one after another, while another process polls /health
    every 20 ms; -> its answer, its mean time, /health's latencies and the server's peak RSS growth."""
    base, base_tree = rss_mib(proc.pid), tree_rss_mib(proc.pid)
    ctx = mp.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    watcher = ctx.Process(target=_watch_health, args=(origin, proc.pid, stop, out))
    watcher.start()
    time.sleep(1.0)                                      # (the watcher's interpreter starts)
    t0 = time.perf_counter()
    for _ in range(repeat):
        status, n = send()
    took = (time.perf_counter() - t0) / repeat
    time.sleep(0.3)
    stop.set()
    health, peak, peak_tree = out.get(timeout=60)
    watcher.join()
    return {"status": status, "answers": n, "seconds": round(took, 2),
            "health_p50_ms": round(1000 * float(np.percentile(health, 50)), 1),
            "health_p99_ms": round(1000 * float(np.percentile(health, 99)), 1),
            "health_max_ms": round(1000 * max(health), 1), "health_n": len(health),
            "rss_growth_mib": round(max(peak) - base, 1),
            "rss_growth_with_encoder_mib": round(max(peak_tree) - base_tree, 1)}


def load_beside(origin: str, texts: list[str], seconds: float, send) -> dict:
    """A 4-client route load for `seconds`, with `send()` called twice in it: what the load got."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    stop_at = time.time() + seconds
    clients = [ctx.Process(target=_route_client, args=(origin, texts, stop_at, q)) for _ in range(4)]
    for c in clients:
        c.start()
    time.sleep(seconds / 4)
    send()
    send()
    got = [q.get(timeout=seconds + 60) for _ in clients]
    for c in clients:
        c.join()
    lat = [x for g in got for x in g[2]]
    return {"routes_ok": sum(g[0] for g in got), "routes_failed": sum(len(g[1]) for g in got),
            "route_p99_ms": round(1000 * float(np.percentile(lat, 99)), 1) if lat else None}


def bounds(proc, origin: str, texts: list[str], rounds: int) -> list[dict]:
    rows = []
    body = json.dumps({"texts": ["what is entropy"] * 1_000_000}).encode()
    t0 = time.perf_counter()
    r = httpx.post(origin + "/route/batch", content=body, headers={"Content-Type": "application/json"}, timeout=60)
    rows.append({"case": f"10^6 texts ({len(body) / MiB:.0f} MiB), declared length, no token", "status": r.status_code,
                 "seconds": round(time.perf_counter() - t0, 2), "detail": r.json().get("detail")})
    before = rss_mib(proc.pid)
    status, _, answer, sent = chunked_post(origin, "/route/batch", 18 * MiB)
    rows.append({"case": "18 MiB chunked to /route/batch, no token", "status": status,
                 "read_before_refused_mib": round(sent / MiB, 1), "rss_growth_mib": round(rss_mib(proc.pid) - before, 1)})

    def batch(texts_, auth):
        def send():
            r = httpx.post(origin + "/route/batch", json={"texts": texts_}, headers=auth, timeout=300)
            return r.status_code, len(r.json()) if r.status_code == 200 else r.text
        return send

    known_big = (texts * (rr.BATCH_TEXTS[0] // len(texts) + 1))[:rr.BATCH_TEXTS[0]]
    for k in range(rounds):
        new = [f"probe round {k}: a question never asked before, number {i}, about {w}"
               for i, w in enumerate(["entropy", "tax law", "enzymes", "sonnets"] * (rr.BATCH_NEW_TEXTS[0] // 4))]
        cases = [(f"{rr.BATCH_TEXTS[0]} known texts, token", known_big, AUTH),
                 (f"{rr.BATCH_NEW_TEXTS[0]} new texts, token", new[:rr.BATCH_NEW_TEXTS[0]], AUTH),
                 (f"{rr.BATCH_TEXTS[1]} known texts, no token", known_big[:rr.BATCH_TEXTS[1]], {}),
                 (f"{rr.BATCH_NEW_TEXTS[1]} new texts, no token", [t + " (anon)" for t in new[:rr.BATCH_NEW_TEXTS[1]]],
                  {})]
        for name, texts_, auth in cases:
            rows.append({"case": f"round {k}: {name}", **under_watch(proc, origin, batch(texts_, auth))})
    fresh = [f"load-beside: a question never asked before, number {i}" for i in range(rr.BATCH_NEW_TEXTS[0])]
    rows.append({"case": f"4-client route load for 20 s beside 2 batches of {rr.BATCH_TEXTS[0]} known texts",
                 **load_beside(origin, texts, 20, batch(known_big, AUTH))})
    rows.append({"case": f"4-client route load for 20 s beside 2 batches of {rr.BATCH_NEW_TEXTS[0]} new texts",
                 **load_beside(origin, texts, 20, batch(fresh, AUTH))})
    return rows


def keys(db: Path) -> list[dict]:
    """Every way to point a key elsewhere; -> a row per case with how many requests carried a key elsewhere."""
    good, evil = FakeUpstream(), FakeUpstream()
    with Registry(db) as reg:
        names = [m.name for m in reg.models()][:3]
        reg.set_endpoint(names[0], good.base, upstream_model="good", api_key_env=BOUND)
        reg.set_endpoint(names[1], evil.base, upstream_model="evil-bound", api_key_env=BOUND)
        reg.set_endpoint(names[2], evil.base, upstream_model="evil-other", api_key_env=OTHER)
    os.environ.update(SECRETS)
    proc, origin = start_server(db, TOKEN, ("--upstream-key", f"{BOUND}={good.base}"))
    rows = []
    try:
        def leaked() -> int:
            return sum(1 for _, auth in evil.seen if auth)

        def case(name, fn):
            before = leaked()
            status = fn()
            rows.append({"case": name, "status": status, "keys_sent_elsewhere": leaked() - before})

        post = lambda path, body: httpx.post(origin + path, json=body, headers=AUTH, timeout=60).status_code  # noqa
        put = lambda path, body: httpx.put(origin + path, json=body, headers=AUTH, timeout=60).status_code  # noqa
        chat = lambda m: post("/v1/chat/completions", {"model": m, "messages": [{"role": "user", "content": "hi"}]})  # noqa
        moved = good.base.replace(str(good.port), str(evil.port))
        for var in (OTHER, BOUND):
            for url, where in ((evil.base, "another host:port"), (moved, "the bound host, another port")):
                body = {"base_url": url, "api_key_env": var}
                case(f"PUT /endpoints/{names[0]} -> {where}, key {var}", lambda: put(f"/endpoints/{names[0]}", body))
                case(f"  then the proxy to {names[0]}", lambda: chat(names[0]))
                case(f"ask existing {names[0]} at {where}, key {var}",
                     lambda: post(f"/models/{names[0]}/ask", {**body, "n": 4, "plan": "random"}))
                case(f"ask a new model at {where}, key {var}",
                     lambda: post("/models/probe-new-model/ask", {**body, "n": 4, "plan": "random"}))
        case(f"PUT /endpoints/{names[0]} at the bound origin, key {OTHER}",
             lambda: put(f"/endpoints/{names[0]}", {"base_url": good.base, "api_key_env": OTHER}))
        case(f"proxy to {names[1]} (row written before serving: bound key, other address)", lambda: chat(names[1]))
        case(f"proxy to {names[2]} (row written before serving: unbound key, other address)", lambda: chat(names[2]))
        case("auto routed (every endpoint, some pointing elsewhere)", lambda: chat("auto"))
        good.modes["good"] = "echo"
        r = httpx.post(origin + "/v1/chat/completions", headers=AUTH, timeout=60,
                       json={"model": names[0], "messages": [{"role": "user", "content": "hi"}]})
        echoed = SECRETS[BOUND] in r.text or any(SECRETS[BOUND] in v for v in r.headers.values())
        rows.append({"case": "the bound upstream echoes its key (401 body, X-Echo, Set-Cookie)",
                     "status": r.status_code, "keys_sent_elsewhere": int(echoed),
                     "headers_passed": sorted(h for h in r.headers if h.startswith(("x-echo", "set-cookie")))})
        good.modes.clear()
        case(f"the bound key to its own upstream ({names[0]}): sent, as it should be", lambda: chat(names[0]))
        rows[-1]["key_reached_bound_upstream"] = good.seen[-1][1] == f"Bearer {SECRETS[BOUND]}"
    finally:
        proc.terminate()
        proc.wait(30)
        good.close()
        evil.close()
    return rows


def content_hash(db: Path) -> str:
    with Registry(db) as reg, reg.store.tx() as tx:
        tables = [r[0] for r in tx.sql("SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
                                       "ORDER BY table_name")]
        h = hashlib.sha256()
        for t in tables:
            if t in ("routing_log",):
                continue
            h.update(repr(tx.sql(f'SELECT count(*), sum(hash(x)) FROM (SELECT * FROM "{t}") x')).encode())
    return h.hexdigest()[:16]


def bad_input(db: Path) -> list[dict]:
    before = content_hash(db)
    with Registry(db) as reg:
        m = reg.models()[0].name
    proc, origin = start_server(db, TOKEN)
    rows = []
    try:
        cases = [("POST /models, a lone surrogate in the name", "POST", "/models",
                  '{"name": "\\ud800 x", "evaluations": [{"question_id": "1", "correct": 1}]}'),
                 ("POST /models, a lone surrogate in the family", "POST", "/models",
                  '{"name": "ok-name", "family": "\\udfff", "evaluations": [{"question_id": "1", "correct": 1}]}'),
                 ("PUT /endpoints/M, base_url http://]bad", "PUT", "/endpoints/{m}", '{"base_url": "http://]bad"}'),
                 ("POST /models/00/ask, base_url http://]bad", "POST", "/models/00/ask",
                  '{"base_url": "http://]bad", "n": 2}'),
                 ("POST /route, a lone surrogate in the text", "POST", "/route", '{"text": "\\ud800"}')]
        for name, method, path, body in cases:
            r = httpx.request(method, origin + path.format(m=m), content=body.encode(), timeout=60,
                              headers={**AUTH, "Content-Type": "application/json"})
            one_line = r.headers.get("content-type", "").startswith("application/json") and "\n" not in r.text
            rows.append({"case": name, "status": r.status_code, "one_line_json": one_line,
                         "message": (r.json().get("detail") if one_line else r.text[:80])})
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0] or ""
    rows.append({"case": "server log: tracebacks", "status": out.count("Traceback")})
    rows.append({"case": "database content hash unchanged", "status": content_hash(db) == before})
    return rows


def show(part: str, rows: list[dict], quiet: bool) -> list[dict]:
    if not quiet:
        print(f"\n== {part}", flush=True)
        for row in rows:
            print("  " + row["case"] + ": " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "case"),
                  flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=str(ROOT / "registry.duckdb"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip", nargs="*", default=[], choices=["bounds", "keys", "bad-input"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-probe-"))
    out: dict[str, list[dict]] = {}
    try:
        if "bounds" not in args.skip:
            db = work / "bounds.duckdb"
            shutil.copy(args.db, db)
            with Registry(db) as reg, reg.store.tx() as tx:
                texts = [r[0] for r in tx.sql("""SELECT q.text FROM queries q JOIN text_vectors v
                                                 ON v.content_hash = q.content_hash ORDER BY random() LIMIT 500""")]
            proc, origin = start_server(db, TOKEN)
            try:
                httpx.post(origin + "/route", json={"text": "warm up the encoder process"}, timeout=120)
                out["bounds"] = show("bounds", bounds(proc, origin, texts, args.rounds), args.json)
            finally:
                proc.terminate()
                proc.wait(30)
        if "keys" not in args.skip:
            db = work / "keys.duckdb"
            shutil.copy(args.db, db)
            out["keys"] = show("keys", keys(db), args.json)
        if "bad-input" not in args.skip:
            db = work / "bad.duckdb"
            shutil.copy(args.db, db)
            out["bad_input"] = show("bad input", bad_input(db), args.json)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=1))
    if "keys" in out:
        n = sum(1 for r in out["keys"] if "keys_sent_elsewhere" in r)
        print(f"\nkeys sent to an address the owner did not bind: {sum(r['keys_sent_elsewhere'] for r in out['keys'])}"
              f" of {n} cases")


if __name__ == "__main__":
    main()
