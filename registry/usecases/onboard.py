"""`registry onboard` and what every writing operation does first and last: run the pending onboarding jobs (embed
the models whose evaluations changed, write their versions), then estimate the stability of the versions without
one; `finish_pending` runs the jobs a crash or an interrupt left behind; `keep_routing_state` brings the routing
state up to date with what was written (a refit where the contenders changed), so that a route only reads."""
from __future__ import annotations

import time

from registry.core.store import Store
from registry.data import outbox
from registry.embedding import onboarding


def onboard(store: Store, min_evaluations: int, *, all_models: bool = False, stability: bool = True,
            seconds: dict[str, float] | None = None, sweep: bool = True,
            prepared: dict[str, onboarding.Prepared] | None = None) -> list[onboarding.JobOutcome]:
    """Every pending job (`all_models`: re-embed every model) in one transaction, then, unless `stability` is
    False, `finish_stabilities`. `seconds` gets each step's time; `prepared`: embeddings a server computed ahead."""
    seconds = {} if seconds is None else seconds
    started = time.perf_counter()
    with store.tx() as tx:
        outcomes = onboarding.run_pending(tx, min_evaluations, all_models=all_models, stability=stability,
                                          prepared=prepared)
    seconds["onboarding"] = round(time.perf_counter() - started, 3)
    if stability:
        started = time.perf_counter()
        if finish_stabilities(store, outcomes, sweep):
            seconds["stability"] = round(time.perf_counter() - started, 3)
    return outcomes


def finish_stabilities(store: Store, outcomes: list[onboarding.JobOutcome], sweep: bool = True) -> bool:
    """After an onboarding: the new versions have their stability (run_pending's); estimate any older version's
    still without one, with `sweep` always, else only when a new version lacks its own. -> whether it ran."""
    if not (sweep or any(o.version_id is not None and o.stability is None for o in outcomes)):
        return False
    estimates = estimate_stability(store)
    for o in outcomes:
        if o.version_id in estimates:
            o.stability = estimates[o.version_id]
    return True


def estimate_stability(store: Store) -> dict[int, float]:
    """{version id: stability} for the versions without one (embeddings of two random halves of its evaluations)."""
    with store.tx() as tx:
        return onboarding.estimate_stability(tx)


def finish_pending(store: Store, min_evaluations: int) -> list[onboarding.JobOutcome]:
    """Run the onboarding jobs a crash or an interrupt may have left behind (what every writing command does
    first) -> their outcomes (none: nothing was pending)."""
    with store.tx() as tx:
        has = bool(outbox.pending(tx))
    return onboard(store, min_evaluations) if has else []


def keep_routing_state(store: Store, probation: int | None = None) -> None:
    """Build, fit and save the routing state where the registry changed in a way routing depends on (seconds, said on
    stderr: routing/fit.py); a read and nothing more where the saved one is current."""
    from registry.routing import state

    with store.tx() as tx:
        if state.read(tx, probation) is None:
            from registry.routing import fit

            fit.keep(tx, probation)
