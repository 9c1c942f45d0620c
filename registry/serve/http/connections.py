"""Deadlines on every upstream attempt of the routing proxy, so that an upstream that is slow, silent or trickling
costs a caller a bounded wait (and, for `auto`, a fallback) instead of holding the request and its connection:

- connect: to open the connection;
- first-byte: from sending the request to the response's status line and headers;
- between: between two pieces of the body, from the headers on (a response that trickles a byte every minute fails
  at the first gap longer than this);
- total: the whole attempt, request sent to body read.

Defaults are what a user of an LLM API would expect (a long answer may take minutes to generate, an answer that
stops arriving for half a minute has stalled); `registry serve --upstream-deadline NAME=SECONDS` sets one for every
endpoint, `--upstream-deadline MODEL:NAME=SECONDS` for one model's endpoint.
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx

from registry.core.errors import InputError

NAMES = {"connect": "connect", "first-byte": "first_byte", "between": "between", "total": "total"}


@dataclass(frozen=True)
class Deadlines:
    """Seconds; see the module docstring."""
    connect: float = 10.0
    first_byte: float = 120.0
    between: float = 30.0
    total: float = 300.0


@dataclass(frozen=True)
class UpstreamDeadlines:
    default: Deadlines = Deadlines()
    per_model: tuple[tuple[str, Deadlines], ...] = ()

    def of(self, model: str) -> Deadlines:
        return dict(self.per_model).get(model, self.default)

    @classmethod
    def parse(cls, specs: tuple[str, ...] | list[str]) -> UpstreamDeadlines:
        """From `NAME=SECONDS` (every endpoint) and `MODEL:NAME=SECONDS` (one model's; it starts from the settings
        for every endpoint, whichever order they are given in). A bad one: InputError naming it."""
        default: dict[str, float] = {}                 # Deadlines' field -> seconds
        per_model: dict[str, dict[str, float]] = {}    # model -> the same
        for spec in specs:
            key, sep, value = spec.rpartition("=")
            model, _, name = key.rpartition(":")
            if not sep or name not in NAMES:
                raise InputError(f"upstream deadline {spec!r}: give NAME=SECONDS or MODEL:NAME=SECONDS, NAME one of "
                                 f"{', '.join(NAMES)}")
            try:
                seconds = float(value)
            except ValueError:
                seconds = math.nan
            if not (seconds > 0 and math.isfinite(seconds)):
                raise InputError(f"upstream deadline {spec!r}: the seconds must be a positive number")
            (per_model.setdefault(model, {}) if model else default)[NAMES[name]] = seconds
        base = dataclasses.replace(Deadlines(), **default)
        return cls(base, tuple((m, dataclasses.replace(base, **d)) for m, d in per_model.items()))


class UpstreamTimeout(Exception):
    """An upstream attempt ran past one of its deadlines (the message names which)."""


class Attempt:
    """One request to an upstream under its deadlines: `start` waits for the headers, `chunk` for each piece of
    the body; either raises UpstreamTimeout past a deadline. The caller closes it (`close`)."""

    def __init__(self, client: httpx.AsyncClient, request: httpx.Request, deadlines: Deadlines):
        self.client, self.request, self.d = client, request, deadlines
        self.response: httpx.Response | None = None
        self.pieces: AsyncIterator[bytes] | None = None     # the body, once `start` has its headers
        self.t0 = 0.0

    async def start(self) -> httpx.Response:
        loop = asyncio.get_running_loop()
        self.t0 = loop.time()
        wait = min(self.d.first_byte, self.d.total)
        try:
            async with asyncio.timeout(wait):
                self.response = await self.client.send(self.request, stream=True)
        except TimeoutError:
            raise UpstreamTimeout(f"no answer within {wait:g} s") from None
        self.pieces = self.response.aiter_bytes()
        return self.response

    async def chunk(self) -> bytes | None:
        """The next piece of the body; None at its end."""
        assert self.pieces is not None, "chunk after start"
        left = self.t0 + self.d.total - asyncio.get_running_loop().time()
        wait = max(0.0, min(self.d.between, left))
        try:
            async with asyncio.timeout(wait):
                return await anext(self.pieces)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            raise UpstreamTimeout(f"the answer stalled for {self.d.between:g} s" if wait == self.d.between
                                  else f"the answer took over {self.d.total:g} s") from None

    async def body(self) -> bytes:
        out = []
        while (piece := await self.chunk()) is not None:
            out.append(piece)
        return b"".join(out)

    async def relay(self, first: bytes):
        """The body from `first` on, for a streamed answer: past a deadline the stream ends (its caller already has
        the headers), and the upstream connection is closed either way."""
        try:
            if first:
                yield first
            while True:
                try:
                    piece = await self.chunk()
                except UpstreamTimeout:
                    return
                if piece is None:
                    return
                yield piece
        finally:
            await self.close()

    async def close(self) -> None:
        if self.response is not None:
            await self.response.aclose()


def request_timeout(d: Deadlines) -> httpx.Timeout:
    """httpx's own timeouts: connecting and sending; reading is timed by `Attempt` (httpx's read timeout is per read,
    which a trickle never trips)."""
    return httpx.Timeout(connect=d.connect, write=d.between, read=None, pool=d.connect)
