"""Onboarding: every write of evaluations enqueues a job per affected model (in the same transaction: an outbox);
running the jobs embeds each model from all of its current evaluations and appends an embedding version.

What a version is computed from, exactly: the model's current (newest) evaluations from batches up to
`through_batch`, on queries outside the test split (held-out queries never reach the encoder, so `registry evaluate`
stays honest and agrees with routing), capped at the encoder's `embed_max_set` by query content hash when the
encoder asks for a cap. Its digest is the sha256 of those (query id, correct) pairs, so any version can be
recomputed and checked (`recompute`). An import that moves queries into or out of the test split re-embeds the
models that have them; splits keep no history, so a version made before such an import no longer recomputes.

Each version's stability (how far apart the embeddings of two random halves of those evaluations fall; the halves
are seeded by the digest, so it is reproducible too) is estimated just after, in its own transaction
(`estimate_stability`): the halves cost as much encoder work again, and a new vector should not wait for them.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
from dataclasses import dataclass, field

import numpy as np

from . import encoders
from .querycache import projections, query_meta
from .errors import NotFound
from .store import Tx

MIN_EVALUATIONS = 32


@dataclass
class EvalSet:
    model_id: int
    query_ids: np.ndarray   # [n] int, registry query ids
    y: np.ndarray           # [n] float32 0/1
    digest: str
    through_batch: int = 0  # the newest import batch among the evaluations read (before the test/cap filters)

    @property
    def n(self) -> int:
        return len(self.query_ids)


@dataclass
class JobOutcome:
    model: str
    outcome: str            # embedded | unchanged | too few evaluations
    version: int | None
    n_evaluations: int
    stability: float | None = None
    version_id: int | None = None


def enqueue(tx: Tx, model_ids, reason: str, batch_id: int | None = None, encoder_id: int | None = None) -> None:
    ids = sorted({int(m) for m in model_ids})
    if not ids:
        return
    tx.duck.executemany("INSERT INTO onboarding_jobs (model_id, reason, batch_id, encoder_id) VALUES (?, ?, ?, ?)",
                        [[m, reason, batch_id, encoder_id] for m in ids])


def pending(tx: Tx) -> list[tuple[int, int, str, int | None]]:
    """(job id, model id, reason, batch id) of every job without a result, oldest first."""
    return tx.sql("""SELECT j.id, j.model_id, j.reason, j.batch_id FROM onboarding_jobs j
                     LEFT JOIN onboarding_results r ON r.job_id = j.id WHERE r.job_id IS NULL ORDER BY j.id""")


def newest_per_query(res: dict) -> dict:
    """Keep each (model, query)'s row from its newest batch (numpy: cheaper than a GROUP BY for one model)."""
    model, query, batch = (np.asarray(res[c], dtype=np.int64) for c in ("model_id", "query_id", "batch_id"))
    order = np.lexsort((-batch, query, model))            # by model, query, then newest batch first
    first = np.ones(len(order), dtype=bool)
    first[1:] = (np.diff(model[order]) != 0) | (np.diff(query[order]) != 0)
    keep = order[first]
    return {c: np.asarray(res[c])[keep] for c in ("model_id", "query_id", "correct", "batch_id")}


def evaluation_sets(tx: Tx, model_ids, through_batch: int, max_set: int | None = None) -> dict[int, EvalSet]:
    """Each model's embedding input and its digest (see the module docstring for what it contains): its current
    evaluations in one query, chosen and ordered with the cached `query_meta`."""
    ids = ", ".join(str(int(m)) for m in model_ids) or "NULL"
    res = tx.duck.execute(f"""SELECT model_id, query_id, correct::INT AS correct, batch_id FROM evaluations
                              WHERE model_id IN ({ids}) AND batch_id <= {int(through_batch)}""").fetchnumpy()
    res = newest_per_query(res)
    meta = query_meta(tx)
    model_col = np.asarray(res["model_id"], dtype=np.int64)
    qid_col = np.asarray(res["query_id"], dtype=np.int64)
    correct_col = np.asarray(res["correct"], dtype=np.int64)
    batch_col = np.asarray(res["batch_id"], dtype=np.int64)
    at = meta.rows(qid_col)
    keep = ~meta.is_test[at]
    out = {}
    for m in model_ids:
        of_model = model_col == int(m)
        sel = np.flatnonzero(of_model & keep)
        if max_set and len(sel) > max_set:                      # the cap: lowest content hashes
            sel = sel[np.argsort(meta.hash_rank[at[sel]], kind="stable")[:max_set]]
        sel = sel[np.argsort(meta.ext_rank[at[sel]], kind="stable")]
        out[int(m)] = EvalSet(int(m), qid_col[sel], correct_col[sel].astype(np.float32),
                              digest(meta.external_id[at[sel]], correct_col[sel]),
                              int(batch_col[of_model].max()) if of_model.any() else 0)
    return out


def digest(external_ids, correct) -> str:
    """sha256 of "external_id:correct" pairs joined by commas, in external id order (the caller's order): the
    same value as DuckDB's sha256(string_agg(external_id || ':' || correct, ',' ORDER BY external_id))."""
    text = ",".join(f"{e}:{int(c)}" for e, c in zip(external_ids, correct))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def embed_sets(model, sets: list[tuple[np.ndarray, np.ndarray]], budget: int = 1 << 16,
               projected: bool = False) -> np.ndarray:
    """Embed many sets in padded, masked batches. sets: [(q [n,Dq], y [n])] -> z [len(sets), D] float32; with
    `projected`, each set brings its rows' input projections instead of query vectors: [(PS [n,2,D], y [n])]
    (see `projections`).

    Largest first; a batch pads to its first set's width (a multiple of 64) and takes sets down to a quarter of it.
    Versions are float32: the same set embedded in another batch differs by under 1e-6 (float32 sums in another
    order), the tolerance `recompute` is checked to."""
    import torch

    order = sorted(range(len(sets)), key=lambda i: -len(sets[i][1]))
    width_of = lambda i: max(64, -(-len(sets[i][1]) // 64) * 64)
    z = np.zeros((len(sets), model.cfg.d_model), dtype=np.float32)
    start = 0
    with torch.no_grad():
        while start < len(order):
            width = width_of(order[start])
            end = start + 1
            while (end < len(order) and (end - start + 1) * width <= budget
                   and 4 * len(sets[order[end]][1]) >= width):
                end += 1
            chunk = order[start:end]
            x = np.zeros((len(chunk), width, *sets[chunk[0]][0].shape[1:]), dtype=np.float32)   # [B,N,Dq] | [B,N,2,D]
            y = np.zeros((len(chunk), width), dtype=np.float32)                                  # [B,N]
            mask = np.zeros((len(chunk), width), dtype=bool)                                     # [B,N]
            for b, i in enumerate(chunk):
                n = len(sets[i][1])
                x[b, :n], y[b, :n], mask[b, :n] = sets[i][0], sets[i][1], True
            x, y, mask = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(mask)
            out = model.embed_proj(x[:, :, 0], x[:, :, 1], y, mask) if projected else model.embed(x, y, mask)
            z[chunk] = out.numpy()
            start = end
    return z


def halves(es: EvalSet) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint random halves of a set, seeded by its digest (so stability is reproducible)."""
    rng = np.random.default_rng(int(es.digest[:16], 16))
    perm = rng.permutation(es.n)
    return perm[: es.n // 2], perm[es.n // 2:]


def projected_inputs(tx: Tx, model, sets: list[EvalSet]) -> list[tuple[np.ndarray, np.ndarray]]:
    """What `embed_sets(..., projected=True)` takes for these sets: their rows' input projections, and y."""
    row_of, proj = projections(tx, model, np.concatenate([s.query_ids for s in sets]))
    return [(proj[[row_of[int(i)] for i in s.query_ids]], s.y) for s in sets]


def compute(tx: Tx, model, sets: list[EvalSet]) -> np.ndarray:
    """Embeddings [len(sets), D] of evaluation sets, in one batched pass."""
    if not sets:
        return np.zeros((0, model.cfg.d_model), dtype=np.float32)
    return embed_sets(model, projected_inputs(tx, model, sets), projected=True)


@dataclass
class NewVersion:
    """A version this transaction appended (what the in-memory index needs once it commits)."""
    id: int
    model_id: int
    name: str
    vector: np.ndarray
    created: str


@dataclass
class ModelState:
    """What onboarding needs to know of a model besides its evaluations: its name, its newest version number, and
    per encoder its newest version there and that version's digest."""
    name: str
    latest_version: int = 0
    by_encoder: dict = field(default_factory=dict)      # encoder id -> (version, digest)


def model_states(tx: Tx, model_ids) -> dict[int, ModelState]:
    """Kept per open database: versions are appended only by `run_pending`, which updates the states it changes
    when it commits, and a model created by an import starts with none (`new_models`); others are read once."""
    known = tx.cache.get("model_states", {})
    missing = sorted({int(m) for m in model_ids} - known.keys())
    found: dict[int, ModelState] = {}
    if missing:
        for m, name, version, dig, enc in tx.sql(f"""
                SELECT m.id, m.name, v.version, v.digest, v.encoder_id FROM models m
                LEFT JOIN embedding_versions v ON v.model_id = m.id WHERE m.id IN ({', '.join(map(str, missing))})
                ORDER BY m.id, v.version"""):
            st = found.setdefault(m, ModelState(name))
            if version is not None:
                st.latest_version = version
                st.by_encoder[enc] = (version, dig)
        tx.after_commit(lambda: tx.cache.setdefault("model_states", {}).update(
            {m: st for m, st in found.items() if m not in tx.cache["model_states"]}))
    return {int(m): known.get(int(m)) or found[int(m)] for m in model_ids}


def new_models(tx: Tx, rows) -> None:
    """An import created these models [(id, name)]: once it commits, their state (no versions) is known."""
    if rows:
        tx.after_commit(lambda: tx.cache.setdefault("model_states", {}).update(
            {int(m): ModelState(name) for m, name in rows}))


_worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="registry-encoder")


def run_pending(tx: Tx, min_evaluations: int = MIN_EVALUATIONS, all_models: bool = False) -> list[JobOutcome]:
    """Finish every pending job (and with `all_models`, re-embed every model) in one batched pass.

    This is every onboarding's hot path, so it reads little: the jobs, the models' versions, their evaluations."""
    from . import index

    encoder_id = encoders.ensure_default(tx)
    if encoder_id is None:
        return []
    if all_models:
        enqueue(tx, [r[0] for r in tx.sql("SELECT id FROM models")], "manual", encoder_id=encoder_id)
    jobs = pending(tx)
    if not jobs:
        return []
    model, meta = encoders.load(tx, encoder_id)
    model_ids = sorted({j[1] for j in jobs})
    newest_job = {m: (reason, batch) for _, m, reason, batch in jobs}     # jobs are oldest first: the newest wins
    states = model_states(tx, model_ids)
    names = {m: states[m].name for m in model_ids}
    latest_version = {m: states[m].latest_version for m in model_ids}          # (read before any update below)
    # all current evaluations; each version records the newest batch among them (what `recompute` reads up to)
    sets = evaluation_sets(tx, model_ids, 2 ** 62, meta.get("embed_max_set"))
    todo = [m for m in model_ids if sets[m].n >= min_evaluations
            and states[m].by_encoder.get(encoder_id, (0, None))[1] != sets[m].digest]
    outcomes: dict[int, JobOutcome] = {}
    version_of: dict[int, int] = {}
    forward = None
    if todo:
        # the forward pass runs on a worker thread while this one reserves the version ids and writes the job
        # results (torch and DuckDB both release the GIL); the thread never touches the database
        inputs = projected_inputs(tx, model, [sets[m] for m in todo])
        forward = _worker.submit(embed_sets, model, inputs, projected=True)
    try:
        if todo:
            reserved = tx.sql(f"SELECT nextval('embedding_versions_id_seq') FROM range({len(todo)})")
            version_of = {m: int(r[0]) for m, r in zip(todo, reserved)}
        for m in model_ids:
            if m in version_of:
                outcomes[m] = JobOutcome(names[m], "embedded", latest_version[m] + 1, sets[m].n,
                                         version_id=version_of[m])
            else:
                kind = "too few evaluations" if sets[m].n < min_evaluations else "unchanged"
                outcomes[m] = JobOutcome(names[m], kind, latest_version[m] or None, sets[m].n)
        results = [[j, outcomes[m].outcome, version_of.get(m)] for j, m, _, _ in jobs]
        for start in range(0, len(results), 1000):
            chunk = results[start:start + 1000]
            tx.sql(f"""INSERT INTO onboarding_results (job_id, outcome, version_id)
                       VALUES {', '.join(['(?, ?, ?)'] * len(chunk))}""", [x for r in chunk for x in r])
    finally:
        z = forward.result() if forward is not None else None
    if todo:
        # plain multi-row VALUES: for the usual one or few rows DuckDB takes them faster than an Arrow scan
        rows = [[version_of[m], m, latest_version[m] + 1, encoder_id, z[i].tolist(), sets[m].n, sets[m].digest,
                 sets[m].through_batch, newest_job[m][0], newest_job[m][1]] for i, m in enumerate(todo)]
        created = {}
        for start in range(0, len(rows), 500):
            chunk = rows[start:start + 500]
            values = ", ".join([f"(?, ?, ?, ?, ?::FLOAT[{z.shape[1]}], ?, ?, ?, ?, ?)"] * len(chunk))
            created.update(tx.sql(f"""INSERT INTO embedding_versions (id, model_id, version, encoder_id, vector,
                                          n_evaluations, digest, through_batch, reason, batch_id)
                                      VALUES {values} RETURNING id, created::VARCHAR""",
                                  [x for r in chunk for x in r]))
        new = [NewVersion(version_of[m], m, names[m], z[i], created[version_of[m]]) for i, m in enumerate(todo)]
        index.versions_written(tx)                                      # (its after-commit runs first)
        tx.after_commit(lambda: index.appended(tx, encoder_id, new))

        def update_states():
            cached = tx.cache.get("model_states", {})
            for v in new:
                if v.model_id in cached:
                    st = cached[v.model_id]
                    st.latest_version = outcomes[v.model_id].version
                    st.by_encoder[encoder_id] = (st.latest_version, sets[v.model_id].digest)
        tx.after_commit(update_states)
    return [outcomes[m] for m in model_ids]


def estimate_stability(tx: Tx) -> dict[int, float]:
    """Every version without a stability estimate gets one (normally just the versions the last onboarding wrote):
    the distance between the embeddings of the two digest-seeded halves of its evaluations, in one batched pass per
    encoder. -> {version id: stability}"""
    import pyarrow as pa

    todo = tx.sql("""SELECT v.id, v.model_id, v.encoder_id, v.through_batch, v.digest FROM embedding_versions v
                     ANTI JOIN version_stability s ON s.version_id = v.id
                     WHERE v.n_evaluations >= 2 ORDER BY v.id""")
    out: dict[int, float] = {}
    for encoder_id in sorted({r[2] for r in todo}):
        model, meta = encoders.load(tx, encoder_id)
        mine = [r for r in todo if r[2] == encoder_id]
        sets = []
        for through in sorted({r[3] for r in mine}):
            rows = [r for r in mine if r[3] == through]
            found = evaluation_sets(tx, [r[1] for r in rows], through, meta.get("embed_max_set"))
            sets += [(r[0], found[r[1]]) for r in rows if found[r[1]].digest == r[4]]   # else: not reproducible
        if not sets:
            continue
        z = compute(tx, model, [EvalSet(s.model_id, s.query_ids[h], s.y[h], s.digest)
                                for _, s in sets for h in halves(s)])
        for i, (vid, _) in enumerate(sets):
            out[vid] = float(np.linalg.norm(z[2 * i] - z[2 * i + 1]))
    if out:
        tx.duck.register("_stability", pa.table({"version_id": pa.array(list(out), pa.int64()),
                                                 "stability": pa.array(list(out.values()), pa.float64())}))
        try:
            tx.sql("INSERT INTO version_stability (version_id, stability) SELECT version_id, stability FROM _stability")
        finally:
            tx.duck.unregister("_stability")
    return out


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
