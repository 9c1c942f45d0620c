"""Planned probes: which queries to ask a new or partly evaluated model next, so that what the
registry knows of it settles fastest; pure numerics here, the registry side is in answers/probe_plans.py.

The model is known through the predictor: P(correct | z, q). Given the answers so far, its embedding z is read by
likelihood (`read`): the z that maximises the predictor's likelihood of those answers under a Gaussian prior
fitted to the other models' embeddings (Newton steps; the predictor's logit is piecewise linear in z, so the
Gauss-Newton matrix is the exact Hessian of the likelihood term, and its inverse the Laplace posterior covariance).
The next queries are then those whose answers would shrink the posterior variance of the model's logits where
routing decides (`choose`): reference queries are weighted by how close the model's predicted logit comes to the
best other model's there, plus a floor that keeps the rest of the map in view. Picks are greedy in batches (rank-one
updates of the covariance), so that one batch does not ask the same thing twice.

Why a likelihood reading: the set encoder was trained on random subsets and reads a chosen set as if it were
random; asking where the model is uncertain (questions of about its own difficulty) makes it look average, so a
planned set read by the encoder lands further from the model than a random one of the same size. The likelihood
does not care how the questions were chosen (the design enters only through which answers are observed).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SEED_SIZE = 32        # random probes first: the reading's linearisation needs some answers to stand on
BATCH = 16            # planned picks between two readings
RIDGE = 0.01          # prior covariance + RIDGE x its mean variance (fewer models than dimensions)
PRIOR_SCALE = 3.0     # the prior covariance x this: a weaker prior than the models' spread (chosen on val)
FLOOR = 1.0           # reference weight every query keeps, besides its routing relevance (chosen on val)
REFERENCES = 1000     # reference queries the logits' variance is measured on
CANDIDATES = 3000     # candidate queries scored per batch (a seeded random subset of the pool beyond that)


class Predictor:
    """The predictor's pieces in float64, for logits and their gradients in z. u: query projections [n,D]."""

    def __init__(self, model):
        w = {k: v.detach().cpu().double().numpy() for k, v in model.named_parameters()}
        self.Wz, self.bz = w["w_z.weight"], w["w_z.bias"]                 # [H,D], [H]
        self.Wu, self.Wzu = w["w_u.weight"], w["w_zu.weight"]             # [H,D], [H,D]
        self.head, self.hb = w["head.weight"][0], float(w["head.bias"][0])
        self.qb = (w["q_bias.weight"][0], float(w["q_bias.bias"][0])) if model.cfg.query_bias else None
        self.Wq, self.bq = w["q_proj.weight"], w["q_proj.bias"]
        self.E, self.category_ids = w.get("q_cat.weight"), model.category_ids   # category rows (None: text only)

    def project(self, qvecs: np.ndarray, categories=None) -> Queries:
        """Query vectors [n,Dq] (and their categories [n], for a predictor that reads them) -> Queries."""
        u = np.asarray(qvecs, dtype=np.float64) @ self.Wq.T + self.bq
        bias = None if self.qb is None else u @ self.qb[0] + self.qb[1]
        ids = self.category_ids(categories) if self.E is not None else None
        rows = None
        if ids is not None:
            rows = self.E[ids]                                               # [n,D+1]: logit += [z, 1] . row
            if ids.ndim == 2:                                                # several columns: their rows add up
                rows = rows.sum(1)
        return Queries(u, u @ self.Wu.T, bias, rows)

    def logits(self, z: np.ndarray, q: Queries) -> np.ndarray:
        """z [D] -> logits [n]."""
        pre = q.u @ (self.Wzu * z[None]).T + q.uwu + (self.Wz @ z + self.bz)[None]
        out = np.maximum(pre, 0.0) @ self.head + self.hb
        if q.cat is not None:
            out = out + q.cat[:, :-1] @ z + q.cat[:, -1]
        return out if q.bias is None else out + q.bias

    def logits_grad(self, z: np.ndarray, q: Queries) -> tuple[np.ndarray, np.ndarray]:
        """z [D] -> (logits [n], d logit / dz [n,D])."""
        pre = q.u @ (self.Wzu * z[None]).T + q.uwu + (self.Wz @ z + self.bz)[None]     # [n,H]
        c = (pre > 0) * self.head[None]                                                # [n,H]
        out = np.maximum(pre, 0.0) @ self.head + self.hb
        if q.bias is not None:
            out = out + q.bias
        grad = c @ self.Wz + (c @ self.Wzu) * q.u
        if q.cat is not None:                                                          # linear in z
            out, grad = out + q.cat[:, :-1] @ z + q.cat[:, -1], grad + q.cat[:, :-1]
        return out, grad


@dataclass
class Queries:
    u: np.ndarray               # [n,D] query projections
    uwu: np.ndarray             # [n,H] their hidden-layer term
    bias: np.ndarray | None     # [n] per-query logit bias (encoders with query_bias)
    cat: np.ndarray | None = None   # [n,D+1] each query's category row (encoders with category features)

    def take(self, rows) -> Queries:
        return Queries(self.u[rows], self.uwu[rows], None if self.bias is None else self.bias[rows],
                       None if self.cat is None else self.cat[rows])


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


@dataclass
class Prior:
    mean: np.ndarray            # [D]
    precision: np.ndarray       # [D,D]


def gaussian_prior(Z: np.ndarray, ridge: float = RIDGE) -> Prior:
    """The other models' embeddings Z [K,D] as a Gaussian: their mean and covariance, plus ridge x the mean variance
    on the diagonal (K is smaller than D)."""
    Z = np.asarray(Z, dtype=np.float64)
    C = np.cov(Z.T) if len(Z) > 1 else np.zeros((Z.shape[1], Z.shape[1]))
    scale = np.trace(C) / len(C) if np.trace(C) > 0 else 1.0
    return Prior(Z.mean(0), np.linalg.inv(PRIOR_SCALE * (C + ridge * scale * np.eye(len(C)))))


def read(pred: Predictor, q: Queries, y: np.ndarray, prior: Prior, iters: int = 30,
         tol: float = 1e-7) -> tuple[np.ndarray, np.ndarray]:
    """The likelihood reading of answers y [n] (0/1) on queries q: (z [D], posterior precision [D,D]). Newton steps
    from the prior mean, halved until the objective falls; deterministic for the same inputs."""
    y = np.asarray(y, dtype=np.float64)
    mu, lam = prior.mean, prior.precision

    def objective(z):
        lg = pred.logits(z, q)
        d = z - mu
        return float(np.sum(np.logaddexp(0.0, lg) - y * lg) + 0.5 * d @ lam @ d)

    z, cur = mu.copy(), objective(mu)
    for _ in range(iters):
        lg, g = pred.logits_grad(z, q)
        p = _sigmoid(lg)
        H = (g * (p * (1 - p))[:, None]).T @ g + lam
        step = np.linalg.solve(H, g.T @ (p - y) + lam @ (z - mu))
        t = 1.0
        while t >= 1e-4:
            new = objective(z - t * step)
            if new <= cur:
                break
            t *= 0.5
        else:
            break
        z, gain, cur = z - t * step, cur - new, new
        if gain <= tol * max(1.0, abs(cur)):
            break
    lg, g = pred.logits_grad(z, q)
    p = _sigmoid(lg)
    return z, (g * (p * (1 - p))[:, None]).T @ g + lam


def expect_answers(pred: Predictor, z: np.ndarray, precision: np.ndarray, q: Queries) -> np.ndarray:
    """The posterior precision once queries q are answered too (their answers not known yet: the information they
    carry at z does not depend on them)."""
    if len(q.u) == 0:
        return precision
    lg, g = pred.logits_grad(z, q)
    p = _sigmoid(lg)
    return precision + (g * (p * (1 - p))[:, None]).T @ g


def _greedy(G: np.ndarray, w: np.ndarray, cov: np.ndarray, B: np.ndarray, k: int) -> list[int]:
    """k rows of G [n,D] (logit gradients of candidate queries; w [n] their Bernoulli variances) chosen one at a
    time, each the largest reduction of tr(B cov) (B = weighted reference gradients' scatter), cov updated after
    each pick (rank one), so a batch does not ask the same thing twice. With K = cov after the picks so far,
    s = g'Kg and t = g'KBKg per candidate are updated in O(n D) per pick (no [n,D] rewrite)."""
    GS0 = G @ cov                                       # [n,D]: rows g'cov (before any pick)
    s = np.einsum("nd,nd->n", GS0, G)
    t = np.einsum("nd,nd->n", GS0 @ B, GS0)
    A: list[np.ndarray] = []                            # per pick: a = G kv [n], kv [D], c
    KV: list[np.ndarray] = []
    C: list[float] = []
    out: list[int] = []
    for _ in range(min(k, len(G))):
        gain = w * t / (1.0 + w * s)
        gain[out] = -np.inf
        j = int(np.argmax(gain))
        out.append(j)
        kv = GS0[j] - sum(a[j] * v / c for a, v, c in zip(A, KV, C)) if A else GS0[j].copy()   # row j of G K
        c = 1.0 / max(w[j], 1e-12) + s[j]
        a = G @ kv
        b = B @ kv
        gsb = GS0 @ b - sum(ai * (vi @ b) / ci for ai, vi, ci in zip(A, KV, C)) if A else GS0 @ b   # G K B kv
        t = t - 2.0 * a * gsb / c + a * a * (kv @ b) / (c * c)
        s = s - a * a / c
        A.append(a)
        KV.append(kv)
        C.append(c)
    return out


def choose(pred: Predictor, z: np.ndarray, precision: np.ndarray, cand: Queries, ref: Queries, *,
           best_other: np.ndarray | None, k: int, floor: float | None = None) -> list[int]:
    """Indices of k candidate queries to ask next. ref: reference queries, best_other [len(ref)]: the best other
    model's logit on each (None: no other model, every reference weighs the same); floor: FLOOR unless given."""
    floor = FLOOR if floor is None else floor
    cov = np.linalg.inv(precision)
    lg, G = pred.logits_grad(z, cand)
    p = _sigmoid(lg)
    lr, GR = pred.logits_grad(z, ref)
    if best_other is None:
        rho = np.ones(len(lr))
    else:
        sd = np.sqrt(np.maximum(np.einsum("nd,nd->n", GR @ cov, GR), 1e-12))
        rho = np.exp(-0.5 * ((lr - best_other) / sd) ** 2) + floor      # routing relevance + floor
    B = (GR * rho[:, None]).T @ GR
    return _greedy(G, p * (1 - p), cov, B, k)


def plan_rows(pred: Predictor, q: Queries, answers: np.ndarray, *, pool: list[np.ndarray],
              seed_rows: list[np.ndarray], sizes, priors: list[Prior], others: Sequence[np.ndarray | None],
              ref: np.ndarray, seed: int = 0, batch: int | None = None, candidates: int | None = None,
              truth: np.ndarray | None = None) -> dict[int, list[np.ndarray]]:
    """The simulated protocol for benches and `evaluate --planned`: every model m starts from seed_rows[m] and is
    asked batch after batch, each batch chosen from its pool[m] (rows of q it has an answer for) on what the answers
    so far say, its answer revealed from answers [M, rows] (1/0). -> {n: [rows asked of each model, in order]}.
    others[m]: the best other model's logit on each reference row (ref: rows of q; None: no other model). truth
    [M,D] (benches only): plan as if each model's embedding were known to be truth[m] (the posterior linearised
    there): what planning could do if its reading of the answers so far were exact."""
    batch, candidates = batch or BATCH, CANDIDATES if candidates is None else candidates
    rng = np.random.default_rng([seed, 1])
    R = q.take(ref)
    sets = [list(map(int, s)) for s in seed_rows]
    out = {}
    for n in sorted(sizes):
        for m in range(len(sets)):
            while len(sets[m]) < n:
                asked = np.asarray(sets[m])
                if truth is None:
                    z, prec = read(pred, q.take(asked), answers[m, asked], priors[m])
                else:
                    z = truth[m]
                    prec = expect_answers(pred, z, priors[m].precision, q.take(asked))
                left = np.setdiff1d(pool[m], asked)
                if not len(left):
                    break
                if candidates and len(left) > candidates:
                    left = np.sort(rng.choice(left, candidates, replace=False))
                pick = choose(pred, z, prec, q.take(left), R, best_other=others[m], k=min(batch, n - len(sets[m])))
                sets[m] += left[pick].tolist()
        out[n] = [np.asarray(s[:n]) for s in sets]
    return out


def compare(pred: Predictor, q: Queries, correct: np.ndarray, *, pool_rows: np.ndarray, z_all: np.ndarray,
            eval_rows: np.ndarray, sizes, seeds: int, encode, draw, plans: dict | None = None,
            oracle: bool = False) -> dict:
    """Planned against random at each n, every model known from n evaluations of pool_rows (`evaluate
    --sample-efficiency --planned` and bench/planned_probes.py). correct [M, rows of q] (1/0/-1); z_all [M,D]: each
    model's embedding from all its evaluations, which gives the *other* models' prior and routing relevance when a
    model is planned (every model in turn is the new one); encode(rows per model) -> z [M,D]: the set encoder.
    draw(n, seed) -> n random rows per model (evaluation.subset_rows: the sample-efficiency curve's draws); a planned
    draw starts from draw(SEED_SIZE, seed). Each set is read by the encoder and by likelihood; scored by hit@1 and
    AUC on eval_rows. plans: {seed: planned rows}, reused when given, filled in otherwise; oracle: plan with each
    model's embedding taken as z_all (plan_rows' truth), an upper reference for the planner, not a design.
    -> {str(n): {design: {reading: {"hit@1", "hit@1_std", "auc", "auc_std"}}}, "draws"}"""
    from registry.locus import baselines as B

    M = len(correct)
    answers = (correct == 1).astype(np.float64)
    priors = [gaussian_prior(np.delete(z_all, m, 0)) for m in range(M)]
    ref = np.sort(np.random.default_rng(0).choice(pool_rows, min(REFERENCES, len(pool_rows)), replace=False))
    L_ref = np.stack([pred.logits(z, q.take(ref)) for z in z_all])
    others = [np.delete(L_ref, m, 0).max(0) if M > 1 else None for m in range(M)]
    pool = [pool_rows[correct[m, pool_rows] >= 0] for m in range(M)]
    truth, qe = correct[:, eval_rows], q.take(eval_rows)
    plans = {} if plans is None else plans

    def score(Z):
        p = np.stack([_sigmoid(pred.logits(z, qe)) for z in Z])
        return B.hit_at_k(B.among_answered(p, truth), truth, 1), B.predictor_metrics(p, truth)["auc"]

    def by_likelihood(rows):
        return np.stack([read(pred, q.take(r), answers[m, r], priors[m])[0] for m, r in enumerate(rows)])

    got: dict = {}
    for s in range(seeds):
        if s not in plans:
            plans[s] = plan_rows(pred, q, answers, pool=pool, seed_rows=draw(SEED_SIZE, s), sizes=sizes,
                                 priors=priors, others=others, ref=ref, seed=s, truth=z_all if oracle else None)
        for n in sizes:
            for design, rows in (("random", draw(n, s)), ("planned", plans[s][n])):
                got.setdefault((n, design, "encoder"), []).append(score(np.asarray(encode(rows), np.float64)))
                got.setdefault((n, design, "likelihood"), []).append(score(by_likelihood(rows)))
    out: dict[str, dict[str, Any]] = {}                 # {"draws": seeds, design: {reading: figures}} per n
    for (n, design, reading), v in got.items():
        a = np.array(v)
        out.setdefault(str(n), {"draws": seeds}).setdefault(design, {})[reading] = {
            "hit@1": round(float(a[:, 0].mean()), 4), "hit@1_std": round(float(a[:, 0].std()), 4),
            "auc": round(float(a[:, 1].mean()), 4), "auc_std": round(float(a[:, 1].std()), 4)}
    return out
