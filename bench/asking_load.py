"""A token holder's worst asking, and everyone else's requests beside it.

    .venv/bin/python bench/asking_load.py --db registry.duckdb [--seconds 60] [--clients 4]

On a copy of the registry: a claim of gpt-4o-2024-05-13 on a fake upstream that answers every request in 30 s, then
`registry serve --token`; two `POST /models/X/verify` at the schema's largest values (the budget's two slots; a third
is refused) run while `--clients` client threads send, for `--seconds`, a mix of registrations (`POST /models`, 64
answers of its own, a new name each), reads (`GET /models`, `/stats`, `/models/X/similar`) and pages (`/`, `/ui/models/X`),
each timed. Then: the server's threads and RSS against before the asking (a warm server: one request of each kind
made first), and SIGTERM to exit (both verifies still asking). Prints one table. (A client that hangs up stops its asking within 5 s: tests/test_asking_budget.py.)
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
X = "gpt-4o-2024-05-13"
AUTH = {"authorization": "Bearer t0ken"}
LARGEST = {"n": 2048, "repeat": 256, "concurrency": 16, "deadline": 120.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_figures(pid: int) -> tuple[int, float]:
    """(threads, RSS in MB) of a process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    get = {line.split(":")[0]: line.split(":")[1].strip() for line in status.splitlines() if ":" in line}
    return int(get["Threads"]), int(get["VmRSS"].split()[0]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--no-asking", action="store_true", help="the same load without the verifies (the baseline)")
    args = ap.parse_args()
    from registry import Registry
    from tests.http_tools import ChatUpstream

    tmp = tempfile.mkdtemp()
    db = os.path.join(tmp, "r.duckdb")
    shutil.copy(args.db, db)
    upstream = ChatUpstream(lambda text: "A", latency=30)
    with Registry(db) as reg:
        reg.claim(X, upstream.url, name=f"{X}@slow")
        with reg.store.tx() as tx:
            qids = [r[0] for r in tx.sql("SELECT external_id FROM queries ORDER BY id LIMIT 64")]
    port = free_port()
    origin = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([str(ROOT / ".venv/bin/registry"), "--db", db, "serve", "--port", str(port), "--token",
                               "t0ken"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = httpx.Client(base_url=origin, timeout=120)
    while True:
        try:
            if client.get("/health").json().get("ready"):
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    # the baseline is a warm server: one request of each kind first (the encoder loaded, the pages' first build,
    # each read's first statement), so that what is measured is what asking and the load add, not start-up
    client.post("/models", headers=AUTH, json={"name": "warm-up", "evaluations": [
        {"question_id": q, "correct": j % 3 == 0} for j, q in enumerate(qids)]})
    for path in ("/", f"/ui/models/{X}", "/models", "/stats", f"/models/{X}/similar"):
        client.get(path)
    threads0, rss0 = proc_figures(server.pid)

    def verify():
        try:
            httpx.post(f"{origin}/models/{X}/verify", json=LARGEST, headers=AUTH, timeout=3600)
        except httpx.HTTPError:
            pass
    third = None
    if not args.no_asking:
        for _ in range(2):
            threading.Thread(target=verify, daemon=True).start()
        while upstream.requests < 32:
            time.sleep(0.2)
        third = client.post(f"/models/{X}/verify", json={"n": 8}, headers=AUTH).status_code

    times: dict[str, list[float]] = {"registration": [], "read": [], "page": [], "page /": [], "page /ui/models/X": []}
    failures: list[str] = []
    stop = time.monotonic() + args.seconds
    peak = [threads0, rss0]

    def user(i: int):
        c = httpx.Client(base_url=origin, timeout=60)
        k = 0
        while time.monotonic() < stop:
            k += 1
            kind = ("registration", "read", "read", "page")[k % 4]
            t0 = time.monotonic()
            if kind == "registration":
                # (answers of its own: a copy of an earlier registration's is recorded as its alias)
                own = np.random.default_rng([i, k]).integers(0, 2, len(qids))
                r = c.post("/models", headers=AUTH, json={"name": f"load-{i}-{k}", "evaluations": [
                    {"question_id": q, "correct": int(own[j])} for j, q in enumerate(qids)]})
            elif kind == "read":
                r = c.get(("/models", "/stats", f"/models/{X}/similar")[k % 3])
            else:
                path = ("/", f"/ui/models/{X}")[(k // 4) % 2]
                r = c.get(path)
                times["page " + path.replace(X, "X")].append(time.monotonic() - t0)
            times[kind].append(time.monotonic() - t0)
            if r.status_code != 200:
                failures.append(f"{kind} {r.status_code}")

    users = [threading.Thread(target=user, args=(i,)) for i in range(args.clients)]
    for u in users:
        u.start()
    while any(u.is_alive() for u in users):
        t, m = proc_figures(server.pid)
        peak = [max(peak[0], t), max(peak[1], m)]
        time.sleep(0.5)

    server.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    server.wait(timeout=120)
    term = time.monotonic() - t0
    upstream.close()
    print(f"| {args.clients} clients, {args.seconds:g} s, "
          f"{'no asking' if args.no_asking else 'beside 2 verifies at the largest values on a 30 s upstream'} "
          f"| p50 (s) | p99 (s) | max (s) | n |")
    print("|---|---|---|---|---|")
    for kind, ts in times.items():
        a = np.array(ts)
        print(f"| {kind} | {np.percentile(a, 50):.3f} | {np.percentile(a, 99):.3f} | {a.max():.3f} | {len(a)} |")
    print(f"\nfailures: {len(failures)} {sorted(set(failures))[:5]}; third verify while two ran: HTTP {third}; "
          f"upstream requests sent: {upstream.requests}")
    print(f"server threads {threads0} before the asking, at most {peak[0]} during; RSS {rss0:.0f} MB before, at most "
          f"{peak[1]:.0f} MB (+{peak[1] - rss0:.0f} MB); SIGTERM to exit {term:.2f} s")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
