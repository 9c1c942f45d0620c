"""How long a command takes from the shell, beside the floor: a bare `python -c "import duckdb; ..."` count of the
same file. Runs alternate (floor, then each command, then again) so the machine's noise falls on all alike; prints
the median wall time of each and its ratio to the floor's median.

    PYTHONPATH=$PWD .venv/bin/python bench/startup.py --db registry.duckdb [--runs 7]

As an installed package runs: with its bytecode compiled (pip compiles a wheel's modules when it installs them;
where PYTHONDONTWRITEBYTECODE is set, as on these machines, every command would compile every module of ours
again), so the commands run with it unset, each once before the timed runs.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KNOWN = "What is the derivative of x^2?"     # bin/build-default routes it: the registry holds its vector then


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    db = work / "registry.duckdb"
    shutil.copy(args.db, db)                 # commands that log (route) write to a copy, never the original
    registry = [sys.executable, "-m", "registry", "--db", str(db)]
    floor = [sys.executable, "-c", f"import duckdb; c = duckdb.connect({str(db)!r}); "
                                   "print(c.sql('SELECT count(*) FROM models').fetchall())"]
    cases = {"bare duckdb count (floor)": floor, "registry stats": registry + ["stats"],
             "registry models": registry + ["models"], "registry show gpt-4o-2024-05-13": registry + ["show", "gpt-4o-2024-05-13"],
             "registry history gpt-4o-2024-05-13": registry + ["history", "gpt-4o-2024-05-13"],
             "registry similar gpt-4o-2024-05-13": registry + ["similar", "gpt-4o-2024-05-13"],
             "registry fallback gpt-4o-2024-05-13": registry + ["fallback", "gpt-4o-2024-05-13"],
             "registry route (a text it holds)": registry + ["route", KNOWN]}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(registry + ["route", KNOWN], check=True, capture_output=True, env=env)   # its vector is stored
    for cmd in cases.values():                                           # (and the bytecode written) from now on
        subprocess.run(cmd, check=True, capture_output=True, env=env)
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.runs):
        for name, cmd in cases.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True, env=env)
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["bare duckdb count (floor)"])
    print(f"| command | median s ({args.runs} runs, alternating) | x floor |")
    print("|---|---|---|")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"| `{name}` | {m:.3f} | {m / base:.2f} |")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
