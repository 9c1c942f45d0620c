"""The checks every HTTP request passes before the app sees it, in one plain ASGI middleware (Starlette's
BaseHTTPMiddleware costs a task per request, and reads nothing the checks need):

- Host: only the names this server serves (loopback names, the bound address, `serve --allowed-host`), else 421: a
  web page whose name was re-pointed at this machine (DNS rebinding) cannot reach it.
- Origin: a state-changing request from a page must come from this server's own origin, else 403: another site's
  page cannot write through the owner's browser.
- Token: a request to a route that needs the token is refused (401) before a byte of its body is read, so an
  anonymous caller cannot make the server read, parse or buffer anything.
- Body: counted as it arrives (a chunked body has no Content-Length to trust) and refused (413) past the limit
  (ANON_BODY for a request without the server's token: what anyone may send is small); one that pauses for over
  BODY_GAP seconds is refused too (408).
- Every response carries headers that keep pages from being framed, sniffed, or fed another host's scripts.

Refusals are one line, `{"detail": ...}` (OpenAI's shape on the proxy's routes), and close the connection when the
client had a body to send, so that the server reads none of the rest.
"""
from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match

from registry.serve import proxy
from registry.serve.context import require_token, token_problem

ANON_BODY = 1 << 20    # bytes: the largest body a request without the server's token may send (a route batch's texts)
BODY_GAP = 30.0     # seconds a request body may pause: a client that stops sending half-way does not hold a connection
WRITE_METHODS = frozenset({"POST", "PUT", "DELETE", "PATCH"})
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("0.0.0.0", "::", "")
# 'self' only: the pages load their scripts, styles and images from this server (the map's legend and the bars are
# sized by the page's script, not by inline styles); data: images are Swagger UI's icons
CSP = ("default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
SECURITY_HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-frame-options", b"DENY"),
                    (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]


class BodyRefused(HTTPException):
    """Raised from `receive` once a body passes the limit (413) or stalls (408): an HTTPException, so that FastAPI's
    body parsing passes it on to the app's handlers (which answer in the route's error shape) instead of calling it
    bad JSON."""


@dataclass(frozen=True)
class Hosts:
    """The names a request's Host may give. `extra`: the operator's `--allowed-host` names, also accepted as an
    Origin (a page served under that name, say through a reverse proxy); "*" accepts any Host."""
    names: frozenset[str]
    extra: frozenset[str] = frozenset()
    any_ip: bool = False           # bound to every interface: any IP address (a literal cannot be re-pointed)

    @classmethod
    def serving(cls, bound: str, allowed: tuple[str, ...] | list[str] = ()) -> Hosts:
        extra = frozenset(h.strip().lower().strip("[]").rstrip(".") for h in allowed)
        wildcard = bound.strip().strip("[]") in WILDCARD_BINDS
        names = set(LOOPBACK_NAMES) | extra | (set() if wildcard else {bound.strip().lower().strip("[]")})
        return cls(frozenset(names), extra, wildcard)

    def accepts(self, host: str) -> bool:
        if "*" in self.extra or host in self.names:
            return True
        if not self.any_ip:
            return False
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return False
        return True


def host_name(value: str) -> str:
    """'Example.org:8000' -> 'example.org'; '[::1]:8000' -> '::1'."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def error_response(path: str, message: str, status: int, headers: dict | None = None) -> JSONResponse:
    """{"detail": message}, or OpenAI's error shape on the proxy's routes."""
    response = (proxy.openai_error(message, status) if path.startswith(proxy.PREFIX)
                else JSONResponse({"detail": message}, status_code=status))
    response.headers.update(headers or {})
    return response


def token_routes(app) -> list:
    """The app's routes whose dependencies include the token check (read from the routes themselves, so a route
    that declares `Depends(require_token)` is guarded here with nothing else to keep in step)."""
    return [r for r in app.router.routes
            if any(d.call is require_token for d in getattr(getattr(r, "dependant", None), "dependencies", ()))]


class Guards:
    def __init__(self, app, *, token: str | None, max_body: int, hosts: Hosts | None):
        """hosts None: no Host or Origin check (an app served in-process, as a test client calls it)."""
        self.app, self.token, self.max_body, self.hosts = app, token, max_body, hosts
        self.guarded: list | None = None   # the routes that need the token, read from the app at its first request

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value.decode("latin-1"))
        has_body = b"transfer-encoding" in headers or headers.get(b"content-length", "0") not in ("", "0")
        refusal = self.refusal(scope, headers)
        if refusal is not None:
            status, message, extra = refusal
            extra = {**extra, "connection": "close"} if has_body else extra
            return await error_response(scope["path"], message, status, extra)(scope, receive, self.secured(send))
        limit = self.limit(headers)
        received, cut, done = 0, False, not has_body

        async def counted():
            nonlocal received, cut, done
            if done:            # the body is in: what follows is the client's disconnect, however late
                return await receive()
            try:
                async with asyncio.timeout(BODY_GAP):
                    message = await receive()
            except TimeoutError:
                cut = True
                raise BodyRefused(408, f"the request body stalled for {BODY_GAP:g} s: send it without pauses") \
                    from None
            done = message["type"] != "http.request" or not message.get("more_body", False)
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    cut = True
                    raise BodyRefused(413, self.too_large(limit))
            return message

        started = False
        inner = self.secured(send)

        async def sending(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if cut:         # the rest of the body is never read: the connection cannot carry another request
                    message = {**message, "headers": list(message.get("headers", [])) + [(b"connection", b"close")]}
            await inner(message)

        try:
            await self.app(scope, counted, sending)
        except BodyRefused as exc:
            if started:
                raise
            await error_response(scope["path"], exc.detail, exc.status_code, {"connection": "close"})(
                scope, receive, inner)

    def limit(self, headers: dict) -> int:
        """The body limit of this request: the server's, or ANON_BODY where the server has a token and the request
        does not carry it."""
        if self.token is None or token_problem(self.token, headers.get(b"authorization")) is None:
            return self.max_body
        return min(self.max_body, ANON_BODY)

    def too_large(self, limit: int | None = None) -> str:
        limit = self.max_body if limit is None else limit
        size = f"{limit // (1 << 20)} MiB" if limit >= 1 << 20 else f"{limit // 1024} KiB"
        anon = limit < self.max_body
        return (f"request body over {size}{' without the server token' if anon else ''}: send less "
                f"({'a batch in parts' if anon else 'a results file in parts'}, say)")

    def refusal(self, scope, headers: dict) -> tuple[int, str, dict] | None:
        """(status, message, headers) of a request refused before the app sees it; None: let it in."""
        host = host_name(headers.get(b"host", ""))
        if self.hosts is not None and host and not self.hosts.accepts(host):
            return 421, (f"host {host!r} is not served here: give it to `registry serve --allowed-host` if this "
                         f"server is meant to answer to that name"), {}
        method = scope["method"]
        origin = headers.get(b"origin")
        if self.hosts is not None and origin is not None and method in WRITE_METHODS:
            parts = urlsplit(origin)
            same = parts.netloc.lower() == headers.get(b"host", "").lower()
            if not same and (parts.hostname or "") not in self.hosts.extra:
                return 403, f"origin {origin!r} may not change this server: only its own pages may", {}
        if self.token is not None and self.needs_token(scope):
            problem = token_problem(self.token, headers.get(b"authorization"))
            if problem is not None:
                return problem.status_code, str(problem.detail), dict(problem.headers or {})
        size, limit = headers.get(b"content-length"), self.limit(headers)
        if size is not None and (not size.isdigit() or int(size) > limit):
            return 413, self.too_large(limit), {}
        return None

    def needs_token(self, scope) -> bool:
        if self.guarded is None:
            self.guarded = token_routes(scope["app"])
        return any(r.matches(scope)[0] is Match.FULL for r in self.guarded)

    @staticmethod
    def secured(send):
        async def with_headers(message):
            if message["type"] == "http.response.start":
                have = {name.lower() for name, _ in message.get("headers", [])}
                message = {**message, "headers": list(message.get("headers", []))
                           + [h for h in SECURITY_HEADERS if h[0] not in have]}
            await send(message)
        return with_headers
