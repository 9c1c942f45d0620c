"""Two `registry serve` replicas on one PostgreSQL database under load (issue 14, bar 3), for real over loopback.

A throwaway PostgreSQL (tests/pg.py, fsync on) gets the whole MMLU-Pro registry (../shared/data/mmlu-pro: 31
models, 12,032 questions, 371,244 evaluations, splits; the questions' MiniLM vectors are exported from a DuckDB
registry built from the same data, `--vectors-from`, so the import does not run MiniLM again), then two servers run
on it, A and B. N client processes for D seconds (bench/load.py's client mix, half of them on each server):
70% routes of known texts, 20% routes of new short texts, 5% registrations of a new model with 64 evaluations, 5%
additions of 64 new evaluations to one of four shared models (every replica onboards them: concurrent onboarding of
the same model). Beside the load, this process registers a probe model through one replica every ~2 s, alternately
A and B, and asks the other (a route of a known text listing every candidate) until it answers with that model's
version: the lag from acknowledgement to being served there.

Afterwards: 0 failed requests; for every model its versions are 1..n with no gap or duplicate; every acknowledged
evaluation is in the database, every reported version exists; no onboarding job is left pending.

    .venv/bin/python bench/replicas.py [--clients 8 --seconds 60] [--writer-nice 10]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TOKEN = "replicas-test"
SHARED = [f"shared-{i}" for i in range(4)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT.parent / "shared/data/mmlu-pro"))
    ap.add_argument("--vectors-from", default=str(ROOT / "registry.duckdb"),
                    help="a DuckDB registry of the same questions whose MiniLM vectors are exported and imported")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--writer-nice", default=None,
                    help="REGISTRY_WRITER_NICE for both servers (default: theirs, 0; 10: reads first)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from registry import Registry
    from tests.pg import Server

    work = Path(tempfile.mkdtemp(prefix="bench-replicas-"))
    server = Server(durable=True)
    procs: list[subprocess.Popen] = []
    try:
        url = server.create_db("registry")
        t0 = time.perf_counter()
        with Registry(args.vectors_from) as duck:
            duck.export_vectors(str(work / "vectors.parquet"))
        with Registry(url) as reg:
            imported = reg.import_files(directory=args.data, vectors=str(work / "vectors.parquet"))
            with reg.store.tx() as tx:
                texts = [r[0] for r in tx.sql("""SELECT q.text FROM queries q JOIN text_vectors v
                                                 ON v.content_hash = q.content_hash ORDER BY random() LIMIT 500""")]
                qids = [r[0] for r in tx.sql("""SELECT q.external_id FROM queries q LEFT JOIN query_splits s
                                                ON s.query_id = q.id WHERE coalesce(s.split, '') <> 'test'
                                                ORDER BY q.id""")]
        setup_s = time.perf_counter() - t0

        bases = []
        for tag in "AB":
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            env = {**os.environ, **({"REGISTRY_WRITER_NICE": args.writer_nice} if args.writer_nice else {})}
            procs.append(subprocess.Popen([sys.executable, "-m", "registry", "--db", url, "serve", "--port", str(port),
                                           "--token", TOKEN], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                          stderr=open(work / f"server-{tag}.log", "w")))
            bases.append(f"http://127.0.0.1:{port}")
        from bench.load import _wait
        for base, proc, tag in zip(bases, procs, "AB"):
            _wait(base, proc, work / f"server-{tag}.log")
        auth = {"Authorization": f"Bearer {TOKEN}"}
        # before the clock: MiniLM loaded in each server, each encoder's first forward pass, the shared models
        for i, base in enumerate(bases):
            httpx.post(f"{base}/route", json={"text": "warm up"}, timeout=120)
            warm = [{"question_id": q, "correct": j % 2 == 0} for j, q in enumerate(qids[i * 64:(i + 1) * 64])]
            r = httpx.post(f"{base}/models", json={"name": f"warm-up-{'AB'[i]}", "evaluations": warm}, headers=auth,
                           timeout=120)
            r.raise_for_status()
        pools = _pools(qids, args.clients)
        for j, name in enumerate(SHARED):       # each shared model starts from its own questions
            first = [{"question_id": q, "correct": (k + j) % 3 == 0} for k, q in enumerate(pools["seed"][j])]
            httpx.post(f"{bases[j % 2]}/models", json={"name": name, "params_b": 7, "evaluations": first}, headers=auth,
                       timeout=120).raise_for_status()

        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        t_start = time.time()
        stop = t_start + args.seconds
        clients = [ctx.Process(target=_client, args=(k, bases[k % 2], "AB"[k % 2], auth, texts, qids,
                                                     pools[k], stop, results)) for k in range(args.clients)]
        for p in clients:
            p.start()
        lags: list[tuple[str, float]] = []
        probe_failures: list[str] = []
        prober = threading.Thread(target=_probe, args=(bases, auth, texts[0], qids, stop, lags, probe_failures))
        prober.start()
        lat: dict[tuple[str, str], list[float]] = {}
        failures: list[str] = []
        acked: dict[str, set[str]] = {}          # model -> question ids of acknowledged evaluations
        versions_seen: set[tuple[str, int]] = set()
        slow: list[tuple] = []
        for _ in clients:
            c_lat, c_failures, c_acked, c_versions, c_slow = results.get()
            slow += [(round(at - t_start, 1), *rest) for at, *rest in c_slow]
            for key, xs in c_lat.items():
                lat.setdefault(tuple(key), []).extend(xs)
            failures += c_failures
            for name, q in c_acked.items():
                acked.setdefault(name, set()).update(q)
            versions_seen |= {tuple(v) for v in c_versions}
        for p in clients:
            p.join()
        prober.join()
        wall = time.time() - t_start
        health = [httpx.get(f"{b}/health", timeout=30).json() for b in bases]
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=120)

        # --- the database afterwards ----------------------------------------------------------------------------
        problems: list[str] = []
        with Registry(url) as reg, reg.store.tx() as tx:
            by_model: dict[str, list[int]] = {}
            for name, v in tx.sql("""SELECT m.name, v.version FROM embedding_versions v JOIN models m
                                     ON m.id = v.model_id ORDER BY m.name, v.version"""):
                by_model.setdefault(name, []).append(v)
            bad = [n for n, vs in by_model.items() if vs != list(range(1, len(vs) + 1))]
            problems += [f"{n}: versions {by_model[n]}" for n in bad]
            have: dict[str, set[str]] = {}
            for name, q in tx.sql("""SELECT m.name, q.external_id FROM evaluations e JOIN models m ON m.id = e.model_id
                                     JOIN queries q ON q.id = e.query_id
                                     WHERE m.name IN (SELECT unnest(?::VARCHAR[]))""", [sorted(acked)]):
                have.setdefault(name, set()).add(q)
            missing = {n: len(q - have.get(n, set())) for n, q in acked.items() if q - have.get(n, set())}
            problems += [f"{n}: {k} acknowledged evaluations missing" for n, k in missing.items()]
            absent = [(n, v) for n, v in versions_seen if v not in by_model.get(n, [])]
            problems += [f"{n}: reported version {v} missing" for n, v in absent]
            pending = tx.sql("""SELECT count(*) FROM onboarding_jobs j LEFT JOIN onboarding_results r
                                ON r.job_id = j.id WHERE r.job_id IS NULL""")[0][0]
            if pending:
                problems.append(f"{pending} onboarding jobs pending")
            shared_versions = {n: len(by_model.get(n, [])) for n in SHARED}
            shared_adds = sum(len(v) for (kind, _), v in lat.items() if kind == "add to shared")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        server.stop()

    total = sum(len(v) for v in lat.values())
    lag_ms = np.array([1000 * x for _, x in lags]) if lags else np.array([np.nan])
    result = {
        "clients": args.clients, "seconds": round(wall, 1), "setup_s": round(setup_s, 1),
        "evaluations_imported": imported.evaluations_added, "requests": total, "per_s": round(total / wall, 1),
        "failures": len(failures) + len(probe_failures), "models_checked": len(by_model),
        "models_with_bad_versions": len(bad), "acked_evaluations": sum(len(v) for v in acked.values()),
        "acked_models": len(acked), "missing_evaluations": sum(missing.values()), "pending_jobs": pending,
        "shared_model_versions": shared_versions, "shared_additions_acked": shared_adds,
        "lag_ms": {"n": len(lags), "p50": round(float(np.median(lag_ms)), 1),
                   "max": round(float(np.max(lag_ms)), 1)},
        "latency_ms": {f"{k} via {r}": {"n": len(xs), "p50": round(1000 * float(np.percentile(xs, 50)), 1),
                                         "p99": round(1000 * float(np.percentile(xs, 99)), 1)}
                       for (k, r), xs in sorted(lat.items())},
        "writers": [h["writer"] for h in health], "slow_requests": sorted(slow),
    }
    ok = not failures and not probe_failures and not problems and lags and max(x for _, x in lags) <= 1.0
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"PostgreSQL, whole MMLU-Pro ({imported.evaluations_added:,} evaluations imported, set-up "
              f"{setup_s:.0f} s); 2 replicas, {args.clients} clients for {wall:.0f} s over loopback: {total} requests "
              f"({total / wall:.1f}/s), {len(failures) + len(probe_failures)} failed")
        print(f"{'kind':<16} {'via':>3} {'n':>6} {'p50 ms':>8} {'p99 ms':>8}")
        for (kind, via), xs in sorted(lat.items()):
            print(f"{kind:<16} {via:>3} {len(xs):>6} {1000 * np.percentile(xs, 50):>8.1f} "
                  f"{1000 * np.percentile(xs, 99):>8.1f}")
        print()
        print("| check | result |")
        print("|---|---|")
        print(f"| failed requests | {len(failures) + len(probe_failures)} |")
        print(f"| models whose versions are not 1..n (gap or duplicate) | {len(bad)} of {len(by_model)} |")
        print(f"| acknowledged evaluations missing | {sum(missing.values())} of "
              f"{sum(len(v) for v in acked.values()):,} ({len(acked)} models) |")
        print(f"| reported versions missing | {len(absent)} |")
        print(f"| onboarding jobs pending | {pending} |")
        print(f"| shared models: additions acknowledged through both / versions | {shared_adds} / "
              f"{sum(shared_versions.values())} ({', '.join(f'{n}: {v}' for n, v in shared_versions.items())}) |")
        print(f"| registered through one, served by the other: lag p50 / max (n) | {np.median(lag_ms):.0f} ms / "
              f"{np.max(lag_ms):.0f} ms ({len(lags)}) |")
        print(f"| writer follows (refreshes for the other's writes) A / B | {health[0]['writer'].get('follows')} / "
              f"{health[1]['writer'].get('follows')} |")
        for tag, h in zip("AB", health):
            w = h["writer"]
            print(f"writer {tag}: {w['groups']} groups, longest cycle {w['longest_cycle_ms']:.0f} ms, stage "
                  f"{w['stage_ms']:.0f} ms, onboard {w['onboard_ms']:.0f} ms, refresh {w['refresh_ms']:.0f} ms "
                  f"(totals), {w['refits']} refits, {w['follows']} follows")
        if slow:
            print("requests over 3 s (sent at s into the run, kind, replica, s):", sorted(slow)[:12])
        print(f"bar 3: {'met' if ok else 'NOT met'}")
        for f in (failures + probe_failures + problems)[:8]:
            print("  ", f)
    sys.exit(0 if ok else 1)


def _pools(qids: list[str], clients: int) -> dict:
    """Disjoint question ids: per shared model its first 64, then per client its own slice, walked in order, so
    that no two additions to a shared model ever carry the same question (a different result for one it has would
    be refused without `update`, by design)."""
    rest = qids[64 * len(SHARED):]
    out: dict = {"seed": [qids[64 * j: 64 * (j + 1)] for j in range(len(SHARED))]}
    for k in range(clients):
        out[k] = rest[k::clients]
    return out


def _client(k: int, base: str, via: str, auth: dict, texts: list[str], qids: list[str], pool: list[str],
            stop: float, results) -> None:
    from bench.load import _short_text

    lat: dict[tuple, list[float]] = {}
    failures: list[str] = []
    acked: dict[str, set[str]] = {}
    versions: list[tuple[str, int]] = []
    slow: list[tuple] = []              # (seconds into the run it was sent, kind, replica, seconds taken) over 3 s
    rnd = random.Random(k)
    cursor = {name: 0 for name in SHARED}
    with httpx.Client(base_url=base, timeout=120, headers=auth) as c:
        n = 0
        while time.time() < stop:
            n += 1
            roll = rnd.random()
            if roll < 0.7:
                kind, body = "route known", {"text": rnd.choice(texts)}
            elif roll < 0.9:
                kind, body = "route new", {"text": _short_text(rnd, f"replicas {k}-{n}")}
            elif roll < 0.95:
                name, picked = f"load-{k}-{n}", rnd.sample(qids, 64)
                kind = "register"
            else:
                name = rnd.choice(SHARED)
                # this client's own questions for the model, 64 at a time (pool offset per model: disjoint too)
                start = (cursor[name] + 64 * SHARED.index(name) * 5) % max(1, len(pool) - 64)
                picked = pool[start:start + 64]
                cursor[name] += 64
                kind = "add to shared"
            if kind in ("register", "add to shared"):
                body = {"name": name, "params_b": 7,
                        # a result fixed per (model, question): a question sent twice repeats its result
                        "evaluations": [{"question_id": q, "correct": zlib.crc32(f"{name}/{q}".encode()) % 2 == 0}
                                        for q in picked]}
                path = "/models"
            else:
                path = "/route"
            t0 = time.perf_counter()
            try:
                r = c.post(path, json=body)
                ok, detail = r.status_code == 200, f"{r.status_code} {r.text[:200]}"
            except httpx.HTTPError as exc:
                ok, detail = False, repr(exc)
            dt = time.perf_counter() - t0
            if dt > 3:
                slow.append((time.time() - dt, kind, via, round(dt, 1)))
            if not ok:
                failures.append(f"{kind} via {via}: {detail}")
                continue
            lat.setdefault((kind, via), []).append(dt)
            if kind in ("register", "add to shared"):
                acked.setdefault(name, set()).update(picked)
                if r.json()["version"] is not None:
                    versions.append((name, r.json()["version"]))
    results.put((lat, failures, acked, versions, slow))


def _probe(bases: list[str], auth: dict, text: str, qids: list[str], stop: float, lags: list, failures: list) -> None:
    """Every ~2 s: register a probe model through one replica (alternately A and B) and ask the other until its
    route answer lists the model's version -> (direction, seconds from acknowledgement)."""
    rnd = random.Random(99)
    i = 0
    with httpx.Client(timeout=120, headers=auth) as c:
        while time.time() < stop - 3:
            src, dst = (0, 1) if i % 2 == 0 else (1, 0)
            name = f"probe-{i}"
            rows = [{"question_id": q, "correct": rnd.random() < 0.5} for q in rnd.sample(qids, 64)]
            try:
                r = c.post(f"{bases[src]}/models", json={"name": name, "evaluations": rows})
                r.raise_for_status()
                acked = time.perf_counter()
                version = r.json()["version"]
                while True:
                    a = c.post(f"{bases[dst]}/route", json={"text": text, "top": 0, "include_probation": True})
                    a.raise_for_status()
                    if a.json()["versions"].get(name) == version:
                        lags.append(("AB"[src] + "->" + "AB"[dst], time.perf_counter() - acked))
                        break
                    if time.perf_counter() - acked > 10:
                        failures.append(f"{name}: not served by {'AB'[dst]} 10 s after its registration")
                        break
                    time.sleep(0.02)
            except httpx.HTTPError as exc:
                failures.append(f"probe {name}: {exc!r}")
            i += 1
            time.sleep(1.5)


if __name__ == "__main__":
    main()
