"""Embedding, pure: which evaluations a model's embedding is computed from, their digest, and the batched, masked
forward pass over many sets at once. Nothing here writes: onboarding.py turns its output into versions, and
evaluation, fingerprinting and training use it directly.

What an embedding is computed from, exactly: the model's current (newest) evaluations from batches up to
`through_batch`, on queries outside the test split (held-out queries never reach the encoder, so `registry evaluate`
stays honest and agrees with routing), capped at the encoder's `embed_max_set` by query content hash when the
encoder asks for a cap. Its digest is the sha256 of those (query id, correct) pairs, so any version can be
recomputed and checked (`onboarding.recompute`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from .evaluations import newest_per_query
from .querycache import projections, query_meta
from .store import Tx

MIN_EVALUATIONS = 32   # the fewest evaluations a model is embedded from


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




def embed_file(tx: Tx, path: str, model, min_evaluations: int = MIN_EVALUATIONS):
    """Embed an unregistered model from its results file, as onboarding would (test queries left out), reading the
    file into temporary tables only: nothing is written. -> (z [D], answers: `ingest.Answers`)"""
    from . import ingest, querycache, textvec
    from .errors import InputError

    a = ingest.read_answers(tx, path)
    keep = ~a.is_test
    n = int(keep.sum()) + len(a.new_texts)
    if n < min_evaluations:
        raise InputError(f"{n} evaluations outside the test split; at least {min_evaluations} are needed to embed a "
                         f"model", file=str(path))
    row_of, qmat = querycache.query_vectors(tx, a.query_ids[keep])
    q = qmat[[row_of[int(i)] for i in a.query_ids[keep]]]
    if a.new_texts:
        q = np.concatenate([q, textvec.encode(a.new_texts)])
    y = np.concatenate([a.correct[keep], a.new_correct]).astype(np.float32)
    return embed_sets(model, [(q, y)])[0], a
