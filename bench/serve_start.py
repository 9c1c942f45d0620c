"""How soon `registry serve` answers, on a copy of a registry: /health's first answer, the moment it says ready (the
routing state built, the writer started), and the first home page, each from the process's start.

    .venv/bin/python bench/serve_start.py --db registry.duckdb [--runs 3] [--fresh]

--fresh: drop the copy's saved routing states first, so the warm-up builds the state whole (the first serve after an
import that no route has followed).
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = str(ROOT / ".venv" / "bin" / "registry")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one(db: str) -> dict:
    port = free_port()
    t0 = time.monotonic()
    proc = subprocess.Popen([REGISTRY, "--db", db, "serve", "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    first = ready = None
    try:
        while time.monotonic() - t0 < 180:
            try:
                h = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()
                first = first or time.monotonic() - t0
                if h.get("ready"):
                    ready = time.monotonic() - t0
                    break
            except httpx.HTTPError:
                if proc.poll() is not None:
                    raise SystemExit(f"serve exited {proc.returncode}: {proc.stderr.read().strip()[-500:]}") from None
            time.sleep(0.05)
        t1 = time.monotonic()
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=120)
        home = time.monotonic() - t1
        assert page.status_code == 200, page.status_code
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return {"health": first, "ready": ready, "home": home}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            db = os.path.join(tmp, "r.duckdb")
            shutil.copy(args.db, db)
            if args.fresh:
                import duckdb

                con = duckdb.connect(db)
                con.execute("DELETE FROM routing_states")
                con.close()
            rows.append(one(db))
            os.remove(db)
    print(f"| serve on {os.path.basename(args.db)}{' (no saved routing state)' if args.fresh else ''} | median (s) "
          f"| runs (s) |")
    print("|---|---|---|")
    for key, what in (("health", "first /health answer"), ("ready", "/health says ready"),
                      ("home", "first home page (after ready)")):
        vals = [r[key] for r in rows]
        print(f"| {what} | {statistics.median(vals):.2f} | {', '.join(f'{v:.2f}' for v in vals)} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
