"""Feedback, the operations a user names: `registry feedback --file outcomes.jsonl` (and the server's
`POST /v1/feedback`, through its writer), `registry feedback-source`, `registry drift`. Input is checked whole
before the transaction; each landing is one transaction (outcomes, their production queries, evaluations and the
drift test's events), and the re-embedding it calls for is onboarding's own (a new version per model, one forward
pass)."""
from __future__ import annotations

from dataclasses import dataclass, field

from registry.core.errors import InputError
from registry.core.store import Store
from registry.data import outbox
from registry.traffic import corrections as corrections_
from registry.traffic import drift as drift_
from registry.traffic import outcomes, sources
from registry.usecases import onboard as onboard_uc

REASON = "production outcomes"


@dataclass
class FeedbackResult:
    outcomes: int                              # outcomes landed
    correct: int                               # of which right, at their sources' thresholds
    models: dict[str, int]                     # model -> outcomes landed for it
    queries_added: int                         # production queries that joined the registry
    events: list[drift_.Event] = field(default_factory=list)    # drift events this landing raised
    reembedded: list[str] = field(default_factory=list)         # models given a new version


def check_window(window_s: float) -> float:
    if isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or not window_s > 0:
        raise InputError(f"the feedback window must be a positive number of seconds, got {window_s!r}")
    return float(window_s)


def feedback(store: Store, path: str, *, min_evaluations: int, window_s: float = outcomes.WINDOW_S,
             webhook: str | None = None, reembed_now: bool = True) -> FeedbackResult:
    """Land a JSONL file of outcomes (all or nothing), run the drift test, then re-embed the models they changed."""
    window_s = check_window(window_s)
    items = outcomes.read_file(path)            # checked whole before the transaction
    out = land(store, items, window_s=window_s, webhook=webhook)
    if reembed_now:
        out.reembedded = reembed(store, min_evaluations)
    return out


def land(store: Store, items: list[outcomes.Outcome], *, window_s: float = outcomes.WINDOW_S,
         webhook: str | None = None) -> FeedbackResult:
    """Checked outcomes (`outcomes.check`) in one transaction with the drift test's new events."""
    with store.tx() as tx:
        landed = outcomes.land(tx, items, window_s)
        events = drift_.check(tx, webhook=webhook)
        corrections_.refresh(tx)        # what routes read, in the landing's own transaction
    return FeedbackResult(landed.outcomes, landed.correct, landed.models, landed.queries_added, events)


def stale_models(store: Store) -> list[int]:
    """Models with counted outcomes newer than what their newest version read."""
    with store.tx() as tx:
        return [int(m) for (m,) in tx.sql(f"""
            SELECT DISTINCT f.model_id FROM feedback f
            LEFT JOIN (SELECT model_id, max(through_batch) AS tb FROM embedding_versions GROUP BY model_id) v
                   ON v.model_id = f.model_id
            WHERE (v.tb IS NULL OR f.batch_id > v.tb)
              AND f.batch_id NOT IN ({sources.LEFT_OUT_BATCHES})""")]


def reembed(store: Store, min_evaluations: int, model_ids: list[int] | None = None) -> list[str]:
    """Enqueue the models whose outcomes no version has read yet (or `model_ids`) and run onboarding -> the models
    given a new version."""
    ids = stale_models(store) if model_ids is None else model_ids
    if not ids:
        return []
    with store.tx() as tx:
        outbox.enqueue(tx, ids, REASON)
    done = onboard_uc.onboard(store, min_evaluations, sweep=False)
    return sorted(o.model for o in done if o.outcome == "embedded")


@dataclass
class SourceResult:
    source: sources.Source
    reembedded: list[str]


def set_source(store: Store, name: str, *, min_evaluations: int, weight: float | None = None,
               threshold: float | None = None, enabled: bool | None = None) -> SourceResult:
    """Set a source's weight, threshold or whether it counts; models whose embedding input changed re-embed."""
    sources.check_name(name)
    sources.check_setting(weight, threshold)
    with store.tx() as tx:
        src, changed = sources.set_source(tx, name, weight, threshold, enabled)
        corrections_.refresh(tx)        # a source's weight or switch changes what they count
    return SourceResult(src, reembed(store, min_evaluations, changed) if changed else [])


def source_list(store: Store) -> list[sources.Source]:
    with store.tx() as tx:
        return sorted(sources.current(tx).values(), key=lambda s: s.name)


def drift(store: Store, model: str | None = None) -> list[drift_.Event]:
    with store.tx() as tx:
        return drift_.events(tx, model)


def outcomes_of(items: object, where: str = "outcome") -> list[outcomes.Outcome]:
    """Outcomes given as plain objects (an HTTP body), checked; each named by its place ("outcome 3")."""
    if not isinstance(items, list) or not items:
        raise InputError("outcomes: give a non-empty list of {request_id, outcome, source}")
    if len(items) > outcomes.MAX_OUTCOMES:
        raise InputError(f"outcomes: at most {outcomes.MAX_OUTCOMES:,} in one request, got {len(items):,}")
    return [outcomes.check(o, f"{where} {i}") for i, o in enumerate(items, 1)]

