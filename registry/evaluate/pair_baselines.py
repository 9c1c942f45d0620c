"""The pair-model baselines `registry evaluate` reports beside LOCUS, trained with torch: MF (EmbedLLM-style matrix
factorisation) and a multidimensional IRT read from the query text, each fitted on the train pairs with its
dimension chosen on val (locus/baselines.py holds the metrics and the numpy baselines; routing serves its own numpy
pair models, routing/pairs.py, without torch).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

from registry.locus.baselines import val_hit

PairModel = TypeVar("PairModel", bound=torch.nn.Module)     # MF or IRT: what train_pairs' `make` builds


class MF(torch.nn.Module):
    """EmbedLLM-style matrix factorisation: logit = <e_m, W q> + b_m. One vector per known model."""

    def __init__(self, n_models: int, d_query: int, dim: int):
        super().__init__()
        self.e = torch.nn.Embedding(n_models, dim)
        self.w = torch.nn.Linear(d_query, dim)
        self.b = torch.nn.Parameter(torch.zeros(n_models))
        torch.nn.init.normal_(self.e.weight, std=dim ** -0.5)

    def logits(self, q):                                           # q [N,Dq] -> [M,N]
        return self.e.weight @ self.w(q).T + self.b[:, None]

    def pair_logits(self, m, q):                                   # m [P] model indices, q [P,Dq] -> [P]
        return (self.e(m) * self.w(q)).sum(-1) + self.b[m]


class IRT(torch.nn.Module):
    """Multidimensional IRT with the item side read from the query text (IRT-Router; the LOCUS paper's IRT-Net):
    logit = a(q) . theta_m - b(q), a(q) = A q + a0 (discrimination), b(q) = w . q + b0 (difficulty), theta_m one
    ability vector per model. Unlike MF, the per-query difficulty is explicit and the model side is only theta, so
    a new model is placed by fitting theta alone against the frozen query side (`fit_theta`)."""

    def __init__(self, n_models: int, d_query: int, dim: int):
        super().__init__()
        self.theta = torch.nn.Embedding(n_models, dim)
        self.a = torch.nn.Linear(d_query, dim)
        self.b = torch.nn.Linear(d_query, 1)
        torch.nn.init.normal_(self.theta.weight, std=dim ** -0.5)

    def logits(self, q, theta=None):                               # q [N,Dq] -> [M,N] (theta [M,dim]: other models)
        theta = self.theta.weight if theta is None else theta
        return theta @ self.a(q).T - self.b(q)[:, 0][None]

    def pair_logits(self, m, q):
        return (self.theta(m) * self.a(q)).sum(-1) - self.b(q)[:, 0]


@contextlib.contextmanager
def one_thread():
    """torch on one thread for the pair models' small steps: on 2 cores a second thread gains at most 1.6x, and
    where another process holds a core its spinning costs 5-20x (MF at 64 dimensions: 5.2 s on 2 threads when
    quiet, 103 s beside two other jobs; 8.4 s and 9.6 s on one)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_pairs(make: Callable[[int, int, int], PairModel], qvecs, correct, train_idx, val_idx, dim: int, *,
                seed: int = 0, epochs: int = 12, lr: float = 1e-3, weight_decay: float = 1e-4,
                batch: int = 4096) -> tuple[PairModel, dict]:
    """A pair model (MF or IRT: `make(n_models, d_query, dim)`) fitted by BCE on the observed train pairs with
    AdamW; the epoch with the best validation hit@1 (`val_hit`; ties: lower BCE) is kept."""
    with one_thread():
        return _train_pairs(make, qvecs, correct, train_idx, val_idx, dim, seed=seed, epochs=epochs, lr=lr,
                            weight_decay=weight_decay, batch=batch)


def _train_pairs(make, qvecs, correct, train_idx, val_idx, dim: int, *, seed, epochs, lr, weight_decay, batch):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    tr = np.asarray(train_idx)
    m_idx, n_idx = np.nonzero(correct[:, tr] >= 0)
    pm, pn = torch.from_numpy(m_idx), torch.from_numpy(tr[n_idx])
    py = torch.from_numpy((correct[m_idx, tr[n_idx]] == 1).astype(np.float32))
    q = torch.from_numpy(qvecs)
    qv, cv = q[np.asarray(val_idx)], correct[:, val_idx]
    model = make(correct.shape[0], qvecs.shape[1], dim)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    best: tuple[tuple[float, float], int] | None = None          # ((val hit@1, -val BCE), epoch)
    best_state: dict[str, torch.Tensor] | None = None
    for ep in range(epochs):
        model.train()
        perm = torch.randperm(len(py), generator=g)
        for s in range(0, len(perm), batch):
            b = perm[s:s + batch]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model.pair_logits(pm[b], q[pn[b]]), py[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            lv = model.logits(qv).numpy()
        obs = cv >= 0
        bce = float(torch.nn.functional.binary_cross_entropy_with_logits(
            torch.from_numpy(lv[obs]), torch.from_numpy((cv[obs] == 1).astype(np.float32))))
        key = (val_hit(lv, cv), -bce)
        if best is None or key > best[0]:
            best, best_state = (key, ep), {k: v.clone() for k, v in model.state_dict().items()}
    assert best is not None and best_state is not None, "train_pairs needs epochs >= 1"   # the first epoch sets it
    model.load_state_dict(best_state)
    model.eval()
    return model, {"dim": dim, "epoch": best[1], "val_hit@1": best[0][0], "val_bce": -best[0][1]}


def train_mf(qvecs, correct, train_idx, val_idx, dim: int, seed: int = 0, **kw) -> tuple[MF, dict]:
    return train_pairs(MF, qvecs, correct, train_idx, val_idx, dim, seed=seed, **kw)


def _choose_dim(make, qvecs, correct, train_idx, val_idx, *, dims, seed, progress=None, **kw):
    """Dimension chosen by validation hit@1 (ties: lower validation BCE); `progress(dim, i, n)` told as each
    dimension's fit starts."""
    runs = []
    for i, d in enumerate(dims):
        if progress is not None:
            progress(d, i + 1, len(dims))
        runs.append(train_pairs(make, qvecs, correct, train_idx, val_idx, d, seed=seed, **kw))
    model, info = max(runs, key=lambda r: (r[1]["val_hit@1"], -r[1]["val_bce"]))
    info = dict(info, val_by_dim={r[1]["dim"]: r[1]["val_hit@1"] for r in runs})
    return model, info


def mf_router(qvecs, correct, train_idx, val_idx, dims=(16, 32, 64, 128), seed: int = 0, **kw) -> tuple[MF, dict]:
    return _choose_dim(MF, qvecs, correct, train_idx, val_idx, dims=dims, seed=seed, **kw)


def irt_router(qvecs, correct, train_idx, val_idx, dims=(1, 4, 16, 64), seed: int = 0, **kw) -> tuple[IRT, dict]:
    """IRT's dimension chosen on val as MF's is; 1 is the classic two-parameter logistic model."""
    return _choose_dim(IRT, qvecs, correct, train_idx, val_idx, dims=dims, seed=seed, **kw)


def mf_probs(model: MF, qvecs, eval_idx) -> np.ndarray:
    with torch.no_grad():
        return torch.sigmoid(model.logits(torch.from_numpy(qvecs[np.asarray(eval_idx)]))).numpy()


irt_probs = mf_probs     # either pair model: sigmoid(logits) over its fitted models


def irt_theta_probs(model: IRT, theta: np.ndarray, qvecs, eval_idx) -> np.ndarray:
    """P(correct) [K,N] of abilities theta [K,dim] (say, new models' from `fit_theta`) under a fitted query side."""
    with torch.no_grad():
        return torch.sigmoid(model.logits(torch.from_numpy(qvecs[np.asarray(eval_idx)]),
                                          torch.as_tensor(theta, dtype=torch.float32))).numpy()


def fit_theta(model: IRT, qvecs: np.ndarray, sets: list[tuple[np.ndarray, np.ndarray]], iters: int = 50,
              tol: float = 1e-10) -> np.ndarray:
    """A new model's ability from its evaluations with the query side (a, b) frozen: sets = [(query indices, 0/1
    answers)] per new model -> theta [K,dim] float32. MAP under a Gaussian prior with the fitted models' mean and
    per-dimension variance (so 128 answers place theta among the known abilities instead of at the extremes), solved
    by Newton's method with step halving: the log-posterior is strictly concave, so the result is the unique
    maximum, and deterministic. Nothing in `model` changes."""
    with torch.no_grad():
        known = model.theta.weight.detach().double().numpy()
        A_all = model.a.weight.detach().double().numpy()                   # [dim,Dq]
        a0, w, b0 = (t.detach().double().numpy() for t in (model.a.bias, model.b.weight[0], model.b.bias))
    mu, var = known.mean(0), known.var(0) + 1e-6
    out = np.empty((len(sets), known.shape[1]), dtype=np.float32)

    def objective(th, A, off, y):                                          # log-posterior (up to a constant)
        z = A @ th + off
        return float((y * z - np.logaddexp(0.0, z)).sum() - 0.5 * (((th - mu) ** 2) / var).sum())

    for i, (rows, y) in enumerate(sets):
        q = np.asarray(qvecs, dtype=np.float64)[np.asarray(rows)]
        A, off, y = q @ A_all.T + a0, -(q @ w + b0), np.asarray(y, dtype=np.float64)
        th, f = mu.copy(), objective(mu, A, off, y)
        for _ in range(iters):
            p = 1.0 / (1.0 + np.exp(-(A @ th + off)))
            grad = A.T @ (y - p) - (th - mu) / var
            hess = (A * (p * (1 - p))[:, None]).T @ A + np.diag(1.0 / var)
            step, t = np.linalg.solve(hess, grad), 1.0
            while t > 1e-6 and objective(th + t * step, A, off, y) < f:
                t /= 2
            th_new = th + t * step
            f_new = objective(th_new, A, off, y)
            done = f_new - f < tol
            th, f = (th_new, f_new) if f_new >= f else (th, f)
            if done:
                break
        out[i] = th
    return out
