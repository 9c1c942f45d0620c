"""`registry evaluate --split test` as a user runs it on a freshly built default registry, side by side with the code
of another revision (by default the one before evaluate kept its baselines), then once more with unchanged data.

    PYTHONPATH=$PWD .venv/bin/python bench/evaluate_speed.py --db registry.duckdb [--before 621c5d3]

Each side gets its own copy of the registry as `bin/build-default` leaves it (the routing state that side's code
builds when it routes a text, untimed; no baselines kept), then `evaluate --split test --json` is timed from the
shell; the figures of all runs must be identical. Runs alternate sides (before, after, before, after, ...) so the
machine's noise falls on both alike.
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

ROOT = Path(__file__).resolve().parents[1]
KNOWN = "What is the derivative of x^2?"


def registry(code: Path, db: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(code)!r}); from registry.cli import main; "
                                  f"main()", "--db", str(db), *args]


def prepared(code: Path, source: Path, dest: Path) -> Path:
    """A copy of the built registry as that side's code leaves it after `bin/build-default` (schema upgraded, a
    text routed), without any kept baselines."""
    shutil.copy(source, dest)
    subprocess.run(registry(code, dest, "db", "upgrade"), check=True, capture_output=True)
    subprocess.run([sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); "
                    "c.execute(\"DELETE FROM routing_states WHERE key LIKE 'evaluate-baselines/%'\")", str(dest)],
                   check=True)
    subprocess.run(registry(code, dest, "route", KNOWN), check=True, capture_output=True)
    return dest


def timed(cmd: list[str]) -> tuple[float, dict]:
    started = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return time.perf_counter() - started, json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--before", default="621c5d3", help="the revision to compare with")
    ap.add_argument("--runs", type=int, default=1, help="fresh runs per side")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    old = work / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(old), args.before], check=True,
                   capture_output=True)
    try:
        rows, figures = [], []
        fresh = {"before": [], "after": []}
        again = []
        for run in range(args.runs):
            for side, code in (("before", old), ("after", ROOT)):
                db = prepared(code, Path(args.db), work / f"{side}-{run}.duckdb")
                seconds, report = timed(registry(code, db, "evaluate", "--split", "test", "--json"))
                fresh[side].append(seconds)
                figures.append((f"{side} fresh", report))
                if side == "after":
                    seconds, report = timed(registry(code, db, "evaluate", "--split", "test", "--json"))
                    again.append(seconds)
                    figures.append(("after, again", report))
        rows.append(("before: fresh", statistics.median(fresh["before"])))
        rows.append(("after: fresh", statistics.median(fresh["after"])))
        rows.append(("after: again, unchanged data", statistics.median(again)))
        print(f"registry evaluate --split test on {args.db} (median of {args.runs}; before = {args.before})")
        print(f"{'case':<32} {'seconds':>8} {'vs before':>10}")
        for name, s in rows:
            print(f"{name:<32} {s:>8.1f} {s / rows[0][1]:>9.2f}x")
        reference = figures[0][1]
        same = [name for name, r in figures if r == reference]
        print(f"figures identical to before's: {len(same)} of {len(figures)} runs"
              + ("" if len(same) == len(figures) else
                 f" (differ: {', '.join(n for n, r in figures if r != reference)})"))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
