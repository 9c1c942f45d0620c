"""Many users on one file (issue 51, item 6): the command line beside a running `registry serve`, and two commands at
once on a file no server holds.

1. `registry serve` (with a token) on a copy of the registry, under bench/load.py's mix (70% routes of known texts,
   20% routes of new short texts, 10% registrations of a new model with 64 evaluations; its own client processes,
   open loop at --rate requests/s). Beside it, from the shell, with REGISTRY_TOKEN set: --n `registry stats`,
   `registry similar MODEL` and `registry route TEXT` (a text the registry holds), and --registers `registry
   register` of a new model's results file, --concurrency commands at a time. Each is timed from start to exit
   (the process's start-up included); none may fail, each read within --bar seconds, and every registered model
   must be in the file afterwards.
2. With the server stopped: two `registry register`s started together on the same file; both must land (the second
   waits its turn, REGISTRY_BUSY_TIMEOUT).

    .venv/bin/python bench/many_users.py [--db registry.duckdb] [--n 20] [--registers 5] [--rate 20] [--json]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import load  # noqa: E402  (bench/load.py: its client processes and mix)

TOKEN = load.TOKEN


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=str(ROOT / "registry.duckdb"))
    ap.add_argument("--n", type=int, default=20, help="runs of each read command")
    ap.add_argument("--registers", type=int, default=5, help="registrations from the command line")
    ap.add_argument("--clients", type=int, default=4, help="load client processes (bench/load.py's)")
    ap.add_argument("--rate", type=float, default=20.0, help="the load's offered requests/s, all clients together")
    ap.add_argument("--concurrency", type=int, default=1, help="command-line commands running at once")
    ap.add_argument("--bar", type=float, default=2.0, help="seconds a read may take")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from registry import Registry

    work = Path(tempfile.mkdtemp(prefix="bench-many-users-"))
    db = work / "registry.duckdb"
    shutil.copy(args.db, db)
    rnd = random.Random(0)
    with Registry(db) as reg, reg.store.tx() as tx:
        texts = [r[0] for r in tx.sql("""SELECT q.text FROM queries q JOIN text_vectors v ON v.content_hash = q.content_hash
                                         ORDER BY q.id LIMIT 500""")]
        qids = [r[0] for r in tx.sql("""SELECT q.external_id FROM queries q LEFT JOIN query_splits s
                                        ON s.query_id = q.id WHERE coalesce(s.split, '') <> 'test' ORDER BY q.id""")]
        model = reg.models()[0].name
    files = []
    for i in range(args.registers + 2):
        path = work / f"evals-{i}.csv"
        path.write_text("question_id,correct\n" + "".join(f"{q},{int(rnd.random() < 0.5)}\n"
                                                          for q in rnd.sample(qids, 200)))
        files.append(path)

    # --- 1. beside a server under load -------------------------------------------------------------------------------
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(work / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "registry", "--db", str(db), "serve", "--port", str(port),
                             "--token", TOKEN], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}"
    load._wait(base, proc, work / "server.log")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    httpx.post(f"{base}/route", json={"text": "warm up"}, timeout=120)
    warm = [{"question_id": q, "correct": i % 2 == 0} for i, q in enumerate(qids[:64])]
    httpx.post(f"{base}/models", json={"name": "load-warm-up", "evaluations": warm}, headers=auth, timeout=120)

    ctx = mp.get_context("spawn")
    lock, stopped, results = ctx.Lock(), ctx.Event(), ctx.Queue()
    clients = [ctx.Process(target=load._client, args=(k, base, auth, texts, qids, time.time() + 3600, lock, stopped,
                                                      results, "plain", args.rate / args.clients))
               for k in range(args.clients)]
    for c in clients:
        c.start()
    time.sleep(3)                       # the load under way before the first command
    text = texts[0]
    jobs = [("stats", ("stats",))] * args.n + [("similar", ("similar", model))] * args.n \
        + [("route", ("route", text))] * args.n
    jobs += [("register", ("register", f"cli-user-{i}", "--evals", str(files[i]))) for i in range(args.registers)]
    rnd.shuffle(jobs)
    env = {**os.environ, "REGISTRY_TOKEN": TOKEN}
    t_load = time.time()
    with ThreadPoolExecutor(args.concurrency) as pool:
        done = list(pool.map(lambda job: (job[0], *run(db, job[1], env)), jobs))
    stopped.set()
    load_lat: dict[str, list[float]] = {}
    load_failures: list[str] = []
    for _ in clients:
        c_lat, c_failures, *_ = results.get()
        for kind, xs in c_lat.items():
            load_lat.setdefault(kind, []).extend(xs)
        load_failures += c_failures
    for c in clients:
        c.join()
    load_s = time.time() - t_load
    advert_seen = Path(str(db) + ".serving").exists()
    proc.terminate()
    proc.wait(timeout=120)
    advert_left = Path(str(db) + ".serving").exists()

    # --- 2. two registers at once, no server -------------------------------------------------------------------------
    plain = {k: v for k, v in os.environ.items() if k != "REGISTRY_TOKEN"}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda i: run(db, ("register", f"together-{i}", "--evals", str(files[args.registers + i])),
                                           plain), range(2)))
    together_s = time.perf_counter() - t0
    done += [("register, no server", *out) for out in outs]
    waited = sum("waiting for process" in err for _, _, err in outs)
    with Registry(db) as reg:
        names = {m.name for m in reg.models()}
    landed = {f"cli-user-{i}" for i in range(args.registers)} | {"together-0", "together-1"}
    missing = sorted(landed - names)

    rows = {}
    for kind, rc, seconds, err in done:
        r = rows.setdefault(kind, {"n": 0, "ok": 0, "seconds": [], "errors": []})
        r["n"] += 1
        r["ok"] += rc == 0
        r["seconds"].append(seconds)
        if rc:
            r["errors"].append(err.strip()[-300:])
    table = {kind: {"n": r["n"], "ok": r["ok"], "p50_s": round(float(np.median(r["seconds"])), 2),
                    "max_s": round(max(r["seconds"]), 2), "errors": r["errors"][:3]} for kind, r in rows.items()}
    reads_ok = all(table[k]["ok"] == table[k]["n"] and table[k]["max_s"] <= args.bar
                   for k in ("stats", "similar", "route") if k in table)
    ok = reads_ok and all(r["ok"] == r["n"] for r in table.values()) and not missing
    result = {"commands": table, "concurrency": args.concurrency, "bar_s": args.bar, "missing_models": missing,
              "advert_while_serving": advert_seen, "advert_left_after_stop": advert_left,
              "second_register_waited": waited, "together_s": round(together_s, 2),
              "load": {"clients": args.clients, "offered_per_s": args.rate, "seconds": round(load_s, 1),
                       "requests": sum(len(v) for v in load_lat.values()), "failures": len(load_failures),
                       "p50_ms": {k: round(1000 * float(np.median(v)), 1) for k, v in sorted(load_lat.items())}},
              "ok": ok}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        lo = result["load"]
        print(f"registry serve under bench/load.py's mix ({lo['clients']} clients, {lo['offered_per_s']:g} requests/s "
              f"offered, open loop): {lo['requests']} requests in {lo['seconds']} s, {lo['failures']} failed; p50 ms "
              + ", ".join(f"{k} {v}" for k, v in lo["p50_ms"].items()))
        for f in load_failures[:3]:
            print("    load failure:", f[:300])
        print(f"command-line commands beside it, {args.concurrency} at a time (REGISTRY_TOKEN set), each timed from "
              f"start to exit:")
        print(f"{'command':<22} {'n':>3} {'ok':>3} {'p50 s':>7} {'max s':>7}")
        for kind, r in table.items():
            print(f"{kind:<22} {r['n']:>3} {r['ok']:>3} {r['p50_s']:>7.2f} {r['max_s']:>7.2f}")
            for e in r["errors"]:
                print("    ", e)
        print(f"two registers started together with no server: {2 - len(set(missing) & {'together-0', 'together-1'})}"
              f" of 2 landed in {together_s:.1f} s ({waited} waited its turn); registered models missing: "
              f"{missing or 'none'}; advert {'present' if advert_seen else 'ABSENT'} while serving, "
              f"{'LEFT' if advert_left else 'removed'} after the stop")
        print(f"reads within {args.bar:g} s and nothing refused: {'yes' if ok else 'NO'}")
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if ok else 1)


def run(db: Path, argv: tuple[str, ...], env: dict) -> tuple[int, float, str]:
    """One command-line command: (exit code, seconds from start to exit, the end of its stderr)."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "registry", "--db", str(db), *argv], cwd=ROOT, capture_output=True,
                       text=True, env=env, timeout=600)
    return r.returncode, time.perf_counter() - t0, r.stderr


if __name__ == "__main__":
    main()
