"""Issue 13, bar 2: the routing proxy adds at most 15 ms at p50 over calling the upstream directly, for a known text.

A fake OpenAI upstream (uvicorn, loopback) and a real `registry serve` process on a copy of the registry, every model
given an endpoint at the fake upstream; the same chat request (model "auto", a question the registry holds) is sent
N times directly to the upstream and N times through the proxy, interleaved, by one client.

    .venv/bin/python bench/proxy.py --db registry.duckdb [--n 200]
"""
from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn
from fastapi import FastAPI, Request

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from registry import Registry  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--n", type=int, default=200)
    args = ap.parse_args()
    fake = FastAPI()

    @fake.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        return {"id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}

    up_port = free_port()
    server = uvicorn.Server(uvicorn.Config(fake, host="127.0.0.1", port=up_port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{up_port}/v1"
    tmp = Path(tempfile.mkdtemp())
    db = tmp / "proxy.duckdb"
    shutil.copy(args.db, db)
    with Registry(db) as reg:
        for m in reg.models():
            reg.set_endpoint(m.name, base)
        with reg.store.tx() as tx:
            text = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "registry", "--db", str(db), "serve", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client = httpx.Client(timeout=60)
    try:
        while True:
            try:
                if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        body = {"model": "auto", "messages": [{"role": "user", "content": text}]}
        for _ in range(5):       # warm both paths (the first route builds the routing state)
            client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
            client.post(f"{base}/chat/completions", json=body)
        direct, proxied, chosen = [], [], set()
        for _ in range(args.n):
            t = time.perf_counter()
            client.post(f"{base}/chat/completions", json={**body, "model": "x"}).raise_for_status()
            direct.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            r = client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
            proxied.append((time.perf_counter() - t) * 1000)
            r.raise_for_status()
            chosen.add(r.headers["x-registry-model"])
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        server.should_exit = True
        shutil.rmtree(tmp)
    d, p = statistics.median(direct), statistics.median(proxied)
    q = lambda xs: sorted(xs)[int(0.99 * (len(xs) - 1))]  # noqa: E731
    print(f"| {args.n} requests, one client, loopback | p50 | p99 |\n|---|---|---|")
    print(f"| upstream directly | {d:.1f} ms | {q(direct):.1f} ms |")
    print(f"| through the proxy (route a known text, forward) | {p:.1f} ms | {q(proxied):.1f} ms |")
    print(f"| added by the proxy | {p - d:.1f} ms | | bar <= 15 ms at p50: {'holds' if p - d <= 15 else 'FAILS'}")
    print(f"(routed to: {', '.join(sorted(chosen))})")


if __name__ == "__main__":
    main()
