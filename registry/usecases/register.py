"""`registry register`: a model's metadata and 0/1 results in one transaction (refused whole when it would silently
change a model that exists), then onboarding, then what the registry now says of it (`report`: version, evidence
status, nearest models, a warning where one is due) and its same-model verdict recorded as an alias; `report` is also
how `ask` and the imports by reader report each model. `probe`: the questions to ask a model first. Tidying: `delete`
and `rename` (answers/tidying.py), the endpoints claiming a deleted model deleted with it, and `remove_endpoint`,
which deletes an endpoint that is a model of its own (a claim) rather than leave it behind as a model."""
from __future__ import annotations

from typing import Any

from registry.answers import catalog, probe_plans, registration, tidying
from registry.answers.registration import RegisterResult, Staged
from registry.asking import claims
from registry.core.errors import check_text
from registry.core.store import Store
from registry.data import endpoints
from registry.embedding import evidence, onboarding
from registry.usecases import onboard as onboard_uc


def register(store: Store, name: str, evals: str, metadata: dict[str, Any], *, min_evaluations: int,
             probation: int | None, k: int = 5, progress: bool = False, update: bool = False,
             alias_of: str | None = None) -> RegisterResult:
    """The import and its checks in one transaction (a refusal changes nothing), with `alias_of` (the user's word:
    it is another name of that model); onboarding; then the report in a read, and its same-model verdict recorded
    as an alias. `probation`: the probation minimum set for this registry (None: its data sets it)."""
    name = registration.check(name, metadata)
    check_text(alias_of, "alias_of")
    onboard_uc.finish_pending(store, min_evaluations)
    with store.tx() as tx:
        staged = registration.stage(tx, name, evals, metadata, update, progress)
        if alias_of is not None:
            catalog.set_alias(tx, name, alias_of, "user")
    try:
        outcomes = onboard_uc.onboard(store, min_evaluations)
    except Exception as exc:      # the rows are committed, their onboarding job too: say so, and how to finish
        failed = registration.onboarding_failed(exc, name, staged)
        if failed is None:
            raise
        raise failed from None
    return report(store, staged, {o.model: o for o in outcomes}.get(name), k=k, probation=probation)


def report(store: Store, staged: Staged, o: onboarding.JobOutcome | None, *, k: int = 5,
           probation: int | None = None) -> RegisterResult:
    """What the registry says of a staged and onboarded model, in a read; then its same-model verdict recorded."""
    with store.tx() as tx:
        result = registration.report(tx, staged, o, k, evidence.minimum(tx, probation))
    record_alias(store, result)
    return result


def report_served(store: Store, snap: Any, book: Any, staged: Staged, o: onboarding.JobOutcome | None, *, k: int = 5,
                  probation: int | None = None) -> RegisterResult:
    """`report` from a running server's snapshot and answer book where they can say it (no read), else `report`'s
    read; the alias is not recorded here (the server's writer records it in its own turn)."""
    minimum = 0 if o is None else evidence.store_minimum(store, probation)   # (no read where none is needed)
    served = registration.report_served(snap, book, staged, o, k, minimum)
    if served is not None:
        return served
    with store.tx() as tx:
        return registration.report(tx, staged, o, k, evidence.minimum(tx, probation))


def record_alias(store: Store, result: RegisterResult) -> None:
    """A registration's same-model verdict (`result.alias_of`), recorded in a transaction of its own."""
    if result.alias_of is None:
        return
    with store.tx() as tx:
        registration.record_alias(tx, result)


def probe(store: Store, model: str, n: int = 16, seed: int = 0, out: str | None = None, *,
          min_evaluations: int) -> probe_plans.ProbePlan:
    """The next n queries to ask a new or partly evaluated model so that its embedding and its routing settle
    fastest, written to `out` for `register` (CSV or JSONL, an empty `correct` column to fill in); a read."""
    onboard_uc.finish_pending(store, min_evaluations)
    with store.tx() as tx:
        return probe_plans.plan(tx, model, n, seed, out)


def delete(store: Store, name: str, *, reason: str | None = None) -> tidying.Deleted:
    """`name` deleted, and the endpoints claiming it (each a model of its own), in one transaction."""
    check_text(reason, "reason")
    with store.tx() as tx:
        claimants = [c.endpoint for c in claims.current(tx) if c.model == name]
        out = tidying.delete(tx, name, reason)
        for endpoint in claimants:
            tidying.delete(tx, endpoint, f"the model it claimed, {name}, was deleted")
        out.also = claimants
        return out


def rename(store: Store, old: str, new: str, *, reason: str | None = None) -> tidying.Renamed:
    check_text(reason, "reason")
    with store.tx() as tx:
        return tidying.rename(tx, old, new, reason)


def remove_endpoint(store: Store, model: str) -> None:
    """MODEL's endpoint removed; where MODEL is an endpoint claiming another model (a model of its own, X@provider),
    that model is deleted with it: it has no other use."""
    with store.tx() as tx:
        if any(c.endpoint == model for c in claims.current(tx)):
            tidying.delete(tx, model, "its endpoint was removed")
        else:
            endpoints.remove(tx, model)
