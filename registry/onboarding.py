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


def evaluation_sets(tx: Tx, model_ids, through_batch: int, max_set: int | None = None) -> dict[int, EvalSet]:
    """Each model's embedding input, read in one query (see the module docstring for what it contains)."""
    ids = ", ".join(str(int(m)) for m in model_ids) or "NULL"
    cap = f"WHERE rank <= {int(max_set)}" if max_set else ""
    # the evaluations a version is computed from: current (newest) per query, outside the test split, ranked by
    # content hash for the optional cap; both the rows and their digest are read from it
    used = f"""
        WITH cur AS (SELECT model_id, query_id, arg_max(correct, batch_id) AS correct FROM evaluations
                     WHERE model_id IN ({ids}) AND batch_id <= {int(through_batch)} GROUP BY model_id, query_id),
             ranked AS (SELECT cur.model_id, cur.query_id, cur.correct, q.external_id,
                               row_number() OVER (PARTITION BY cur.model_id ORDER BY q.content_hash, q.external_id)
                                   AS rank
                        FROM cur JOIN queries q ON q.id = cur.query_id
                        LEFT JOIN query_splits s ON s.query_id = cur.query_id
                        WHERE s.split IS NULL OR s.split <> 'test'),
             used AS (SELECT * FROM ranked {cap})"""
    res = tx.duck.execute(f"""{used} SELECT model_id, query_id, correct::INT AS correct, external_id FROM used
                              ORDER BY model_id, external_id""").fetchnumpy()
    digests = dict(tx.sql(f"""{used} SELECT model_id, sha256(string_agg(external_id || ':' || correct::INT, ','
                                                                        ORDER BY external_id))
                              FROM used GROUP BY model_id"""))
    model_col = np.asarray(res["model_id"])
    out = {}
    for m in model_ids:
        sel = model_col == int(m)
        out[int(m)] = EvalSet(int(m), np.asarray(res["query_id"])[sel].astype(np.int64),
                              np.asarray(res["correct"])[sel].astype(np.float32),
                              digests.get(int(m), hashlib.sha256(b"").hexdigest()))
    return out


def query_vectors(tx: Tx, query_ids: np.ndarray) -> dict[int, int] | tuple:
    """(row of each query id, [n, 384] float32 matrix) for the given registry query ids."""
    import pyarrow as pa

    uniq = np.unique(query_ids)
    tx.duck.register("_qids", pa.table({"id": uniq}))
    try:
        tbl = tx.arrow("""SELECT q.id, v.vector FROM _qids i JOIN queries q ON q.id = i.id
                                 JOIN text_vectors v ON v.content_hash = q.content_hash AND v.text_encoder = ?
                                 ORDER BY q.id""", [textvec.TEXT_ENCODER])
    finally:
        tx.duck.unregister("_qids")
    ids = tbl.column("id").to_numpy()
    if len(ids) != len(uniq):
        missing = sorted(set(uniq.tolist()) - set(ids.tolist()))[:3]
        raise NotFound(f"queries without a text vector under {textvec.TEXT_ENCODER}: ids {missing}")
    flat = tbl.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return {int(q): i for i, q in enumerate(ids)}, flat.reshape(len(ids), -1).astype(np.float32)


def embed_sets(model, sets: list[tuple[np.ndarray, np.ndarray]], budget: int = 1 << 16) -> np.ndarray:
    """Embed many sets in padded, masked batches. sets: [(q [n,Dq], y [n])] -> z [len(sets), D].

    Sets are batched with sets of similar size (padding to the next multiple of 64). The forward pass runs in the
    model's own dtype: versions are computed with a float64 copy of the encoder (encoders.load_for_embedding) and
    stored as float32, so a version recomputed alone equals the one computed in a batch with others (float32 BLAS
    gives differences of about 1e-6 between batch shapes)."""
    import torch

    width_of = [max(64, -(-len(y) // 64) * 64) for _, y in sets]
    z = np.zeros((len(sets), model.cfg.d_model), dtype=np.float32)
    with torch.no_grad():
        for width in sorted(set(width_of)):
            same = [i for i, w in enumerate(width_of) if w == width]
            per_batch = max(1, budget // width)
            for start in range(0, len(same), per_batch):
                chunk = same[start:start + per_batch]
                dtype = np.float64 if next(model.parameters()).dtype == torch.float64 else np.float32
                q = np.zeros((len(chunk), width, sets[chunk[0]][0].shape[1]), dtype=dtype)       # [B,N,Dq]
                y = np.zeros((len(chunk), width), dtype=dtype)                                   # [B,N]
                mask = np.zeros((len(chunk), width), dtype=bool)                                 # [B,N]
                for b, i in enumerate(chunk):
                    n = len(sets[i][1])
                    q[b, :n], y[b, :n], mask[b, :n] = sets[i][0], sets[i][1], True
                z[chunk] = model.embed(torch.from_numpy(q), torch.from_numpy(y), torch.from_numpy(mask)).float().numpy()
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


def run_pending(tx: Tx, min_evaluations: int = MIN_EVALUATIONS, all_models: bool = False) -> list[JobOutcome]:
    """Finish every pending job (and with `all_models`, re-embed every model) in one batched pass."""
    encoder_id = encoders.ensure_default(tx)
    if encoder_id is None:
        return []
    if all_models:
        enqueue(tx, [r[0] for r in tx.sql("SELECT id FROM models")], "manual", encoder_id=encoder_id)
    jobs = pending(tx)
    if not jobs:
        return []
    model, meta = encoders.load_for_embedding(tx, encoder_id)
    model_ids = sorted({j[1] for j in jobs})
    through = int(tx.sql("SELECT coalesce(max(id), 0) FROM import_batches")[0][0])
    sets = evaluation_sets(tx, model_ids, through, meta.get("embed_max_set"))
    latest = {m: (v, d) for m, v, d in tx.sql(f"""
        SELECT model_id, max(version), arg_max(digest, version) FILTER (WHERE encoder_id = {encoder_id})
        FROM embedding_versions WHERE model_id IN ({', '.join(map(str, model_ids))}) GROUP BY model_id""")}
    names = dict(tx.sql(f"SELECT id, name FROM models WHERE id IN ({', '.join(map(str, model_ids))})"))
    newest_job = {m: (j, reason, batch) for j, m, reason, batch in jobs}  # jobs are oldest first
    todo = [m for m in model_ids if sets[m].n >= min_evaluations and latest.get(m, (0, None))[1] != sets[m].digest]
    z, stab = compute(tx, model, [sets[m] for m in todo])
    outcomes, version_of = {}, {}
    for i, m in enumerate(todo):
        version = (latest.get(m, (0, None))[0] or 0) + 1
        _, reason, batch = newest_job[m]
        vid = tx.sql("""INSERT INTO embedding_versions (model_id, version, encoder_id, vector, n_evaluations, digest,
                            through_batch, reason, batch_id, stability)
                        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id""",
                     [m, version, encoder_id, z[i].tolist(), sets[m].n, sets[m].digest, through, reason, batch,
                      stab[i]])[0][0]
        version_of[m] = vid
        outcomes[m] = JobOutcome(names[m], "embedded", version, sets[m].n, stab[i])
    for m in model_ids:
        if m not in outcomes:
            kind = "too few evaluations" if sets[m].n < min_evaluations else "unchanged"
            outcomes[m] = JobOutcome(names[m], kind, latest.get(m, (None, None))[0], sets[m].n)
    tx.duck.executemany("INSERT INTO onboarding_results (job_id, outcome, version_id) VALUES (?, ?, ?)",
                        [[j, outcomes[m].outcome, version_of.get(m)] for j, m, _, _ in jobs])
    return [outcomes[m] for m in model_ids]


def recompute(tx: Tx, version_id: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """Recompute a stored version from the evaluations it names: (stored vector, recomputed, digest matches)."""
    row = tx.sql("""SELECT model_id, encoder_id, through_batch, digest, vector FROM embedding_versions
                    WHERE id = ?""", [version_id])
    if not row:
        raise NotFound(f"unknown embedding version id {version_id}")
    model_id, encoder_id, through, digest, vector = row[0]
    model, meta = encoders.load_for_embedding(tx, encoder_id)
    s = evaluation_sets(tx, [model_id], through, meta.get("embed_max_set"))[model_id]
    z, _ = compute(tx, model, [s], with_stability=False)
    return np.asarray(vector, dtype=np.float32), z[0], s.digest == digest
