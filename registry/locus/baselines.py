"""Routing metrics and the simple baselines LOCUS is compared with, on the same arrays.

Arrays: qvecs [Nq,Dq] float32 (unit norm); correct [M,Nq] int8 with 1/0 and -1 = missing. A score matrix is
[M,N] over the queries being routed (higher = route there). A missing (model, query) counts as wrong when chosen;
`among_answered` (locus/interaction.py: the one scoring rule of every routing figure) keeps every method from choosing
one where another model has a result (evaluate/ scores routing that way); predictor metrics (accuracy, AUC, Brier)
use observed entries only. Numpy only: the pair models trained with torch (MF, IRT), which `registry evaluate`
reports beside these, are evaluate/pair_baselines.py's (routing serves its own numpy ones: routing/pairs.py).
"""
from __future__ import annotations

from math import comb

import numpy as np

from registry.locus.interaction import among_answered  # noqa: F401  (the one scoring rule; B.among_answered)

# ---------------------------------------------------------------- metrics

def topk_models(scores: np.ndarray, k: int) -> np.ndarray:
    """[M,N] scores -> [k,N] model indices, best first; ties go to the lower model index (stable sort)."""
    return np.argsort(-np.asarray(scores, dtype=np.float64), axis=0, kind="stable")[:k]


def hit_at_k(scores: np.ndarray, correct: np.ndarray, k: int = 1) -> float:
    """Share of queries where one of the k top-scored models answered correctly (missing = wrong)."""
    top = topk_models(scores, k)                                  # [k,N]
    right = np.take_along_axis(correct, top, axis=0) == 1         # [k,N]
    return float(right.any(axis=0).mean())


def oracle_hit(correct: np.ndarray) -> float:
    return float((correct == 1).any(axis=0).mean())


def random_hit_at_k(correct: np.ndarray, k: int = 1) -> float:
    """Expected hit@k of k models drawn uniformly without replacement: 1 - C(M-c, k) / C(M, k) per query."""
    M = correct.shape[0]
    k = min(k, M)                                                 # fewer models than k: every model is drawn
    c = (correct == 1).sum(axis=0)
    miss = np.array([comb(M - int(ci), k) / comb(M, k) for ci in c])
    return float(1.0 - miss.mean())


def predictor_metrics(probs: np.ndarray, correct: np.ndarray) -> dict:
    """Accuracy (p > 0.5), ROC-AUC and Brier score of P(correct) over the observed entries."""
    from sklearn.metrics import roc_auc_score  # here: importing sklearn costs routing's start-up 2 s otherwise

    obs = correct >= 0
    p, y = np.asarray(probs, dtype=np.float64)[obs], correct[obs].astype(np.float64)
    return {"acc": float(((p > 0.5) == (y == 1)).mean()),
            "auc": float(roc_auc_score(y, p)) if 0 < y.mean() < 1 else float("nan"),
            "brier": float(((p - y) ** 2).mean())}


def coverage(scores: np.ndarray, correct: np.ndarray) -> tuple[int, float | None]:
    """(queries whose top-1 model has a result, hit@1 over those queries alone): a choice without a result cannot
    be scored, and hit@1 counts it as wrong."""
    got = np.take_along_axis(correct, topk_models(scores, 1), axis=0)[0]
    scored = int((got >= 0).sum())
    return scored, (float((got == 1).sum() / scored) if scored else None)


def disagreement(correct: np.ndarray) -> np.ndarray:
    """[N] bool: the queries where the models' observed answers differ (some right, some wrong): the only ones
    where the choice of model matters."""
    return (correct == 1).any(axis=0) & (correct == 0).any(axis=0)


def routing_report(scores: np.ndarray, correct: np.ndarray, probs: np.ndarray | None = None,
                   strongest: int | None = None) -> dict:
    """hit@1/3/5, and what routing used: how many models it chooses, how often its choice differs from the
    strongest model's (`strongest`, a row: the best single model), and hit@1 on the queries where models disagree;
    with `probs`, the predictor metrics of those P(correct)."""
    out: dict[str, float | None] = {f"hit@{k}": hit_at_k(scores, correct, k) for k in (1, 3, 5)}
    top = topk_models(scores, 1)[0]
    out["n_chosen"] = int(len(np.unique(top)))                      # how many distinct models get routed to
    if strongest is not None:
        out["differs_from_strongest"] = float((top != strongest).mean())
    dis = disagreement(correct)
    out["hit@1_disagree"] = hit_at_k(scores[:, dis], correct[:, dis], 1) if dis.any() else None
    scored, on_scored = coverage(scores, correct)
    out["scored"] = scored                                          # of correct.shape[1] queries
    out["coverage"] = scored / max(correct.shape[1], 1)
    out["hit@1_scored"] = on_scored
    if probs is not None:
        out.update(predictor_metrics(probs, correct))
    return out


# ---------------------------------------------------------------- baselines

def model_accuracy(correct: np.ndarray) -> np.ndarray:
    """[M] accuracy over observed entries."""
    obs = correct >= 0
    return (correct == 1).sum(1) / np.maximum(obs.sum(1), 1)


def best_single_scores(correct: np.ndarray, train_idx, eval_idx) -> np.ndarray:
    """Each model's train accuracy as its score on every query: routes everything to the best model."""
    acc = model_accuracy(correct[:, train_idx])
    return np.repeat(acc[:, None], len(eval_idx), axis=1)


def per_category_scores(correct: np.ndarray, categories: np.ndarray, known: np.ndarray, eval_idx,
                        prior: float) -> np.ndarray:
    """[M, len(eval_idx)]: each model's accuracy on the query's category over the (model, query) pairs in `known`
    ([M,Nq] bool), shrunk toward its overall accuracy by `prior` pseudo-answers; ties go to the stronger model."""
    eval_idx = np.asarray(eval_idx)
    known = known & (correct >= 0)
    y = (correct == 1) & known
    overall = y.sum(1) / np.maximum(known.sum(1), 1)
    out = np.zeros((correct.shape[0], len(eval_idx)))
    for c in np.unique(categories[eval_idx]):
        in_c = categories == c
        yc, nc = (y & in_c).sum(1), (known & in_c).sum(1)
        out[:, categories[eval_idx] == c] = ((yc + prior * overall) / (nc + prior + 1e-9))[:, None]
    return out + 1e-9 * overall[:, None]


def per_category_router(correct: np.ndarray, categories: np.ndarray, train_idx, val_idx, eval_idx,
                        priors=(0, 5, 20, 50, 200)) -> tuple[np.ndarray, dict]:
    """The router that sends each query to its category's best model (by the answers in that category), the prior
    chosen on val from the train answers, then the scores on eval_idx from the train and val answers (every
    non-test answer, as the registry embeds models from). -> (scores [M, len(eval_idx)], {"prior", "val"})."""
    tr, va = np.asarray(train_idx), np.asarray(val_idx)
    known_tr = np.zeros(correct.shape, dtype=bool)
    known_tr[:, tr] = True
    val = {p: val_hit(per_category_scores(correct, categories, known_tr, va, p), correct[:, va]) for p in priors}
    prior = max(priors, key=lambda p: (val[p], -p))
    known = known_tr.copy()
    known[:, va] = True
    return per_category_scores(correct, categories, known, eval_idx, prior), {"prior": prior, "val": val}


def knn_scores(qvecs: np.ndarray, correct: np.ndarray, train_idx, eval_idx, k: int,
               own_neighbours: bool = False) -> np.ndarray:
    """Mean correctness of each model on the k most cosine-similar train queries (observed entries only).

    own_neighbours: each model's k nearest among the train queries *it* has a result for. With a few results per
    model (a new model known from 128 of 9,626 train queries), the shared k = 50 neighbours would hold under one of
    its results on average, so its score would be 0 almost everywhere; on complete rows the two rules agree."""
    tr = np.asarray(train_idx)
    if not own_neighbours:
        return _knn_shared(qvecs, correct, tr, np.asarray(eval_idx), k)
    seen = correct[:, tr] >= 0
    out = np.empty((correct.shape[0], len(eval_idx)), dtype=np.float64)
    groups: dict[bytes, list[int]] = {}
    for m in range(correct.shape[0]):                              # models with the same observed train queries
        groups.setdefault(np.packbits(seen[m]).tobytes(), []).append(m)
    for rows in groups.values():
        cols = tr[seen[rows[0]]]
        if len(cols) == 0:
            out[rows] = 0.0
            continue
        out[rows] = _knn_shared(qvecs, correct[rows], cols, np.asarray(eval_idx), k)
    return out


def _knn_shared(qvecs, correct, tr, ev, k):
    k = min(k, len(tr))
    y = correct[:, tr].astype(np.float32)                          # [M,Ntr]
    obs = (y >= 0).astype(np.float32)
    y = np.where(y > 0, 1.0, 0.0).astype(np.float32)
    out = np.empty((correct.shape[0], len(ev)), dtype=np.float64)
    for s in range(0, len(ev), 1024):                             # chunks keep the [n,Ntr] similarity small
        sims = qvecs[ev[s:s + 1024]] @ qvecs[tr].T                 # [n,Ntr]
        nn_idx = np.argpartition(-sims, k - 1, axis=1)[:, :k]      # [n,k]
        hits = y[:, nn_idx].sum(-1)                                # [M,n]
        seen = obs[:, nn_idx].sum(-1)
        out[:, s:s + 1024] = hits / np.maximum(seen, 1)
    return out + 1e-6 * model_accuracy(correct[:, tr])[:, None]     # ties among neighbours: the stronger model


def val_hit(scores: np.ndarray, correct_val: np.ndarray) -> float:
    """Validation hit@1 for choosing a baseline's settings, each query's choice among the models with a validation
    result for it (`among_answered`, as the test split is scored): a model without one (a new model known from a
    few hundred results) cannot be judged there, and counting its choices as wrong would tune the baseline against
    it. With every model on every val query this is hit_at_k(..., 1)."""
    rows = (correct_val >= 0).any(axis=1)
    return hit_at_k(among_answered(scores[rows], correct_val[rows]), correct_val[rows], 1) if rows.any() else 0.0


def knn_router(qvecs, correct, train_idx, val_idx, ks=(5, 10, 20, 50, 100),
               own_neighbours: bool = False) -> tuple[int, dict]:
    """k chosen by validation hit@1 (ties: smaller k), among the ks a train split of this size allows."""
    ks = [k for k in ks if k <= len(train_idx)] or [len(train_idx)]
    val = {k: val_hit(knn_scores(qvecs, correct, train_idx, val_idx, k, own_neighbours), correct[:, val_idx])
           for k in ks}
    return max(ks, key=lambda k: (val[k], -k)), val
