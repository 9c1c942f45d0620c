"""The first `registry route` after a registration, from the shell: with the saved routing state of before the
registration (what a user has: its fit and policy are taken where the contenders did not change), beside the same
route with no saved state (the state built whole: what that route cost before). Alternating runs, each on its own
copy of the registry; the registered model is a copy of a real model's first N results (N under the probation
minimum: on probation, so no contender). Prints the median wall times and whether the two routes decided alike.

    PYTHONPATH=$PWD .venv/bin/python bench/route_after_registration.py --db registry.duckdb [--runs 3] [--n 128]
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
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=128, help="results of the registered model")
    ap.add_argument("--model", default="gpt-4o-2024-05-13", help="whose first N results it registers")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    base = work / "base.duckdb"
    shutil.copy(args.db, base)
    registry = [sys.executable, "-m", "registry"]
    subprocess.run(registry + ["--db", str(base), "db", "upgrade"], check=True, capture_output=True)
    subprocess.run(registry + ["--db", str(base), "route", TEXT, "--json"], check=True, capture_output=True)  # saved
    with duckdb.connect(str(base), read_only=True) as con:
        rows = con.execute("""SELECT q.external_id, e.correct::INT FROM evaluations e JOIN queries q ON q.id = e.query_id
                              JOIN models m ON m.id = e.model_id WHERE m.name = ? ORDER BY q.id LIMIT ?""",
                           [args.model, args.n]).fetchall()
    results = work / "results.csv"
    results.write_text("question_id,correct\n" + "".join(f"{q},{c}\n" for q, c in rows))
    times: dict[str, list[float]] = {"saved state of before (now)": [], "nothing saved (the state built whole)": []}
    answers: dict[str, list] = {k: [] for k in times}
    for run in range(args.runs):
        for case in times:
            db = work / f"run{run}-{len(answers[case])}-{case[:5]}.duckdb"
            shutil.copy(base, db)
            subprocess.run(registry + ["--db", str(db), "register", f"newcomer-{run}", "--evals", str(results)],
                           check=True, capture_output=True)
            if case.startswith("nothing"):
                with duckdb.connect(str(db)) as con:
                    con.execute("DELETE FROM routing_states WHERE key LIKE 'routing-state/%'")
            t0 = time.perf_counter()
            out = subprocess.run(registry + ["--db", str(db), "route", TEXT, "--json"], check=True,
                                 capture_output=True, text=True)
            times[case].append(time.perf_counter() - t0)
            d = json.loads(out.stdout)
            answers[case].append((d["model"], [(c["model"], c["prob"]) for c in d["candidates"]]))
            db.unlink()
    print(f"| first route after registering {args.n} results | median s | runs |")
    print("| --- | --- | --- |")
    for case, ts in times.items():
        print(f"| {case} | {statistics.median(ts):.2f} | {', '.join(f'{t:.2f}' for t in ts)} |")
    a, b = answers.values()
    print(f"same decision and candidates' probabilities in every run: {a == b}")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
