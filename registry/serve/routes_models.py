"""The HTTP routes of the models themselves: the list, one model and its history, registering one (JSON rows or an
uploaded results file, through the writer); the availability marks (`availability`); and where the routing proxy
sends each model's requests (`endpoints`)."""
from __future__ import annotations

import os
import tempfile
from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette import convertors
from starlette.exceptions import HTTPException

from registry.answers.catalog import MODEL_PAGE, MODEL_PAGE_MAX
from registry.core.errors import InputError
from registry.data.endpoints import ENV_NAME
from registry.data.import_models_queries import PATH_SUFFIXES
from registry.serve.context import EvalRow, ServerState, json_response, require_token, rows_file, rows_named, server
from registry.serve.http import shapes

UPLOAD_TYPES = {"text/csv": ".csv", "application/x-ndjson": ".jsonl", "application/jsonl": ".jsonl",
                "application/vnd.apache.parquet": ".parquet", "application/octet-stream": ".csv"}

models_router = APIRouter()
availability_router = APIRouter()
endpoints_router = APIRouter()


class RegisterBody(BaseModel):
    model_config = ConfigDict(strict=True)       # a number sent as a string is refused, as the schema says
    name: shapes.ModelName
    evaluations: list[EvalRow] = Field(min_length=1)
    family: str | None = None
    provider: str | None = None
    params_b: float | None = Field(None, ge=0)
    cost: float | None = Field(None, ge=0)
    open_weights: bool | None = None
    tags: dict | None = None
    update: bool = False


MAX_QUESTIONS = 2048      # questions one asking request may ask (verify: of each endpoint, repeats besides)
MAX_DEADLINE = 120.0      # seconds one upstream request may take


class AskBody(BaseModel):
    model_config = ConfigDict(strict=True)
    n: shapes.WholeNumber = Field(128, ge=1, le=MAX_QUESTIONS)
    plan: Literal["fingerprint", "probe", "random"] = "fingerprint"
    concurrency: shapes.WholeNumber = Field(8, ge=1, le=16)
    base_url: str | None = Field(None, json_schema_extra=shapes.BASE_URL_SCHEMA)
    upstream_model: shapes.ModelName | None = None
    api_key_env: str | None = Field(None, json_schema_extra={"pattern": ENV_NAME})
    keep_responses: bool = False
    seed: shapes.WholeNumber = Field(0, ge=0, le=2**32 - 1)
    deadline: float = Field(60.0, gt=0, le=MAX_DEADLINE)


class ClaimBody(BaseModel):
    model_config = ConfigDict(strict=True)
    base_url: str = Field(json_schema_extra=shapes.BASE_URL_SCHEMA)
    name: shapes.ModelName | None = Field(None, min_length=1)      # (its schema's minLength, enforced)
    upstream_model: shapes.ModelName | None = None
    api_key_env: str | None = Field(None, json_schema_extra={"pattern": ENV_NAME})
    reference: bool = False
    watched: bool = True


class VerifyBody(BaseModel):
    model_config = ConfigDict(strict=True)
    endpoints: list[shapes.ModelName] | None = None
    n: shapes.WholeNumber = Field(256, ge=1, le=MAX_QUESTIONS)
    repeat: shapes.WholeNumber = Field(32, ge=0, le=256)
    seed: shapes.WholeNumber = Field(0, ge=0, le=2**32 - 1)
    concurrency: shapes.WholeNumber = Field(8, ge=1, le=16)
    deadline: float = Field(60.0, gt=0, le=MAX_DEADLINE)


class WatchBody(BaseModel):
    model_config = ConfigDict(strict=True)
    n: shapes.WholeNumber = Field(64, ge=8, le=MAX_QUESTIONS)
    models: list[shapes.ModelName] | None = None
    seed: shapes.WholeNumber = Field(0, ge=0, le=2**32 - 1)
    concurrency: shapes.WholeNumber = Field(8, ge=1, le=16)
    deadline: float = Field(60.0, gt=0, le=MAX_DEADLINE)


class RenameBody(BaseModel):
    model_config = ConfigDict(strict=True)
    name: shapes.ModelName
    reason: str | None = Field(None, max_length=1000)


class AvailabilityBody(BaseModel):
    model_config = ConfigDict(strict=True)
    models: list[str] = Field(min_length=1)
    reason: str | None = None


class EndpointBody(BaseModel):
    model_config = ConfigDict(strict=True)
    base_url: str = Field(json_schema_extra=shapes.BASE_URL_SCHEMA)
    upstream_model: shapes.ModelName | None = None
    api_key_env: str | None = Field(None, json_schema_extra={"pattern": ENV_NAME})


# {name:path}: a name may hold "/" (Hugging Face's org/model), so the routes with a suffix come before the bare
# one, which would otherwise take "org/model/history" as a name (the app includes the other suffixes' router first)
MAX_OFFSET = 2 ** 53          # (a page's offset: past any registry, within what the database takes)


@models_router.get("/models")
def models(request: Request, s: ServerState = Depends(server),
           limit: Annotated[int, Query(ge=0, le=MODEL_PAGE_MAX)] = MODEL_PAGE,
           offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0):
    """A page of the models, by name (`limit` from `offset`): the total in `x-total-count`, the next page in `Link`
    (as GitHub's API pages)."""
    page = s.registry.models(limit=limit, offset=offset)
    total = s.registry.model_count()
    out = json_response(page)
    out.headers["x-total-count"] = str(total)
    if offset + len(page) < total and limit:
        out.headers["link"] = f'<{request.url.path}?limit={limit}&offset={offset + limit}>; rel="next"'
    return out


@models_router.get("/models/{name:path}/history")
def history(name: str, s: ServerState = Depends(server)):
    return json_response(s.registry.history(name))


@models_router.get("/models/{name:path}/verdicts")
def endpoint_verdicts(name: str, s: ServerState = Depends(server)):
    """Each endpoint claiming the model and its verdict now (what `registry verify` and `watch` report)."""
    return json_response(s.registry.endpoint_verdicts(name))


# the paths under a model (/models/NAME/history), from the one list the name rule reads (no name ends in one)
SUBPATHS = tuple(suffix.lstrip("/") for suffix in PATH_SUFFIXES)
POST_ONLY = ("evaluations", "ask", "claims", "verify", "rename")   # of those, the ones a GET may not take


@models_router.get("/models/{name:path}")
def show(name: str, s: ServerState = Depends(server)):
    # (a name never ends in a path suffix: GET /models/X/claims is the wrong method on a path, not a model)
    if "/" in name and name.rsplit("/", 1)[1] in POST_ONLY:
        raise HTTPException(405, "Method Not Allowed")
    return json_response(s.registry.show(name))


class _ModelPath(convertors.PathConvertor):
    """A model's name in a path that a method of its own acts on (DELETE /models/X): any path, not one ending in a
    path under a model (DELETE /models/X/history is the wrong method on that path: 405, not model 'X/history')."""
    regex = r"(?!.*/(?:" + "|".join(SUBPATHS) + r")$).*"


convertors.register_url_convertor("model", _ModelPath())


@models_router.delete("/models/{name:model}", dependencies=[Depends(require_token)])
def delete(name: shapes.ModelName, s: ServerState = Depends(server),
           reason: Annotated[str | None, Query(max_length=1000)] = None):
    """`registry delete NAME`: it leaves every list and answer; its versions and results stay (its history)."""
    return json_response(s.serving.write(lambda: s.registry.delete(name, reason=reason)))


@models_router.post("/models/{name:path}/rename", dependencies=[Depends(require_token)])
def rename(name: shapes.ModelName, body: RenameBody, s: ServerState = Depends(server)):
    """`registry rename NAME NEW`: its versions, results and aliases stay its own."""
    return json_response(s.serving.write(lambda: s.registry.rename(name, body.name, reason=body.reason)))


@models_router.post("/models", dependencies=[Depends(require_token)])
def register(body: RegisterBody, s: ServerState = Depends(server)):
    """Register (or update) a model with its evaluations as JSON rows; it is embedded at once."""
    path = rows_file(body.evaluations)
    try:
        with rows_named("evaluations", path):
            return json_response(s.serving.register(body.name, path, dict(
                family=body.family, provider=body.provider, params_b=body.params_b, cost=body.cost,
                open_weights=body.open_weights, tags=body.tags), update=body.update))
    finally:
        os.unlink(path)


@models_router.post("/models/{name:path}/evaluations", dependencies=[Depends(require_token)],
                    openapi_extra={"requestBody": {"required": True, "content": {"text/csv": {"schema": {
                        "type": "string", "pattern": shapes.CSV_UPLOAD}}}}})
async def upload(name: shapes.ModelName, request: Request, s: ServerState = Depends(server), *,
                 family: str | None = None, provider: str | None = None,
                 params_b: float | None = Query(None, ge=0), cost: float | None = Query(None, ge=0),
                 open_weights: bool | None = None, update: bool = False,
                 tag: list[Annotated[str, Field(pattern="=")]] = Query([], description="K=V, repeatable: the "
                                                                                    "model's tags"),
                 k: int = Query(5, ge=1, le=1000, description="nearest models the answer lists")):
    """Upload an evaluations file as the request body (CSV, JSONL or Parquet: say which in Content-Type:
    text/csv, application/x-ndjson or application/jsonl, application/vnd.apache.parquet; application/octet-stream
    is read as CSV); the model's metadata, as `registry register` takes it, in the query string (what `registry
    register` sends while the server holds the file)."""
    tags = {}
    for t in tag:
        if "=" not in t:
            raise InputError(f"tag {t!r} is not K=V")
        key, value = t.split("=", 1)
        tags[key.strip()] = value.strip()
    metadata = dict(family=family, provider=provider, params_b=params_b, cost=cost, open_weights=open_weights,
                    tags=tags)
    kind = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if kind not in UPLOAD_TYPES:
        raise InputError(f"Content-Type {kind or '(none)'} not accepted; use one of {sorted(UPLOAD_TYPES)}")
    chunks, size = [], 0
    async for chunk in request.stream():     # a body without Content-Length is capped here too
        size += len(chunk)
        if size > s.max_body:
            return JSONResponse({"detail": f"request body over {s.max_body // (1 << 20)} MiB"}, status_code=413)
        chunks.append(chunk)
    data = b"".join(chunks)
    if not data:
        raise InputError("empty upload")
    fd, path = tempfile.mkstemp(suffix=UPLOAD_TYPES[kind])
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    try:
        def run():
            with rows_named("the uploaded file", path, rows=False):
                return json_response(s.serving.register(name, path, metadata, update=update, k=k))
        return await anyio.to_thread.run_sync(run)
    finally:
        os.unlink(path)


@models_router.post("/models/{name:path}/ask", dependencies=[Depends(require_token)])
async def ask(name: shapes.ModelName, body: AskBody, request: Request, s: ServerState = Depends(server)):
    """`registry ask NAME`: ask its endpoint (or body.base_url), grade and store the answers, say what they show."""
    # a key goes only to the origin the owner bound it to (core/keys.py): checked before anything is written or sent;
    # a base_url other than the model's recorded endpoint is refused (409), never recorded in its place: the routing
    # proxy sends the model's requests there. An endpoint that answers nothing: 502, nothing stored
    # (asked on a thread of its own in the server's asking budget; the writer takes only its transactions)
    options = {**body.model_dump(), "concurrency": min(body.concurrency, s.asking.share)}
    return json_response(await s.asking.run(request, lambda cancel: s.registry.ask(
        name, **options, keys=s.keys, keep_endpoint=True, write=s.serving.write, cancel=cancel)))


@models_router.post("/models/{name:path}/claims", dependencies=[Depends(require_token)])
def claim(name: shapes.ModelName, body: ClaimBody, s: ServerState = Depends(server)):
    """`registry endpoints add NAME`: an endpoint claiming NAME, a model of its own; its key only as bound. The
    reference mark (what every verdict is judged against) is the owner's, set from the command line: 403 here."""
    if body.reference:
        raise HTTPException(403, "the reference mark is the owner's: set it with `registry endpoints add MODEL "
                                 "--base-url URL --reference` on the registry's own machine")
    s.keys.check(body.api_key_env, body.base_url)
    return json_response(s.serving.write(lambda: s.registry.claim(name, **body.model_dump())))


@models_router.post("/models/{name:path}/verify", dependencies=[Depends(require_token)])
async def verify(name: shapes.ModelName, body: VerifyBody, request: Request, s: ServerState = Depends(server)):
    """`registry verify NAME`: every endpoint claiming NAME asked the same planned questions and judged (in the
    server's asking budget, outside its writer; a client that hangs up stops it)."""
    r = await s.asking.run(request, lambda cancel: s.registry.verify(
        name, **body.model_dump(), keys=s.keys, write=s.serving.write, cancel=cancel, max_in_flight=s.asking.share))
    return json_response({**r.__dict__, "faithful": r.faithful})


@models_router.get("/watch")
def watch_status(s: ServerState = Depends(server)):
    """`registry watch --status`: every watched endpoint's rounds and events so far."""
    return json_response(s.registry.watch(status=True))


@models_router.post("/watch", dependencies=[Depends(require_token)])
async def watch_round(body: WatchBody, request: Request, s: ServerState = Depends(server)):
    """`registry watch --once`: one round for every watched endpoint (events in the answer and the timeline), in the
    server's asking budget, outside its writer."""
    return json_response(await s.asking.run(request, lambda cancel: s.registry.watch(
        **body.model_dump(), keys=s.keys, write=s.serving.write, cancel=cancel, max_in_flight=s.asking.share)))


@availability_router.get("/availability")
def availability(s: ServerState = Depends(server)):
    return json_response(s.registry.availability())


@availability_router.post("/availability/unavailable", dependencies=[Depends(require_token)])
def mark_unavailable(body: AvailabilityBody, s: ServerState = Depends(server)):
    return json_response(s.serving.write(lambda: s.registry.mark_unavailable(body.models, body.reason)))


@availability_router.post("/availability/available", dependencies=[Depends(require_token)])
def mark_available(body: AvailabilityBody, s: ServerState = Depends(server)):
    return json_response(s.serving.write(lambda: s.registry.mark_available(body.models, body.reason)))


@endpoints_router.get("/endpoints")
def endpoints(s: ServerState = Depends(server)):
    return json_response(s.registry.endpoints())


@endpoints_router.put("/endpoints/{model:path}", dependencies=[Depends(require_token)])
def set_endpoint(model: str, body: EndpointBody, s: ServerState = Depends(server)):
    """Where the routing proxy sends MODEL's requests (`registry endpoints set`); the proxy uses it at once. Its
    api_key_env must be one the owner bound to this base URL's origin (`serve --upstream-key`)."""
    s.keys.check(body.api_key_env, body.base_url)
    return json_response(s.serving.write(lambda: s.registry.set_endpoint(
        model, body.base_url, upstream_model=body.upstream_model, api_key_env=body.api_key_env)))


@endpoints_router.delete("/endpoints/{model:path}", dependencies=[Depends(require_token)])
def remove_endpoint(model: str, s: ServerState = Depends(server)):
    """MODEL's endpoint removed (`registry endpoints remove`): the proxy no longer sends it requests."""
    s.serving.write(lambda: s.registry.remove_endpoint(model))
    return {"model": model, "removed": True}
