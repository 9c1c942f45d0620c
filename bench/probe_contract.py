"""The OpenAPI contract fuzzed at depth: schemathesis `--checks all` against a real `registry serve --token` on a
copy of a registry, N examples per operation (tests/test_contract.py runs 20 in the slow tier; this runs 100 or
more), with the settings in tests/schemathesis.toml (the upstream-calling operations' documented 502 / 504 are not
counted as the server's own errors). Three models get an endpoint on a fake upstream on loopback first, so that
the routing proxy's requests are routed and forwarded rather than all refused with a 404 (`--no-endpoints`: none).
Prints the run's last lines and one summary line: examples per operation, cases generated, failures, errors,
seconds.

    .venv/bin/python bench/probe_contract.py --db registry.duckdb [--examples 100] [--seed 1 2 3] [--phases ...]
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry import Registry  # noqa: E402
from tests.conftest import start_server  # noqa: E402
from tests.http_tools import FakeUpstream  # noqa: E402

TOKEN = "c0ntract"
CONFIG = ROOT / "tests" / "schemathesis.toml"


def run(origin: str, examples: int, seed: int, phases: str | None, timeout: float) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG), "run", f"{origin}/openapi.json",
           "--checks", "all", "--max-examples", str(examples), "--seed", str(seed), "--workers", "1",
           "--request-timeout", "60", "--no-color", "--header", f"Authorization: Bearer {TOKEN}"]
    if phases:
        cmd += ["--phases", phases]
    with tempfile.TemporaryDirectory() as cwd:          # (its run cache goes there)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return out.returncode, out.stdout + out.stderr


def counts(text: str) -> dict[str, int]:
    """failures and errors from schemathesis's last line, cases generated from its summary."""
    last = [line for line in text.splitlines() if line.startswith("=") and " in " in line]
    tail = last[-1] if last else ""
    got = {what: int(m[1]) if (m := re.search(rf"(\d+) {what}", tail)) else 0 for what in ("failure", "error")}
    generated = re.search(r"(\d+) generated", text)
    got["generated"] = int(generated[1]) if generated else 0
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=str(ROOT / "registry.duckdb"), help="the registry to copy (never modified)")
    ap.add_argument("--examples", type=int, default=100, help="examples per operation")
    ap.add_argument("--seed", type=int, nargs="+", default=[20261203], help="one run per seed, on one server")
    ap.add_argument("--phases", default=None, help="schemathesis phases (default: all of them)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds the whole run may take")
    ap.add_argument("--no-endpoints", action="store_true", help="give no model an endpoint")
    args = ap.parse_args()
    upstream = None if args.no_endpoints else FakeUpstream()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "registry.duckdb"
        shutil.copy(args.db, db)
        if upstream is not None:
            with Registry(db) as reg:
                for m in [m.name for m in reg.models()][:3]:
                    reg.set_endpoint(m, upstream.base, upstream_model=f"up-{m}")
        proc, origin = start_server(db, TOKEN)
        try:
            # the first new text loads MiniLM: once here, not inside a fuzzed request's time
            httpx.post(f"{origin}/route", json={"text": "warm up the text encoder"}, timeout=120)
            runs = []
            for seed in args.seed:
                t0 = time.time()
                rc, text = run(origin, args.examples, seed, args.phases, args.timeout)
                runs.append((seed, rc, text, time.time() - t0, threads_of(proc.pid)))
        finally:
            proc.terminate()
            try:
                log, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                log, _ = proc.communicate()
            if upstream is not None:
                upstream.close()
    for seed, rc, text, seconds, threads in runs:
        lines = text.splitlines()
        found = [i for i, line in enumerate(lines) if re.match(r"=+ (ERRORS|FAILURES) =+", line)]
        print("\n".join(lines[found[0] if found else -30:]))       # what it found, then its summary
        got = counts(text)
        print(f"schemathesis --checks all, {args.examples} examples per operation, seed {seed}"
              f"{', phases ' + args.phases if args.phases else ''}"
              f"{'' if upstream is None else ', 3 models with an endpoint'}: {got['generated']} cases generated, "
              f"{got['failure']} failures, {got['error']} errors, exit {rc}, {seconds:.0f} s; server threads "
              f"after it: {threads}")
    print(f"server log: {log.count('Traceback')} tracebacks"
          + ("" if upstream is None else f"; the fake upstream answered {len(upstream.seen)} requests"))


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


if __name__ == "__main__":
    main()
