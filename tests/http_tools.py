"""What the network-safety tests drive a real server with: a fake OpenAI upstream that misbehaves on demand (asyncio
streams on loopback, in a thread), a raw-socket client that sends a chunked body until the server answers, and the
server's resident memory; and a fake chat upstream for `registry ask` (a threading HTTP server)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class FakeUpstream:
    """An OpenAI-compatible upstream on a free loopback port. How it answers a request is set per upstream model id
    (`modes[model]`, "ok" by default):
    - "ok": a chat completion naming the model;
    - "trickle": the headers at once, then one byte of the body every `gap` seconds ("trickle-stream": the same
      as an event stream);
    - "notjson": 200 with an HTML page;
    - "echo": 401 whose body and `X-Echo` header repeat the request's Authorization (an upstream leaking its key).
    `seen` records (model, Authorization) of every request; `open` counts connections still held."""

    def __init__(self, gap: float = 1.0):
        self.gap, self.modes, self.seen, self.open = gap, {}, [], 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self.run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)
        self.base = f"http://127.0.0.1:{self.port}/v1"

    def run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self.handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            fields = dict(line.split(": ", 1) for line in head.split("\r\n")[1:] if ": " in line)
            fields = {k.lower(): v for k, v in fields.items()}
            body = json.loads(await reader.readexactly(int(fields.get("content-length", "0"))))
            self.seen.append((body["model"], fields.get("authorization")))
            mode = self.modes.get(body["model"], "ok")
            if mode in ("trickle", "trickle-stream"):
                kind = b"text/event-stream" if mode == "trickle-stream" else b"application/json"
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + kind + b"\r\ncontent-length: 1000\r\n\r\n")
                for _ in range(1000):
                    writer.write(b" ")
                    await writer.drain()
                    await asyncio.sleep(self.gap)
                    if reader.at_eof():            # the proxy hung up
                        break
                return
            if mode == "echo":
                auth = (fields.get("authorization") or "").encode()
                payload = json.dumps({"error": {"message": f"bad key {auth.decode()}"}}).encode()
                writer.write(b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\nx-echo: " + auth
                             + b"\r\nset-cookie: s=" + auth.replace(b" ", b"_") + b"\r\ncontent-length: "
                             + str(len(payload)).encode() + b"\r\nconnection: close\r\n\r\n" + payload)
                await writer.drain()
                return
            if mode == "notjson":
                payload, kind = b"<html>502 Bad Gateway</html>", b"text/html"
            else:
                payload, kind = json.dumps({"id": "x", "object": "chat.completion", "model": body["model"], "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": f"from {body['model']}"}}]}).encode(), \
                    b"application/json"
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + kind + b"\r\ncontent-length: "
                         + str(len(payload)).encode() + b"\r\nconnection: close\r\n\r\n" + payload)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):   # (cancelled: by close)
            pass
        finally:
            self.open -= 1
            writer.close()

    def close(self) -> None:
        async def stop():
            tasks = asyncio.all_tasks() - {asyncio.current_task()}
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def chunked_post(origin: str, path: str, total: int, headers: dict | None = None,
                 chunk: int = 1 << 20) -> tuple[int, dict, bytes, int]:
    """POST `total` bytes to `path` with Transfer-Encoding: chunked, made as it goes (never held whole), stopping
    as soon as the server answers. -> (status, headers, body, bytes sent)."""
    url = urlsplit(origin)
    s = socket.create_connection((url.hostname, url.port), timeout=60)
    head = (f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: chunked\r\n" + "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()) + "\r\n")
    s.sendall(head.encode())
    piece = b"%x\r\n" % chunk + b"7" * chunk + b"\r\n"
    sent = 0
    first = True
    while sent < total:
        # a server that refuses on the head answers at once: give it the moment a careful client gives
        if select.select([s], [], [], 0.5 if first else 0)[0]:
            break
        first = False
        try:
            s.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += chunk
    else:
        s.sendall(b"0\r\n\r\n")
    data = b""
    try:
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            more = s.recv(65536)
            if not more:
                break
            data += more
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if ": " in line)}
    return int(lines[0].split()[1]), fields, body, sent


def _length(data: bytes) -> int:
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    for line in head.split("\r\n"):
        if line.startswith("content-length:"):
            return int(line.split(":", 1)[1])
    return 1 << 30


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def wait_for(check, timeout: float, step: float = 0.1) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if check():
            return True
        time.sleep(step)
    return check()


def raw_request(origin: str, data: bytes) -> tuple[int, bytes]:
    """Send `data` as it is (a request no HTTP client would make) and read the answer. -> (status, answer)"""
    url = urlsplit(origin)
    with socket.create_connection((url.hostname, url.port), timeout=30) as s:
        s.sendall(data)
        answer = read_answer(s)
    return int(answer.split(b" ", 2)[1]), answer


def read_answer(s: socket.socket) -> bytes:
    """An HTTP answer's head and body (as long as its Content-Length says, or to the connection's end)."""
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
        more = s.recv(65536)
        if not more:
            break
        answer += more
    return answer


class ChatUpstream:
    """A fake /v1/chat/completions for `registry ask`: `answer(question_text) -> reply text` (None: hang;
    "TRICKLE": headers, then a byte every 0.2 s; "ERROR": 500), after `latency` seconds, with `throttle` 429s
    first; its answers name `served_model` (default: the model asked for) and bill `bill` times the prompt's
    bytes / 4 as prompt tokens (default: 10 tokens)."""

    def __init__(self, answer, throttle: int = 0, retry_after: str = "0", latency: float = 0.0,
                 served_model: str | None = None, bill: float | None = None):
        self.answer, self.throttle, self.retry_after, self.latency = answer, throttle, retry_after, latency
        self.served_model, self.bill = served_model, bill
        self.requests, self.auth = 0, []
        self.lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with upstream.lock:
                    upstream.requests += 1
                    upstream.auth.append(self.headers.get("authorization"))
                    throttled = upstream.throttle > 0
                    upstream.throttle -= throttled
                time.sleep(upstream.latency)
                if throttled:
                    self.send_response(429)
                    self.send_header("retry-after", upstream.retry_after)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                text = body["messages"][0]["content"].split("\n\n", 1)[1]
                reply = upstream.answer(text)
                if reply is None:
                    time.sleep(30)
                    return
                if reply == "ERROR":            # a failing upstream: 500 on every request
                    self.send_response(500)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                if reply == "TRICKLE":          # headers at once, then a byte every 0.2 s for ever (30 s)
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", "1000")
                    self.end_headers()
                    for _ in range(150):
                        try:
                            self.wfile.write(b" ")
                            self.wfile.flush()
                        except OSError:
                            return
                        time.sleep(0.2)
                    return
                sent = len(body["messages"][0]["content"].encode())
                billed = 10 if upstream.bill is None else round(upstream.bill * (sent / 4 + 12))   # (+ the template)
                out = json.dumps({"model": upstream.served_model or body.get("model"),
                                  "choices": [{"message": {"role": "assistant", "content": reply}}],
                                  "usage": {"prompt_tokens": billed, "completion_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self._handler = Handler
        self._listen(0)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _listen(self, port: int) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler)
        self.server.daemon_threads = True
        # (a short poll: shutdown waits out one, and every test closes its upstream)
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def down(self):
        """An outage: nothing listens at the URL (connections refused) until `up`."""
        self.close()

    def up(self):
        self._listen(int(self.url.rsplit(":", 1)[1]))

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def serving(app):
    """An ASGI app (a fake upstream written with FastAPI) served by uvicorn in a thread on a free loopback port:
    -> its origin, http://127.0.0.1:PORT; stopped on exit."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
