"""One server-wide budget for asking endpoints over HTTP (`POST /models/{name}/ask`, `/verify`, `/watch`): at most
OPERATIONS of them at once (another is refused, 429 with Retry-After, nothing asked), their requests to upstreams
under way at once at most IN_FLIGHT in all (each operation's share), each run on a thread of its own outside the
writer (it hands the writer only its short transactions), and stopped when its client hangs up or the server stops:
the cancel it was given is set, nothing more is sent, and the requests under way are cut."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from registry.core.errors import RegistryError

OPERATIONS = 2          # asking operations at once, server-wide
IN_FLIGHT = 32          # upstream requests under way at once, all of them together
POLL_S = 0.25           # how often a running operation looks whether its client is still there


class AskingBusy(RegistryError):
    """Every asking slot is taken: retry later (429)."""


class AskingBudget:
    def __init__(self, operations: int = OPERATIONS, in_flight: int = IN_FLIGHT):
        self.operations, self.in_flight = operations, in_flight
        self._slots = threading.BoundedSemaphore(operations)
        self._running: set[threading.Event] = set()
        self._lock = threading.Lock()

    @property
    def share(self) -> int:
        """Upstream requests one operation may have under way."""
        return max(1, self.in_flight // self.operations)

    async def run(self, request: Any, fn: Callable[[threading.Event], Any]) -> Any:
        """fn(cancel) on a thread of its own, in a slot of the budget; `cancel` is set when the client hangs up
        (looked at every POLL_S) or this request is cancelled (the server stopping). -> fn's result."""
        if not self._slots.acquire(blocking=False):
            raise AskingBusy(f"the server is already asking endpoints for {self.operations} requests (its limit): "
                             f"send this one again when they are done")
        cancel = threading.Event()
        with self._lock:
            self._running.add(cancel)
        try:
            work = asyncio.get_running_loop().run_in_executor(None, fn, cancel)
            while True:
                done, _ = await asyncio.wait({work}, timeout=POLL_S)
                if done:
                    return work.result()
                if not cancel.is_set() and await request.is_disconnected():
                    cancel.set()
        finally:
            cancel.set()            # (the server stopping cancels the wait above: the asking stops too)
            with self._lock:
                self._running.discard(cancel)
            self._slots.release()

    def cancel_all(self) -> None:
        """Stop every asking operation (the server is stopping)."""
        with self._lock:
            for cancel in self._running:
                cancel.set()
