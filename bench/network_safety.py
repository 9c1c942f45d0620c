"""`registry serve` under the network probes, measured against a real server process on a copy of a registry:

- a 256 MiB chunked body without the token to POST /models: the answer, how much was sent, the server's memory;
- a 200 MiB chunked body to POST /route: the answer, when, how much was read, the server's memory;
- 400 connections that never send a request: how many are still open 5, 9, 11 and 13 s later;
- an upstream that sends its headers and then a byte every 45 s, with the default deadlines: how long `auto` (which
  falls back) and a named model (504) take to answer.

    .venv/bin/python bench/network_safety.py --db registry.duckdb [--skip-trickle]
"""
from __future__ import annotations

import argparse
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry import Registry, RouteOptions  # noqa: E402
from tests.conftest import start_server  # noqa: E402
from tests.http_tools import FakeUpstream, chunked_post, rss_mib  # noqa: E402

MiB = 1 << 20


def bodies(proc, origin: str) -> None:
    before = rss_mib(proc.pid)
    t0 = time.time()
    status, _, _, sent = chunked_post(origin, "/models", 256 * MiB)
    print(f"POST /models, 256 MiB chunked, no token: {status} after {time.time() - t0:.2f} s, {sent / MiB:.0f} MiB "
          f"sent; server RSS {before:.0f} -> {rss_mib(proc.pid):.0f} MiB")
    before = rss_mib(proc.pid)
    t0 = time.time()
    status, _, _, sent = chunked_post(origin, "/route", 200 * MiB)
    print(f"POST /route, 200 MiB chunked: {status} after {time.time() - t0:.2f} s, {sent / MiB:.0f} MiB sent; "
          f"server RSS {before:.0f} -> {rss_mib(proc.pid):.0f} MiB")


def idle(origin: str) -> None:
    port = int(origin.rsplit(":", 1)[1])
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(400)]
    for s in socks:
        s.setblocking(False)
    t0, closed = time.time(), set()
    for at in (5, 9, 11, 13):
        time.sleep(max(0.0, t0 + at - time.time()))
        for i, s in enumerate(socks):
            try:
                if s.recv(1) == b"":
                    closed.add(i)
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed.add(i)
        print(f"400 silent connections, {at} s later: {400 - len(closed)} still open")
    for s in socks:
        s.close()


def trickle(db: Path) -> None:
    upstream = FakeUpstream(gap=45)
    with Registry(db) as reg:
        with reg.store.tx() as tx:
            text = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]
        choice = reg.route(text, RouteOptions(log=False)).model
        models = [choice] + [link.model for link in reg.fallback(choice, k=2).chain][:1]
        for m in models:
            reg.set_endpoint(m, upstream.base, upstream_model=f"up-{m}")
    upstream.modes[f"up-{choice}"] = "trickle"
    proc, origin = start_server(db)
    try:
        for model in ("auto", choice):
            t0 = time.time()
            r = httpx.post(origin + "/v1/chat/completions", timeout=400,
                           json={"model": model, "messages": [{"role": "user", "content": text}]})
            print(f"trickling upstream (a byte every 45 s), model {model!r}: {r.status_code} "
                  f"({r.headers.get('x-registry-model', '-')}) after {time.time() - t0:.1f} s")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        upstream.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--skip-trickle", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "registry.duckdb"
        shutil.copy(args.db, db)
        proc, origin = start_server(db, "bench-token")
        try:
            bodies(proc, origin)
            idle(origin)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        if not args.skip_trickle:
            trickle(db)


if __name__ == "__main__":
    main()
