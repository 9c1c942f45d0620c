"""The steps of registering a model (usecases/register.py runs them in order): its name and metadata checked, its
metadata and results staged in a transaction, refused whole when that would silently change a model that exists
(`stage`); then, once onboarded, what the registry says of it (`report`, or `report_served` from a server's memory):
version, evidence status, nearest models, and a warning where one is due; its same-model verdict as an alias."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from registry.answers import catalog, fingerprint, neighbours
from registry.answers.neighbours import Neighbour
from registry.core.errors import Conflict, DiskFull, InputError, RegistryError, check_text, storage_problem
from registry.core.transaction import Tx
from registry.data import current_evaluations, import_models_queries, import_run
from registry.embedding import encoders, onboarding
from registry.locus import evidence


@dataclass(kw_only=True)
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
    status: str = "not embedded"        # established | probation | not embedded (locus/evidence.py)
    updated: dict = field(default_factory=dict)   # metadata field -> [old, new] (with update=True)
    results_changed: int = 0            # results that superseded different stored ones (with update=True)
    alias_of: str | None = None         # the model it is recorded as another name of (its answers or its user said)


@dataclass
class Staged:
    """A registration's rows, written in a transaction (not yet onboarded)."""
    name: str
    changes: dict                       # metadata field -> [old, new]
    evaluations_added: int
    queries_added: int
    results_changed: int


def check(name: str, metadata: dict) -> str:
    """The name to register under, once the metadata is sound (before any transaction): the name as every model
    name is checked, the text fields as every text is (errors.text_problem)."""
    name = (name or "").strip()
    problem = import_models_queries.model_name_problem(name)
    if problem:
        raise InputError(problem)
    for label in ("family", "provider", "tags"):
        check_text(metadata.get(label), label)
    for label, value in (("params_b", metadata.get("params_b")), ("cost", metadata.get("cost"))):
        if value is not None and not (value >= 0 and value != float("inf")):
            raise InputError(f"{label} must be a non-negative number, got {value}")
    return name


def stage(tx: Tx, name: str, evals: str, metadata: dict, update: bool = False, progress: bool = False) -> Staged:
    """The model's metadata and results into `tx`, refused whole (InputError) when it would silently change a model
    that exists. The server's writer stages many registrations in one transaction."""
    changes = _metadata(tx, name, metadata, update)
    imported = import_run.run_model_import(tx, name, str(evals), progress=progress)
    changed = _changed_results(tx, name, imported.batch_id, update, evals)
    return Staged(name, changes, imported.evaluations_added, imported.queries_added, changed)


def stage_group(tx: Tx, jobs: list[tuple], parsed: list[list[dict] | None] | None = None) -> list[Staged]:
    """Many registrations (`stage`'s (name, evals, metadata, update) each) in `tx`, for the server's writer. Those
    whose files are small JSONL of query ids and results only (what `POST /models` writes), each for a different
    model, are imported together from memory (import_run.run_rows_import): one pass of the import's checks for the
    group instead of one per registration, and no file read again by DuckDB (a group of one too). A bad row in a
    group of several refuses the group with no line named: the writer then stages each registration alone, and
    alone a bad row is read again from its file, which names the line. `parsed`: each file's `plain_rows`, where
    the caller has read them already (the writer's request threads)."""
    names = [j[0] for j in jobs]
    parsed = parsed or [plain_rows(j[1]) for j in jobs]
    rows = {i: r for i, (j, r) in enumerate(zip(jobs, parsed)) if names.count(j[0]) == 1 and r is not None}
    together = list(rows)      # (in order)
    out: dict[int, Staged] = {i: stage(tx, *jobs[i]) for i in range(len(jobs)) if i not in together}
    if together:
        out.update(_stage_together(tx, [jobs[i] for i in together], [rows[i] for i in together], together))
    return [out[i] for i in range(len(jobs))]


def _stage_together(tx: Tx, jobs: list[tuple], rows: list[list[dict]], at: list[int]) -> dict[int, Staged]:
    names = [j[0] for j in jobs]
    # the group's models that exist (name -> id), then which of them have results (mostly none exist: new models)
    # (a list of constants: DuckDB looks them up in the name index; a list parameter unnested is a join)
    found = tx.sql(f"SELECT id, name FROM models WHERE name IN ({', '.join('?' * len(names))})", names)
    if found:
        found_ids = [i for i, _ in found]
        evaluated = {m for (m,) in tx.sql("""SELECT DISTINCT model_id FROM evaluations
                                             WHERE model_id IN (SELECT unnest(?::INTEGER[]))""", [found_ids])}
        found = [(i, name, i in evaluated) for i, name in found]
    known = {name for _, name, _ in found}
    had_results = {name for _, name, has in found if has}
    ids = {name: int(i) for i, name, _ in found}
    ids.update(import_run.insert_new_models(tx, {name: metadata for name, _, metadata, _ in jobs if name not in known}))
    changes = [_metadata(tx, name, metadata, update) if name in known else {}
               for name, _, metadata, update in jobs]
    imported = import_run.run_rows_import(
        tx, [name for name, model_rows in zip(names, rows) for _ in model_rows],
        [r["question_id"] for model_rows in rows for r in model_rows],
        [bool(r["correct"]) for model_rows in rows for r in model_rows], label=f"{len(jobs)} registrations",
        evaluated=[int(i) for i, _, has in found if has], ids=ids)
    if imported is None:      # a row with a problem: the writer stages each registration alone, naming its line
        if len(jobs) == 1:
            return {at[0]: stage(tx, *jobs[0])}          # the file path names the bad row (and refuses)
        raise InputError("a registration of the group has a bad row")
    added = {} if imported.already_imported or imported.batch_id is None else imported.added_by_model
    return {i: Staged(name, ch, added.get(name, 0), 0,
                      _changed_results(tx, name, imported.batch_id, update, evals) if name in had_results else 0)
            for i, (name, evals, _, update), ch in zip(at, jobs, changes)}


_PLAIN_KEYS = {"question_id", "correct"}
_PLAIN_MAX_BYTES = 1 << 20


def plain_rows(evals) -> list[dict] | None:
    """The rows of a small JSONL file of question ids and results only (what `POST /models` writes), else None."""
    import json
    import os

    path = str(evals)
    if not path.endswith(".jsonl") or not os.path.isfile(path) or os.path.getsize(path) > _PLAIN_MAX_BYTES:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return None
    ok = rows and all(isinstance(r, dict) and r.keys() == _PLAIN_KEYS and isinstance(r["question_id"], str)
                      and r["correct"] in (0, 1) for r in rows)
    return rows if ok else None


def _metadata(tx: Tx, name: str, metadata: dict, update: bool) -> dict:
    changes = import_run.upsert_model_metadata(tx, name, **metadata)
    if changes and not update:
        field_, (old, new) = next(iter(changes.items()))
        raise Conflict(f"{name!r} is already registered with {field_}={old!r} (given {new!r}"
                         + (f", and {len(changes) - 1} more field(s)" if len(changes) > 1 else "")
                         + "): pass --update (update=True) to change its metadata")
    return changes


def _changed_results(tx: Tx, name: str, batch_id: int | None, update: bool, evals) -> int:
    changed = import_run.changed_results(tx, name, batch_id)
    if changed and not update:
        qid, old, new = changed[1]
        raise Conflict(f"{changed[0]} of these results differ from the ones {name!r} already has (e.g. "
                         f"query {qid}: stored {old}, given {new}): pass --update (update=True) to record them "
                         f"as newer evaluations (the old ones are kept)", file=str(evals))
    return changed[0] if changed else 0


def report(tx: Tx, staged: Staged, o: onboarding.JobOutcome | None, k: int, probation_min: int) -> RegisterResult:
    """What the registry now says of a staged and onboarded model (read in `tx`): version, evidence status, nearest
    models, warnings. `o`: its onboarding outcome (None: nothing new to embed)."""
    name = staged.name
    if o is None:  # nothing new to embed: its current version
        info = catalog.show(tx, name, probation_min)
        o = onboarding.JobOutcome(name, "unchanged", info.version, info.embedded_from or 0)
    held_out = catalog.held_out(tx, name)
    model_id = tx.sql("SELECT id FROM models WHERE name = ?", [name])[0][0]
    if o.version is not None and o.stability is None:      # (unchanged: its version's figure, as first reported)
        o = replace(o, stability=stored_stability(tx, model_id, o.version))
    # its answers against every other model's, once: the neighbours' disagreement and the duplicate test use it
    own = current_evaluations.of_models(tx, [model_id])
    rates = current_evaluations.disagreement(tx, own["query_id"], own["correct"], [
        m for (m,) in tx.sql("SELECT id FROM models WHERE id <> ?", [model_id])])
    near, notes, status = [], [], "not embedded"
    if o.version is not None:
        near = neighbours.of_registered(tx, name, k, encoders.require_active(tx),
                                        answers=(own["query_id"], own["correct"]),
                                        own_evaluations=o.n_evaluations, probation_min=probation_min,
                                        rates=rates)
        status = "probation" if evidence.on_probation(o.n_evaluations, probation_min) else "established"
        notes = [] if status == "established" else [_probation_note(o, probation_min)]
    same = fingerprint.duplicate_of(tx, model_id, rates)                                   # from its answers
    alias = catalog.aliases(tx).get(name, (None, None))[0]
    return _result(staged, o, near, notes + _duplicate_notes(name, same), held_out, status,
                   alias_of=alias or (same.match if same else None))


def report_served(snap, book, staged: Staged, o: onboarding.JobOutcome | None, k: int,
                  probation_min: int) -> RegisterResult | None:
    """`report` from a running server's memory, with no read: its snapshot (serve/snapshot.py: the index of current
    versions) and its answer book (serve/answerbook.py), both up to date with the write being reported. What `report`
    says, the same way (tests/test_writer.py compares them); None where only the plain `report` can say it."""
    model_id = book.id_of(staged.name)
    if o is None or model_id is None or not evidence.on_probation(o.n_evaluations, probation_min) \
            or (o.version is not None and o.stability is None):
        # nothing new was embedded, no answers, or an established model (its table reads error correlations and
        # its neighbours' own questions, as `similar` does), or a version whose stability is stored: the plain report
        return None
    rates = book.disagreement(model_id)
    near, notes, status = [], [], "not embedded"
    vector = snap.index.vector_of(staged.name) if o.version is not None else None
    if vector is not None:
        # a model on probation is placed by its answers alone (neighbours.rank): the rates are all it needs
        near = neighbours.by_vector(None, vector, snap.index.size, snap.index.encoder_id,
                                    exclude={staged.name}, vi=snap.index, rates=rates)
        near = neighbours.placed(near, dict(zip(snap.pool.names, snap.pool.n_evaluations.tolist())), o.n_evaluations,
                                 probation_min, k)
        status = "probation" if evidence.on_probation(o.n_evaluations, probation_min) else "established"
        notes = [] if status == "established" else [_probation_note(o, probation_min)]
    same = fingerprint.duplicate_of(None, model_id, rates, book.names, book.calibration({model_id}))
    return _result(staged, o, near, notes + _duplicate_notes(staged.name, same), book.held_out(model_id),
                   status, alias_of=same.match if same else None)


def stored_stability(tx: Tx, model_id: int, version: int) -> float | None:
    """A version's stability as it was estimated (None: not yet), the figure its registration first reported."""
    row = tx.sql("""SELECT coalesce(s.stability, v.stability) FROM embedding_versions v
                    LEFT JOIN version_stability s ON s.version_id = v.id
                    WHERE v.model_id = ? AND v.version = ?""", [model_id, version])
    return None if not row or row[0][0] is None else float(row[0][0])


def _duplicate_notes(name: str, same: fingerprint.Fingerprint | None) -> list[str]:
    warning = fingerprint.duplicate_warning(name, same)
    return [] if warning is None else [warning]


def record_alias(tx: Tx, result: RegisterResult) -> None:
    """A registration's same-model verdict, recorded in `tx`: the model is an alias of its match, unless it already
    is one (its user's word, or an earlier verdict, stands)."""
    if result.alias_of is None:
        return
    known = catalog.aliases(tx)
    if result.model in known:
        return
    root = result.alias_of
    while root in known:              # its match is itself another name of something
        root = known[root][0]
    if root == result.model:          # ...of this model (two copies registered together): that verdict stands
        result.alias_of = None
        return
    result.alias_of = catalog.set_alias(tx, result.model, result.alias_of, "registration")


def _probation_note(o: onboarding.JobOutcome, minimum: int) -> str:
    return (f"on probation: embedded from {o.n_evaluations} evaluations, routing needs {minimum} to choose it "
            f"unasked; its nearest models are uncertain at this size")


def _result(staged: Staged, o: onboarding.JobOutcome, near: list[Neighbour], notes: list[str], held_out: int,
            status: str, *, alias_of: str | None) -> RegisterResult:
    return RegisterResult(model=staged.name, version=o.version, outcome=o.outcome, n_evaluations=o.n_evaluations,
                          stability=o.stability, neighbours=near, warning="; ".join(notes) or None,
                          evaluations_added=staged.evaluations_added, queries_added=staged.queries_added,
                          held_out=held_out, status=status, updated=staged.changes,
                          results_changed=staged.results_changed, alias_of=alias_of)


def onboarding_failed(exc: Exception, name: str, staged: Staged) -> RegistryError | None:
    """The one-line error for a registration whose rows committed but whose onboarding failed for want of storage
    (None: another failure, raised as it is): its onboarding job is committed too, so say how to finish."""
    problem = exc.reason if isinstance(exc, DiskFull) else storage_problem(exc)
    if problem is None:
        return None
    then = "when there is room" if "no space left" in problem.lower() else "to embed it"
    return RegistryError(f"registered {name!r} and its {staged.evaluations_added} evaluations, but embedding it "
                         f"failed: {problem}; run `registry onboard` {then}")
