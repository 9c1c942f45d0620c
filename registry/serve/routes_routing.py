"""The HTTP routes that route query texts (`POST /route`, `/route/batch`): answered from the serving snapshot; the
log rows go to the writer without waiting. The routing proxy (serve/proxy.py) routes through
`Serving.route_unlogged` instead: it logs who answered once its upstreams have.

A request's cost is bounded before it is paid: a batch holds at most `BATCH_TEXTS` texts, of which at most
`BATCH_NEW_TEXTS` the registry has never seen (each costs a MiniLM pass; a known one a lookup), both far smaller
without the server's token. One known text is answered on the event loop (under a millisecond); a batch is routed
`CHUNK` texts at a time on a worker thread and its answer streamed as it is made, so a large batch neither holds the
loop nor the whole answer in memory."""
from __future__ import annotations

import time
from typing import Literal

import anyio
from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

from registry.routing.decision import LISTED, Decision, RouteOptions
from registry.serve.context import ServerState, is_authorized, json_response, server
from registry.serve.http.shapes import Text, WholeNumber
from registry.serve.serving import Serving

# texts in one batch, and texts among them whose vector is not yet known: (with the server's token, without it)
BATCH_TEXTS = (2_000, 200)
BATCH_NEW_TEXTS = (256, 16)
CHUNK = 32              # texts routed and serialised per worker-thread hop: the loop waits at most one chunk's GIL

ROUTE_TOP = LISTED

routing_router = APIRouter()


class RouteOptionsBody(BaseModel):
    """The options every route body takes (`route_options` turns them into RouteOptions). Strict: a number sent
    as a string is refused, as the schema says."""
    # a cost weight and a minimum probability are two ways to trade accuracy for cost: one at a time
    model_config = ConfigDict(strict=True, json_schema_extra={"not": {
        "required": ["cost_weight", "min_prob"],
        "properties": {"cost_weight": {"type": "number"}, "min_prob": {"type": "number"}}}})
    cost_weight: float | None = Field(None, ge=0)
    min_prob: float | None = Field(None, ge=0, le=1)
    unavailable: list[str] | None = Field(None, max_length=10_000)
    log_text: bool = True
    cost_by: Literal["cost", "params"] = "cost"
    include_probation: bool = False
    top: WholeNumber = Field(ROUTE_TOP, ge=0)


class RouteBody(RouteOptionsBody):
    text: Text


class RouteBatchBody(RouteOptionsBody):
    texts: list[Text] = Field(min_length=1, json_schema_extra={"maxItems": BATCH_TEXTS[0]})


def route_options(body: RouteOptionsBody, authorized: bool = True) -> RouteOptions:
    """What a route body asks for, checked where it is made (a bad value: InputError, 400). A caller without the
    server's token routes, but its text is not kept in the log (which only the token may read), and it may not ask
    for that."""
    if not authorized and "log_text" in body.model_fields_set and body.log_text:
        raise HTTPException(401, "log_text: keeping a routed text in the log needs the server's token",
                            headers={"WWW-Authenticate": "Bearer"})
    return RouteOptions(cost_weight=body.cost_weight, min_prob=body.min_prob,
                        unavailable=tuple(body.unavailable or ()), cost_by=body.cost_by,
                        include_probation=body.include_probation, top=body.top, log_text=body.log_text and authorized)


async def options_in_body(request: Request) -> None:
    """A route option in the query string would be ignored (the body holds them): refused, not dropped."""
    given = [k for k in request.query_params if k in RouteOptionsBody.model_fields]
    if given:
        raise HTTPException(400, f"{given[0]}: give route options in the JSON body, not the query string")


def decisions(serving: Serving, texts: list[str], options: RouteOptions) -> list[Decision]:
    """The server's one call of `Serving.route`: every HTTP route routes through it."""
    return serving.route(texts, options)


async def _routed(s: ServerState, texts: list[str], options: RouteOptions, one: bool):
    def answer():
        out = decisions(s.serving, texts, options)
        return json_response(out[0] if one else out)
    t0 = time.perf_counter()
    if s.serving.vectors.known(texts):    # under a millisecond, waits for nothing: answered on the event loop
        out = answer()
        s.serving.timed("route_known", time.perf_counter() - t0)
        return out
    out = await anyio.to_thread.run_sync(answer)     # MiniLM runs: off the loop
    s.serving.timed("route_new", time.perf_counter() - t0)
    return out


def batch_limits(s: ServerState, texts: list[str], authorized: bool) -> None:
    """Refuse (413) a batch over its limits before any of it is routed."""
    who = 0 if authorized else 1
    if len(texts) > BATCH_TEXTS[who]:
        raise HTTPException(413, f"texts: {len(texts)} texts in one batch, at most {BATCH_TEXTS[who]}"
                                 f"{'' if authorized else f' without the server token ({BATCH_TEXTS[0]} with it)'}: "
                                 f"send them in several batches")
    new = s.serving.vectors.unknown(texts)
    if new > BATCH_NEW_TEXTS[who]:
        raise HTTPException(413, f"texts: {new} texts the registry has not seen in one batch, at most "
                                 f"{BATCH_NEW_TEXTS[who]}"
                                 f"{'' if authorized else f' without the server token ({BATCH_NEW_TEXTS[0]} with it)'}"
                                 f" (each is encoded): send them in several batches")


async def _routed_batch(s: ServerState, texts: list[str], options: RouteOptions):
    """A JSON array of decisions, routed and serialised CHUNK texts at a time off the loop and streamed. The first
    chunk is routed before the answer starts, so a bad option is still a 4xx."""
    t0 = time.perf_counter()

    def chunk(i: int) -> bytes:
        body = b",".join(json_response(d).body for d in decisions(s.serving, texts[i:i + CHUNK], options))
        return (b"[" if i == 0 else b",") + body + (b"]" if i + CHUNK >= len(texts) else b"")

    first = await anyio.to_thread.run_sync(chunk, 0)

    async def rest():
        yield first
        for i in range(CHUNK, len(texts), CHUNK):
            yield await anyio.to_thread.run_sync(chunk, i)
        s.serving.timed("route_batch", time.perf_counter() - t0)

    return StreamingResponse(rest(), media_type="application/json")


@routing_router.post("/route", dependencies=[Depends(options_in_body)])
async def route(body: RouteBody, s: ServerState = Depends(server), authorized: bool = Depends(is_authorized)):
    return await _routed(s, [body.text], route_options(body, authorized), one=True)


@routing_router.post("/route/batch", dependencies=[Depends(options_in_body)])
async def route_batch(body: RouteBatchBody, s: ServerState = Depends(server),
                      authorized: bool = Depends(is_authorized)):
    options = route_options(body, authorized)
    batch_limits(s, body.texts, authorized)
    return await _routed_batch(s, body.texts, options)
