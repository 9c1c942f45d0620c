"""An OpenAI-compatible routing proxy on `registry serve`, as RouteLLM and LiteLLM users expect:

- `GET /v1/models`: "auto" and every model with an endpoint (`registry endpoints set`).
- `POST /v1/chat/completions`: with `"model": "auto"`, the last user message is routed among the models that have an
  endpoint (route options as extra fields or query parameters: `cost_weight`, `min_prob`, `cost_by`), and the
  request goes to the chosen model's upstream with its upstream model id; on a connection error, a deadline passed
  (serve/http/connections.py), a 5xx or a 200 whose body is not JSON, the model's fallback chain is walked. A named
  model is forwarded as is, with no fallback (a deadline passed: 504, another failure: 502). The response is the
  upstream's (streaming passes through once its first piece has come), with headers `x-registry-model` and
  `x-registry-fallback: true|false`; a routed request that was answered also gets `x-registry-request-id`, which is
  its body's `id` too, for feedback (serve/http/traffic.py).
- API keys are read from the environment variable each endpoint names, at request time, and only where the owner
  bound that variable to the endpoint's origin (`serve --upstream-key NAME=URL`, core/keys.py): never stored, never
  logged, never sent elsewhere. An endpoint whose key may not go to it, or whose variable is unset, fails like an
  upstream that cannot be reached (the next model of the chain is tried; a named model: 502 naming why).
- What an upstream sends back: a 2xx body as it came (the key scrubbed from it where it appears) with only the
  headers in PASSED_HEADERS; a 4xx is answered in OpenAI's error shape with the upstream's status and a short,
  sanitised message (its `error.message`, cut to ERROR_CHARS printable characters, the key scrubbed), never its
  body or headers as such.
  The routing log keeps the prompt's hash, not its text, and who answered: its `model` is the model whose upstream
  answered (none when every one failed), `fallback` whether that was a fallback, and its options' `proxy` entry the
  routed choice and the models that failed.
- Errors of the `/v1/...` routes are in OpenAI's shape, `{"error": {"message", "type", "code"}}` (`openai_error`),
  so that an OpenAI client shows the message.
"""
from __future__ import annotations

import json
from typing import Literal

import httpx
from fastapi import Depends, FastAPI, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import JsonDict

from registry.core.errors import Conflict, InputError
from registry.core.keys import KeyRefused, UpstreamKeys
from registry.routing.decision import RouteOptions
from registry.serve.context import require_token
from registry.serve.http import connections, shapes

ROUTE_OPTIONS = ("cost_weight", "min_prob", "cost_by")
# the upstream's response headers passed on (any other, a cookie or an echo of the request, is dropped)
PASSED_HEADERS = {"content-type", "x-request-id", "openai-processing-ms", "retry-after"}
PASSED_PREFIXES = ("x-ratelimit-",)
ERROR_CHARS = 200           # an upstream error's message, as passed on
# one event of a streamed answer, as OpenAPI 3.1 has a text/event-stream schema describe it: its fields (`data`: a
# chat.completion.chunk as JSON, the last one `[DONE]`; an upstream's own events pass through as they came)
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
                            "retry": {"type": "integer", "minimum": 0}}}
PREFIX = "/v1/"
ERROR_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 408: "request_timeout", 409: "conflict", 413: "request_too_large",
               421: "misdirected_request", 422: "invalid_request", 500: "internal_error", 501: "not_implemented",
               502: "upstream_failed", 503: "no_endpoint", 504: "upstream_timeout"}


class ChatMessage(BaseModel):
    """One chat message as OpenAI's API takes it; fields beyond these go upstream as sent."""
    model_config = ConfigDict(extra="allow")
    role: str = Field(min_length=1)
    content: str | list[dict] | None = None


# a user message with text to route on, as JSON Schema: its content a text that is not all space, or content parts
# of which one is such a text
USER_TEXT: JsonDict = {"type": "object", "required": ["role", "content"], "properties": {
    "role": {"const": "user"},
    "content": {"anyOf": [{"type": "string", "pattern": shapes.NOT_BLANK}, {"type": "array", "contains": {
        "type": "object", "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string", "pattern": shapes.NOT_BLANK}}}}]}}}


class ChatRequest(BaseModel):
    """An OpenAI chat completion request: its other fields (temperature, tools, ...) go upstream as sent; the
    route options are the proxy's own and are not sent on."""
    model_config = ConfigDict(extra="allow", json_schema_extra={"not": {
        "required": ["cost_weight", "min_prob"],
        "properties": {"cost_weight": {"type": "number"}, "min_prob": {"type": "number"}}},
        # "auto" routes on a user message's text (last_user_text)
        "if": {"required": ["model"], "properties": {"model": {"const": "auto"}}},
        "then": {"properties": {"messages": {"contains": USER_TEXT}}}})
    model: str = Field(min_length=1, description='"auto" (routed), or a model with an endpoint')
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = None
    cost_weight: float | None = Field(None, ge=0, strict=True)
    min_prob: float | None = Field(None, ge=0, le=1, strict=True)
    cost_by: Literal["cost", "params"] | None = None


def openai_error(message: str, status: int, code: str | None = None) -> JSONResponse:
    """An error as OpenAI's API answers one (what its clients read the message from)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "code": code or ERROR_CODES.get(status)}},
                        status_code=status)


def last_user_text(messages) -> str:
    """The text of the last user message (a string, or the text parts of a list of content parts)."""
    if not isinstance(messages, list) or not messages:
        raise InputError("messages: give a non-empty list of chat messages")
    for m in reversed(messages):
        if isinstance(m, dict) and m.get("role") == "user":
            c = m.get("content")
            if isinstance(c, str) and c.strip():
                return c
            if isinstance(c, list):
                text = "\n".join(p["text"] for p in c if isinstance(p, dict) and p.get("type") == "text"
                                 and isinstance(p.get("text"), str))      # (a part whose text is no string: none)
                if text.strip():
                    return text
    raise InputError("messages: no user message with text to route on")


def mount(app: FastAPI, serving, deadlines: connections.UpstreamDeadlines | None = None,
          keys: UpstreamKeys | None = None) -> httpx.AsyncClient:
    """serving: serving.Serving (routes and endpoints from its current snapshot, log rows through its writer);
    deadlines: of each upstream attempt (serve/http/connections.py); keys: the key variables the server may read
    and where each may go (None: none). -> the upstream client, for the app's lifespan to close."""
    deadlines = deadlines or connections.UpstreamDeadlines()
    keys = keys or UpstreamKeys({})
    client = httpx.AsyncClient(timeout=connections.request_timeout(deadlines.default))

    @app.get("/v1/models", dependencies=[Depends(require_token)])
    def v1_models():
        """OpenAI-style model list: "auto" (routed) and every model with an endpoint."""
        return {"object": "list", "data": [{"id": "auto", "object": "model", "owned_by": "registry"}] + [
            {"id": m, "object": "model", "owned_by": "registry"} for m in serving.snapshots.current.endpoints]}

    # with a token, only its holders may spend the endpoints' API keys (OpenAI clients send it as their key)
    @app.post("/v1/chat/completions", dependencies=[Depends(require_token)], responses={200: {"content": {
        "application/json": {}, "text/event-stream": {"schema": SSE_EVENT}},
        "description": "the completion; with `stream`, server-sent events ending in `data: [DONE]`"}})
    async def chat(request: ChatRequest, cost_weight: float | None = Query(None, ge=0),
                   min_prob: float | None = Query(None, ge=0, le=1),
                   cost_by: Literal["cost", "params"] | None = Query(None)):
        """Route (model "auto") or forward (a named model) an OpenAI chat completion; see the module docstring.
        The route options come in the body or as query parameters (the body's win)."""
        body = request.model_dump(exclude_unset=True)
        eps = serving.snapshots.current.endpoints
        if not eps:     # "auto" too: there is nothing to route among
            return openai_error(f"model {body['model']!r} has no endpoint: no model has one yet "
                                f"(`registry endpoints set MODEL --base-url URL`)", 404, "model_not_found")
        options = {k: body.pop(k, None) for k in ROUTE_OPTIONS}
        if options["cost_weight"] is None and options["min_prob"] is None:    # the body's trade-off, else the query's
            options["cost_weight"], options["min_prob"] = cost_weight, min_prob
        options["cost_by"] = options["cost_by"] or cost_by
        if options["cost_weight"] is not None and options["min_prob"] is not None:      # (both in one place)
            raise InputError("give either a cost weight or a minimum probability, not both")
        routed = None
        if body["model"] == "auto":
            text = last_user_text(body.get("messages"))
            chain, fallback, routed = await run_in_threadpool(_route, serving, text, options)
        elif body["model"] in eps:
            chain, fallback = [body["model"]], False
        else:
            return openai_error(f"model {body['model']!r} has no endpoint (or give 'auto')", 404, "model_not_found")
        last, failed, timed_out = None, [], False
        for i, name in enumerate(chain):
            ep = eps[name]
            try:
                headers = {"Content-Type": "application/json", **keys.header(ep.api_key_env, ep.base_url)}
                limits = deadlines.of(name)
                attempt = connections.Attempt(client, client.build_request(
                    "POST", f"{ep.base_url}/chat/completions", headers=headers,
                    timeout=connections.request_timeout(limits),
                    content=json.dumps({**body, "model": ep.upstream_model})), limits)
            except (KeyRefused, InputError, httpx.InvalidURL, ValueError) as exc:   # nothing was sent
                last = f"{name}: {exc}"
                failed.append(name)
                continue
            try:
                answer = await _attempt(attempt, bool(body.get("stream")))
            except (httpx.HTTPError, connections.UpstreamTimeout, UpstreamFailed) as exc:
                await attempt.close()
                timed_out = isinstance(exc, (connections.UpstreamTimeout, httpx.TimeoutException))
                last = f"{name}: {exc}" if isinstance(exc, (connections.UpstreamTimeout, UpstreamFailed)) \
                    else f"{name}: {type(exc).__name__}"
                failed.append(name)
                continue
            if routed is not None:
                _log_answer(serving, routed, name, failed)
            response = attempt.response
            assert response is not None      # (`_attempt` started it)
            status = response.status_code
            out = passed_headers(response.headers)
            out.update({"x-registry-model": name, "x-registry-fallback": "true" if (fallback or i > 0) else "false"})
            rid = None
            if routed is not None and status < 400:     # an answer: its id is what feedback names
                rid = app.state.traffic.record(routed, name, text, answer if isinstance(answer, bytes) else None)
                out["x-registry-request-id"] = rid
            secret = keys.secret(ep.api_key_env)
            if status >= 400:       # (a 5xx was a failure above): a refusal, told in our words
                if not isinstance(answer, bytes):
                    await attempt.close()
                    answer = b""
                error = openai_error(f"{name}: upstream answered {status}: "
                                     f"{upstream_message(answer, secret)}", status, "upstream_refused")
                error.headers.update({k: v for k, v in out.items() if k != "content-type"})
                return error
            if isinstance(answer, bytes):
                if secret and secret.encode() in answer:
                    answer = answer.replace(secret.encode(), b"[key]")
                if rid is not None:
                    answer = app.state.traffic.with_id(answer, rid)
                return Response(answer, status_code=status, headers=out)
            out["content-type"] = "text/event-stream"    # (also where the upstream answered in one JSON body)
            return StreamingResponse(answer, status_code=response.status_code, headers=out,
                                     background=_closer(attempt))
        if routed is not None:
            _log_answer(serving, routed, None, failed)
        # a deadline that expired is a gateway timeout; an upstream that answered wrongly or not at all, a bad gateway
        return openai_error(f"every model in the chain failed ({', '.join(chain)}); last: {last}",
                            504 if timed_out else 502)

    return client


def passed_headers(headers) -> dict:
    """The upstream's response headers a client gets: PASSED_HEADERS and PASSED_PREFIXES only."""
    return {k: v for k, v in headers.items()
            if k.lower() in PASSED_HEADERS or k.lower().startswith(PASSED_PREFIXES)}


def upstream_message(content: bytes, secret: str | None) -> str:
    """An upstream error body, as one short line to pass on: its OpenAI-shaped `error.message` where it has one,
    else its text; printable characters only, at most ERROR_CHARS, the key scrubbed."""
    text = content.decode("utf-8", "replace")
    try:
        data = json.loads(text)
        found = data.get("error") if isinstance(data, dict) else None
        found = found.get("message") if isinstance(found, dict) else found
        text = found if isinstance(found, str) else text
    except (ValueError, RecursionError):
        pass
    if secret:
        text = text.replace(secret, "[key]")
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if secret and len(secret) >= 8:     # a key cut at the edge still shows none of itself
        text = text.replace(secret[:8], "[key]")
    text = text[:ERROR_CHARS] + ("..." if len(text) > ERROR_CHARS else "")
    return text or "(no message)"


def _route(serving, text: str, options: dict):
    """(models to try in order: the choice, then its fallback chain among models with endpoints; fallback?; the
    routing, whose log row waits for the upstreams' outcome)"""
    snap = serving.snapshots.current
    without = [m for m in snap.routing.known if m not in snap.endpoints]     # only models with an endpoint
    asked = RouteOptions(cost_weight=options["cost_weight"], min_prob=options["min_prob"], unavailable=tuple(without),
                         cost_by=options["cost_by"] or "cost", top=0, log_text=False, log=False)
    # (every candidate: the request's record reads routing's own choice from them, serve/http/traffic.py; the log
    # keeps its LOG_TOP)
    routed = serving.route_unlogged([text], asked)
    d = routed.decisions[0]     # (only the choice is used)
    if d.model is None:
        serving.log(routed)
        ev = snap.routing.evidence
        unsure = sorted(m for m, flag in zip(snap.routing.names, ev.probation.tolist()) if flag and m in snap.endpoints)
        if unsure and set(unsure) >= set(snap.endpoints) & set(snap.routing.names):
            raise Conflict(f"no model to route to: every model with an endpoint ({', '.join(unsure)}) is on "
                           f"probation (embedded from under {ev.minimum} evaluations), which `auto` does not choose; "
                           f"give an established model an endpoint, or name a model")
        raise Conflict(d.note or "no model available")     # (every model with an endpoint is marked down)
    return [d.model] + snap.chain(d.model, set(snap.endpoints), snap.routing.down), d.fallback, routed


def _log_answer(serving, routed, answered: str | None, failed: list[str]) -> None:
    """Log the routed request as it ended: the model that answered (None: none could), whether that was a fallback
    (the routing's own, or a model down the chain), and the models whose upstream failed."""
    d = routed.decisions[0]
    query_hash, text, _, _, candidates, encoder_id, versions, options = routed.log_rows[0]
    used, opts = json.loads(versions), json.loads(options)
    if answered is not None:
        used[answered] = d.versions.get(answered)
    opts["proxy"] = {"chosen": d.model, "answered": answered, "failed": failed}
    row = (query_hash, text, answered, answered is not None and (d.fallback or answered != d.model), candidates,
           encoder_id, json.dumps(used), json.dumps(opts))
    serving.log(routed, [row])


def _closer(attempt):
    from starlette.background import BackgroundTask

    return BackgroundTask(attempt.close)


class UpstreamFailed(Exception):
    """An upstream answered, but not with an answer to pass on (a 5xx, a 200 that is not JSON)."""


async def _attempt(attempt, stream: bool):
    """-> the whole body (bytes), or for a stream an iterator of it once its first piece has come (until then a
    stalled upstream can still be left for the next model). Raises what makes the proxy try the next model."""
    resp = await attempt.start()
    if resp.status_code >= 500:
        raise UpstreamFailed(f"upstream answered {resp.status_code}")
    whole_json = "application/json" in resp.headers.get("content-type", "")     # (it ignored `stream`)
    if stream and resp.status_code < 400 and not whole_json:   # (a refusal is read whole: passed on in our words)
        return attempt.relay(await attempt.chunk() or b"")
    content = await attempt.body()
    await attempt.close()
    if resp.status_code == 200:
        try:
            whole = json.loads(content)
        except (ValueError, RecursionError):
            raise UpstreamFailed("upstream answered 200 with a body that is not JSON") from None
        if stream:      # an upstream that ignored `stream`: its answer as one chunk and the end, as a client expects
            return _one_chunk(as_event_stream(whole))
    return content


def as_event_stream(answer) -> bytes:
    """A whole chat completion as OpenAI's stream of it: one `chat.completion.chunk` carrying each choice's message
    as its delta (and the usage), then `[DONE]`."""
    answer = answer if isinstance(answer, dict) else {}
    choices = [{"index": c.get("index", i), "delta": c.get("message") or {}, "finish_reason": c.get("finish_reason")}
               for i, c in enumerate(answer.get("choices") or []) if isinstance(c, dict)]
    chunk = {k: answer[k] for k in ("id", "created", "model", "system_fingerprint", "usage") if k in answer}
    chunk.update(object="chat.completion.chunk", choices=choices)
    return f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()


async def _one_chunk(data: bytes):
    yield data
