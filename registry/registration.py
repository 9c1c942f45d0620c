"""Registering a model (`registry register`): its metadata and results in, one transaction, refused whole when it
would silently change a model that exists; then onboarding; then what the registry now says of it: version,
evidence status, nearest models, and a warning where one is due."""
from __future__ import annotations

from dataclasses import dataclass, field

from . import catalog, encoders, evaluations, fingerprint, ingest, neighbours, onboarding
from .errors import InputError
from .neighbours import Neighbour
from .store import Tx


@dataclass
class RegisterResult:
    model: str
    version: int | None
    outcome: str                        # embedded | unchanged | too few evaluations
    n_evaluations: int                  # used for the embedding: current evaluations outside the test split
    stability: float | None
    neighbours: list[Neighbour]
    warning: str | None
    evaluations_added: int
    queries_added: int
    held_out: int = 0                   # current evaluations on test queries: kept, never embedded
    status: str = "not embedded"        # established | probation | not embedded (evidence.py)
    updated: dict = field(default_factory=dict)   # metadata field -> [old, new] (with update=True)
    results_changed: int = 0            # results that superseded different stored ones (with update=True)



@dataclass
class Staged:
    """A registration's rows, written in a transaction (not yet onboarded)."""
    name: str
    changes: dict                       # metadata field -> [old, new]
    evaluations_added: int
    queries_added: int
    results_changed: int


def check(name: str, metadata: dict) -> str:
    """The name to register under, once the metadata is sound (before any transaction)."""
    name = (name or "").strip()
    if not name:
        raise InputError("empty model name")
    for label, value in (("params_b", metadata.get("params_b")), ("cost", metadata.get("cost"))):
        if value is not None and not (value >= 0 and value != float("inf")):
            raise InputError(f"{label} must be a non-negative number, got {value}")
    return name


def stage(tx: Tx, name: str, evals: str, metadata: dict, update: bool = False, progress: bool = False) -> Staged:
    """The model's metadata and results into `tx`, refused whole (InputError) when it would silently change a model
    that exists. The server's writer stages many registrations in one transaction."""
    changes = ingest.upsert_model_metadata(tx, name, **metadata)
    if changes and not update:
        field_, (old, new) = next(iter(changes.items()))
        raise InputError(f"{name!r} is already registered with {field_}={old!r} (given {new!r}"
                         + (f", and {len(changes) - 1} more field(s)" if len(changes) > 1 else "")
                         + "): pass --update (update=True) to change its metadata")
    imported = ingest.run_model_import(tx, name, str(evals), progress=progress)
    changed = ingest.changed_results(tx, name, imported.batch_id)
    if changed and not update:
        qid, old, new = changed[1]
        raise InputError(f"{changed[0]} of these results differ from the ones {name!r} already has (e.g. "
                         f"query {qid}: stored {old}, given {new}): pass --update (update=True) to record them "
                         f"as newer evaluations (the old ones are kept)", file=str(evals))
    return Staged(name, changes, imported.evaluations_added, imported.queries_added, changed[0] if changed else 0)


def report(reg, staged: Staged, o: onboarding.JobOutcome | None, k: int = 5) -> RegisterResult:
    """What the registry now says of a staged and onboarded model (a read): version, evidence status, nearest
    models, warnings. `o`: its onboarding outcome (None: nothing new to embed)."""
    name = staged.name
    with reg.store.tx() as tx:
        if o is None:  # nothing new to embed: its current version
            info = catalog.show(tx, name, reg.probation_min)
            o = onboarding.JobOutcome(name, "unchanged", info.version, info.embedded_from or 0)
        held_out = catalog.held_out(tx, name)
        model_id = tx.sql("SELECT id FROM models WHERE name = ?", [name])[0][0]
        # its answers against every other model's, once: the neighbours' disagreement and the duplicate test use it
        own = evaluations.of_models(tx, [model_id])
        rates = evaluations.disagreement(tx, own["query_id"], own["correct"], [
            m for (m,) in tx.sql("SELECT id FROM models WHERE id <> ?", [model_id])])
        near, notes, status = [], [], "not embedded"
        if o.version is not None:
            near = neighbours.of_model(tx, reg.path, name, k, encoders.require_active(tx), rates=rates)
            status = "probation" if o.n_evaluations < reg.probation_min else "established"
            notes = [] if status == "established" else [
                f"on probation: embedded from {o.n_evaluations} evaluations, routing needs {reg.probation_min} to "
                f"choose it unasked; its nearest models are uncertain at this size"]
        notes += [w for w in [fingerprint.duplicate_warning(tx, name, model_id, rates)] if w]   # from its answers
        warning = "; ".join(notes) or None
    return RegisterResult(name, o.version, o.outcome, o.n_evaluations, o.stability, near, warning,
                          staged.evaluations_added, staged.queries_added, held_out, status, staged.changes,
                          staged.results_changed)


def register(reg, name: str, evals: str, metadata: dict, k: int = 5, progress: bool = False,
             update: bool = False) -> RegisterResult:
    """`Registry.register`, over the facade `reg`: the import and its checks in one transaction (a refusal changes
    nothing), onboarding, then the report in a read."""
    name = check(name, metadata)
    reg._finish_pending()
    with reg.store.tx() as tx:
        staged = stage(tx, name, evals, metadata, update, progress)
    return report(reg, staged, {o.model: o for o in reg.onboard()}.get(name), k)
