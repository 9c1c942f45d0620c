"""Imports that start together, and imports interrupted, on a new file: nothing reported is ever lost.

    .venv/bin/python bench/import_safety.py together --procs 2 4 --rounds 20
    .venv/bin/python bench/import_safety.py sigint --at 0.5 1 2 3 5 8 [--repeat 2]

together: per round, N `registry import ../shared/data/mmlu-pro` processes into one new path, released at one instant (each
sleeps until a common start time, then execs the command); then the file must exist, hold 31 models and 371,244
evaluations (`registry stats --json`), pass `registry db check`, and every process that exited 0 must have printed
what the file holds. sigint: one import into a new file, SIGINT at T seconds: exit 130 and one line on stderr saying
what was committed; the file absent or passing `db check`; a rerun completes the import.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = str(ROOT / ".venv" / "bin" / "registry")
DATA = str(ROOT.parent / "shared" / "data" / "mmlu-pro")
MODELS, EVALUATIONS = 31, 371_244
HOLDS = f"{MODELS} models, 12,032 queries, {EVALUATIONS:,} evaluations"
# (the command itself, started at a common instant: sleep until then, then exec)
AT = "import os, sys, time; time.sleep(max(0.0, float(sys.argv[1]) - time.time())); os.execv(sys.argv[2], sys.argv[2:])"


def stats(db: str) -> dict | None:
    p = subprocess.run([REGISTRY, "--db", db, "stats", "--json"], capture_output=True, text=True)
    return json.loads(p.stdout) if p.returncode == 0 else None


def check(db: str) -> bool:
    return subprocess.run([REGISTRY, "--db", db, "db", "check"], capture_output=True).returncode == 0


def together(procs: int, rounds: int) -> dict:
    bad, exits = [], {}
    for r in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            db = os.path.join(tmp, "r.duckdb")
            start = time.time() + 1.5
            ps = [subprocess.Popen([sys.executable, "-c", AT, str(start), REGISTRY, "--db", db, "import", DATA],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(procs)]
            outs = [(p.wait(), *p.communicate()) for p in ps]
            s = stats(db) if os.path.exists(db) else None
            ok = (s is not None and s["models"] == MODELS and s["evaluations"] == EVALUATIONS and check(db))
            for rc, out, err in outs:
                exits[rc] = exits.get(rc, 0) + 1
                if rc == 0 and HOLDS not in out:      # exited 0 without saying what the file holds
                    ok = False
            if not ok:
                bad.append({"round": r, "stats": s, "outputs": [(rc, out[-300:], err[-300:]) for rc, out, err in outs]})
    return {"procs": procs, "rounds": rounds, "rounds_failed": len(bad), "exit_codes": exits, "failures": bad[:3]}


def sigint(at: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "r.duckdb")
        p = subprocess.Popen([REGISTRY, "--db", db, "import", DATA], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        time.sleep(at)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate()
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("  ")]
        said = [ln for ln in lines if "interrupted" in ln] or (["(finished before the signal)"] if p.returncode == 0
                                                               else [])
        exists = os.path.exists(db)
        state = "absent" if not exists else ("checks" if check(db) else "FAILS db check")
        rerun = subprocess.run([REGISTRY, "--db", db, "import", DATA], capture_output=True, text=True)
        s = stats(db)
        complete = rerun.returncode == 0 and s is not None and s["evaluations"] == EVALUATIONS
        return {"at_s": at, "exit": p.returncode, "said": said[-1] if said else (lines[-1] if lines else ""),
                "lines_saying_interrupted": len(said), "file": state, "rerun_completes": complete,
                "ok": (p.returncode == 0 or p.returncode == 130 and len(said) == 1) and state != "FAILS db check"
                and complete}


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("together")
    t.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    t.add_argument("--rounds", type=int, default=20)
    s = sub.add_parser("sigint")
    s.add_argument("--at", type=float, nargs="+", default=[0.5, 1, 2, 3, 5, 8])
    s.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    if args.what == "together":
        print("| processes | rounds | rounds failed | exit codes |")
        print("|---|---|---|---|")
        for n in args.procs:
            r = together(n, args.rounds)
            print(f"| {n} | {r['rounds']} | {r['rounds_failed']} | {r['exit_codes']} |", flush=True)
            for f in r["failures"]:
                print("  failure:", json.dumps(f)[:1500], flush=True)
    else:
        print("| SIGINT at (s) | exit | line | file after | rerun completes |")
        print("|---|---|---|---|---|")
        for _ in range(args.repeat):
            for at in args.at:
                r = sigint(at)
                print(f"| {at:g} | {r['exit']} | {r['said']} | {r['file']} | {r['rerun_completes']} |"
                      + ("" if r["ok"] else "  <- FAILS"), flush=True)


if __name__ == "__main__":
    main()
