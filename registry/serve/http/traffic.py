"""The router learning from its own traffic, as served: the proxy's request records (`Traffic.record`: an id per
request routed with model `auto`, returned in the `x-registry-request-id` header and as the body's `id`), and the
routes that take outcomes back and show what they raised:

- `POST /v1/feedback` (token): `{"outcomes": [{request_id, outcome, source}, ...]}` (at most MAX_OUTCOMES), or one
  outcome as the body. Landed by the writer, all or nothing (traffic/outcomes.py), with the drift test; answered
  once durable. The corrections routing takes from the outcomes are saved in the landing's transaction, and the
  next snapshot routes with them (as `registry route` does); the models with new outcomes re-embed once
  REEMBED_OUTCOMES have come, or REEMBED_S after the first one still waiting (a timer thread), through the writer
  too.
- `GET /drift` (`?model=`): the drift events; `GET /feedback/sources`: the sources and their settings.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any

from fastapi import Body, Depends, FastAPI, Query
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from registry.core.errors import InputError
from registry.routing import query_texts
from registry.serve.context import require_token
from registry.traffic import corrections, requests, sources
from registry.traffic.outcomes import WINDOW_S
from registry.usecases.traffic import feedback as feedback_uc

MAX_OUTCOMES = 1_000      # outcomes in one request
REEMBED_OUTCOMES = 1_000  # outcomes landed before the models they name re-embed
REEMBED_S = 60.0          # or this long after the first outcome still waiting for it
# while outcomes stream in, the models re-embed every few seconds, and each new set of versions leaves routing's
# interaction terms carried over (a refit, tens of seconds of CPU on 2 cores, would follow every REFIT_S): they are
# refitted at most this often meanwhile; the versions themselves route at once
REFIT_WHILE_FEEDBACK_S = 600.0

# what POST /v1/feedback takes, as the document says it (the handler checks it itself, so that a refusal names the
# outcome in one line, traffic/outcomes.py): a schema-valid body is refused only for what the registry holds
OUTCOME = {"type": "object", "required": ["request_id", "outcome"], "additionalProperties": False, "properties": {
    "request_id": {"type": "string", "pattern": requests.ID.pattern,
                   "description": "the id the proxy returned for the request (x-registry-request-id)"},
    "outcome": {"anyOf": [{"type": "boolean"}, {"type": "number", "minimum": 0, "maximum": 1}],
                "description": "0/1 (or true/false), or a score from 0 to 1 (1/0 at the source's threshold)"},
    "source": {"type": "string", "pattern": sources.NAME.pattern, "default": "default",
               "description": "who sends it (a grader, users' thumbs): its weight, threshold, on or off"}}}
FEEDBACK_BODY = {"anyOf": [
    {"type": "object", "required": ["outcomes"], "additionalProperties": False, "properties": {
        "outcomes": {"type": "array", "minItems": 1, "maxItems": MAX_OUTCOMES, "items": OUTCOME}}},
    OUTCOME], "description": "`{\"outcomes\": [outcome, ...]}`, or one outcome"}


class DriftEvent(BaseModel):
    id: int | None
    model: str
    category: str
    drop: float           # expected minus observed since the change point
    statistic: float
    evidence: dict


class FeedbackAnswer(BaseModel):
    stored: int                   # outcomes landed
    correct: int                  # of which right, at their sources' thresholds
    models: dict[str, int]        # model -> its outcomes landed
    queries_added: int            # production queries that joined the registry
    reembedded: list[str]         # models given a new version by this landing
    events: list[DriftEvent]      # drift events it raised


class Traffic:
    """What the proxy keeps of each answered request, and the feedback's after-effects in a running server."""

    def __init__(self, serving, *, keep_texts: bool = False, window_s: float = WINDOW_S, webhook: str | None = None,
                 reembed_outcomes: int = REEMBED_OUTCOMES, reembed_s: float = REEMBED_S):
        self.serving, self.keep_texts, self.webhook = serving, keep_texts, webhook
        self.window_s = feedback_uc.check_window(window_s)
        self.reembed_outcomes, self.reembed_s = reembed_outcomes, reembed_s
        self._waiting = 0                     # outcomes landed since the last re-embedding
        self._since: float | None = None      # when the first of them landed
        self._lock = threading.Lock()
        self._timer: threading.Thread | None = None
        self.stats = {"records": 0, "landed": 0, "reembeddings": 0, "events": 0}

    # --- the proxy's side -----------------------------------------------------------------------------------------
    def record(self, routed, answered: str, text: str, body: bytes | None) -> str:
        """Hand the answered request's record to the writer (with the log rows: not waited for) -> its id."""
        snap = self.serving.snapshots.current
        d = routed.decisions[0]
        terms = snap.routing.interaction
        category = corrections.category_for(terms, d.query_hash)
        cut, hashes = query_texts.clean_texts([text])
        vec = self.serving.vectors(cut, hashes)[0]
        prob = next((c.prob for c in d.candidates if c.model == answered), None)
        if prob is not None and snap.routing.corrections is not None:
            # routing's own P(correct), without traffic's shifts; and none where those shifts turned routing away
            # from its own choice: the queries another model failed on (that is why routing turned) are harder
            # than predicted for every model, and testing the model taking them over would cry drift
            shift = snap.routing.corrections.shift
            own = {c.model: corrections.uncorrected(c.prob, shift(c.model, category, d.query_hash))
                   for c in d.candidates if c.eligible and c.available}
            prob = own.get(answered)
            if own and max(own, key=own.__getitem__) != answered:
                prob = None
        tokens = requests.usage(body) if body is not None else (None, None)
        cost = dict(zip(snap.routing.names, snap.routing.cost.tolist())).get(answered)
        rid = requests.new_id()
        rec = requests.Record(rid, answered, d.model, category, d.query_hash, cut[0] if self.keep_texts else None,
                              requests.vector_bytes(vec), prob, tokens[0], tokens[1],
                              None if cost is None or cost != cost else cost, snap.routing.encoder_id)
        self.serving.writer.log([rec])
        self.stats["records"] += 1
        return rid

    @staticmethod
    def with_id(body: bytes, rid: str) -> bytes:
        """A chat completion's body with our request id as its `id` (the upstream's is dropped)."""
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            return body
        if not isinstance(data, dict):
            return body
        data["id"] = rid
        return json.dumps(data).encode()

    # --- the writer's side ----------------------------------------------------------------------------------------
    def land(self, items: list) -> feedback_uc.FeedbackResult:
        """On the writer thread: the outcomes, the drift test, the corrections read again, a re-embedding if due."""
        reg = self.serving.reg
        out = feedback_uc.land(reg.store, items, window_s=self.window_s, webhook=self.webhook)
        self.stats["landed"] += out.outcomes
        self.stats["events"] += len(out.events)
        with self._lock:
            self._waiting += out.outcomes
            self._since = self._since or time.monotonic()
            due = self._waiting >= self.reembed_outcomes
        if due:
            out.reembedded = self._reembed()
        writer = self.serving.writer
        writer.refit_every_s = max(writer.refit_every_s, REFIT_WHILE_FEEDBACK_S)
        self._start_timer()
        return out

    def _reembed(self) -> list[str]:
        with self._lock:
            self._waiting, self._since = 0, None
        self.stats["reembeddings"] += 1
        return feedback_uc.reembed(self.serving.reg.store, self.serving.reg.min_evaluations)

    def _start_timer(self) -> None:
        if self._timer is None:
            self._timer = threading.Thread(target=self._tick, daemon=True, name="registry-feedback-timer")
            self._timer.start()

    def _tick(self) -> None:
        """Re-embed outcomes that have waited REEMBED_S, through the writer."""
        while True:
            time.sleep(min(1.0, self.reembed_s / 4))
            with self._lock:
                due = self._since is not None and time.monotonic() - self._since >= self.reembed_s
            if due:
                try:
                    self.serving.write(self._reembed)
                except RuntimeError:        # the server is stopping
                    return


def mount(app: FastAPI, traffic: Traffic) -> None:
    serving = traffic.serving

    @app.post("/v1/feedback", dependencies=[Depends(require_token)], response_model=FeedbackAnswer,
              openapi_extra={"requestBody": {"content": {"application/json": {"schema": FEEDBACK_BODY}}}})
    async def v1_feedback(body: Any = Body(..., examples=[{"outcomes": [
            {"request_id": "req-0123456789abcdef01234567", "outcome": 1, "source": "grader"}]}])):
        """Outcomes of requests the proxy answered: `{"outcomes": [{request_id, outcome, source}, ...]}` or one
        outcome; each id once, within the server's window; all or nothing: 404 for an id the proxy never issued,
        409 for one already used or past its window, 400 for a malformed outcome."""
        if isinstance(body, dict) and "outcomes" in body:
            extra = sorted(set(body) - {"outcomes"})
            if extra:
                raise InputError(f"unknown field {extra[0]!r} beside outcomes (the body is {{\"outcomes\": [...]}} "
                                 f"or one outcome)")
            given = body["outcomes"]
        else:
            given = [body]
        if isinstance(given, list) and len(given) > MAX_OUTCOMES:
            raise InputError(f"outcomes: at most {MAX_OUTCOMES:,} in one request, got {len(given):,}; send them "
                             f"in parts")
        items = feedback_uc.outcomes_of(given)
        out = await run_in_threadpool(serving.write, lambda: traffic.land(items))
        return {"stored": out.outcomes, "correct": out.correct, "models": out.models,
                "queries_added": out.queries_added, "reembedded": out.reembedded,
                "events": [{"model": e.model, "category": e.category, "drop": e.drop, "statistic": e.statistic,
                            "evidence": e.evidence, "id": e.id} for e in out.events]}

    @app.get("/drift")
    def drift(model: str | None = Query(None, max_length=200)):
        """The drift events raised on production outcomes (`registry drift`), oldest first."""
        return [{"id": e.id, "model": e.model, "category": e.category, "drop": e.drop, "statistic": e.statistic,
                 "evidence": e.evidence, "created": e.created} for e in serving.reg.drift(model)]

    @app.get("/feedback/sources")
    def feedback_sources():
        """Every feedback source with its weight, threshold, whether it counts, and its outcomes."""
        return [vars(s) for s in serving.reg.feedback_sources()]
