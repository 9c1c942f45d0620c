"""HTTP JSON API over the same `Registry` (FastAPI + uvicorn). `registry serve` runs it.

- The server owns the DuckDB file while it runs (DuckDB lets one process open it) and says where it listens in
  `<db>.serving` (serve/http/advert.py): a CLI command started meanwhile goes through its HTTP API
  (serve/http/client.py), or says in one line that the file is served.
- Reads never wait for writes (serve/serving.py): routes answer from an in-memory snapshot swapped whole when a write
  commits; the other reads (models, history, similar, fallback, portfolio, fingerprint) run on their own
  connections, which DuckDB serves from the last commit while a write is in progress. Every write (register,
  evaluations, availability, routing-log rows) goes through one writer thread that commits what is waiting in one
  transaction; a write is answered once durable. New query texts are encoded in shared batches.
- A crash loses no acknowledged write; routing-log rows are written by the writer's next cycle, so a crash loses at
  most the rows of routes answered in the last cycle and the 0.1 s before it (serve/writer.py; /health reports the
  longest cycle).
- Writing endpoints require `Authorization: Bearer <token>` when a token is configured; routing and fingerprinting
  do not (the one only appends to the routing log, the other writes nothing).
- Errors are JSON `{"detail": "<one line>"}`: bad input 400, a missing or ill-typed field 422, unknown names 404
  (a query id too), a request the registry as it stands cannot take or answer 409 (a change that needs `update`,
  prices it lacks, more models than it holds); those of the OpenAI-compatible `/v1/...` routes are in OpenAI's
  shape, `{"error": {"message", "type", "code"}}`.
- Every request first passes the guards of serve/http/guards.py (its Host and Origin, the token before the body is
  read, the body counted against the limit), and every response carries the pages' security headers.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from registry.api import Registry
from registry.core import dialect, settings
from registry.core.errors import (
    Conflict,
    DatabaseLocked,
    EndpointFailed,
    InputError,
    NotFound,
    RegistryError,
    UnknownReference,
)
from registry.core.keys import UpstreamKeys
from registry.serve import proxy, web
from registry.serve.context import ServerState
from registry.serve.http import advert, connections, contract, guards, listener
from registry.serve.http import traffic as traffic_http
from registry.serve.http.asking_budget import AskingBusy
from registry.serve.routes_models import availability_router, endpoints_router, models_router
from registry.serve.routes_reads import reads_router, status_router
from registry.serve.routes_routing import routing_router
from registry.serve.serving import Serving

MAX_BODY = 64 << 20       # bytes: the largest request body (an uploaded results file) the server reads
# DuckDB runs a query on the thread that asks (no worker threads) unless REGISTRY_DUCKDB_THREADS says otherwise: the
# writer's queries then run at the writer's priority, and reads' small queries do not hand work across threads
DUCKDB_THREADS = 1
SHOWN_ERRORS = 5          # validation problems a 422 lists


def create_app(db: str, token: str | None = None, probation_min: int | None = None, create: bool = True, *,
               hosts: guards.Hosts | None = None, deadlines: connections.UpstreamDeadlines | None = None,
               keys: UpstreamKeys | None = None, on_ready: Callable[[float], Any] | None = None,
               traffic: dict | None = None, map_when_ready: bool = False) -> FastAPI:
    """hosts: the names a request's Host may give (`serve` passes those it serves; None, for an app called in
    process, checks none); deadlines: of the proxy's upstream attempts; keys: the API key variables the server may
    read and where each may go (None: none, so no key is ever sent); on_ready: called with the seconds the warm-up
    took (serving.Serving: /health answers while it warms); traffic: what the proxy keeps of requests and how it
    takes feedback (`keep_texts`, `window_s`, `webhook`: serve/http/traffic.py); map_when_ready: draw the home
    page's map in the warm-up (`serve`), not when the first page asks for it."""
    keys = keys or UpstreamKeys({})
    if token is not None and not token.strip():    # nobody could send it: every write would be refused
        raise InputError("the token is blank: give a token of printable characters, or none")
    reg = Registry(db, probation_min=probation_min, create=create)
    threads = settings.current().duckdb_threads
    reg.store.limit_duckdb_threads(DUCKDB_THREADS if threads is None else threads)
    reg.store.save_routing_state = False        # its threads build states side by side; it keeps them in memory
    drawer = web.MapDrawer()
    # (the Store's connection keeps the DuckDB file locked while we serve)
    serving = Serving(reg, on_ready=on_ready, warm_also=(lambda: drawer.draw(reg)) if map_when_ready else None)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        _app.state.server.asking.cancel_all()     # (asking stops first: nothing more is sent or waited for)
        await upstream.aclose()         # the proxy's client
        drawer.close()                  # (a map's reads end before the connection closes)
        serving.close()                 # the writer commits what it holds first
        reg.close()
        if not dialect.is_url(db):      # (uvicorn ends a SIGTERMed process as soon as `serve` has stopped)
            advert.remove(db)           # the file is no longer ours: withdraw our advert, if `serve` wrote one

    # /docs from the package's own Swagger UI files (FastAPI's default fetches them from a CDN: blank offline)
    app = FastAPI(title="LLM model registry", version="1", description=__doc__, docs_url=None, redoc_url=None,
                  lifespan=lifespan)
    app.state.server = ServerState(registry=reg, serving=serving, token=token, max_body=MAX_BODY, keys=keys)

    app.add_middleware(listener.Stopping)     # (inside the guards: its 503 gets their headers)
    app.add_middleware(guards.Guards, token=token, max_body=MAX_BODY, hosts=hosts)
    _offline_docs(app)
    web.mount(app, drawer)      # the pages at / (serve/web.py)
    _add_routes(app, web.pages)
    # the OpenAI-compatible routing proxy at /v1 (serve/proxy.py)
    upstream = proxy.mount(app, serving, deadlines, keys)
    app.state.traffic = traffic_http.Traffic(serving, **(traffic or {}))    # request ids, feedback, drift
    traffic_http.mount(app, app.state.traffic)
    _error_handlers(app)
    # (the suffixed reads, /models/{name}/similar and /fallback, before the bare /models/{name} of the models)
    for router in (status_router, reads_router, models_router, availability_router, endpoints_router,
                   routing_router):
        _add_routes(app, router)
    contract.declare(app)       # /openapi.json: every operation's errors, their shape, its token
    return app


def _add_routes(app: FastAPI, router: APIRouter) -> None:
    """A router's routes as the app's own, in order: `include_router` would keep the router as one entry of
    `app.routes`, and what reads the app's endpoints (the README's check, the OpenAPI schema) reads those."""
    app.router.routes.extend(router.routes)


def _error(path: str, message: str, status: int) -> JSONResponse:
    """{"detail": message}, or OpenAI's error shape on the proxy's routes (the guards answer in the same shapes)."""
    return guards.error_response(path, message, status)


def _error_handlers(app: FastAPI) -> None:
    """Errors are one line each: {"detail": ...} (on /v1/..., OpenAI's shape) with the status the module docstring
    lists."""

    @app.exception_handler(NotFound)
    async def _nf(request, exc):
        return _error(request.url.path, str(exc), 404)

    @app.exception_handler(InputError)
    async def _ie(request, exc):
        return _error(request.url.path, str(exc), 400)

    @app.exception_handler(UnknownReference)      # (a handler is found by the error's class first, then its bases)
    async def _ur(request, exc):
        return _error(request.url.path, str(exc), 404)

    @app.exception_handler(Conflict)
    async def _cf(request, exc):
        return _error(request.url.path, str(exc), 409)

    @app.exception_handler(EndpointFailed)      # an endpoint `ask` asked answered nothing: a bad gateway
    async def _ef(request, exc):
        return _error(request.url.path, str(exc), 502)

    @app.exception_handler(AskingBusy)
    async def _busy(request, exc):
        response = _error(request.url.path, str(exc), 429)
        response.headers["retry-after"] = "30"
        return response

    @app.exception_handler(RegistryError)
    async def _re(request, exc):
        return _error(request.url.path, str(exc), 409 if isinstance(exc, DatabaseLocked) else 400)

    pages = app.exception_handlers.get(HTTPException, http_exception_handler)   # the pages' own (web.mount)

    @app.exception_handler(HTTPException)
    async def _http(request, exc):     # no such route, a wrong method: in the proxy's shape there, else as before
        if exc.status_code == 405:      # Allow: every method of every route on this path (RFC 9110), not the first's
            exc = HTTPException(405, exc.detail, headers={**(exc.headers or {}), "Allow": contract.allowed_methods(
                request.app, request.scope)})
        if request.url.path.startswith(proxy.PREFIX):
            response = proxy.openai_error(str(exc.detail), exc.status_code)
            response.headers.update(exc.headers or {})
            return response
        return await pages(request, exc)

    @app.exception_handler(Exception)
    async def _internal(request, exc):   # a bug of ours: one line to the client, the trace to the server's log
        import traceback

        traceback.print_exception(exc)
        return _error(request.url.path, f"internal error ({type(exc).__name__}); the server's log has the details",
                      500)

    @app.exception_handler(RequestValidationError)
    async def _ve(request, exc):
        errs = exc.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return _error(request.url.path, f"bad JSON: {first.get('ctx', {}).get('error', 'cannot parse')}", 400)
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")) or "body"
        msg = (f"missing field {where!r}" if first.get("type") == "missing"
               else f"field {where!r}: {first.get('msg', 'invalid')}" if where
               else f"the body: {first.get('msg', 'invalid')}")
        if request.url.path.startswith("/ui/"):       # a page: a page that says so
            return web.error_page(request, msg.replace("field ", "parameter ", 1), 422)
        if request.url.path.startswith(proxy.PREFIX):
            return proxy.openai_error(msg, 422)
        if len(errs) > 1:      # a body of many rows: how many are wrong, and the first few, not every one
            msg += f" ({len(errs)} problems; the first {min(len(errs), SHOWN_ERRORS)} listed in 'errors')"
        return JSONResponse({"detail": msg, "errors": [{"loc": e.get("loc"), "msg": e.get("msg")}
                                                       for e in errs[:SHOWN_ERRORS]]}, status_code=422)


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


DOCS_PAGE = """<!DOCTYPE html>
<html><head><meta name="viewport" content="width=device-width, initial-scale=1.0">
<link type="text/css" rel="stylesheet" href="/static/swagger/swagger-ui.css">
<link rel="shortcut icon" href="/static/swagger/favicon.png"><title>{title}: API</title></head>
<body><div id="swagger-ui"></div>
<script src="/static/swagger/swagger-ui-bundle.js"></script><script src="/static/web/docs.js"></script></body></html>
"""


def _offline_docs(app: FastAPI) -> None:
    """/docs from Swagger UI 5's files (which read OpenAPI 3.1, what FastAPI writes), as the fastapi-offline package
    ships them, started by a script file (serve/static/docs.js): FastAPI's page starts it with an inline script,
    which the pages' Content-Security-Policy does not run."""
    import html
    from importlib.resources import files

    from fastapi.responses import HTMLResponse
    from fastapi.staticfiles import StaticFiles

    app.mount("/static/swagger", StaticFiles(directory=str(files("fastapi_offline") / "static")), name="swagger")
    page = DOCS_PAGE.format(title=html.escape(app.title))

    @app.get("/docs", include_in_schema=False)
    def docs():
        return HTMLResponse(page)


# glibc's malloc, as a server of many threads needs it. By default a freed block above the mmap threshold raises the
# threshold to its size (up to 32 MiB), so later arrays of a few MB (a read's, a registration's, a refit's) come from
# the arena of the thread that asked and stay there once freed, behind small blocks still in use: under the asking
# load that kept +170 MB (BENCHMARKS.md). A fixed threshold returns each large block to the system when it is freed;
# a few arenas, not 8 per core, keep ~60 threads from each holding free memory of their own. Fixing the threshold
# also fixes the trim threshold at glibc's 128 KiB, so every small temporary freed at the heap's top gave its pages
# back and the next one faulted them in again (a 36 KB gather: 50 us, not 6): a few MB stay at each arena's top.
MALLOC_MMAP_THRESHOLD = 128 << 10   # bytes (glibc's own starting value, kept fixed)
MALLOC_TRIM_THRESHOLD = 16 << 20    # bytes
MALLOC_ARENAS = 2
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8    # mallopt's parameters (malloc.h)


def bound_malloc() -> bool:
    """Set glibc's malloc for a long-running server (above); a setting the environment gives
    (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_ARENA_MAX) is left as it is. False where the C library
    is not glibc."""
    import ctypes
    import ctypes.util

    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):           # (musl, macOS: their own allocators)
        return False
    done = True
    for env, param, value in (("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD),
                              ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD),
                              ("MALLOC_ARENA_MAX", _M_ARENA_MAX, MALLOC_ARENAS)):
        if env not in os.environ:
            done = mallopt(param, value) == 1 and done
    return done


def serve(db: str, host: str = "127.0.0.1", port: int = 8000, token: str | None = None,
          probation_min: int | None = None, *, allowed_hosts: tuple[str, ...] = (),
          upstream_deadlines: tuple[str, ...] = (), upstream_keys: tuple[str, ...] = (),
          traffic: dict | None = None) -> None:
    """allowed_hosts: names besides the loopback ones and `host` that a request's Host may give ("*": any);
    upstream_deadlines: `NAME=SECONDS` or `MODEL:NAME=SECONDS` (serve/http/connections.py); upstream_keys:
    `NAME=URL`, the key variables the server may read and the one origin each may reach (core/keys.py), besides
    REGISTRY_UPSTREAM_KEYS; traffic: what the proxy keeps and how feedback is taken (`create_app`)."""
    import uvicorn

    deadlines = connections.UpstreamDeadlines.parse(upstream_deadlines)     # a bad one refused before any work
    bound_malloc()                  # (before the server's threads start: arenas are made as threads first allocate)
    config = settings.current()
    keys = UpstreamKeys.parse(config.upstream_keys + tuple(upstream_keys))

    # Routes are short and the writer's cycles long: switch threads every 1 ms (CPython's default is 5 ms) so that a
    # route does not wait out a writer's time slice, its p99 is set by this
    sys.setswitchinterval(config.switch_interval)
    # One thread per numeric call (torch, faiss, numpy's BLAS): requests already run side by side, and a pool's idle
    # thread spinning for work takes the core another request needed (OpenBLAS's took 0.6 of a core under load)
    # (torch is loaded only by what trains, e.g. a bulk onboarding: it takes OMP_NUM_THREADS when it loads, so the
    # server does not import it, 1.5 s, just to set its threads)
    os.environ["OMP_NUM_THREADS"] = str(config.threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(config.threads)
    from threadpoolctl import threadpool_limits

    from registry.embedding.index import load_faiss

    faiss = load_faiss()            # (then its threads are the server's)

    faiss.omp_set_num_threads(config.threads)
    threadpool_limits(config.threads)
    app = create_app(db, token, probation_min, create=False, hosts=guards.Hosts.serving(host, allowed_hosts),
                     deadlines=deadlines, keys=keys, traffic=traffic, map_when_ready=True,
                     on_ready=lambda s: print(f"ready: the routing state is built and the writer runs ({s:.1f} s)",
                                              flush=True))
    # the file is ours now: say where the command line can reach us (`<db>.serving`, serve/http/advert.py)
    secret = advert.new_secret()
    app.state.advert_secret = secret      # (what GET /serving/proof proves: only the file's owner can read it)
    advertised = (not dialect.is_url(db)
                  and advert.write(db, advert.url_for(host, port), bool(token), secret) is not None)
    print(f"serving {db} on http://{host}:{port} (OpenAPI at /openapi.json; writes "
          f"{'need a bearer token' if token else 'are open: no token configured'}); warming up: GET /health says "
          f"when it is ready", flush=True)
    # connections that never finish a request head are closed (serve/http/listener.py); on SIGTERM, requests still
    # running (a proxied one waiting on a slow upstream) get a few seconds, then the server stops
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning", http=listener.with_header_timeout(),
                    timeout_keep_alive=listener.KEEP_ALIVE, timeout_graceful_shutdown=listener.GRACEFUL_SHUTDOWN)
    finally:
        if advertised:
            advert.remove(db)
