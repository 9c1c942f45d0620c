"""Embedding models from their evaluations with a trained LOCUS model, and scoring queries against them: what
training validates with and what the benches read a checkpoint by."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from registry.locus.baselines import hit_at_k, predictor_metrics
from registry.locus.network import LocusModel


def model_rows(correct: np.ndarray, idx_subset, max_set: int | None, seed: int | None) -> list[np.ndarray]:
    """Per model, the query indices (within idx_subset) it was evaluated on; capped to max_set by a seeded draw."""
    idx = np.asarray(idx_subset)
    rng = np.random.default_rng(0 if seed is None else seed)
    rows = []
    for m in range(correct.shape[0]):
        r = idx[correct[m, idx] >= 0]
        if len(r) == 0:
            raise ValueError(f"model {m} has no evaluations in the subset")
        if max_set is not None and len(r) > max_set:
            r = np.sort(rng.choice(r, size=max_set, replace=False))
        rows.append(r)
    return rows


def embed_rows(model: LocusModel, q: torch.Tensor, correct: np.ndarray, rows: list[np.ndarray],
               budget: int = 1 << 16) -> torch.Tensor:
    """Padded, masked batches of sets; about `budget` padded rows per forward pass. -> z [M,D]"""
    P_all, S_all = model.row_proj(q)                                       # [Nq,D] each, once for every model
    zs, start = [], 0
    while start < len(rows):
        end, width = start, 0
        while end < len(rows) and max(width, len(rows[end])) * (end - start + 1) <= max(budget, len(rows[end])):
            width = max(width, len(rows[end]))
            end += 1
        B = end - start
        idx = np.zeros((B, width), dtype=np.int64)
        y = np.zeros((B, width), dtype=np.float32)
        mask = np.zeros((B, width), dtype=bool)
        for i, m in enumerate(range(start, end)):
            r = rows[m]
            idx[i, :len(r)], y[i, :len(r)], mask[i, :len(r)] = r, correct[m, r], True
        it = torch.from_numpy(idx)
        zs.append(model.embed_proj(P_all[it], S_all[it], torch.from_numpy(y), torch.from_numpy(mask)))
        start = end
    return torch.cat(zs)


@torch.no_grad()
def embed_models(model: LocusModel, qvecs: np.ndarray, correct: np.ndarray, idx_subset,
                 max_set: int | None = None, seed: int | None = None) -> np.ndarray:
    """Each model's embedding from its evaluations on idx_subset (observed entries only). -> z [M,D] float32.

    correct [M,Nq] int8 (-1 = missing). max_set caps the set per model by a seeded random draw (seed None = 0).
    """
    model.eval()
    rows = model_rows(correct, idx_subset, max_set, seed)
    return embed_rows(model, torch.from_numpy(np.ascontiguousarray(qvecs, dtype=np.float32)), correct, rows).numpy()


@torch.no_grad()
def predict_proba(model: LocusModel, z: np.ndarray, qvecs: np.ndarray, categories=None) -> np.ndarray:
    """P(correct) [M,N] for model embeddings z [M,D] and query vectors [N,Dq] (with their category names [N], for
    a model that reads them)."""
    model.eval()
    return model.p_correct(z, qvecs, categories)


def route(model: LocusModel, z: np.ndarray, qvecs: np.ndarray, k: int = 1, categories=None) -> np.ndarray:
    """[k,N] indices of the k models most likely to answer each query, best first."""
    p = predict_proba(model, z, qvecs, categories)
    return np.argsort(-p.astype(np.float64), axis=0, kind="stable")[:k]


def evaluate(model: LocusModel, qvecs, correct, embed_idx, eval_idx, *, max_set=None, seed=None,
             categories=None) -> dict:
    """Routing and predictor metrics on eval_idx, with models embedded from their evaluations on embed_idx
    (categories [Nq]: every query's category name, or None)."""
    z = embed_models(model, qvecs, correct, embed_idx, max_set=max_set, seed=seed)
    eval_idx = np.asarray(eval_idx)
    p = predict_proba(model, z, qvecs[eval_idx], None if categories is None else np.asarray(categories)[eval_idx])
    c = correct[:, eval_idx]
    obs = c >= 0
    pt = torch.from_numpy(p[obs].astype(np.float64)).clamp(1e-7, 1 - 1e-7)
    bce = float(F.binary_cross_entropy(pt, torch.from_numpy((c[obs] == 1).astype(np.float64))))
    n_routed = int(len(np.unique(np.argmax(p.astype(np.float64), axis=0))))
    return {"hit@1": hit_at_k(p, c, 1), "bce": bce, "n_routed": n_routed, **predictor_metrics(p, c)}
