"""Pair models for the served policy (routing/served.py), in numpy: routing fits them beside the interaction terms and
must not import torch (locus/baselines.py holds the torch versions that `registry evaluate` reports as baselines).

    MF:  logit(m, q) = u_m . (P q' + p0) + b_m                 (EmbedLLM-style matrix factorisation)
    IRT: logit(m, q) = u_m . (P q' + p0) - (w . q' + c)        (abilities against a text-read difficulty)

q' is the query's text vector projected on the reference queries' first COMPONENTS principal directions: the fit
is full-batch Adam over every observed (model, query) answer, and the projection makes each step cheap enough
(a few ms for 64 models x 10,000 queries) to run inside a routing refit. Binary cross-entropy with a small L2
penalty; the number of steps is chosen on val (checked every CHECK steps), then kept for the refit on train + val.
Deterministic, and blind to the order of the models (routing holds them in id order, `evaluate` in name order):
the per-model vectors start at zero, the shared projection from a fixed seed.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from registry.routing.served_scores import PairModel

COMPONENTS = 96
MAX_STEPS = 300
PATIENCE = 5
CHECK = 20
LR = 0.03
L2 = 1e-4


def one_thread():
    """BLAS limited to one thread while fitting: these products are small, and on a busy machine a second thread
    waiting for a core made each step four times slower (measured on 2 cores beside a training run)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:                       # without it: the BLAS as configured
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(1)


def components(ref_vecs: np.ndarray, n: int = COMPONENTS) -> tuple[np.ndarray, np.ndarray]:
    """(mean [D], basis [D, C]) of the reference vectors: their first principal directions (signs fixed), from the
    eigenvectors of the [D, D] scatter (a tenth of an SVD's time)."""
    x = np.asarray(ref_vecs, dtype=np.float64)
    mean = x.mean(0)
    xc = x - mean
    vals, vecs = np.linalg.eigh(xc.T @ xc)
    basis = vecs[:, np.argsort(-vals, kind="stable")[:min(n, x.shape[1], max(len(x) - 1, 1))]]
    sign = np.where(basis[np.abs(basis).argmax(0), np.arange(basis.shape[1])] < 0, -1.0, 1.0)
    return mean, basis * sign


def _init(kind: str, mean, basis, n_rows: int, dim: int, seed: int) -> PairModel:
    # u at zero: its first gradient g @ h already differs per model, and no row's start depends on its position
    rng = np.random.default_rng(seed)
    c = basis.shape[1]
    return PairModel(kind, mean, basis, np.zeros((n_rows, dim)), np.zeros(n_rows),
                     rng.uniform(-c ** -0.5, c ** -0.5, (c, dim)), np.zeros(dim), np.zeros(c), 0.0)


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def fit(kind: str, q: np.ndarray, correct: np.ndarray, *, mean, basis, dim: int, steps: int = MAX_STEPS,
        judge=None, seed: int = 0) -> PairModel:
    """The pair model fitted on correct [R, N] (1/0, -1 missing) of the queries q [N, C] (reduced). `judge(model)`
    -> a score (higher better), asked every CHECK steps: the best-judged state is returned, with its step count
    (the fit stops after PATIENCE checks without a better one); without a judge, `steps` steps are taken."""
    with one_thread():
        return _fit(kind, np.asarray(q, dtype=np.float32), correct, _init(kind, mean, basis, correct.shape[0], dim,
                                                                          seed), steps, judge)


def _fit(kind, q, correct, m, steps, judge):
    obs = (correct >= 0).astype(np.float32)
    y = (correct == 1).astype(np.float32)
    scale = np.float32(1.0 / max(obs.sum(), 1.0))
    names = ["u", "proj", "proj0"] + (["bias"] if kind == "mf" else ["diff", "diff0"])
    for k in names:
        setattr(m, k, np.asarray(getattr(m, k), dtype=np.float32))
    mom = {k: np.zeros_like(getattr(m, k)) for k in names}
    vel = {k: np.zeros_like(getattr(m, k)) for k in names}
    best = (judge(m), 0, replace(m)) if judge is not None else None     # (steps assign new arrays)
    for t in range(1, steps + 1):
        h = q @ m.proj + m.proj0                                  # [N, d]
        z = m.u @ h.T + m.bias[:, None] - (q @ m.diff + m.diff0)[None]
        g = (_sigmoid(z) - y) * obs * scale                       # d loss / d logit
        gh = g.T @ m.u                                            # [N, d]
        grads = {"u": g @ h + L2 * m.u, "proj": q.T @ gh + L2 * m.proj, "proj0": gh.sum(0)}
        if kind == "mf":
            grads["bias"] = g.sum(1)
        else:
            gq = g.sum(0)
            grads["diff"], grads["diff0"] = -(q.T @ gq) + L2 * m.diff, -gq.sum()
        for k in names:
            mom[k] = 0.9 * mom[k] + 0.1 * grads[k]
            vel[k] = 0.999 * vel[k] + 0.001 * np.square(grads[k])
            step = LR * (mom[k] / (1 - 0.9 ** t)) / (np.sqrt(vel[k] / (1 - 0.999 ** t)) + 1e-8)
            setattr(m, k, (getattr(m, k) - step).astype(np.float32))
        if judge is not None and t % CHECK == 0:
            score = judge(m)
            if score > best[0]:
                best = (score, t, replace(m))
            elif t - best[1] >= PATIENCE * CHECK:
                break
    if judge is None:
        m.steps = steps
        return m
    out = best[2]
    out.steps = best[1]
    return out
