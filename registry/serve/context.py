"""What every router of the HTTP server shares: the server's state (`ServerState`, kept on `app.state.server` and
handed to a handler by `Depends(server)`), the bearer-token check of writing endpoints, answers serialised by
orjson, and a client's JSON rows handed to the library as a file whose errors name what the client sent."""
from __future__ import annotations

import contextlib
import hmac
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import Header, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field, field_validator

from registry.api import Registry
from registry.core.errors import InputError
from registry.core.keys import UpstreamKeys
from registry.data import import_run
from registry.locus.text_encoder import MAX_OPTIONS
from registry.serve.http.asking_budget import AskingBudget
from registry.serve.http.shapes import Correct, QuestionId, RowText
from registry.serve.serving import Serving


@dataclass(frozen=True)
class ServerState:
    registry: Registry       # the facade, for reads on their own connections
    serving: Serving         # routes from the snapshot, every write through the one writer
    token: str | None        # writing endpoints need `Authorization: Bearer <token>`; None: writes are open
    max_body: int            # bytes: the largest request body the server reads
    keys: UpstreamKeys = UpstreamKeys({})    # the API key variables it may read, and where each may go
    asking: AskingBudget = field(default_factory=AskingBudget)     # asking endpoints: how much at once


async def server(request: Request) -> ServerState:
    """The app's state, for `Depends` (async: a handler on the event loop gets it without a thread hop)."""
    return request.app.state.server


def token_problem(token: str | None, authorization: str | None) -> HTTPException | None:
    """Why a request does not carry the server's bearer token (None: it does, or the server has none); compared in
    constant time."""
    if token is None:
        return None
    if not authorization:
        return HTTPException(401, "this endpoint needs the server's token: send Authorization: Bearer <token>",
                             headers={"WWW-Authenticate": "Bearer"})
    if not authorization.startswith("Bearer "):
        return HTTPException(401, "Authorization must be 'Bearer <token>'", headers={"WWW-Authenticate": "Bearer"})
    given = authorization.removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), token.encode()):
        return HTTPException(401, "wrong token", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
    return None


async def require_token(request: Request, authorization: str | None = Header(None)) -> None:
    """The check of a writing endpoint, of the proxy (it spends the endpoints' keys) and of the log (it holds
    routed texts)."""
    problem = token_problem(request.app.state.server.token, authorization)
    if problem is not None:
        raise problem


async def is_authorized(request: Request, authorization: str | None = Header(None)) -> bool:
    """Whether a request that anyone may make carries the token (or the server has none)."""
    return token_problem(request.app.state.server.token, authorization) is None


class EvalRow(BaseModel):
    question_id: QuestionId
    correct: Correct

    @field_validator("question_id", mode="before")
    @classmethod
    def _id_as_written(cls, v):
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
        if not isinstance(v, str):
            raise ValueError(f"a question id is a string or a whole number, got {v!r}")
        return v

    @field_validator("correct", mode="before")
    @classmethod
    def _as_in_a_file(cls, v):
        # the value as a results file would hold it: the file's own rule judges it (a string such as "yes" is not
        # quietly read as true)
        if isinstance(v, bool) or isinstance(v, int):
            return str(int(v))
        if not isinstance(v, str):
            raise ValueError(f"correct must be 0, 1, true or false, got {v!r}")
        return v

    text: RowText | None = None
    options: list[str] | None = Field(None, max_length=MAX_OPTIONS)

    @field_validator("text")
    @classmethod
    def _text_holds_something(cls, v):
        # (the schema's: a text given is not all spaces, even for a query the registry has, whose text it ignores)
        if v is not None and not v.strip(" "):
            raise ValueError("a row's text, when given, must not be empty or only spaces")
        return v


def json_response(obj: Any) -> Response:
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


@contextlib.contextmanager
def rows_named(what: str, path: str, rows: bool = True):
    """Errors about the server's temporary file name what the client sent instead: `evaluations[0]` for line 1 of
    a file of JSON rows, `the uploaded file: line 3` for an upload. The temp path never reaches the client."""
    try:
        yield
    except InputError as exc:
        if exc.file != path and path not in str(exc):
            raise
        problem = exc.problem.replace(path, what)
        if rows:        # the client sent JSON rows: a new query's text goes in the row
            problem = problem.replace(import_run.TEXT_IN_FILE, "the row's `text` field (and `options`, if any)")
        kind = type(exc)        # (its status: an unknown query id is a 404, a conflict a 409)
        if exc.line is None:
            raise kind(problem, file=what) from None
        if rows:
            raise kind(f"{what}[{exc.line - 1}]: {problem}") from None
        raise kind(problem, file=what, line=exc.line) from None


def rows_file(rows: list[EvalRow]) -> str:
    """The client's evaluation rows as a temporary JSONL file (the caller removes it)."""
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        for row in rows:
            r = row.model_dump(exclude_none=True)
            if "options" in r:
                r["options"] = json.dumps(r["options"])
            f.write(json.dumps(r) + "\n")
    return path
