"""/openapi.json as the contract the server keeps: FastAPI's document, amended with what it cannot see.

- Every error is declared with the shape the server sends: `{"detail": "<one line>"}` (a 422 may add `errors`, the
  first few problems), on `/v1/...` OpenAI's `{"error": {"message", "type", "code"}}`; FastAPI's default says a 422
  holds a list of problems, which the server never sends.
- Every status an operation can answer is declared: the ones any request can meet in front of the routes (413 a
  body over the limit, 421 a Host the server does not serve, 403 a state-changing request from a foreign Origin,
  401 a write without the token), the ones the handlers raise (400 bad input, 404 an unknown name, 409 a request
  the registry as it stands cannot take, 422 a missing or ill-typed field) and those of the proxy's upstreams
  (502, 504).
- With a token, the operations that need it say so as a bearer security scheme (routing takes it optionally:
  without it a routed text is not logged), instead of an `authorization` header parameter.
- A 405 carries `Allow` with the methods of every route on the path (`allowed_methods`).
"""
from __future__ import annotations

import re

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Match, Route

ERROR = {"type": "object", "required": ["detail"], "properties": {
    "detail": {"type": "string", "description": "what is wrong, in one line"},
    "errors": {"type": "array", "description": "a 422's first few problems", "items": {
        "type": "object", "properties": {"loc": {"type": "array"}, "msg": {"type": "string"}}}}}}
OPENAI_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "code"], "properties": {
        "message": {"type": "string"}, "type": {"type": "string"}, "code": {"type": ["string", "null"]}}}}}
WHY = {400: "Bad input: one line naming the problem",
       401: "The server's token is needed (Authorization: Bearer <token>), or was wrong",
       403: "A state-changing request from a foreign Origin (a web page on another site)",
       404: "An unknown name: a model, a query id, an endpoint",
       409: "The registry as it stands cannot take or answer this (a change that needs `update`, prices or models "
            "it lacks), or its file is locked",
       413: "The request body is over the server's limit",
       421: "A Host the server does not serve (`serve --allowed-host`)",
       422: "A missing or ill-typed field",
       429: "The server is already asking endpoints for as many requests as it takes at once: send it again later",
       500: "A bug of the server's: one line, the details in its log",
       502: "Every upstream in the chain failed (ask: the endpoint answered none of the questions)",
       503: "The server is stopping: the request was still running when its grace after SIGTERM ran out",
       504: "The upstream did not answer in time"}
ANY = {400, 413, 421, 422, 500, 503}     # any operation: bad input, the guards in front of the routes, a bug, a stop
WRITE = {403, 404, 409}                  # an operation that changes state, or takes names in its body
CONFLICT_READS = {"/portfolio"}          # reads that the registry's contents can make unanswerable (409)
PROXY = {404, 502, 504}                  # /v1/chat/completions: an unknown model; its upstreams'
ASKING = {"/models/{name}/ask"}          # writes that call an endpoint: 502 when it answers nothing
BUDGETED = {"/models/{name}/ask", "/models/{name}/verify", "/watch"}   # asking, in the server's budget: 429


def declare(app: FastAPI) -> None:
    """Replace `app.openapi` by one that amends FastAPI's document once (it is cached, as FastAPI's is)."""
    original = app.openapi

    def openapi():
        if app.openapi_schema is None:
            amend(original(), app)
        return app.openapi_schema

    app.openapi = openapi     # type: ignore[method-assign]  # (FastAPI's documented way to amend its document)


def amend(doc: dict, app: FastAPI) -> None:
    token = app.state.server.token is not None
    routes = {(r.path_format, m.lower()): r for r in app.routes if isinstance(r, APIRoute) for m in r.methods or ()}
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    schemas["Error"], schemas["OpenAIError"] = ERROR, OPENAI_ERROR
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    if token:
        doc["components"]["securitySchemes"] = {"bearer": {
            "type": "http", "scheme": "bearer", "description": "the token given to `registry serve --token`"}}
    for path, operations in doc.get("paths", {}).items():
        for method, op in operations.items():
            route = routes.get((path, method))
            needs = _token_checks(route)
            op["parameters"] = [p for p in op.get("parameters", [])
                                if not (p.get("in") == "header" and p.get("name", "").lower() == "authorization")]
            if not op["parameters"]:
                del op["parameters"]
            if token and needs:
                op["security"] = [{"bearer": []}] if "require_token" in needs else [{}, {"bearer": []}]
            codes = set(ANY)
            if method != "get":
                codes |= WRITE
            if "{" in path:
                codes.add(404)
            if path in CONFLICT_READS:
                codes.add(409)
            if path == "/v1/chat/completions":
                codes |= PROXY
                _route_options_as_one(op)
            if path in ASKING:
                codes.add(502)
            if path in BUDGETED and method == "post":
                codes.add(429)
            if token and (needs or method != "get"):
                codes.add(401)
            shape = "OpenAIError" if path.startswith("/v1/") else "Error"
            responses = op.setdefault("responses", {})
            for code in sorted(codes):
                responses[str(code)] = {"description": WHY[code], "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{shape}"}}}}


ROUTE_OPTIONS = {"cost_weight": {"type": "number", "minimum": 0},
                 "min_prob": {"type": "number", "minimum": 0, "maximum": 1},
                 "cost_by": {"type": "string", "enum": ["cost", "params"]}}


def _route_options_as_one(op: dict) -> None:
    """The proxy's route options in its query string, declared as one exploded object (each option its own query
    parameter on the wire, as before): a schema can then say that `cost_weight` and `min_prob` do not go together,
    which separate parameters cannot."""
    params = [p for p in op.get("parameters", []) if not (p.get("in") == "query" and p.get("name") in ROUTE_OPTIONS)]
    op["parameters"] = params + [{
        "name": "route_options", "in": "query", "required": False, "style": "form", "explode": True,
        "description": "route options for model \"auto\" (`cost_weight`, `min_prob`, `cost_by`), one query parameter "
                       "each; a body's cost_weight or min_prob replaces the query's; the two together are refused",
        "schema": {"type": "object", "properties": ROUTE_OPTIONS, "additionalProperties": False,
                   "not": {"required": ["cost_weight", "min_prob"]}}}]


def _token_checks(route: APIRoute | None) -> set[str]:
    """The names of the token checks among a route's dependencies: require_token (needed), is_authorized
    (optional)."""
    if route is None:
        return set()
    found, todo = set(), list(route.dependant.dependencies)
    while todo:
        dep = todo.pop()
        name = getattr(dep.call, "__name__", "")
        if name in ("require_token", "is_authorized"):
            found.add(name)
        todo.extend(dep.dependencies)
    return found


def allowed_methods(app: FastAPI, scope: dict) -> str:
    """The methods some route of `app` takes on `scope`'s path, for a 405's Allow header: the first route that
    matched the path is not the only one ("/models/{name}" and "/models/{name}/evaluations" share paths)."""
    by_path: dict[str, set[str]] = {}
    for route in app.router.routes:       # (routes with methods: Route, FastAPI's APIRoute among them)
        if isinstance(route, Route) and route.methods and route.matches(scope)[0] != Match.NONE:
            by_path.setdefault(route.path_format, set()).update(route.methods)
    if not by_path:
        return ""
    # "/models/{name}" also matches ".../x/evaluations" (a name may hold "/"), but no model name ends in a path
    # suffix: the path with the most fixed text is the one meant
    meant = max(by_path, key=lambda p: len(re.sub(r"{[^}]*}", "", p)))
    return ", ".join(sorted(by_path[meant]))
