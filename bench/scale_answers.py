"""Every answer with many models (issue 66, bar 2): on a registry that `bench/scale.py --keep` left (10,031 models),
the commands as new processes and the server's answers over HTTP.

    .venv/bin/python bench/scale_answers.py --db SCALE_DB [--runs 3] [--requests 50] [--only process|http]

- As processes (`registry ... --json`, wall time of each child, median, best and worst of `--runs`, in turns):
  `similar` of a new model and of a real one, `route` of a known text (a test question's own text), `models --limit
  100`, `stats`, and the floor: a process importing numpy, DuckDB, FAISS and click.
- Over HTTP (`registry serve` on the same file, warmed by one request of each kind): p50 / p99 of `--requests`
  each of GET /models/X/similar (a different model each time), POST /route (known texts), GET /models (first page), GET / (the home page), and
  the server's start until `/health` says ready.
Prints one table.
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.http_tools import wait_for  # noqa: E402

CLI = [str(ROOT / ".venv/bin/registry")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed_child(args: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--only", choices=("process", "http"), help="one half of the table")
    args = ap.parse_args()
    con = duckdb.connect(args.db, read_only=True)
    try:
        n_models = con.execute("SELECT count(*) FROM models").fetchone()[0]
        n_evals = con.execute("SELECT count(*) FROM evaluations").fetchone()[0]
        synth = con.execute("SELECT name FROM models WHERE name LIKE 'synth-%' ORDER BY name LIMIT 1").fetchone()
        # the models asked over HTTP in turn: a different one each request, so no answer is the one before's
        asked = [r[0] for r in con.execute("""SELECT name FROM models ORDER BY hash(name) LIMIT ?""",
                                            [args.requests + 1]).fetchall()]
        real = con.execute("SELECT name FROM models WHERE name NOT LIKE 'synth-%' ORDER BY id LIMIT 1").fetchone()[0]
        texts = [r[0] for r in con.execute("""SELECT q.text FROM queries q JOIN query_splits s ON s.query_id = q.id
                                               WHERE s.split = 'test' ORDER BY q.id LIMIT 200""").fetchall()]
    finally:
        con.close()
    new = synth[0] if synth else real
    base = CLI + ["--db", args.db]
    rows: list[tuple[str, str, str]] = []

    if args.only != "http":
        # in turns, each command once a round: the machine's slow spells fall on all of them alike; beside them the
        # floor, a process that only imports what every command does (numpy, DuckDB, FAISS, click)
        children = [(f"similar {new}", base + ["similar", new, "-k", "5", "--json"]),
                    (f"similar {real}", base + ["similar", real, "-k", "5", "--json"]),
                    ("route a known text", base + ["route", texts[0], "--json"]),
                    ("models --limit 100", base + ["models", "--limit", "100", "--json"]),
                    ("stats", base + ["stats", "--json"]),
                    ("floor: python importing numpy, duckdb, faiss, click",
                     [sys.executable, "-c", "import numpy, duckdb, faiss, click"])]
        walls: dict[str, list[float]] = {label: [] for label, _ in children}
        for _ in range(args.runs):
            for label, argv in children:
                walls[label].append(timed_child(argv))
        for label, w in walls.items():
            rows.append((f"{label} (process)", f"{np.median(w):.2f} s ({min(w):.2f} / {max(w):.2f})",
                         f"median (best / worst) of {args.runs}"))
            print(rows[-1], flush=True)
    if args.only == "process":
        return table(rows, n_models, n_evals, args.db)

    port = free_port()
    t0 = time.perf_counter()
    server = subprocess.Popen(base + ["serve", "--port", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600)
    try:
        def ready() -> bool:
            try:
                return bool(client.get("/health").json().get("ready"))
            except httpx.HTTPError:
                return False
        if not wait_for(ready, 600, 0.2):       # (a server that died or never came up: said, not waited on)
            raise SystemExit(f"registry serve not ready within 600 s (exit code {server.poll()})")
        rows.append(("server start to ready", f"{time.perf_counter() - t0:.1f} s", ""))
        print(rows[-1], flush=True)
        kinds = {
            f"GET /models/X/similar ({len(asked)} models in turn)":
                lambda i: client.get(f"/models/{asked[i % len(asked)]}/similar", params={"k": 5}),
            "POST /route (a known text)": lambda i: client.post("/route", json={"text": texts[i % len(texts)]}),
            "GET /models (first page)": lambda i: client.get("/models"),
            "GET / (home page)": lambda i: client.get("/"),
        }
        for label, call in kinds.items():
            first = time.perf_counter()
            r = call(0)
            first = time.perf_counter() - first
            assert r.status_code == 200, (label, r.status_code, r.text[:300])
            took = []
            for i in range(args.requests):
                t = time.perf_counter()
                r = call(i + 1)
                took.append(time.perf_counter() - t)
                assert r.status_code == 200, (label, r.status_code, r.text[:300])
            p50, p99 = np.percentile(took, [50, 99]) * 1000
            rows.append((label, f"{p50:.1f} / {p99:.1f} ms", f"first {first * 1000:.0f} ms"))
            print(rows[-1], flush=True)
        inside = client.get("/health").json().get("inside", {})
        for kind in ("similar", "route_known"):
            if kind in inside:
                rows.append((f"{kind}: inside the server (handler to answer)",
                             f"{inside[kind]['p50_ms']:.1f} / {inside[kind]['p99_ms']:.1f} ms", "p50 / p99"))
    finally:
        server.terminate()
        server.wait(30)
    table(rows, n_models, n_evals, args.db)


def table(rows: list[tuple[str, str, str]], n_models: int, n_evals: int, db: str) -> None:
    print(f"\n{n_models:,} models, {n_evals:,} evaluations ({db})\n")
    print("| answer | figure | note |\n|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
