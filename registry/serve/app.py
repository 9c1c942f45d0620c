"""HTTP JSON API over the same `Registry` (FastAPI + uvicorn). `registry serve` runs it.

- The server owns the DuckDB file while it runs (DuckDB lets one process write); a CLI command started meanwhile
  says so in one line (store.DatabaseLocked).
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
- Errors are JSON `{"detail": "<one line>"}`: bad input 400, a missing or ill-typed field 422, unknown names 404,
  an optional feature that this registry lacks 501.
"""
from __future__ import annotations

import contextlib
import hmac
import json
import os
import sys
import tempfile
import time
from typing import Any

import anyio
import orjson
from fastapi import Body, Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from registry.data import ingest
from registry.serve import proxy, web
from registry.api import Registry
from registry.core.errors import DatabaseLocked, InputError, NotFound, RegistryError
from registry.routing.options import RouteOptions
from registry.serve.serving import Serving

UPLOAD_TYPES = {"text/csv": ".csv", "application/x-ndjson": ".jsonl", "application/jsonl": ".jsonl",
                "application/vnd.apache.parquet": ".parquet", "application/octet-stream": ".csv"}


class EvalRow(BaseModel):
    question_id: str = Field(description="the query's id (external id, as in the registry's queries)")
    correct: int | bool
    text: str | None = Field(None, description="the query's text, for a query the registry does not have yet")
    options: list[str] | None = None


class RegisterBody(BaseModel):
    name: str
    evaluations: list[EvalRow]
    family: str | None = None
    provider: str | None = None
    params_b: float | None = None
    cost: float | None = None
    open_weights: bool | None = None
    tags: dict | None = None
    update: bool = False


# the candidates a route answer lists unless asked (`top`; 0: every model): the most likely first, and the chosen
# one wherever it ranks. In a registry of hundreds of models the whole list was most of an answer's bytes and time.
ROUTE_TOP = 50


class RouteBody(BaseModel):
    text: str
    cost_weight: float | None = None
    min_prob: float | None = None
    unavailable: list[str] | None = None
    log_text: bool = True
    cost_by: str = "cost"
    include_probation: bool = False
    top: int = ROUTE_TOP


class RouteBatchBody(BaseModel):
    texts: list[str]
    cost_weight: float | None = None
    min_prob: float | None = None
    unavailable: list[str] | None = None
    log_text: bool = True
    cost_by: str = "cost"
    include_probation: bool = False
    top: int = ROUTE_TOP


class AvailabilityBody(BaseModel):
    models: list[str]
    reason: str | None = None


def _out(obj: Any) -> Response:
    """A result as JSON (dataclasses as objects), serialised by orjson in C: FastAPI's own encoder walks every value
    in Python and cost more than answering the route (a route's answer lists every model)."""
    return Response(orjson.dumps(obj, default=_json_default,
                                 option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS),
                    media_type="application/json")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):                      # numpy scalars orjson does not take (e.g. float16)
        return obj.item()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)                               # Path and the like


class _SizeLimit:
    """Bodies over MAX_BODY are refused before they are read (a clear 413, not a server out of memory). Plain ASGI:
    Starlette's BaseHTTPMiddleware costs a task per request."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            size = dict(scope["headers"]).get(b"content-length")
            if size is not None and (not size.isdigit() or int(size) > MAX_BODY):
                response = JSONResponse({"detail": f"request body over {MAX_BODY // (1 << 20)} MiB: send less (a "
                                                   f"results file in parts, say)"}, status_code=413)
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


def create_app(db: str, token: str | None = None, probation_min: int | None = None,
               create: bool = True) -> FastAPI:
    reg = Registry(db, probation_min=probation_min, create=create)
    hold = None
    if reg.store.dialect == "duckdb":     # (PostgreSQL: a server of its own, shared with other processes)
        hold = reg.store.engine.connect()   # keep the file open (and locked against other processes) while we serve
        # DuckDB runs a query on the thread that asks (no worker threads): the writer's queries then run at the
        # writer's priority, and reads' small queries do not hand work across threads
        threads = int(os.environ.get("REGISTRY_DUCKDB_THREADS", "1"))
        hold.connection.driver_connection.execute(f"SET threads = {threads}")
    serving = Serving(reg)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        await upstream.aclose()         # the proxy's client
        serving.close()                 # the writer commits what it holds first
        if hold is not None:
            hold.close()
        reg.close()

    # /docs from the package's own Swagger UI files (FastAPI's default fetches them from a CDN: blank offline)
    app = FastAPI(title="LLM model registry", version="1", description=__doc__, docs_url=None, redoc_url=None,
                  lifespan=lifespan)
    app.state.registry = reg
    app.state.serving = serving

    app.add_middleware(_SizeLimit)
    _offline_docs(app)
    web.mount(app, reg, token)      # the pages at / (serve/web.py)
    upstream = proxy.mount(app, serving)    # the OpenAI-compatible routing proxy at /v1 (serve/proxy.py)

    def writer(authorization: str | None = Header(None)) -> None:
        if token is None:
            return
        if not authorization:
            raise HTTPException(401, "this endpoint writes: send Authorization: Bearer <token>",
                                headers={"WWW-Authenticate": "Bearer"})
        if not authorization.startswith("Bearer "):
            raise HTTPException(401, "Authorization must be 'Bearer <token>'",
                                headers={"WWW-Authenticate": "Bearer"})
        given = authorization.removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, "wrong token", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})

    # --- errors: one line each ----------------------------------------------------------------------------------
    @app.exception_handler(NotFound)
    async def _nf(_, exc):
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(InputError)
    async def _ie(_, exc):
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(RegistryError)
    async def _re(_, exc):
        return JSONResponse({"detail": str(exc)}, status_code=409 if isinstance(exc, DatabaseLocked) else 400)

    @app.exception_handler(Exception)
    async def _internal(_, exc):   # a bug of ours: one line to the client, the trace to the server's log
        import traceback

        traceback.print_exception(exc)
        return JSONResponse({"detail": f"internal error ({type(exc).__name__}); the server's log has the details"},
                            status_code=500)

    @app.exception_handler(RequestValidationError)
    async def _ve(request, exc):
        errs = exc.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return JSONResponse({"detail": f"bad JSON: {first.get('ctx', {}).get('error', 'cannot parse')}"},
                                status_code=400)
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
        msg = (f"missing field {where!r}" if first.get("type") == "missing"
               else f"field {where!r}: {first.get('msg', 'invalid')}")
        if request.url.path.startswith("/ui/") and hasattr(app.state, "error_page"):   # a page: a page that says so
            return app.state.error_page(request, msg.replace("field ", "parameter ", 1), 422)
        return JSONResponse({"detail": msg, "errors": [{"loc": e.get("loc"), "msg": e.get("msg")} for e in errs]},
                            status_code=422)

    # --- reading --------------------------------------------------------------------------------------------------
    @app.get("/health")
    def health():
        return {"ok": True, "db": reg.path, **serving.stats()}

    @app.get("/models")
    def models():
        return _out(reg.models())

    # {name:path}: a name may hold "/" (Hugging Face's org/model), so the routes with a suffix come before the bare
    # one, which would otherwise take "org/model/history" as a name
    @app.get("/models/{name:path}/history")
    def history(name: str):
        return _out(reg.history(name))

    @app.get("/models/{name:path}/similar")
    def similar(name: str, k: int = Query(5, ge=1, le=1000)):
        return _out(reg.similar(name, k=k))

    @app.get("/models/{name:path}/fallback")
    def fallback(name: str, k: int = Query(5, ge=1, le=1000), include_probation: bool = False):
        fn = _optional(reg, "fallback")
        given = {"k": k, "include_probation": include_probation}
        return _out(fn(name, **{a: v for a, v in given.items() if _takes(fn, a)}))

    @app.get("/models/{name:path}")
    def show(name: str):
        return _out(reg.show(name))

    @app.get("/portfolio")
    def portfolio(k: int | None = Query(None, ge=1, le=1000), target: float | None = Query(None, gt=0, le=1),
                  method: str | None = None, max_params: float | None = None, max_cost: float | None = None,
                  include_probation: bool | None = None):
        """A few models covering the embedding space (give k, or a target share of the pool's accuracy); models on
        probation are members only with include_probation=true."""
        fn = _optional(reg, "portfolio")
        given = {"k": k, "target": target, "method": method, "max_params": max_params, "max_cost": max_cost,
                 "include_probation": include_probation}
        return _out(fn(**{a: v for a, v in given.items() if v is not None and _takes(fn, a)}))

    @app.get("/log")
    def routing_log(since: str | None = None, limit: int | None = Query(None, ge=1), oldest: bool = False):
        """Routing log entries, newest first (oldest=true: oldest first), up to the last route answered."""
        serving.flush()
        return _out(reg.routing_log(since=since, limit=limit, oldest=oldest))

    @app.get("/availability")
    def availability():
        return _out(reg.availability())

    # --- routing ----------------------------------------------------------------------------------------------
    async def _routed(texts: list[str], body, one: bool):
        def answer():
            out = serving.route(texts, RouteOptions(
                cost_weight=body.cost_weight, min_prob=body.min_prob, unavailable=body.unavailable or (),
                log_text=body.log_text, cost_by=body.cost_by, include_probation=body.include_probation, top=body.top))
            return _out(out[0] if one else out)
        t0 = time.perf_counter()
        if serving.vectors.known(texts):    # under a millisecond, waits for nothing: answered on the event loop
            out = answer()
            serving.timed("route_known", time.perf_counter() - t0)
            return out
        out = await anyio.to_thread.run_sync(answer)     # MiniLM runs: off the loop
        serving.timed("route_new", time.perf_counter() - t0)
        return out

    @app.post("/route")
    async def route(body: RouteBody):
        return await _routed([body.text], body, one=True)

    @app.post("/route/batch")
    async def route_batch(body: RouteBatchBody):
        if not body.texts:
            raise InputError("texts: give at least one query")
        return await _routed(body.texts, body, one=False)

    # --- writing ----------------------------------------------------------------------------------------------
    @app.post("/models", dependencies=[Depends(writer)])
    def register(body: RegisterBody):
        """Register (or update) a model with its evaluations as JSON rows; it is embedded at once."""
        if not body.evaluations:
            raise InputError("evaluations: give at least one row")
        path = _temp_file([r.model_dump(exclude_none=True) for r in body.evaluations])
        try:
            with _rows_named("evaluations", path):
                return _out(serving.register(body.name, path, dict(
                    family=body.family, provider=body.provider, params_b=body.params_b, cost=body.cost,
                    open_weights=body.open_weights, tags=body.tags), update=body.update))
        finally:
            os.unlink(path)

    @app.post("/models/{name:path}/evaluations", dependencies=[Depends(writer)])
    async def upload(name: str, request: Request):
        """Upload an evaluations file as the request body (CSV, JSONL or Parquet: say which in Content-Type)."""
        kind = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
        if kind not in UPLOAD_TYPES:
            raise InputError(f"Content-Type {kind or '(none)'} not accepted; use one of {sorted(UPLOAD_TYPES)}")
        chunks, size = [], 0
        async for chunk in request.stream():     # a body without Content-Length is capped here too
            size += len(chunk)
            if size > MAX_BODY:
                return JSONResponse({"detail": f"request body over {MAX_BODY // (1 << 20)} MiB"}, status_code=413)
            chunks.append(chunk)
        data = b"".join(chunks)
        if not data:
            raise InputError("empty upload")
        fd, path = tempfile.mkstemp(suffix=UPLOAD_TYPES[kind])
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        try:
            def run():
                with _rows_named("the uploaded file", path, rows=False):
                    return _out(serving.register(name, path))
            return await anyio.to_thread.run_sync(run)
        finally:
            os.unlink(path)

    @app.post("/fingerprint")
    def fingerprint(evaluations: list[EvalRow] = Body(..., embed=True)):
        """Which registered model (if any) an unknown endpoint's results look like (if this registry has it)."""
        fn = _optional(reg, "fingerprint")
        if not evaluations:
            raise InputError("evaluations: give at least one row")
        path = _temp_file([r.model_dump(exclude_none=True) for r in evaluations])
        try:
            with _rows_named("evaluations", path):
                return _out(fn(path))
        finally:
            os.unlink(path)

    @app.post("/availability/unavailable", dependencies=[Depends(writer)])
    def mark_unavailable(body: AvailabilityBody):
        return _out(serving.write(lambda: reg.mark_unavailable(body.models, body.reason)))

    @app.post("/availability/available", dependencies=[Depends(writer)])
    def mark_available(body: AvailabilityBody):
        return _out(serving.write(lambda: reg.mark_available(body.models, body.reason)))

    return app


MAX_BODY = 64 << 20       # bytes: the largest request body (an uploaded results file) the server reads


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _offline_docs(app: FastAPI) -> None:
    import swagger_ui_bundle
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles

    app.mount("/static/swagger", StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="swagger")

    @app.get("/docs", include_in_schema=False)
    def docs():
        return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{app.title}: API",
                                   swagger_js_url="/static/swagger/swagger-ui-bundle.js",
                                   swagger_css_url="/static/swagger/swagger-ui.css",
                                   swagger_favicon_url="/static/swagger/favicon-32x32.png")


def _optional(reg: Registry, name: str):
    fn = getattr(reg, name, None)
    if fn is None:
        raise HTTPException(501, f"this registry has no {name} yet")
    return fn


def _takes(fn, arg: str) -> bool:
    import inspect

    return arg in inspect.signature(fn).parameters


@contextlib.contextmanager
def _rows_named(what: str, path: str, rows: bool = True):
    """Errors about the server's temporary file name what the client sent instead: `evaluations[0]` for line 1 of
    a file of JSON rows, `the uploaded file: line 3` for an upload. The temp path never reaches the client."""
    try:
        yield
    except InputError as exc:
        if exc.file != path and path not in str(exc):
            raise
        problem = exc.problem.replace(path, what)
        if rows:        # the client sent JSON rows: a new query's text goes in the row
            problem = problem.replace(ingest.TEXT_IN_FILE, "the row's `text` field (and `options`, if any)")
        if exc.line is None:
            raise InputError(problem, file=what) from None
        if rows:
            raise InputError(f"{what}[{exc.line - 1}]: {problem}") from None
        raise InputError(problem, file=what, line=exc.line) from None


def _temp_file(rows: list[dict]) -> str:
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for r in rows:
            r["correct"] = int(r["correct"])
            if "options" in r:
                r["options"] = json.dumps(r["options"])
            f.write(json.dumps(r) + "\n")
    return path


def serve(db: str, host: str = "127.0.0.1", port: int = 8000, token: str | None = None,
          probation_min: int | None = None) -> None:
    import uvicorn

    # Routes are short and the writer's cycles long: switch threads every 1 ms (CPython's default is 5 ms) so that a
    # route does not wait out a writer's time slice, its p99 is set by this
    sys.setswitchinterval(float(os.environ.get("REGISTRY_SWITCH_INTERVAL", "0.001")))
    # One thread per numeric call (torch, faiss, numpy's BLAS): requests already run side by side, and a pool's idle
    # thread spinning for work takes the core another request needed (OpenBLAS's took 0.6 of a core under load)
    import faiss
    import torch
    from threadpoolctl import threadpool_limits

    threads = int(os.environ.get("REGISTRY_THREADS", "1"))
    torch.set_num_threads(threads)
    faiss.omp_set_num_threads(threads)
    threadpool_limits(threads)
    app = create_app(db, token, probation_min, create=False)
    print(f"serving {db} on http://{host}:{port} (OpenAPI at /openapi.json; writes "
          f"{'need a bearer token' if token else 'are open: no token configured'})", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
