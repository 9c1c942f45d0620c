"""The embedding space as a whole: the pool of current embeddings, test-split outcomes and LOCUS predictions over
it, and how well embedding distance tracks real disagreement (`Registry.geometry`).

Portfolio, fallback, map and fingerprint all start from `pool()`: the current version of every model under the
active encoder, read from the FAISS index (which keeps itself up to date with the database), so they never
disagree with `similar` about where a model sits.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from registry.answers import catalog, disagreement
from registry.core.errors import InputError
from registry.core.transaction import Tx
from registry.data import current_evaluations, query_cache
from registry.embedding import index
from registry.locus.evidence import on_probation


@dataclass
class Pool:
    encoder_id: int
    model_ids: np.ndarray        # [M] int64
    names: list[str]             # [M]
    vectors: np.ndarray          # [M,128] float32
    n_evaluations: np.ndarray | None = None   # [M] evaluations behind each embedding (None: not known here)

    def on_probation(self, minimum: int) -> set[str]:
        """The models whose embedding stands on fewer than `minimum` evaluations (locus/evidence.py): never
        chosen as a substitute or a portfolio member unless asked, as routing never chooses them."""
        if self.n_evaluations is None:
            return set()
        return {n for n, weak in zip(self.names, on_probation(self.n_evaluations, minimum).tolist()) if weak}


@dataclass
class Geometry:
    pearson: float
    spearman: float
    pairs: int                   # model pairs with at least `min_shared` shared test queries
    test_queries: int


def pool(tx: Tx, encoder_id: int, as_of: str | None = None) -> Pool:
    """Every model's current embedding under `encoder_id`, ordered by name (so results are deterministic)."""
    vi = index.get(tx, encoder_id, as_of)
    if vi.size == 0:
        raise InputError("the registry has no embedded models yet: import evaluations first (`registry import`)")
    ids, vecs = vi.vectors()
    order = sorted(range(len(ids)), key=lambda i: vi.names[int(ids[i])])
    ids = ids[order]
    names = [vi.names[int(i)] for i in ids]
    n = catalog.current_versions(tx, encoder_id, as_of)
    return Pool(encoder_id, ids, names, np.ascontiguousarray(vecs[order]),
                np.array([n.get(name, (0, 0))[1] for name in names], dtype=np.int64))


def pairwise(vectors: np.ndarray) -> np.ndarray:
    """[M,128] -> [M,M] Euclidean distances (only for pools small enough to hold M*M floats)."""
    sq = (vectors.astype(np.float64) ** 2).sum(1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * vectors.astype(np.float64) @ vectors.T.astype(np.float64)
    d = np.sqrt(np.maximum(d2, 0.0))
    np.fill_diagonal(d, 0.0)
    return d


def test_outcomes(tx: Tx, model_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Current evaluations on the test split: (query ids [N], correct [M,N] int8, 1/0 and -1 = not evaluated)."""
    import pyarrow as pa

    with tx.table("_pool", pa.table({"model_id": np.asarray(model_ids, np.int64),
                                        "row": np.arange(len(model_ids), dtype=np.int64)})):
        res = tx.numpy(f"""
            SELECT p.row, e.query_id, e.correct::INT AS correct
            FROM {current_evaluations.CURRENT} e JOIN _pool p ON p.model_id = e.model_id
            JOIN query_splits s ON s.query_id = e.query_id AND s.split = 'test'""")
    qids = np.unique(np.asarray(res["query_id"], np.int64))
    correct = np.full((len(model_ids), len(qids)), -1, dtype=np.int8)
    correct[np.asarray(res["row"], np.int64), np.searchsorted(qids, res["query_id"])] = res["correct"]
    return qids, correct


def predicted(tx: Tx, encoder_id: int, vectors: np.ndarray, query_ids: np.ndarray) -> np.ndarray:
    """LOCUS predictor: P(correct) [M,N] of each model (its current embedding) on each query."""
    from registry.embedding import encoders

    model, _ = encoders.load(tx, encoder_id)
    row_of, qmat = query_cache.query_vectors(tx, query_ids)
    return model.p_correct(vectors, qmat[[row_of[int(i)] for i in query_ids]],
                           query_cache.query_categories(tx, query_ids, model))


def correlation(tx: Tx, p: Pool, min_shared: int = 10) -> Geometry:
    from scipy.stats import pearsonr, spearmanr

    if len(p.names) < 3:
        raise InputError(f"geometry needs at least 3 embedded models, the registry has {len(p.names)}")
    qids, correct = test_outcomes(tx, p.model_ids)
    rate, _ = disagreement.disagreement_matrix(correct, min_shared)
    dist = pairwise(p.vectors)
    iu = np.triu_indices(len(p.names), 1)
    x, y = dist[iu], rate[iu]
    keep = ~np.isnan(y)
    if keep.sum() < 3:
        raise InputError(f"too few model pairs share {min_shared} evaluated test queries to correlate")
    return Geometry(round(float(pearsonr(x[keep], y[keep])[0]), 4), round(float(spearmanr(x[keep], y[keep])[0]), 4),
                    int(keep.sum()), len(qids))
