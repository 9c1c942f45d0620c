"""How `registry serve` listens: uvicorn's HTTP protocol, with a deadline on a request's head. Uvicorn closes a
connection left idle after a response (its keep-alive timeout), but one that never completes a request (opened and
left silent, or sending its headers a byte at a time) would be held for ever: enough of them and nobody else can
connect. Each connection must have sent a whole request head within HEADER_TIMEOUT seconds of opening, or of the
first byte after its previous response; otherwise it is closed.

On SIGTERM, requests still running get GRACEFUL_SHUTDOWN seconds; uvicorn then cancels them, and `Stopping` answers
each one that has not started its response with a 503 in the route's error shape (uvicorn's own answer would be a
plain-text 500, and a traceback per request in the log).
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.auto import AutoHTTPProtocol

HEADER_TIMEOUT = 10.0      # seconds: what a client on a slow network needs for a request head, with room to spare
KEEP_ALIVE = 5             # seconds an idle connection is kept after a response (uvicorn's default)
GRACEFUL_SHUTDOWN = 3      # seconds requests still running get after SIGTERM before they are cancelled


def with_header_timeout(base: type = AutoHTTPProtocol, seconds: float = HEADER_TIMEOUT) -> type:
    """`base` (a uvicorn HTTP protocol class) whose connections close when a request head takes over `seconds`."""

    class HeaderTimeout(base):
        header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self.arm()

        def data_received(self, data: bytes) -> None:
            waiting = self.cycle is None or self.cycle.response_complete
            if waiting and self.header_timer is None:     # the first bytes of a request: its head is on the clock
                self.arm()
            before = self.cycle
            super().data_received(data)
            if self.cycle is not before:                  # a request's head is complete: the app has it
                self.disarm()

        def connection_lost(self, exc):
            self.disarm()
            super().connection_lost(exc)

        def arm(self) -> None:
            self.disarm()
            self.header_timer = asyncio.get_running_loop().call_later(seconds, self.head_too_slow)

        def disarm(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def head_too_slow(self) -> None:
            self.header_timer = None
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeout


STOPPING = (f"the server is stopping: this request was still running {GRACEFUL_SHUTDOWN} s after it was told to "
            f"stop; send it again once the server is back")


class Stopping:
    """ASGI middleware: a request cancelled by the server's shutdown (past the grace) is answered 503, {"detail":
    ...} (OpenAI's shape on the proxy's routes), and leaves no traceback. A response already under way (a stream)
    just ends: its connection is closed."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def sending(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()         # (answered here: the cancellation has done its work)
            if not started:
                await stopping_response(scope["path"])(scope, receive, send)


def stopping_response(path: str):
    from fastapi.responses import JSONResponse

    from registry.serve import proxy

    headers = {"connection": "close", "retry-after": "5"}
    if path.startswith(proxy.PREFIX):
        response = proxy.openai_error(STOPPING, 503, "server_stopping")
        response.headers.update(headers)
        return response
    return JSONResponse({"detail": STOPPING}, status_code=503, headers=headers)
