"""How `registry serve` listens: uvicorn's HTTP protocol, with a deadline on a request's head. Uvicorn closes a
connection left idle after a response (its keep-alive timeout), but one that never completes a request (opened and
left silent, or sending its headers a byte at a time) would be held for ever: enough of them and nobody else can
connect. Each connection must have sent a whole request head within HEADER_TIMEOUT seconds of opening, or of the
first byte after its previous response; otherwise it is closed.
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
