"""The HTTP routes that read the embedding space (`reads`: similar models, a fallback chain, a portfolio, a
fingerprint of an unknown endpoint's results; nothing is written) and the server's own state (`status`: its health
and figures, the routing log)."""
from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Literal

from fastapi import APIRouter, Body, Depends, Query, Request

from registry.core.errors import NotFound
from registry.serve.context import EvalRow, ServerState, json_response, require_token, rows_file, rows_named, server
from registry.serve.http import advert

reads_router = APIRouter()
status_router = APIRouter()
# (the log's own check, DuckDB's cast, takes these and more: '2026-01-31 12:00' too)
TIMESTAMP = {"anyOf": [{"type": "string", "format": "date"}, {"type": "string", "format": "date-time"}],
             "description": "only entries at or after this time (e.g. 2026-01-31 or 2026-01-31T12:00:00Z)"}


@reads_router.get("/models/{name:path}/similar")
def similar(name: str, k: int = Query(5, ge=1, le=1000), s: ServerState = Depends(server)):
    """The k nearest models, ranked by shared answers where two models have enough (how alike they err, else how
    often they disagree), else by embedding distance: each neighbour's `combined` is the figure ranked by, its
    `placed_by` the evidence that placed it (`registry similar`; a fallback chain ranks by the embedding alone)."""
    t0 = time.perf_counter()
    out = s.serving.similar(name, k=k)
    s.serving.timed("similar", time.perf_counter() - t0)
    return json_response(out)


@reads_router.get("/stats")
def stats(s: ServerState = Depends(server)):
    """Counts of what the registry holds (`registry stats`), and `probation_min`: the fewest evaluations behind an
    established model's embedding now (what `registry similar` notes)."""
    counted = s.registry.stats(s.serving.writer.book.current_count())     # (the answer book's count, where current)
    return json_response({**asdict(counted), "probation_min": s.registry.probation_min})


@reads_router.get("/models/{name:path}/fallback")
def fallback(name: str, k: int = Query(5, ge=1, le=1000), include_probation: bool = False,
             s: ServerState = Depends(server)):
    """Substitutes for a model that is down, by embedding distance alone (`ranked_by` says so; `similar` also reads
    the answers two models share, so its first may differ)."""
    return json_response(s.registry.fallback(name, k=k, include_probation=include_probation))


@reads_router.get("/portfolio")
def portfolio(*, k: int | None = Query(None, ge=1, le=1000), target: float | None = Query(None, gt=0, le=1),
              method: Literal["kmedoids", "kcenter", "routing"] | None = None, max_params: float | None = None,
              max_cost: float | None = None, include_probation: bool | None = None, fill: bool = False,
              s: ServerState = Depends(server)):
    """A few models keeping the routing or covering the embedding space (k of them, or the fewest keeping a target
    share of the pool's accuracy, at most k if both are given; neither: k=5); models on probation are members only
    with include_probation=true; by routing value, members that add nothing only with fill=true. Each answer has
    its routing accuracy as served on test among the members, the pool's, and the share kept."""
    return json_response(s.registry.portfolio(k=k, target=target, method=method, max_params=max_params,
                                              max_cost=max_cost, include_probation=bool(include_probation),
                                              fill=fill))


@reads_router.post("/fingerprint")
def fingerprint(evaluations: list[EvalRow] = Body(..., embed=True, min_length=1), s: ServerState = Depends(server)):
    """Which registered model (if any) an unknown endpoint's results look like (if this registry has it)."""
    path = rows_file(evaluations)      # (at least one row: the body's schema says so)
    try:
        with rows_named("evaluations", path):
            return json_response(s.registry.fingerprint(path))
    finally:
        os.unlink(path)


@status_router.get("/serving/proof", include_in_schema=False)
def serving_proof(request: Request, nonce: str = Query(..., min_length=16, max_length=128)):
    """The answer to the command line's challenge (serve/http/advert.py): proves this server wrote the advert beside
    the file it serves. Nothing secret leaves: an HMAC of the caller's nonce. 404 where the server advertised none."""
    secret = getattr(request.app.state, "advert_secret", None)
    if not secret:
        raise NotFound("this server advertises no database file")
    return {"proof": advert.proof(secret, nonce, request.app.state.server.registry.path)}


@status_router.get("/health")
def health(s: ServerState = Depends(server)):
    return {"ok": True, "db": s.registry.path, **s.serving.stats()}


@status_router.get("/log", dependencies=[Depends(require_token)])   # it can hold routed texts
def routing_log(since: str | None = Query(None, json_schema_extra=TIMESTAMP), limit: int | None = Query(None, ge=1),
                oldest: bool = False, s: ServerState = Depends(server)):
    """Routing log entries, newest first (oldest=true: oldest first), up to the last route answered."""
    s.serving.flush()
    return json_response(s.registry.routing_log(since=since, limit=limit, oldest=oldest))
