"""PostgreSQL at scale (issue 66, bar 3): the same Parquet of new models' evaluations imported into a copy of the
default registry on DuckDB and on PostgreSQL (tests/pg.py's throwaway server, started as the test command starts
it), side by side in one run, then `similar` served by two replicas on the PostgreSQL registry.

- The file: `--parquet` (what `bench/scale.py --keep` leaves: 10,000 models x 10,000 questions, 10^8 rows), or its
  first `--models` models (a subset written by DuckDB first, not timed).
- Each import is the public path, `registry --db DB import --evaluations F --json` in a child process: wall time,
  peak RSS (wait4) and the import's own `seconds`. PostgreSQL first gets the default registry by `registry db copy`
  (not timed).
- Replicas: two `registry serve` processes on the PostgreSQL URL; the seconds until each says ready, then
  GET /models/X/similar from each for a few new models (p50), and whether the two answers are the same.

Usage: .venv/bin/python bench/scale_pg.py --parquet F [--db DEFAULT_DB] [--models N] [--skip-duckdb]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.scale import child  # noqa: E402
from bench.scale_answers import free_port  # noqa: E402
from tests.http_tools import wait_for  # noqa: E402
from tests.pg import Server  # noqa: E402

CLI = str(ROOT / ".venv/bin/registry")


def subset(parquet: str, models: int, out: Path) -> tuple[int, int]:
    """The first `models` models' rows of the file (by name) into `out`: (models, rows)."""
    con = duckdb.connect()
    con.execute(f"""COPY (SELECT * FROM read_parquet(?) WHERE model IN (
                        SELECT DISTINCT model FROM read_parquet(?) ORDER BY model LIMIT {int(models)}))
                    TO '{out}' (FORMAT parquet)""", [parquet, parquet])
    return con.execute("SELECT count(DISTINCT model), count(*) FROM read_parquet(?)", [str(out)]).fetchone()


def imported(db: str, parquet: str) -> dict:
    wall, rss, text = child([CLI, "--db", db, "import", "--evaluations", parquet, "--json"], env=None)
    print(f"  {db[:40]}: {wall:.1f} s, peak {rss:.2f} GB", flush=True)
    return {"wall": wall, "rss": rss, "seconds": json.loads(text).get("seconds", {})}


def replicas(url: str, models: list[str], n: int = 2) -> list[tuple[float, float, list]]:
    """Start n servers on the URL: for each, (seconds to ready, p50 ms of similar over `models`, the answers)."""
    procs, out = [], []
    try:
        for _ in range(n):
            port = free_port()
            t0 = time.perf_counter()
            procs.append(subprocess.Popen([CLI, "--db", url, "serve", "--port", str(port)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600)

            def ready() -> bool:
                try:
                    return bool(client.get("/health").json().get("ready"))
                except httpx.HTTPError:
                    return False
            if not wait_for(ready, 3600, 0.5):
                raise SystemExit(f"replica not ready in an hour (exit code {procs[-1].poll()})")
            start = time.perf_counter() - t0
            took, answers = [], []
            for name in models:
                t = time.perf_counter()
                r = client.get(f"/models/{name}/similar", params={"k": 5})
                took.append(time.perf_counter() - t)
                assert r.status_code == 200, (r.status_code, r.text[:300])
                answers.append([x["model"] for x in r.json()])
            out.append((start, 1000 * float(np.median(took[1:] or took)), answers))
            print(f"  replica {len(out)}: ready {start:.1f} s, similar p50 {out[-1][1]:.1f} ms", flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.wait(60)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parquet", required=True)
    ap.add_argument("--db", default=str(ROOT / "registry.duckdb"), help="the default registry (copied, not changed)")
    ap.add_argument("--models", type=int, default=None)
    ap.add_argument("--skip-duckdb", action="store_true", help="PostgreSQL only (no side by side)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="scale-pg-"))
    server = None
    try:
        parquet = args.parquet
        if args.models:
            parquet = str(work / "subset.parquet")
            print("subset:", subset(args.parquet, args.models, Path(parquet)), flush=True)
        con = duckdb.connect()
        n_models, n_rows = con.execute("SELECT count(DISTINCT model), count(*) FROM read_parquet(?)",
                                       [parquet]).fetchone()
        asked = [r[0] for r in con.execute("SELECT DISTINCT model FROM read_parquet(?) ORDER BY model LIMIT 6",
                                           [parquet]).fetchall()]
        con.close()
        rows: list[tuple[str, str]] = []
        if not args.skip_duckdb:
            db = work / "registry.duckdb"
            shutil.copy(args.db, db)
            duck = imported(str(db), parquet)
            rows.append(("DuckDB: import and embed (wall, peak RSS)", f"{duck['wall']:.1f} s, {duck['rss']:.2f} GB"))
        server = Server()
        url = server.create_db("scale")
        subprocess.run([CLI, "--db", args.db, "db", "copy", url], check=True, stdout=subprocess.DEVNULL)
        pg = imported(url, parquet)
        rows.append(("PostgreSQL: import and embed (wall, peak RSS)", f"{pg['wall']:.1f} s, {pg['rss']:.2f} GB"))
        rows.append(("PostgreSQL: the import's own steps", ", ".join(f"{k} {v:.1f} s" for k, v in
                                                                    pg["seconds"].items())))
        if not args.skip_duckdb:
            rows.append(("PostgreSQL / DuckDB", f"**{pg['wall'] / duck['wall']:.2f}x** (bar 3x)"))
        served = replicas(url, asked)
        rows.append(("replicas: ready; similar p50 (each)", "; ".join(f"{s:.1f} s, {p:.1f} ms" for s, p, _ in served)))
        rows.append(("replicas give the same answers", str(all(a == served[0][2] for _, _, a in served))))
        print(f"\n{n_models:,} new models, {n_rows:,} evaluations ({args.parquet})\n")
        print("| figure | value |\n|---|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} |")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
