"""Onboarding: works off the outbox (data/outbox.py): embeds each model with a pending job from all of its current
evaluations (embedding/embed.py says which, and digests them) and appends an embedding version. Any version can be
recomputed and checked (`recompute`). An activated encoder becomes active in the transaction that writes its
models' versions (embedding/encoders.py). An import that moves queries into or out of the test split re-embeds the
models that have them; splits keep no history, so a version made before such an import no longer recomputes.

Each version's stability (how far apart the embeddings of two random halves of those evaluations fall; the halves
are seeded by the digest, so it is reproducible too) is estimated just after, in its own transaction
(`estimate_stability`): the halves cost as much encoder work again, and a new vector should not wait for them.
"""
from __future__ import annotations

import concurrent.futures
import os
from dataclasses import dataclass

import numpy as np

from registry.core.errors import NotFound
from registry.core.transaction import Tx
from registry.data.outbox import enqueue, model_states, pending
from registry.embedding import encoders
from registry.embedding.embed import (
    MIN_EVALUATIONS,
    EvalSet,
    chosen,
    chunked_sets,
    compute,
    embed_sets,
    evaluation_sets,
    halves,
    projected_inputs,
)
from registry.embedding.embed import (
    stability as stability_of,
)


@dataclass
class JobOutcome:
    model: str
    outcome: str            # embedded | unchanged | too few evaluations
    version: int | None
    n_evaluations: int
    stability: float | None = None
    version_id: int | None = None
    prepared: bool = False  # its vector was computed ahead (Prepared), not by this onboarding


@dataclass
class Prepared:
    """A new model's embedding computed before its registration is written, from the rows the request brought (a
    server computes it in the request's thread while the writer is busy with other work). `run_pending` takes it
    only if the model's evaluation set, read after the commit, has this digest under this encoder; otherwise it
    embeds the set as always."""
    encoder_id: int
    digest: str
    z: np.ndarray                               # [D] the version's vector
    halves: tuple[np.ndarray, np.ndarray]       # [D] each: the stability halves' embeddings


def prepare(tx: Tx, external_ids: list[str], correct: list[bool],
            min_evaluations: int = MIN_EVALUATIONS) -> Prepared | None:
    """What onboarding would embed for a model whose only evaluations are these rows (embedding.evaluation_sets:
    outside the test split, capped, in external id order), or None when that cannot be known from them alone (an
    unknown query, a question twice, too few rows, no active encoder). Reads nothing a warm server has not cached."""
    from registry.data.query_cache import query_meta

    encoder_id = encoders.active_id(tx)
    meta = query_meta(tx)
    rows = meta.rows_of_external(external_ids)
    if encoder_id is None or rows is None or len(np.unique(rows)) != len(rows):
        return None
    model, info = encoders.load(tx, encoder_id)
    sel = chosen(meta, rows, info.get("embed_max_set"))
    rows, y = rows[sel], np.asarray(correct, dtype=np.int64)[sel]
    if len(rows) < max(2, min_evaluations):
        return None
    full = EvalSet(-1, meta.ids[rows], y.astype(np.float32), meta.digest(rows, y))
    sets = [full] + [EvalSet(-1, full.query_ids[h], full.y[h], full.digest) for h in halves(full)]
    z = compute(tx, model, sets)
    return Prepared(encoder_id, full.digest, z[0], (z[1], z[2]))


@dataclass
class NewVersion:
    """A version this transaction appended (what the in-memory index needs once it commits)."""
    id: int
    model_id: int
    name: str
    vector: np.ndarray
    created: str


_worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="registry-encoder")
# bulk forward passes run this many sets at once, a core each (embed_sets' lanes)
LANES = max(1, min(os.cpu_count() or 1, 8))


class _Forward:
    """Forward passes on the worker thread, one chunk of sets at a time, while this thread reads the next chunk
    from the database (torch and DuckDB both release the GIL; the worker never touches the database). At most two
    chunks are in memory: the one embedding and the one just read. -> `z`: {key: vector}"""

    def __init__(self, tx: Tx, model, inline: bool = False):
        self.tx, self.model = tx, model
        self.running: tuple[list, concurrent.futures.Future[np.ndarray]] | None = None
        self.z: dict[int | tuple[int, int], np.ndarray] = {}
        # inline: on this thread (a server's small onboardings, one chunk: nothing to overlap, and under a full CPU
        # each hand-over to the worker and back waits for a core)
        self.inline = inline

    def submit(self, keys: list, sets: list[EvalSet]) -> None:
        proj, inputs = projected_inputs(self.tx, self.model, sets)     # row numbers into the shared projections
        self.wait()
        if keys and self.inline:
            self.z.update(zip(keys, embed_sets(self.model, inputs, projected=True, table=proj)))
        elif keys:
            self.running = (keys, _worker.submit(embed_sets, self.model, inputs, projected=True, table=proj,
                                                 lanes=LANES))

    def wait(self) -> None:
        if self.running is not None:
            keys, future = self.running
            self.running = None
            self.z.update(zip(keys, future.result()))


INLINE_MAX = 64             # models: up to this many (a server's registrations), embedded on the calling thread
FEW_ROWS = 16               # rows: up to this many are inserted as VALUES rather than through an Arrow table
ONE_READ_MAX = 8            # models: up to this many (and fused), their evaluations are read in one chunk


def run_pending(tx: Tx, min_evaluations: int = MIN_EVALUATIONS, all_models: bool = False,
                stability: bool = False, prepared: dict[str, Prepared] | None = None) -> list[JobOutcome]:
    """Finish every pending job (and with `all_models`, re-embed every model) in one batched pass; with
    `stability`, each new version's stability estimate too, from the same read of its evaluations (its two halves
    ride along in the same forward passes, at most STABILITY_SAMPLE rows beside the set's n; the same figure
    `estimate_stability` gives), so that a bulk import reads its evaluations once.
    `prepared` ({model name: Prepared}): embeddings computed ahead, used where their digest matches the set read.

    This is every onboarding's hot path, so it reads little: the jobs, the models' versions, their evaluations.
    Many models stream through in chunks of evaluations (`embedding.chunked_sets`), so memory does not grow with
    the registry."""
    from registry.embedding import index

    encoder_id = encoders.ensure_default(tx)
    if encoder_id is None:
        return []
    # an activation waiting for its models' embeddings: they are written under it, and it becomes active with them
    switching = encoders.pending_switch(tx)
    encoder_id = switching or encoder_id
    if all_models:
        enqueue(tx, [r[0] for r in tx.sql("SELECT id FROM models")], "manual", encoder_id=encoder_id)
    jobs = pending(tx)
    if not jobs:
        return []
    done_elsewhere: dict[int, JobOutcome] = {}
    if tx.postgres:      # other processes (server replicas, CLI runs) onboard the same database at the same time
        jobs, done_elsewhere = _lock_models(tx, jobs)
        if not jobs:
            return list(done_elsewhere.values())
    model, meta = encoders.load(tx, encoder_id)
    model_ids = sorted({j[1] for j in jobs})
    newest_job = {m: (reason, batch) for _, m, reason, batch in jobs}     # jobs are oldest first: the newest wins
    states = model_states(tx, model_ids)
    names = {m: states[m].name for m in model_ids}
    latest_version = {m: states[m].latest_version for m in model_ids}          # (read before any update below)
    outcomes: dict[int, JobOutcome] = {}
    version_of: dict[int, int] = {}
    # per model (evaluations, digest, newest batch among them: what `recompute` reads up to); the sets themselves
    # live only as long as their chunk
    sets: dict[int, tuple[int, str, int]] = {}
    forward = _Forward(tx, model, inline=stability and len(model_ids) <= INLINE_MAX)
    taken: set[int] = set()          # models whose prepared vectors were used
    given = prepared or {}
    try:
        # (a server's registrations, a few models: one read, without the count that plans chunks)
        chunks = ([evaluation_sets(tx, model_ids, 2 ** 62, meta.get("embed_max_set"))]
                  if stability and len(model_ids) <= ONE_READ_MAX
                  else chunked_sets(tx, model_ids, 2 ** 62, meta.get("embed_max_set")))
        for found in chunks:
            mine = [m for m in found if found[m].n >= min_evaluations
                    and states[m].by_encoder.get(encoder_id, (0, None))[1] != found[m].digest]
            sets.update({m: (s.n, s.digest, s.through_batch) for m, s in found.items()})
            ahead = {m: given[names[m]] for m in mine if names[m] in given
                     and given[names[m]].encoder_id == encoder_id and given[names[m]].digest == found[m].digest}
            taken.update(ahead)
            for m, p in ahead.items():
                forward.z[m] = p.z
                if stability:
                    forward.z[(m, 0)], forward.z[(m, 1)] = p.halves
            mine = [m for m in mine if m not in ahead]
            halved = [m for m in mine if found[m].n >= 2] if stability else []
            forward.submit(mine + [(m, h) for m in halved for h in (0, 1)],
                           [found[m] for m in mine] + [EvalSet(m, found[m].query_ids[part], found[m].y[part],
                                                               found[m].digest)
                                                       for m in halved for part in halves(found[m])])
            del found
        todo = [m for m in model_ids if sets[m][0] >= min_evaluations
                and states[m].by_encoder.get(encoder_id, (0, None))[1] != sets[m][1]]
        # while the last chunk's forward pass runs: reserve the version ids and write the job results
        if todo:
            reserved = tx.sql(f"SELECT nextval('embedding_versions_id_seq') FROM generate_series(1, {len(todo)})")
            version_of = {m: int(r[0]) for m, r in zip(todo, reserved)}
        for m in model_ids:
            if m in version_of:
                outcomes[m] = JobOutcome(names[m], "embedded", latest_version[m] + 1, sets[m][0],
                                         version_id=version_of[m], prepared=m in taken)
            else:
                kind = "too few evaluations" if sets[m][0] < min_evaluations else "unchanged"
                outcomes[m] = JobOutcome(names[m], kind, latest_version[m] or None, sets[m][0])
        results = [[j, outcomes[m].outcome, version_of.get(m)] for j, m, _, _ in jobs]
        for start in range(0, len(results), 1000):
            chunk = results[start:start + 1000]
            tx.sql(f"""INSERT INTO onboarding_results (job_id, outcome, version_id)
                       VALUES {', '.join(['(?, ?, ?)'] * len(chunk))}""", [x for r in chunk for x in r])
    finally:
        forward.wait()
    if todo:
        z = np.stack([forward.z[m] for m in todo])
        # plain multi-row VALUES: for the usual one or few rows DuckDB takes them faster than an Arrow scan
        rows = [[version_of[m], m, latest_version[m] + 1, encoder_id, z[i].tolist(), sets[m][0], sets[m][1],
                 sets[m][2], newest_job[m][0], newest_job[m][1]] for i, m in enumerate(todo)]
        created: dict[int, str] = {}           # version id -> its creation time
        for start in range(0, len(rows), 500):
            chunk = rows[start:start + 500]
            values = ", ".join([f"(?, ?, ?, ?, ?::FLOAT[{z.shape[1]}], ?, ?, ?, ?, ?)"] * len(chunk))
            created.update(tx.sql(f"""INSERT INTO embedding_versions (id, model_id, version, encoder_id, vector,
                                          n_evaluations, digest, through_batch, reason, batch_id)
                                      VALUES {values} RETURNING id, created::VARCHAR""",
                                  [x for r in chunk for x in r]))
        if stability:
            stable = {m: stability_of(forward.z[(m, 0)], forward.z[(m, 1)], sets[m][0]) for m in todo
                      if (m, 0) in forward.z}
            _write_stability(tx, {version_of[m]: v for m, v in stable.items()})
            for m, v in stable.items():
                outcomes[m].stability = v
        new = [NewVersion(version_of[m], m, names[m], z[i], created[version_of[m]]) for i, m in enumerate(todo)]
        # what a snapshot built in this transaction reads of them (routing.with_new_versions), known without a read
        tx.notes.versions_written.extend(
            (v.id, v.model_id, v.name, outcomes[v.model_id].version, v.vector, outcomes[v.model_id].n_evaluations,
             outcomes[v.model_id].stability, encoder_id) for v in new)
        index.versions_written(tx)                                      # (its after-commit runs first)
        tx.after_commit(lambda: index.appended(tx, encoder_id, new))

        def update_states():
            cached = tx.cache.get("model_states", {})
            for v in new:
                if v.model_id in cached:
                    st = cached[v.model_id]
                    st.latest_version = outcomes[v.model_id].version
                    st.by_encoder[encoder_id] = (st.latest_version, sets[v.model_id][1])
        tx.after_commit(update_states)
    if switching:
        encoders.activate(tx, switching)
    return [outcomes[m] for m in model_ids] + [o for m, o in done_elsewhere.items() if m not in outcomes]


LOCK_SPACE = 0x4C4F      # pg_advisory_xact_lock(LOCK_SPACE, model id): one model's version numbering


def _lock_models(tx: Tx, jobs: list) -> tuple[list, dict[int, JobOutcome]]:
    """PostgreSQL: hold each pending model's onboarding lock until this transaction ends (a transaction-level
    advisory lock per model, taken in id order so two onboardings never wait on each other in a cycle; staging
    writes take none, so they never wait on it). Then read the pending jobs again: a job another process finished
    while this one waited is not done twice (its outcome is read back), and a job it committed meanwhile for a
    locked model is taken too. Versions are numbered from what is committed once the lock is held (model_states
    reads them again on PostgreSQL), so two replicas never write the same version number (the unique
    (model_id, version) constraint would refuse the second; it never has to)."""
    first = {j[0]: j[1] for j in jobs}
    mids = sorted(set(first.values()))
    tx.sql("""SELECT pg_advisory_xact_lock(?::INTEGER, m)::VARCHAR FROM
              (SELECT m FROM unnest(?::INTEGER[]) AS t(m) ORDER BY m) s""", [LOCK_SPACE, mids])
    locked = set(mids)
    now = [j for j in pending(tx) if j[1] in locked]
    gone = sorted(set(first) - {j[0] for j in now})
    elsewhere: dict[int, JobOutcome] = {}
    if gone:    # finished by another process: what it did, newest job per model
        for _job_id, model_id, name, outcome, version, n in tx.sql("""
                SELECT r.job_id, j.model_id, m.name, r.outcome, v.version, v.n_evaluations
                FROM onboarding_results r JOIN onboarding_jobs j ON j.id = r.job_id JOIN models m ON m.id = j.model_id
                LEFT JOIN embedding_versions v ON v.id = r.version_id
                WHERE r.job_id IN (SELECT unnest(?::INTEGER[])) ORDER BY r.job_id""", [gone]):
            if version is None:      # unchanged or too few: the model's newest version, as this process reports it
                version, n = (tx.sql("SELECT max(version), NULL FROM embedding_versions WHERE model_id = ?",
                                     [model_id])[0])
            elsewhere[model_id] = JobOutcome(name, outcome, version, n or 0)
    return now, {m: o for m, o in elsewhere.items() if m not in {j[1] for j in now}}


def estimate_stability(tx: Tx) -> dict[int, float]:
    """Every version without a stability estimate gets one (normally just the versions the last onboarding wrote):
    the distance between the embeddings of the two digest-seeded halves of its evaluations, in one batched pass per
    encoder. -> {version id: stability}"""
    todo = tx.sql("""SELECT v.id, v.model_id, v.encoder_id, v.through_batch, v.digest FROM embedding_versions v
                     WHERE NOT EXISTS (SELECT 1 FROM version_stability s WHERE s.version_id = v.id)
                     AND v.n_evaluations >= 2 ORDER BY v.id""")
    out: dict[int, float] = {}
    for encoder_id in sorted({r[2] for r in todo}):
        model, meta = encoders.load(tx, encoder_id)
        mine = [r for r in todo if r[2] == encoder_id]
        forward = _Forward(tx, model)          # streamed in chunks of evaluations, as onboarding is
        done: list[int] = []
        n_of: dict[int, int] = {}
        try:
            for through in sorted({r[3] for r in mine}):
                rows = [r for r in mine if r[3] == through]
                for found in chunked_sets(tx, list(dict.fromkeys(r[1] for r in rows)), through,
                                          meta.get("embed_max_set")):
                    ok = [r for r in rows if r[1] in found and found[r[1]].digest == r[4]]  # else: not reproducible
                    forward.submit([(r[0], half) for r in ok for half in (0, 1)],
                                   [EvalSet(s.model_id, s.query_ids[h], s.y[h], s.digest)
                                    for s in (found[r[1]] for r in ok) for h in halves(s)])
                    done += [r[0] for r in ok]
                    n_of.update({r[0]: found[r[1]].n for r in ok})
        finally:
            forward.wait()
        for vid in done:
            out[vid] = stability_of(forward.z[(vid, 0)], forward.z[(vid, 1)], n_of[vid])
    _write_stability(tx, out)
    return out


def _write_stability(tx: Tx, estimates: dict[int, float]) -> None:
    """{version id: stability} into version_stability, in one statement."""
    import pyarrow as pa

    if not estimates:
        return
    conflict = " ON CONFLICT DO NOTHING" if tx.postgres else ""
    if len(estimates) <= FEW_ROWS:       # a few rows: plain VALUES cost less than registering an Arrow table
        tx.sql("INSERT INTO version_stability (version_id, stability) VALUES "
               + ", ".join(["(?, ?)"] * len(estimates)) + conflict,
               [x for v, st in estimates.items() for x in (int(v), float(st))])
        return
    with tx.table("_stability", pa.table({"version_id": pa.array(list(estimates), pa.int64()),
                                          "stability": pa.array(list(estimates.values()), pa.float64())})):
        # (PostgreSQL: another replica may have estimated the same version at the same time; the first one stays)
        tx.sql("INSERT INTO version_stability (version_id, stability) SELECT version_id, stability FROM _stability"
               + (" ON CONFLICT DO NOTHING" if tx.postgres else ""))


def recompute(tx: Tx, version_id: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """Recompute a stored version from the evaluations it names: (stored vector, recomputed, digest matches)."""
    row = tx.sql("""SELECT model_id, encoder_id, through_batch, digest, vector FROM embedding_versions
                    WHERE id = ?""", [version_id])
    if not row:
        raise NotFound(f"unknown embedding version id {version_id}")
    model_id, encoder_id, through, stored_digest, vector = row[0]
    model, meta = encoders.load(tx, encoder_id)
    s = evaluation_sets(tx, [model_id], through, meta.get("embed_max_set"))[model_id]
    z = compute(tx, model, [s])
    return np.asarray(vector, dtype=np.float32), z[0], s.digest == stored_digest
