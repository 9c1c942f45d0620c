"""The routing interaction: what differs between models on a given question, read from actual answers.

The predictor ranks (model, question) pairs well but routes as if one model were always best: it learns each model's
strength and each question's difficulty, and little of the model-by-question interaction, which is all routing uses.
Measured on MMLU-Pro (BENCHMARKS.md), routing by the predictor alone loses to a router that picks each category's
best model. So routing adds two terms to the predictor's logit, both read from the registry's answers on the
reference (non-test) queries, neither retraining the encoder:

    score(m, q) = logit P(m, q) + a * b[m, category(q)] + w * r_k(m, q)

- b[m, c]: model m's logit offset on category c, the maximum-a-posteriori shift that makes the predictor's P fit m's
  answers in c (a Gaussian prior of L2 pseudo-weight, so a model with a few answers in c keeps b near 0). A query
  whose category the registry does not know (a new text, or a category with no reference answers) takes the mix of
  its CAT_K nearest reference queries' categories.
- r_k(m, q): the mean residual (answer minus adjusted P) of m on the k reference queries nearest to q by text vector
  (cosine), over those m has answered, with a prior of RESID_PRIOR pseudo-answers at 0 (so a model known from a few
  answers gets almost nothing).

a, k and w are chosen on the validation split (the terms fitted on train alone, routing hit@1 on val, the grid
below): not the grid's argmax, which on a val split of a few hundred questions picks the setting val's noise
favours, but every setting's mean weighted by how near its val hit@1 is to the best, in standard errors
(`smoothed_setting`); then the terms are refitted on train + val, as models are embedded from all of their non-test
evaluations. a = w = 0 is the predictor alone: where it leads val clearly, the weights gather on it. The terms
are fitted against the predictor's own logits, and routing adds them to its logit after the evidence shrinkage;
only the MAX_MODELS strongest eligible models get them (`contenders`), so a refit costs about a second whatever the
size of the registry. `registry evaluate` and routing build this the same way (`fit`), so what is measured is what
is served.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

GRID_A = (0.0, 0.5, 1.0, 1.5, 2.0)      # category offset weights tried on val
GRID_K = (10, 20, 50, 100, 200)         # neighbours tried on val
GRID_W = (0.0, 0.5, 1.0, 2.0, 4.0)      # residual weights tried on val
# pseudo-answers at residual 0 in each neighbourhood's mean: a model known from 128 answers has one or two among a
# query's 100 nearest, whose mean residual is mostly noise (MMLU-Pro, 6 models held out: new-model AUC 0.7199 at 1,
# 0.7227 at 10); an established model, with every neighbour answered, loses a tenth that w's choice on val restores
RESID_PRIOR = 10.0
L2 = 10.0                                # prior pseudo-weight of each offset (in units of answers x p(1-p))
CAT_K = 50                               # reference neighbours whose categories stand in for an unknown one
NEWTON_STEPS = 25
MAX_MODELS = 64                          # models that get the terms: the eligible ones most often right (see fit)
_CLIP = 1e-6


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _CLIP, 1 - _CLIP)
    return np.log(p) - np.log1p(-p)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


# --- the scoring rule of every routing figure ------------------------------------------------------------------
# A routing choice is scored where it can be: each query's choice is made among the models with a result for it
# (a query no model has a result for keeps its scores, and counts as wrong). `registry evaluate` (every method),
# the served policy's val figures, `route --frontier` and a portfolio's routing accuracy all score this way.

def among_answered(scores: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """scores [M,N] with every (model, query) that has no result in correct [M,N] (-1) ranked below all that have
    one: a method then chooses among the models that could answer each query, so one partly evaluated model does
    not count against a method that prefers it."""
    scores = np.asarray(scores, dtype=np.float64)
    missing = (correct < 0) & (correct >= 0).any(axis=0, keepdims=True)
    return np.where(missing, -np.inf, scores)


def answered_choice(scores: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """[N] each query's choice (a row) among the models with a result for it; ties: the lower row."""
    return np.argmax(among_answered(scores, correct), axis=0)


def answered_right(scores: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """[N] bool: whether each query's choice among the models with a result for it was right."""
    return correct[answered_choice(scores, correct), np.arange(correct.shape[1])] == 1


def category_offsets(logits: np.ndarray, correct: np.ndarray, cat: np.ndarray, n_cat: int,
                     l2: float = L2) -> np.ndarray:
    """b [M, n_cat]: per model and category, argmax_b sum log-likelihood(answers | sigmoid(logit + b)) - l2 b^2 / 2,
    over the observed answers (correct [M,N] 1/0, -1 missing; cat [N] in 0..n_cat-1). Each (m, c) is a separate
    one-dimensional concave problem: Newton's method, a few steps (about 5 to 1e-5)."""
    if len(cat) == 0 or correct.shape[0] == 0:
        return np.zeros((correct.shape[0], n_cat))
    order = np.argsort(cat, kind="stable")                 # columns grouped by category: sums by reduceat
    present, starts = np.unique(cat[order], return_index=True)
    L, c = np.asarray(logits, dtype=np.float64)[:, order], correct[:, order]
    obs = (c >= 0).astype(np.float64)
    y = (c == 1).astype(np.float64)
    col = np.searchsorted(present, cat[order])             # each column's category among those present
    b = np.zeros((correct.shape[0], len(present)))
    for _ in range(NEWTON_STEPS):
        p = sigmoid(L + b[:, col])
        grad = np.add.reduceat((y - p) * obs, starts, axis=1) - l2 * b
        hess = np.add.reduceat(p * (1 - p) * obs, starts, axis=1) + l2
        step = grad / hess
        b += step
        if np.abs(step).max() < 1e-5:
            break
    out = np.zeros((correct.shape[0], n_cat))
    out[:, present] = b
    return out


def residuals(adjusted: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(answer - sigmoid(adjusted logit) where observed, else 0; observed as 0/1), float32 [M,N] each."""
    obs = correct >= 0
    r = np.where(obs, (correct == 1) - sigmoid(adjusted), 0.0)
    return r.astype(np.float32), obs.astype(np.float32)


CHUNK = 256     # queries per similarity block in `neighbours`


def neighbours(ref_vecs: np.ndarray, qvecs: np.ndarray, k: int) -> np.ndarray:
    """[N,k] indices of the k reference vectors most cosine-similar to each query (vectors are unit norm), most
    similar first; ties by index."""
    k = min(k, len(ref_vecs))
    out = np.empty((len(qvecs), k), dtype=np.int64)
    # chunks keep the [n, Nref] similarity and argpartition's int64 copy of it small (40 MB at 10,000 references)
    for s in range(0, len(qvecs), CHUNK):
        q = np.asarray(qvecs[s:s + CHUNK], dtype=np.float32)
        # a few queries (a route): einsum's own loop, 0.8 ms for 10,000 references, where a multi-threaded BLAS
        # matrix-vector product took 12 ms on 2 busy cores; many (evaluate, fitting): the BLAS product
        sims = np.einsum("nd,md->nm", q, ref_vecs) if len(q) <= 16 else q @ ref_vecs.T
        part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        order = np.lexsort((part, -np.take_along_axis(sims, part, axis=1)), axis=1)
        out[s:s + CHUNK] = np.take_along_axis(part, order, axis=1)
    return out


def knn_residual(resid: np.ndarray, seen: np.ndarray, nn: np.ndarray, k: int) -> np.ndarray:
    """[M,N]: each model's residuals summed over the first k neighbours of each query, over (its answers +
    RESID_PRIOR)."""
    idx = nn[:, :k]
    return resid[:, idx].sum(-1) / (seen[:, idx].sum(-1) + RESID_PRIOR)


def neighbour_sums(values: np.ndarray, nn: np.ndarray, ks) -> dict[int, np.ndarray]:
    """{k: [M,N] sum of each model's values over each query's first k neighbours} for increasing ks at once: each
    neighbour is read once (sums of the segments between consecutive ks, then running totals), a block of models at
    a time."""
    ks = sorted(ks)
    out = {k: np.zeros((values.shape[0], len(nn))) for k in ks}
    for s in range(0, values.shape[0], 64):
        total, lo = 0.0, 0
        for k in ks:
            hi = min(k, nn.shape[1])
            if hi > lo:
                total = total + values[s:s + 64][:, nn[:, lo:hi]].sum(-1, dtype=np.float64)
            out[k][s:s + 64] = total
            lo = max(lo, hi)
    return out


_val_nn: dict[bytes, np.ndarray] = {}     # the val queries' neighbours among train: the same for every model


def _neighbours_cached(ref_vecs: np.ndarray, qvecs: np.ndarray, k: int) -> np.ndarray:
    import hashlib

    # (the shapes too: the same vectors cut elsewhere between reference and query are another question)
    key = hashlib.sha1(ref_vecs.tobytes() + qvecs.tobytes() + repr((ref_vecs.shape, qvecs.shape, k)).encode()).digest()
    if key not in _val_nn:
        if len(_val_nn) >= 4:
            _val_nn.clear()
        _val_nn[key] = neighbours(ref_vecs, qvecs, k)
    return _val_nn[key]


def category_mix(cat: np.ndarray, nn: np.ndarray, ref_cat: np.ndarray, n_cat: int) -> np.ndarray:
    """[N, n_cat]: one-hot of each query's category where known (0..n_cat-1), else the share of each category among
    its CAT_K nearest reference queries."""
    out = np.zeros((len(cat), n_cat))
    known = (cat >= 0) & (cat < n_cat)
    out[np.flatnonzero(known), cat[known]] = 1.0
    for i in np.flatnonzero(~known):
        near = ref_cat[nn[i, :CAT_K]]
        near = near[near >= 0]                     # reference queries without a category say nothing here
        if len(near):
            out[i] = np.bincount(near, minlength=n_cat)[:n_cat] / len(near)
    return out


@dataclass
class Interaction:
    """The fitted terms over the reference (train and val) queries, for the models `rows` of the routing logits."""
    a: float
    k: int
    w: float
    categories: list[str]            # the categories with reference answers; b's columns
    rows: np.ndarray                 # [R] the models (rows of the routing logits) that get the terms
    offsets: np.ndarray              # b [R, C]
    ref_vecs: np.ndarray             # [Nref, Dq] float32: the reference queries' text vectors
    ref_cat: np.ndarray              # [Nref] category index (-1: none)
    resid: np.ndarray                # [R, Nref] float32: answer - sigmoid(logit + a b), 0 where unanswered
    seen: np.ndarray                 # [R, Nref] float32: 1 where answered
    selection: dict = field(default_factory=dict)   # what validation measured (see `fit`)
    # [R, Nval] the chosen setting's routing logits on val from terms fitted on train alone (what val judged), so
    # that the served policy can judge blends with it honestly (routing/served.py); None without a val split
    val_logits: np.ndarray | None = field(default=None, repr=False, compare=False)

    def category_index(self, names) -> np.ndarray:
        pos = {c: i for i, c in enumerate(self.categories)}
        return np.array([pos.get(c, -1) if c is not None else -1 for c in names], dtype=np.int64)

    def scores(self, logits: np.ndarray, qvecs: np.ndarray, cat: np.ndarray,
               nn: np.ndarray | None = None) -> np.ndarray:
        """Routing logits [M,N] from the predictor's logits [M,N], the queries' text vectors [N,Dq] and category
        indices [N] (-1: unknown). `nn`: the queries' nearest reference queries [N, >= the k used], when known."""
        out = np.array(logits, dtype=np.float64)
        if (self.a == 0 and self.w == 0) or not len(self.ref_vecs) or out.shape[1] == 0 or not len(self.rows):
            return out
        need_mix = self.a != 0 and bool(((cat < 0) | (cat >= len(self.categories))).any())
        kk = max(self.k if self.w else 0, CAT_K if need_mix else 0, 1)
        nn = neighbours(self.ref_vecs, qvecs, kk) if nn is None or nn.shape[1] < kk else nn[:, :kk]
        if self.a:
            out[self.rows] += self.a * (self.offsets @ category_mix(cat, nn, self.ref_cat, len(self.categories)).T)
        if self.w:
            out[self.rows] += self.w * knn_residual(self.resid, self.seen, nn, self.k)
        return out


def answered_hit(scores: np.ndarray, correct: np.ndarray) -> float:
    """hit@1 by the one scoring rule (`answered_right`: each query's choice among the models with a result for it),
    over the rows with any result here: what the report shows as a val hit@1 (the interaction's, the predictor's,
    and every policy `routing/served.py` judges, which reads it from here)."""
    rows = (correct >= 0).any(axis=1)
    if not rows.any() or not correct.shape[1]:
        return 0.0
    return float(answered_right(np.asarray(scores, dtype=np.float64)[rows], correct[rows]).mean())


def _hit1(scores: np.ndarray, correct: np.ndarray) -> float:
    """The criterion the weights are chosen by: validation hit@1 among the models with a validation answer, a
    choice of a model without an answer for the query counting as wrong (not `answered_hit`, the figure shown:
    choosing the weights by that picked a 2, w 4 on MMLU-Pro and lost 0.011 on test)."""
    rows = (correct >= 0).any(axis=1)
    if not rows.any():
        return 0.0
    top = np.argmax(scores[rows], axis=0)                   # ties: the lower row, as baselines.topk_models
    return float((correct[rows][top, np.arange(correct.shape[1])] == 1).mean())


def contenders(correct: np.ndarray, train_idx, val_idx, eligible: np.ndarray | None = None) -> np.ndarray:
    """[R] the models that get the terms, ascending: the eligible ones, at most MAX_MODELS of them, those most often
    right on their train and val answers. The fit costs models x reference queries, and in a registry of a thousand
    models the hundredth strongest is not where routing decides; this keeps a refit near a second."""
    ref = np.concatenate([np.asarray(train_idx, dtype=np.int64), np.asarray(val_idx, dtype=np.int64)])
    elig = np.ones(correct.shape[0], dtype=bool) if eligible is None else np.asarray(eligible, dtype=bool)
    rows = np.flatnonzero(elig)
    if len(rows) <= MAX_MODELS:
        return rows
    c = correct[rows][:, ref]
    acc = (c == 1).sum(1) / np.maximum((c >= 0).sum(1), 1)
    return np.sort(rows[np.argsort(-acc, kind="stable")[:MAX_MODELS]])


def smoothed_setting(results: dict, n_val: int) -> tuple[float, int, float]:
    """(a, k, w) from every grid setting's val hit@1 (results: setting -> hit@1): their means weighted by
    exp((hit - best hit) / SE), SE the standard error of a val hit@1 at the best one's (k: the weighted median among
    the settings with w > 0). A setting val cannot tell from the best weighs nearly as much as the best: on
    AlpacaEval's 161 val questions the plain argmax of 105 settings routed test at 0.7081, below a setting drawn at
    random (0.7253, five folds pooled); this at 0.7354. On MMLU-Pro's 1,203 the weights gather near the best."""
    keys = list(results)
    hits = np.array([results[s] for s in keys])
    best = float(hits.max())
    se = max(float(np.sqrt(best * (1 - best) / max(n_val, 1))), 1e-6)
    weight = np.exp((hits - best) / se)
    weight /= weight.sum()
    a_s, k_s, w_s = (np.array([s[i] for s in keys], dtype=np.float64) for i in range(3))
    a, w = float(weight @ a_s), float(weight @ w_s)
    by_k = np.array([weight[(k_s == k) & (w_s > 0)].sum() for k in GRID_K])
    k = GRID_K[0] if by_k.sum() <= 0 else GRID_K[int(np.searchsorted(np.cumsum(by_k) / by_k.sum(), 0.5))]
    return round(a, 4), int(k), round(w, 4)


def fit(logits: np.ndarray, correct: np.ndarray, qvecs: np.ndarray, categories, train_idx, val_idx, *,
        rows: np.ndarray | None = None) -> Interaction:
    """Choose a, k, w on val and fit the terms on train + val, for the models `rows` (`contenders`; None: all).

    logits [R, Nq]: the predictor's logits of those models on the registry's queries (only the train and val columns
    are read), correct [M, Nq] (-1 missing) of every model, qvecs [Nq, Dq], categories [Nq] (str; None = unknown),
    train_idx / val_idx index the queries. Validation judges routing among the `rows`."""
    rows = np.arange(correct.shape[0]) if rows is None else np.asarray(rows, dtype=np.int64)
    correct = np.asarray(correct)[rows]
    tr, va = np.asarray(train_idx, dtype=np.int64), np.asarray(val_idx, dtype=np.int64)
    ref = np.sort(np.concatenate([tr, va]))
    cats = [None if c is None else str(c) for c in categories]
    names = sorted({cats[i] for i in ref.tolist() if cats[i] is not None})
    pos = {c: i for i, c in enumerate(names)}
    cat = np.array([pos.get(c, -1) if c is not None else -1 for c in cats], dtype=np.int64)
    known_cat = cat >= 0
    M = correct.shape[0]
    logits = np.asarray(logits, dtype=np.float64)
    qvecs = np.asarray(qvecs, dtype=np.float32)

    selection: dict[str, object] = {"grid": {"a": list(GRID_A), "k": list(GRID_K), "w": list(GRID_W)}}
    best, val_logits = (0.0, 10, 0.0), None
    cv = correct[:, va]
    obs = cv >= 0
    if len(tr) and len(va) and M and obs.any():
        trc = tr[known_cat[tr]]                   # offsets fit on labelled train queries
        nn_va = _neighbours_cached(qvecs[tr], qvecs[va], max(max(GRID_K), CAT_K))
        # a val query's category counts only if train has answers in it (as a category unseen in training would)
        cat_va = np.where(np.isin(cat[va], np.unique(cat[trc])), cat[va], -1)
        b_tr = category_offsets(logits[:, trc], correct[:, trc], cat[trc], len(names)) if len(names) else \
            np.zeros((M, 0))
        mix_va = category_mix(cat_va, nn_va, cat[tr], len(names)) if len(names) else np.zeros((len(va), 0))
        results = {}
        counts = neighbour_sums((correct[:, tr] >= 0).astype(np.float32), nn_va, GRID_K)
        for a in GRID_A:
            adj_tr = logits[:, tr] + (a * b_tr[:, np.maximum(cat[tr], 0)] * known_cat[tr] if len(names) and a
                                      else 0.0)
            resid, seen = residuals(adj_tr, correct[:, tr])
            base = logits[:, va] + (a * (b_tr @ mix_va.T) if len(names) and a else 0.0)
            sums = neighbour_sums(resid, nn_va, GRID_K) if any(GRID_W) else {}
            for k in GRID_K:
                r = sums[k] / (counts[k] + RESID_PRIOR) if sums else 0.0     # knn_residual, for every k at once
                for w in GRID_W:
                    if w == 0 and k != GRID_K[0]:
                        continue                   # k does not matter without the residual
                    s = base + w * r
                    results[(a, k, w)] = round(_hit1(s, cv), 9)
        best = smoothed_setting(results, len(va))
        ba, bk, bw = best
        adj_tr = logits[:, tr] + (ba * b_tr[:, np.maximum(cat[tr], 0)] * known_cat[tr] if len(names) and ba else 0.0)
        val_logits = logits[:, va] + (ba * (b_tr @ mix_va.T) if len(names) and ba else 0.0)
        if bw:
            val_logits = val_logits + bw * knn_residual(*residuals(adj_tr, correct[:, tr]), nn_va, bk)
        # the figures shown (`answered_hit`, the one rule) and, apart, the criterion's own that chose the weights
        # (unrounded: served.py compares them with the other policies' figures, which are not rounded either)
        selection.update(val_hit={"chosen": answered_hit(val_logits, cv),
                                  "predictor": answered_hit(logits[:, va], cv)},
                         criterion={"chosen": round(_hit1(val_logits, cv), 9),
                                    "best_setting": max(results.values()),
                                    "predictor": results[(0.0, GRID_K[0], 0.0)]},
                         val_queries=int(len(va)))
    a, k, w = best
    selection.update(a=a, k=k, w=w)
    refc = ref[known_cat[ref]]
    b = category_offsets(logits[:, refc], correct[:, refc], cat[refc], len(names)) if len(names) else np.zeros((M, 0))
    adj = logits[:, ref] + (a * b[:, np.maximum(cat[ref], 0)] * known_cat[ref] if len(names) and a else 0.0)
    resid, seen = residuals(adj, correct[:, ref])
    selection.update(models=int(len(rows)))
    return Interaction(a, k, w, names, rows, b, np.ascontiguousarray(qvecs[ref]), cat[ref], resid, seen, selection,
                       val_logits=val_logits)
