"""How long a command takes from the shell, beside the floor: a bare `python -c "import duckdb; ..."` count of the
same file. Runs alternate (floor, then each command, then again) so the machine's noise falls on all alike; prints
the median wall time of each and its ratio to the floor's median.

    PYTHONPATH=$PWD .venv/bin/python bench/startup.py --db registry.duckdb [--runs 7] [--only route]

`registry route` of a text never seen (a new text each run) is timed on both text encoder backends: ONNX Runtime
(the default) and torch (sentence-transformers, what every such route ran before the ONNX backend; forced with
`text_encoder.prefer("torch")`, as a process without onnxruntime would run). --only: the cases whose name holds it
(the floor always runs).

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
import uuid
from pathlib import Path

KNOWN = "What is the derivative of x^2?"     # bin/build-default routes it: the registry holds its vector then
NEW = "How many moons did the planet in this made-up question have in run {run}, {tag}?"
AS_BEFORE = ("import torch, scipy.stats; from registry.cli import main; main()")   # what register imported
ON_TORCH = ("import sys; from registry.locus import text_encoder; text_encoder.prefer('torch'); "
            "from registry.cli import main; main()")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--only", default=None, help="only the cases whose name holds this (and the floor)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    db = work / "registry.duckdb"
    shutil.copy(args.db, db)                 # commands that log (route) write to a copy, never the original
    registry = [sys.executable, "-m", "registry", "--db", str(db)]
    subprocess.run(registry + ["db", "upgrade"], check=True, capture_output=True)   # (a registry built earlier)
    floor = [sys.executable, "-c", f"import duckdb; c = duckdb.connect({str(db)!r}); "
                                   "print(c.sql('SELECT count(*) FROM models').fetchall())"]
    cases = {"bare duckdb count (floor)": floor, "registry stats": registry + ["stats"],
             "registry models": registry + ["models"], "registry show gpt-4o-2024-05-13": registry + ["show", "gpt-4o-2024-05-13"],
             "registry history gpt-4o-2024-05-13": registry + ["history", "gpt-4o-2024-05-13"],
             "registry similar gpt-4o-2024-05-13": registry + ["similar", "gpt-4o-2024-05-13"],
             "registry fallback gpt-4o-2024-05-13": registry + ["fallback", "gpt-4o-2024-05-13"],
             "registry route (a text it holds)": registry + ["route", KNOWN],
             "registry route (a new text), ONNX Runtime": lambda run: registry + ["route", new_text(run, "onnx")],
             "registry route (a new text), torch": lambda run: [sys.executable, "-c", ON_TORCH] + registry[3:]
             + ["route", new_text(run, "torch")]}
    # registrations write to a copy of their own: on the routing copy each would make the next route rebuild the
    # routing state (what "the first route after a registration" costs, not what a route costs)
    shutil.copy(db, work / "register.duckdb")
    writer = registry[:3] + ["--db", str(work / "register.duckdb")]
    evals = work / "evals128.csv"             # 128 results of a registered model, as a new model's file
    subprocess.run([sys.executable, "-c", f"""import duckdb
c = duckdb.connect({str(db)!r}, read_only=True)
c.sql(\"\"\"COPY (SELECT q.external_id AS query_id, e.correct::INT AS correct FROM evaluations e
    JOIN queries q ON q.id = e.query_id JOIN models m ON m.id = e.model_id WHERE m.name = 'DeepSeek-Coder-V2'
    ORDER BY hash(q.external_id) LIMIT 128) TO '{evals}' (HEADER)\"\"\")"""], check=True)
    cases.update({
        "registry register (128 results)": lambda run: writer + ["register", f"new-{run}-{uuid.uuid4().hex[:6]}",
                                                                 "--evals", str(evals)],
        "registry register (128 results), torch and scipy imported as before": lambda run: (
            [sys.executable, "-c", AS_BEFORE] + writer[3:] + ["register", f"old-{run}-{uuid.uuid4().hex[:6]}",
                                                              "--evals", str(evals)]),
        "registry similar --evals (128 results)": registry + ["similar", "--evals", str(evals)],
        "registry similar --evals (128 results), torch and scipy imported as before": (
            [sys.executable, "-c", AS_BEFORE] + registry[3:] + ["similar", "--evals", str(evals)])})
    cases = {k: v for k, v in cases.items() if args.only is None or args.only in k or "floor" in k}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(registry + ["route", KNOWN], check=True, capture_output=True, env=env)   # its vector is stored
    for cmd in cases.values():                   # (and the bytecode written, the ONNX graph exported) from now on
        subprocess.run(cmd(-1) if callable(cmd) else cmd, check=True, capture_output=True, env=env)
    times: dict[str, list[float]] = {k: [] for k in cases}
    for run in range(args.runs):
        for name, cmd in cases.items():
            t0 = time.perf_counter()
            subprocess.run(cmd(run) if callable(cmd) else cmd, check=True, capture_output=True, env=env)
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["bare duckdb count (floor)"])
    print(f"| command | median s ({args.runs} runs, alternating) | min | max | x floor |")
    print("|---|---|---|---|---|")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"| `{name}` | {m:.3f} | {min(ts):.3f} | {max(ts):.3f} | {m / base:.2f} |")
    shutil.rmtree(work)


def new_text(run: int, tag: str) -> str:
    """A text no registry holds: a new one for every run and backend of this invocation."""
    return NEW.format(run=run, tag=f"{tag} {uuid.uuid4().hex[:8]}")


if __name__ == "__main__":
    main()
