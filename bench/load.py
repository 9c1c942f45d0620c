"""The server under load, for real over loopback (issue 13, bars 1 and 3): `registry serve` on a copy of the registry,
N client processes for D seconds, each request drawn from the issue's mix: 70% routes of texts the registry already
embedded, 20% routes of new short texts (MiniLM runs), 10% registrations of a new model with 64 evaluations. The
floor for a new text, a bare single-text MiniLM encode, is measured in this process in the same run.

Afterwards the file is checked: every evaluation a registration was acknowledged for and every version the server
reported must be there, and every acknowledged route must have its routing-log row.

With `--kill-after S` the server is SIGKILLed S seconds into the load instead of stopped (bar 3): acknowledged writes
must all be there, log rows may be missing only for routes answered within the documented window before the kill
(2 x the longest writer cycle, read from /health just before, + the writer's 0.1 s flush interval), the file must
open, and `registry onboard` must finish any onboarding job the kill left pending.

    .venv/bin/python bench/load.py [--clients 8 --seconds 60] [--rate 100] [--kill-after 30]
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TOKEN = "load-test"
OPEN_LOOP_CONNECTIONS = 4      # per client process, with --rate
WORDS = ("entropy gradient theorem enzyme tariff contract voltage protein orbit ledger statute molecule derivative "
         "inflation neuron catalyst verdict torque genome equilibrium").split()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=str(ROOT / "registry.duckdb"))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--kill-after", type=float, default=None, help="SIGKILL the server this many seconds in")
    ap.add_argument("--rate", type=float, default=None,
                    help="offered requests/s in all (open loop: each client sends at Poisson times, and a latency "
                         "counts from when its request was due); default: closed loop, each client sends its next "
                         "request as soon as it has the answer (the server saturated)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--http", choices=["plain", "httpx"], default="plain",
                    help="the clients' HTTP library: the standard library's keep-alive connection (lighter) or httpx")
    args = ap.parse_args()
    from registry import Registry
    from registry.data import outbox
    from registry.locus import text_encoder as textvec

    work = Path(tempfile.mkdtemp(prefix="bench-load-"))
    db = work / "registry.duckdb"
    shutil.copy(args.db, db)
    with Registry(db) as reg, reg.store.tx() as tx:
        # texts whose vectors are stored (every imported query's): "known" texts
        texts = [r[0] for r in tx.sql("""SELECT q.text FROM queries q JOIN text_vectors v ON v.content_hash = q.content_hash
                                         ORDER BY random() LIMIT 500""")]
        qids = [r[0] for r in tx.sql("""SELECT q.external_id FROM queries q LEFT JOIN query_splits s
                                        ON s.query_id = q.id WHERE coalesce(s.split, '') <> 'test'""")]
        log_before = tx.sql("SELECT count(*) FROM routing_log")[0][0]

    # the floor: a bare single-text MiniLM encode of a new short text, in this process, before and after the load
    # (the lower median counts: the stricter bar)
    textvec.load_model()
    textvec.encode(["warm up the floor"])
    floor_before = _bare_encode_ms(textvec, "before")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "registry", "--db", str(db), "serve", "--port", str(port),
                             "--token", TOKEN], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(work / "server.log", "w"))
    base = f"http://127.0.0.1:{port}"
    _wait(base, proc, work / "server.log")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    # before the clock: MiniLM loaded in the server, and one registration (the encoder's first forward pass)
    httpx.post(f"{base}/route", json={"text": "warm up"}, timeout=120)
    warm = [{"question_id": q, "correct": i % 2 == 0} for i, q in enumerate(qids[:64])]
    httpx.post(f"{base}/models", json={"name": "load-warm-up", "evaluations": warm}, headers=auth, timeout=120)

    lat: dict[str, list[float]] = {}
    failures: list[str] = []
    acked_evals: dict[str, set[str]] = {}           # model -> question ids of acknowledged registrations
    acked_versions: dict[str, int] = {}             # model -> the version the server reported
    routed: list[tuple[str, float]] = []            # (text, time the answer arrived) of acknowledged routes
    # each client is its own process, as the applications in front of a router are: client threads in one process
    # would share its GIL, and what they measured would include waiting for each other
    ctx = mp.get_context("spawn")
    lock, killed, results = ctx.Lock(), ctx.Event(), ctx.Queue()
    t_start = time.time()
    stop = t_start + args.seconds
    procs = [ctx.Process(target=_client, args=(k, base, auth, texts, qids, stop, lock, killed, results, args.http,
                                                    args.rate / args.clients if args.rate else None))
             for k in range(args.clients)]
    for p in procs:
        p.start()
    during: list[float] = []          # the same bare encode, side by side with the load (one every 0.5 s)

    def floor_under_load() -> None:
        i = 0
        while time.time() < stop and not killed.is_set():
            text = _short_text(random.Random(50_000 + i), f"during {i}")
            t0 = time.perf_counter()
            textvec.encode([text])
            during.append(time.perf_counter() - t0)
            i += 1
            time.sleep(0.5)

    floor = threading.Thread(target=floor_under_load)
    floor.start()
    window_s = kill_time = longest_cycle_ms = None
    if args.kill_after is not None:
        time.sleep(max(0.0, t_start + args.kill_after - time.time() - 0.5))
        longest_cycle_ms = httpx.get(f"{base}/health", timeout=30).json()["writer"]["longest_cycle_ms"]
        time.sleep(0.5)
        with lock:                                       # no answer is counted after this instant
            killed.set()
            kill_time = time.time()
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        window_s = 2 * longest_cycle_ms / 1000 + 0.1
    for _ in procs:                                  # each client's results, once its loop ends
        c_lat, c_failures, c_evals, c_versions, c_routed = results.get()
        for kind, xs in c_lat.items():
            lat.setdefault(kind, []).extend(xs)
        failures += c_failures
        acked_evals.update(c_evals)
        acked_versions.update(c_versions)
        routed += c_routed
    for p in procs:
        p.join()
    floor.join()
    wall = (kill_time or time.time()) - t_start
    health = None
    if kill_time is None:
        health = httpx.get(f"{base}/health", timeout=30).json()
        proc.terminate()
        proc.wait(timeout=120)

    bare_ms = min(floor_before, _bare_encode_ms(textvec, "after"))
    bare_load_ms = 1000 * float(np.median(during)) if during else float("nan")

    # --- the file afterwards ----------------------------------------------------------------------------------------
    checks: dict[str, object] = {}
    onboard = None
    if kill_time is not None:
        with Registry(db) as reg, reg.store.tx() as tx:              # the file opens after the kill
            checks["pending_jobs_after_kill"] = len(outbox.pending(tx))
        onboard = subprocess.run([sys.executable, "-m", "registry", "--db", str(db), "onboard", "--json"],
                                 cwd=ROOT, capture_output=True, text=True)
        checks["onboard_exit"] = onboard.returncode
    missing = []
    with Registry(db) as reg, reg.store.tx() as tx:
        checks["pending_jobs_at_end"] = len(outbox.pending(tx))
        have: dict[str, set[str]] = {}
        for name, q in tx.sql("""SELECT m.name, q.external_id FROM evaluations e JOIN models m ON m.id = e.model_id
                                 JOIN queries q ON q.id = e.query_id WHERE m.name LIKE 'load-%'"""):
            have.setdefault(name, set()).add(q)
        for name, q in acked_evals.items():
            if q - have.get(name, set()):
                missing.append(f"{name}: {len(q - have.get(name, set()))} acknowledged evaluations missing")
        vers = {(n, v) for n, v in tx.sql("""SELECT m.name, v.version FROM embedding_versions v
                                            JOIN models m ON m.id = v.model_id WHERE m.name LIKE 'load-%'""")}
        missing += [f"{n}: version {v} missing" for n, v in acked_versions.items() if (n, v) not in vers]
        logged = Counter(t for (t,) in tx.sql("SELECT text FROM routing_log ORDER BY id OFFSET ?", [log_before]))
    # an acknowledged route without its log row: lost. Texts repeat (known ones), so per text the newest answers
    # are taken as the lost ones, and every new text is unique, so for those the attribution is exact.
    by_text: dict[str, list[float]] = {}
    for text, at in routed:
        by_text.setdefault(text, []).append(at)
    lost_at = []
    for text, ats in by_text.items():
        extra = len(ats) - logged.get(text, 0)
        if extra > 0:
            lost_at += sorted(ats)[-extra:]
    lost_outside = [at for at in lost_at if kill_time is None or at < kill_time - window_s]

    total = sum(len(v) for v in lat.values())
    pct = {kind: (1000 * float(np.percentile(xs, 50)), 1000 * float(np.percentile(xs, 99)), len(xs))
           for kind, xs in sorted(lat.items())}
    result = {
        "clients": args.clients, "offered_per_s": args.rate, "seconds": round(wall, 1), "requests": total,
        "per_s": round(total / wall, 1),
        "failures": len(failures), "bare_encode_ms": round(bare_ms, 1),
        "bare_encode_under_load_ms": round(bare_load_ms, 1),
        "latency_ms": {k: {"p50": round(a, 1), "p99": round(b, 1), "n": n} for k, (a, b, n) in pct.items()},
        "acked_registrations": len(acked_evals), "acked_evaluations": sum(len(v) for v in acked_evals.values()),
        "missing": len(missing), "acked_routes": len(routed), "log_rows_lost": len(lost_at),
        "log_rows_lost_outside_window": len(lost_outside), "killed": kill_time is not None,
        "window_s": window_s, "longest_cycle_ms": longest_cycle_ms, **checks,
        "server_stats": health,
    }
    ok = not failures and not missing and not lost_outside and checks.get("onboard_exit", 0) == 0 \
        and checks["pending_jobs_at_end"] == 0
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.clients} clients for {wall:.0f} s over loopback{' (SIGKILLed)' if kill_time else ''}"
              f"{f', offered {args.rate:g} requests/s (open loop)' if args.rate else ' (closed loop)'}: "
              f"{total} requests ({total / wall:.1f}/s), {len(failures)} failed; "
              f"{result['acked_evaluations']} evaluations acknowledged for {len(acked_evals)} new models, "
              f"missing afterwards: {len(missing)}")
        print(f"bare single-text MiniLM encode (this process, same run): p50 {bare_ms:.1f} ms idle (before and "
              f"after the load), {bare_load_ms:.1f} ms under the load (one every 0.5 s, side by side)")
        print(f"{'kind':<14} {'n':>6} {'p50 ms':>8} {'p99 ms':>8}")
        for kind, (p50, p99, n) in pct.items():
            print(f"{kind:<14} {n:>6} {p50:>8.1f} {p99:>8.1f}")
        if "route new" in pct:
            print(f"new-text route p50 / bare encode p50: {pct['route new'][0] / bare_ms:.2f}x idle, "
                  f"{pct['route new'][0] / bare_load_ms:.2f}x under the load")
        print(f"routing-log rows: {len(routed)} routes acknowledged, {len(lost_at)} rows lost"
              + (f", {len(lost_outside)} of them answered before the window "
                 f"(kill - {window_s:.3f} s; longest writer cycle {longest_cycle_ms} ms)" if kill_time else ""))
        if kill_time:
            print(f"after the kill: the file opened with {checks['pending_jobs_after_kill']} pending onboarding "
                  f"jobs; `registry onboard` exited {checks['onboard_exit']}, "
                  f"{checks['pending_jobs_at_end']} pending afterwards")
        elif health:
            print(f"server: {json.dumps(health['writer'])}, {health['text_batches']} text batches for "
                  f"{health['texts_encoded']} texts")
            print("inside the server (handler start to answer): " + ", ".join(
                f"{k} p50 {v['p50_ms']} ms, p99 {v['p99_ms']} ms" for k, v in health.get("inside", {}).items()))
        for f in failures[:5] + missing[:5]:
            print("  ", f)
        if onboard is not None and onboard.returncode:
            print("  onboard:", onboard.stderr.strip()[-500:])
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


class _Plain:
    """A keep-alive HTTP/1.1 connection by the standard library: a request costs the client a fraction of what
    httpx's costs, which matters when the 8 clients share the server's two cores (--http httpx: the old client)."""

    def __init__(self, base: str, auth: dict):
        host, port = base.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=120)
        self.headers = {"Content-Type": "application/json", **auth}

    def post(self, path: str, body: dict) -> tuple[int, str]:
        try:
            self.conn.request("POST", path, json.dumps(body), self.headers)
            r = self.conn.getresponse()
            return r.status, r.read().decode()
        except (OSError, http.client.HTTPException):
            self.conn.close()          # the next request opens a new connection
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.conn.close()


class _Httpx:
    def __init__(self, base: str, auth: dict):
        self.c = httpx.Client(base_url=base, timeout=120, headers=auth)

    def post(self, path: str, body: dict) -> tuple[int, str]:
        r = self.c.post(path, json=body)
        return r.status_code, r.text

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.c.close()


def _connection(base: str, auth: dict, http_lib: str):
    return _Plain(base, auth) if http_lib == "plain" else _Httpx(base, auth)


def _client(k: int, base: str, auth: dict, texts: list[str], qids: list[str], stop: float, lock, killed,
            results, http_lib: str = "plain", rate: float | None = None) -> None:
    """One client process: requests drawn from the issue's mix until `stop`; its latencies and what was
    acknowledged go back through `results` at the end.

    Closed loop (no rate): one connection, each request sent as soon as the last one is answered. Open loop (rate:
    this client's requests/s): requests are due at Poisson times and sent from a pool of OPEN_LOOP_CONNECTIONS
    connections (as an application's concurrent users would: a slow registration does not hold back the next
    route), and a latency counts from when the request was due, so a server that falls behind is charged for the
    wait (no coordinated omission)."""
    lat: dict[str, list[float]] = {}
    failures: list[str] = []
    acked_evals: dict[str, set[str]] = {}
    acked_versions: dict[str, int] = {}
    routed: list[tuple[str, float]] = []
    rnd = random.Random(k)
    local = threading.local()
    opened: list = []

    def send(kind: str, path: str, body: dict, t0: float) -> None:
        if not hasattr(local, "c"):
            local.c = _connection(base, auth, http_lib)
            opened.append(local.c)
        try:
            status, text = local.c.post(path, body)
            ok, detail = status == 200, ""
        except (httpx.HTTPError, OSError, http.client.HTTPException) as exc:
            ok, detail, text = False, repr(exc), ""
        dt = time.perf_counter() - t0
        if not ok and not detail:
            detail = f"{status} {text[:200]}"
        with lock:          # the kill is set under the same lock: no answer is counted after it
            if not ok:
                if not killed.is_set():        # after the kill, in-flight requests fail by design
                    failures.append(f"{kind}: {detail}")
                return
            lat.setdefault(kind, []).append(dt)
            if kind == "register":
                acked_evals[body["name"]] = {e["question_id"] for e in body["evaluations"]}
                version = json.loads(text)["version"]
                if version is not None:
                    acked_versions[body["name"]] = version
            else:
                routed.append((body["text"], time.time()))

    pool = ThreadPoolExecutor(OPEN_LOOP_CONNECTIONS) if rate else None
    n = 0
    due = time.perf_counter() + (rnd.expovariate(rate) if rate else 0.0)
    while time.time() < stop and not killed.is_set():
        n += 1
        if rate:
            time.sleep(max(0.0, due - time.perf_counter()))
        roll = rnd.random()
        body: dict
        if roll < 0.7:
            kind, path, body = "route known", "/route", {"text": rnd.choice(texts)}
        elif roll < 0.9:
            kind, path, body = "route new", "/route", {"text": _short_text(rnd, f"{k}-{n}")}
        else:
            body = {"name": f"load-{k}-{n}", "params_b": 7,
                    "evaluations": [{"question_id": q, "correct": rnd.random() < 0.5} for q in rnd.sample(qids, 64)]}
            kind, path = "register", "/models"
        if rate:
            pool.submit(send, kind, path, body, due)
            due += rnd.expovariate(rate)
        else:
            send(kind, path, body, time.perf_counter())
    if pool:
        pool.shutdown(wait=True)
    for c in opened:
        c.__exit__(None, None, None)
    results.put((lat, failures, acked_evals, acked_versions, routed))


def _bare_encode_ms(textvec, tag: str, n: int = 40) -> float:
    times = []
    for i in range(n):
        text = _short_text(random.Random(hash(tag) + i), f"floor {tag} {i}")
        t0 = time.perf_counter()
        textvec.encode([text])
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times))


def _short_text(rnd: random.Random, tag: str) -> str:
    """A new short question, never seen by the registry (tag makes it unique)."""
    return f"Explain how {' '.join(rnd.choices(WORDS, k=rnd.randint(6, 14)))} relate ({tag})?"


def _wait(base: str, proc, log: Path) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited at start-up: {log.read_text()[-1000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    sys.exit("the server did not start in 120 s")


if __name__ == "__main__":
    main()
