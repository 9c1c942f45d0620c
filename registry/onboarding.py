"""Onboarding: every write of evaluations enqueues a job per affected model (in the same transaction: an outbox);
running the jobs embeds each model from all of its current evaluations and appends an embedding version.

What a version is computed from, exactly: the model's current (newest) evaluations from batches up to
`through_batch`, on queries outside the test split (held-out queries never reach the encoder, so `registry evaluate`
stays honest and agrees with routing), capped at the encoder's `embed_max_set` by query content hash when the
encoder asks for a cap. Its digest is the sha256 of those (query id, correct) pairs, so any version can be
recomputed and checked (`recompute`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from . import encoders, textvec
from .errors import NotFound
from .store import Tx

MIN_EVALUATIONS = 32


@dataclass
class EvalSet:
    model_id: int
    query_ids: np.ndarray   # [n] int, registry query ids
    y: np.ndarray           # [n] float32 0/1
    digest: str

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


def enqueue(tx: Tx, model_ids, reason: str, batch_id: int | None = None, encoder_id: int | None = None) -> None:
    ids = sorted({int(m) for m in model_ids})
    if not ids:
        return
    tx.duck.executemany("INSERT INTO onboarding_jobs (model_id, reason, batch_id, encoder_id) VALUES (?, ?, ?, ?)",
                        [[m, reason, batch_id, encoder_id] for m in ids])


def pending(tx: Tx) -> list[tuple[int, int, str, int | None]]:
    """(job id, model id, reason, batch id) of every job without a result, oldest first."""
    return tx.sql("""SELECT j.id, j.model_id, j.reason, j.batch_id FROM onboarding_jobs j
                     WHERE j.id NOT IN (SELECT job_id FROM onboarding_results) ORDER BY j.id""")


@dataclass
class QueryMeta:
    """Per query, sorted by id: what choosing and ordering a model's evaluations needs (cached per open database;
    imports that add queries or change splits invalidate it)."""
    ids: np.ndarray           # [n] registry query ids, ascending
    external_id: np.ndarray   # [n] object (str)
    hash_rank: np.ndarray     # [n] position in (content hash, external id) order: the cap keeps the lowest
    ext_rank: np.ndarray      # [n] position in external id order (DuckDB's string order): the digest's order
    is_test: np.ndarray       # [n] bool: held out, never embedded

    def rows(self, query_ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.ids, query_ids)


def query_meta(tx: Tx) -> QueryMeta:
    def build():
        r = tx.duck.execute("""
            SELECT q.id, q.external_id, row_number() OVER (ORDER BY q.content_hash, q.external_id) AS hash_rank,
                   row_number() OVER (ORDER BY q.external_id) AS ext_rank, coalesce(s.split = 'test', false) AS test
            FROM queries q LEFT JOIN query_splits s ON s.query_id = q.id ORDER BY q.id""").fetchnumpy()
        return QueryMeta(np.asarray(r["id"], dtype=np.int64), np.asarray(r["external_id"], dtype=object),
                         np.asarray(r["hash_rank"], dtype=np.int64), np.asarray(r["ext_rank"], dtype=np.int64),
                         np.asarray(r["test"], dtype=bool))
    return tx.cached("query_meta", build)


def _newest_per_query(res: dict) -> dict:
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
    res = _newest_per_query(res)
    meta = query_meta(tx)
    model_col = np.asarray(res["model_id"], dtype=np.int64)
    qid_col = np.asarray(res["query_id"], dtype=np.int64)
    correct_col = np.asarray(res["correct"], dtype=np.int64)
    at = meta.rows(qid_col)
    keep = ~meta.is_test[at]
    out = {}
    for m in model_ids:
        sel = np.flatnonzero((model_col == int(m)) & keep)
        if max_set and len(sel) > max_set:                      # the cap: lowest content hashes
            sel = sel[np.argsort(meta.hash_rank[at[sel]], kind="stable")[:max_set]]
        sel = sel[np.argsort(meta.ext_rank[at[sel]], kind="stable")]
        out[int(m)] = EvalSet(int(m), qid_col[sel], correct_col[sel].astype(np.float32),
                              digest(meta.external_id[at[sel]], correct_col[sel]))
    return out


def digest(external_ids, correct) -> str:
    """sha256 of "external_id:correct" pairs joined by commas, in external id order (the caller's order): the
    same value as DuckDB's sha256(string_agg(external_id || ':' || correct, ',' ORDER BY external_id))."""
    text = ",".join(f"{e}:{int(c)}" for e, c in zip(external_ids, correct))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# a registry up to this many queries keeps all their text vectors in memory after the first read (about 1.5 KB each):
# reading them costs one scan of text_vectors either way, and every later onboarding then reads none
PRELOAD_QUERIES = 200_000


def query_vectors(tx: Tx, query_ids: np.ndarray) -> tuple[dict[int, int], np.ndarray]:
    """(row of each query id, float32 matrix [rows, 384]) holding at least the given registry query ids.

    A query's text vector never changes, so vectors are kept per open database (`Tx.cache`); only ids not seen
    before are read, and they join the cache when the transaction commits (a rolled-back query never does)."""
    import pyarrow as pa

    key = ("query_vectors", textvec.TEXT_ENCODER)
    row_of, mat = tx.cache.get(key, ({}, None))
    uniq = np.unique(np.asarray(query_ids, dtype=np.int64))
    missing = np.array([q for q in uniq.tolist() if q not in row_of], dtype=np.int64)
    if len(missing) == 0:
        return row_of, mat
    preload = mat is None and tx.sql("SELECT count(*) FROM queries")[0][0] <= PRELOAD_QUERIES
    source = "queries q" if preload else "_qids i JOIN queries q ON q.id = i.id"
    tx.duck.register("_qids", pa.table({"id": missing}))
    try:
        tbl = tx.arrow(f"""SELECT q.id, v.vector FROM {source}
                           JOIN text_vectors v ON v.content_hash = q.content_hash AND v.text_encoder = ?
                           ORDER BY q.id""", [textvec.TEXT_ENCODER])
    finally:
        tx.duck.unregister("_qids")
    ids = tbl.column("id").to_numpy()
    if not set(missing.tolist()) <= set(ids.tolist()):
        absent = sorted(set(missing.tolist()) - set(ids.tolist()))[:3]
        raise NotFound(f"queries without a text vector under {textvec.TEXT_ENCODER}: ids {absent}")
    flat = tbl.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    new = flat.reshape(len(ids), -1).astype(np.float32)
    base = 0 if mat is None else len(mat)
    row_of = {**row_of, **{int(q): base + i for i, q in enumerate(ids.tolist())}}
    mat = new if mat is None else np.concatenate([mat, new])
    tx.after_commit(lambda: tx.cache.__setitem__(key, (row_of, mat)))
    return row_of, mat


def embed_sets(model, sets: list[tuple[np.ndarray, np.ndarray]], budget: int = 1 << 16) -> np.ndarray:
    """Embed many sets in padded, masked batches. sets: [(q [n,Dq], y [n])] -> z [len(sets), D] float32.

    Largest first; a batch pads to its first set's width (a multiple of 64) and takes sets down to a quarter of it,
    so a model's set and its two halves (see `compute`) go through one forward pass. Versions are float32: the same
    set embedded in another batch differs by under 1e-6 (float32 sums in another order), the tolerance
    `recompute` is checked to."""
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
            q = np.zeros((len(chunk), width, sets[chunk[0]][0].shape[1]), dtype=np.float32)      # [B,N,Dq]
            y = np.zeros((len(chunk), width), dtype=np.float32)                                  # [B,N]
            mask = np.zeros((len(chunk), width), dtype=bool)                                     # [B,N]
            for b, i in enumerate(chunk):
                n = len(sets[i][1])
                q[b, :n], y[b, :n], mask[b, :n] = sets[i][0], sets[i][1], True
            z[chunk] = model.embed(torch.from_numpy(q), torch.from_numpy(y), torch.from_numpy(mask)).numpy()
            start = end
    return z


def halves(es: EvalSet) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint random halves of a set, seeded by its digest (so stability is reproducible)."""
    rng = np.random.default_rng(int(es.digest[:16], 16))
    perm = rng.permutation(es.n)
    return perm[: es.n // 2], perm[es.n // 2:]


def compute(tx: Tx, model, sets: list[EvalSet], with_stability: bool = True) -> tuple[np.ndarray, list[float | None]]:
    """Embeddings [len(sets), D] and stabilities (distance between the embeddings of two random halves), in one
    batched pass over every set and half."""
    if not sets:
        return np.zeros((0, model.cfg.d_model), dtype=np.float32), []
    row_of, qmat = query_vectors(tx, np.concatenate([s.query_ids for s in sets]))
    inputs, half_index = [], []
    for s in sets:
        q = qmat[[row_of[int(i)] for i in s.query_ids]]
        inputs.append((q, s.y))
        if with_stability and s.n >= 2:
            a, b = halves(s)
            half_index.append(len(inputs))
            inputs += [(q[a], s.y[a]), (q[b], s.y[b])]
        else:
            half_index.append(None)
    z = embed_sets(model, inputs)
    full = [i for i in range(len(inputs)) if i not in {h for h in half_index if h is not None} | {
        h + 1 for h in half_index if h is not None}]
    stab = [None if h is None else float(np.linalg.norm(z[h] - z[h + 1])) for h in half_index]
    return z[full], stab


@dataclass
class NewVersion:
    """A version this transaction appended (what the in-memory index needs once it commits)."""
    id: int
    model_id: int
    name: str
    vector: np.ndarray
    created: str


def model_names(tx: Tx, model_ids) -> dict[int, str]:
    """Names by model id (a model's name never changes: cached per open database, as query vectors are)."""
    known = tx.cache.get("model_names", {})
    missing = sorted({int(m) for m in model_ids} - known.keys())
    if missing:
        found = dict(tx.sql(f"SELECT id, name FROM models WHERE id IN ({', '.join(map(str, missing))})"))
        merged = {**known, **found}
        tx.after_commit(lambda: tx.cache.__setitem__("model_names", {**tx.cache.get("model_names", {}), **found}))
        known = merged
    return {int(m): known[int(m)] for m in model_ids}


def run_pending(tx: Tx, min_evaluations: int = MIN_EVALUATIONS, all_models: bool = False) -> list[JobOutcome]:
    """Finish every pending job (and with `all_models`, re-embed every model) in one batched pass.

    This is every onboarding's hot path, so it reads little: the jobs, the models' versions, their evaluations."""
    import pyarrow as pa

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
    newest_job = {m: (reason, batch) for _, m, reason, batch in jobs}      # jobs are oldest first: the newest wins
    names = model_names(tx, model_ids)
    # each model's versions, plus one row with the newest version id under this encoder (for the in-memory index)
    latest_version, latest_digest, newest_before = {}, {}, 0
    for m, version, dig, enc, vid in tx.sql(f"""
            SELECT model_id, version, digest, encoder_id, id FROM embedding_versions
            WHERE model_id IN ({', '.join(map(str, model_ids))})
            UNION ALL SELECT NULL, NULL, NULL, NULL, max(id) FROM embedding_versions WHERE encoder_id = ?""",
                                           [encoder_id]):
        if m is None:
            newest_before = int(vid or 0)
            continue
        if version > latest_version.get(m, 0):
            latest_version[m] = version
        if enc == encoder_id and version >= latest_digest.get(m, (0, None))[0]:
            latest_digest[m] = (version, dig)
    # a version covers the evaluations up to the newest batch at this moment
    through = int(tx.sql("SELECT coalesce(max(id), 0) FROM import_batches")[0][0])
    sets = evaluation_sets(tx, model_ids, through, meta.get("embed_max_set"))
    todo = [m for m in model_ids
            if sets[m].n >= min_evaluations and latest_digest.get(m, (0, None))[1] != sets[m].digest]
    z, stab = compute(tx, model, [sets[m] for m in todo])
    outcomes, version_of = {}, {}
    if todo:
        tx.duck.register("_new_versions", pa.table({
            "model_id": pa.array(todo, pa.int64()),
            "version": pa.array([latest_version.get(m, 0) + 1 for m in todo], pa.int64()),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(z.ravel(), pa.float32()), z.shape[1]),
            "n_evaluations": pa.array([sets[m].n for m in todo], pa.int64()),
            "digest": [sets[m].digest for m in todo],
            "reason": [newest_job[m][0] for m in todo],
            "batch_id": pa.array([newest_job[m][1] for m in todo], pa.int64()),
            "stability": pa.array(stab, pa.float64())}))
        try:
            written = tx.sql(f"""
                INSERT INTO embedding_versions (model_id, version, encoder_id, vector, n_evaluations, digest,
                                                through_batch, reason, batch_id, stability)
                SELECT model_id, version, {int(encoder_id)}, vector::FLOAT[{z.shape[1]}], n_evaluations, digest,
                       {through}, reason, batch_id, stability FROM _new_versions
                RETURNING id, model_id, created::VARCHAR""")
        finally:
            tx.duck.unregister("_new_versions")
        row_of = {m: i for i, m in enumerate(todo)}
        new = [NewVersion(int(vid), int(m), names[m], z[row_of[m]], created) for vid, m, created in written]
        for v in new:
            version_of[v.model_id] = v.id
            outcomes[v.model_id] = JobOutcome(names[v.model_id], "embedded", latest_version.get(v.model_id, 0) + 1,
                                              sets[v.model_id].n, stab[row_of[v.model_id]])
        tx.after_commit(lambda: index.appended(tx.path, encoder_id, newest_before, new))
    for m in model_ids:
        if m not in outcomes:
            kind = "too few evaluations" if sets[m].n < min_evaluations else "unchanged"
            outcomes[m] = JobOutcome(names[m], kind, latest_version.get(m), sets[m].n)
    tx.duck.executemany("INSERT INTO onboarding_results (job_id, outcome, version_id) VALUES (?, ?, ?)",
                        [[j, outcomes[m].outcome, version_of.get(m)] for j, m, _, _ in jobs])
    return [outcomes[m] for m in model_ids]


def recompute(tx: Tx, version_id: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """Recompute a stored version from the evaluations it names: (stored vector, recomputed, digest matches).
    The set is embedded with its halves, as onboarding embeds a single model."""
    row = tx.sql("""SELECT model_id, encoder_id, through_batch, digest, vector FROM embedding_versions
                    WHERE id = ?""", [version_id])
    if not row:
        raise NotFound(f"unknown embedding version id {version_id}")
    model_id, encoder_id, through, stored_digest, vector = row[0]
    model, meta = encoders.load(tx, encoder_id)
    s = evaluation_sets(tx, [model_id], through, meta.get("embed_max_set"))[model_id]
    z, _ = compute(tx, model, [s])
    return np.asarray(vector, dtype=np.float32), z[0], s.digest == stored_digest
