"""The first `registry route` after a registration that adds a contender, from the shell, beside a route with nothing
registered since (side by side, alternating, the same text, each on its own copy of the registry). The registration
pays the refit (its own time is printed too); the route after it only reads the saved state. The registered model is
a copy of a real model's first N results (N above the probation minimum: a contender, so the fit changes).

    PYTHONPATH=$PWD .venv/bin/python bench/route_after_registration.py --db registry.duckdb [--runs 5] [--n 2000]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

TEXT = "Which of these statements about the made-up element in this benchmark question is true?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--n", type=int, default=2000, help="results of the registered model")
    ap.add_argument("--model", default="gpt-4o-2024-05-13", help="whose first N results it registers")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    base = work / "base.duckdb"
    shutil.copy(args.db, base)
    registry = [sys.executable, "-m", "registry"]
    subprocess.run(registry + ["--db", str(base), "db", "upgrade"], check=True, capture_output=True)
    subprocess.run(registry + ["--db", str(base), "route", TEXT, "--json"], check=True, capture_output=True)  # kept
    with duckdb.connect(str(base), read_only=True) as con:
        rows = con.execute("""SELECT q.external_id, e.correct::INT FROM evaluations e JOIN queries q ON q.id = e.query_id
                              JOIN models m ON m.id = e.model_id WHERE m.name = ? ORDER BY q.id LIMIT ?""",
                           [args.model, args.n]).fetchall()
    results = work / "results.csv"
    results.write_text("question_id,correct\n" + "".join(f"{q},{c}\n" for q, c in rows))
    cases = ("nothing registered since", "after registering a contender")
    times: dict[str, list[float]] = {c: [] for c in cases}
    register_s, said, chosen = [], [], {c: [] for c in cases}
    for run in range(args.runs):
        for case in cases:
            db = work / f"run{run}-{case[:5]}.duckdb"
            shutil.copy(base, db)
            if case == cases[1]:
                t0 = time.perf_counter()
                out = subprocess.run(registry + ["--db", str(db), "register", f"newcomer-{run}", "--evals",
                                                 str(results)], check=True, capture_output=True, text=True)
                register_s.append(time.perf_counter() - t0)
                said.append("refitting the routing state" in out.stderr)
            t0 = time.perf_counter()
            out = subprocess.run(registry + ["--db", str(db), "route", TEXT, "--json"], check=True,
                                 capture_output=True, text=True)
            times[case].append(time.perf_counter() - t0)
            assert "routing state" not in out.stderr, out.stderr         # a route never builds it here
            chosen[case].append(json.loads(out.stdout)["model"])
            with duckdb.connect(str(db), read_only=True) as con:
                if case == cases[1]:       # the contender is one: it has an embedding the state holds
                    assert con.execute("SELECT count(*) FROM models WHERE name = ?", [f"newcomer-{run}"]).fetchone()[0]
            db.unlink()
    print(f"| `registry route` (same text, {args.runs} alternating runs) | median s | runs |")
    print("| --- | --- | --- |")
    for case, ts in times.items():
        print(f"| {case} | {statistics.median(ts):.2f} | {', '.join(f'{t:.2f}' for t in ts)} |")
    ratio = statistics.median(times[cases[1]]) / statistics.median(times[cases[0]])
    print(f"ratio after / nothing since: {ratio:.2f} (bar: at most 1.3)")
    print(f"`registry register` of {args.n} results (pays the refit): median {statistics.median(register_s):.2f} s; "
          f"said so on stderr in {sum(said)}/{len(said)} runs")
    print(f"chosen: {', '.join(sorted(set(chosen[cases[0]])))} | {', '.join(sorted(set(chosen[cases[1]])))}")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
