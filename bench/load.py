"""The server under load, for real over loopback (issue 6, bar 4): `registry serve` on a copy of the registry, N
client threads for D seconds mixing route calls (known and new texts, single and batch) with registering new models
and adding evaluations to them. Afterwards the server is stopped and the file checked: every evaluation a client
sent and every embedding version the server reported must be there. Prints failures and p50/p99 per kind.

    .venv/bin/python bench/load.py --db registry.duckdb [--clients 8 --seconds 60]
"""
from __future__ import annotations

import argparse
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TOKEN = "load-test"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=str(ROOT / "registry.duckdb"))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--write-share", type=float, default=0.15, help="share of requests that write")
    args = ap.parse_args()
    from registry import Registry

    work = Path(tempfile.mkdtemp(prefix="bench-load-"))
    db = work / "registry.duckdb"
    shutil.copy(args.db, db)
    with Registry(db) as reg, reg.store.tx() as tx:
        texts = [r[0] for r in tx.sql("SELECT text FROM queries ORDER BY random() LIMIT 500")]
        qids = [r[0] for r in tx.sql("""SELECT q.external_id FROM queries q LEFT JOIN query_splits s
                                        ON s.query_id = q.id WHERE coalesce(s.split, '') <> 'test'""")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "registry", "--db", str(db), "serve", "--port", str(port),
                             "--token", TOKEN], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    _wait(base, proc)
    httpx.post(f"{base}/route", json={"text": "warm up"}, timeout=120)  # MiniLM loaded before the clock starts

    lat: dict[str, list[float]] = {}
    failures: list[str] = []
    sent: dict[str, set[str]] = {}        # model -> query ids sent (and accepted)
    versions: dict[str, set[int]] = {}    # model -> versions the server reported
    lock = threading.Lock()
    stop = time.time() + args.seconds

    def client(k: int) -> None:
        rnd = random.Random(k)
        with httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            n = 0
            while time.time() < stop:
                n += 1
                roll = rnd.random()
                if roll < args.write_share:
                    name = f"load-{k}-{rnd.randrange(3)}"          # new model, or more evaluations for it
                    picked = rnd.sample(qids, 64)
                    rows = [{"question_id": q, "correct": rnd.random() < 0.5} for q in picked]
                    # update: a result that differs from the one stored for the model is recorded as newer
                    # (without it, register refuses changed results with a 400 since issue 19)
                    kind, call = "register", lambda: c.post("/models", json={"name": name, "params_b": 7,
                                                                               "evaluations": rows, "update": True})
                elif roll < 0.5:
                    kind, call = "route known", lambda: c.post("/route", json={"text": rnd.choice(texts)})
                elif roll < 0.9:
                    q = f"{rnd.choice(texts)[:200]} (variant {k}-{n})"   # a new text: MiniLM runs
                    kind, call = "route new", lambda: c.post("/route", json={"text": q})
                else:
                    kind, call = "route batch 16", lambda: c.post(
                        "/route/batch", json={"texts": [f"{t[:200]} #{k}-{n}" for t in rnd.sample(texts, 16)]})
                t0 = time.perf_counter()
                try:
                    r = call()
                    ok = r.status_code == 200
                    detail = f"{r.status_code} {r.text[:200]}"
                except httpx.HTTPError as exc:
                    ok, detail = False, repr(exc)
                dt = time.perf_counter() - t0
                with lock:
                    lat.setdefault(kind, []).append(dt)
                    if not ok:
                        failures.append(f"{kind}: {detail}")
                    elif kind == "register":
                        sent.setdefault(name, set()).update(picked)
                        if r.json()["version"] is not None:
                            versions.setdefault(name, set()).add(r.json()["version"])

    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.clients)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    proc.terminate()
    proc.wait(timeout=60)

    missing = []
    with Registry(db) as reg, reg.store.tx() as tx:
        for name, q in sent.items():
            have = {r[0] for r in tx.sql("""SELECT DISTINCT q.external_id FROM evaluations e
                                            JOIN models m ON m.id = e.model_id JOIN queries q ON q.id = e.query_id
                                            WHERE m.name = ?""", [name])}
            if q - have:
                missing.append(f"{name}: {len(q - have)} evaluations missing")
        for name, vs in versions.items():
            have = {r[0] for r in tx.sql("""SELECT v.version FROM embedding_versions v JOIN models m
                                            ON m.id = v.model_id WHERE m.name = ?""", [name])}
            if vs - have:
                missing.append(f"{name}: versions {sorted(vs - have)} missing")
    shutil.rmtree(work, ignore_errors=True)

    total = sum(len(v) for v in lat.values())
    print(f"{args.clients} clients for {wall:.0f} s over loopback: {total} requests ({total / wall:.1f}/s), "
          f"{len(failures)} failed; {sum(len(v) for v in sent.values())} evaluations sent for {len(sent)} models, "
          f"{sum(len(v) for v in versions.values())} versions reported; missing afterwards: {len(missing)}")
    print(f"{'kind':<16} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}")
    everything = []
    for kind, xs in sorted(lat.items()):
        everything += xs
        print(f"{kind:<16} {len(xs):>5} {1000 * np.percentile(xs, 50):>8.0f} {1000 * np.percentile(xs, 99):>8.0f}")
    print(f"{'all':<16} {len(everything):>5} {1000 * np.percentile(everything, 50):>8.0f} "
          f"{1000 * np.percentile(everything, 99):>8.0f}")
    for f in failures[:5] + missing[:5]:
        print("  ", f)
    sys.exit(1 if failures or missing else 0)


def _wait(base: str, proc) -> None:
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit("the server exited at start-up")
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
