"""How a registered model's answers explain an endpoint's, allowing for another configuration (pure numpy/scipy).

The null `verify` judges against is "the claimed model under another prompt, temperature or precision": the endpoint
answers question i right with probability

    P(e_i = 1) = sigmoid(a + b * (2 y_i - 1) + c * logit(pi_i))

where y_i is the model's registered outcome, pi_i its chance on that question from a Rasch fit of every registered
model's results (pi = sigmoid(ability - difficulty)), `a` the endpoint's ability shift, `b` how closely it repeats the
model's own answers, `c` how much the question's difficulty for that model still counts. A rerun keeps `b` high and
flips where pi is near one half; a prompt shift moves `a`; both stay this model. Each registered model M gets the same
three-parameter fit to its own y and pi, so the fits are compared on equal terms: another model explains the answers
better when its log-likelihood beats the claimed model's by more than chance allows were the answers the claimed
model's (Cox's test of non-nested models, one-sided). A share of answers from M is a mixture of the two fits (its
weight by maximum likelihood; the likelihood-ratio statistic against weight 0 is half chi-square(0), half
chi-square(1))."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

EPS = 1e-6


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -30, 30)))


def difficulty(results: np.ndarray) -> np.ndarray:
    """Each question's Rasch difficulty from a models x questions matrix of 1/0 (-1: none): the logit of how often
    the models miss it, smoothed by one right and one wrong answer (a question every model gets right stays finite)."""
    seen = results >= 0
    right = ((results == 1) & seen).sum(axis=0)
    asked = seen.sum(axis=0)
    share = (right + 1.0) / (asked + 2.0)
    return -np.log(share / (1 - share))


def chances(y: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A model's chance on each question, sigmoid(ability - difficulty), its ability the one whose chances add up
    to its right answers (a few Newton steps); y: 1/0 (-1: none)."""
    seen = y >= 0
    k = float((y[seen] == 1).sum())
    n = int(seen.sum())
    if n == 0:
        return np.full(len(b), 0.5)
    target = min(max(k, 0.5), n - 0.5)
    theta = 0.0
    for _ in range(30):
        p = sigmoid(theta - b[seen])
        step = (target - p.sum()) / max(float((p * (1 - p)).sum()), 1e-9)
        theta += step
        if abs(step) < 1e-8:
            break
    return sigmoid(theta - b)


@dataclass
class Fit:
    params: np.ndarray          # (a, b, c)
    loglik: np.ndarray          # each question's log-likelihood of the endpoint's answer
    p: np.ndarray               # each question's P(right) under the fit

    @property
    def total(self) -> float:
        return float(self.loglik.sum())


def design(y: np.ndarray, pi: np.ndarray) -> np.ndarray:
    """[1, 2y - 1, logit(pi)]: the fit's inputs, one row a question (a question the model was not asked: y = 0.5
    in effect, its own answer unknown)."""
    sign = np.where(y < 0, 0.0, 2.0 * (y == 1) - 1.0)
    lp = np.log(np.clip(pi, EPS, 1 - EPS) / np.clip(1 - pi, EPS, 1))
    return np.column_stack([np.ones(len(y)), sign, lp])


def fit(e: np.ndarray, y: np.ndarray, pi: np.ndarray, ridge: float = 0.05) -> Fit:
    """The three-parameter logistic fit of the endpoint's answers e (1/0) to a model's (y, pi), by Newton's method
    with a small ridge (a perfect separation stays finite)."""
    x = design(y, pi)
    e = e.astype(float)
    w = np.zeros(3)
    for _ in range(50):
        p = sigmoid(x @ w)
        grad = x.T @ (e - p) - ridge * w
        hess = (x * (p * (1 - p))[:, None]).T @ x + ridge * np.eye(3)
        step = np.linalg.solve(hess, grad)
        w += step
        if np.abs(step).max() < 1e-7:
            break
    p = np.clip(sigmoid(x @ w), EPS, 1 - EPS)
    return Fit(w, e * np.log(p) + (1 - e) * np.log(1 - p), p)


def cox(null: Fit, other: Fit, e: np.ndarray) -> tuple[float, float]:
    """(z, one-sided p) of Cox's test of the null fit against another, non-nested one: the log-likelihood ratio of
    the other over the null, against its mean and variance were the answers drawn from the null fit (each answer a
    Bernoulli of the null's chance; Cox 1961). Vuong's test of the two, tried first, named 65 of 98 similar pairs
    where this names all 98 (bench/verify_nulls.py): the null here is the model under test."""
    from scipy.stats import norm

    p0, p1 = null.p, other.p
    up, down = np.log(p1 / p0), np.log((1 - p1) / (1 - p0))
    d = float(np.where(e.astype(bool), up, down).sum())
    mean = float((p0 * up + (1 - p0) * down).sum())
    var = float((p0 * (1 - p0) * (up - down) ** 2).sum())
    if var < 1e-12:
        return 0.0, 1.0
    z = (d - mean) / math.sqrt(var)
    return z, float(norm.sf(z))


def mixture(e: np.ndarray, mine: Fit, other: Fit) -> tuple[float, float]:
    """(weight, p): the share of answers best explained as the other model's, and the p-value of the likelihood
    ratio against none (half chi-square(0), half chi-square(1)). The log-likelihood is concave in the weight: no
    share at all where its slope at 0 is not positive, else Newton's steps inside [0, 1]."""
    from scipy.stats import chi2

    e = e.astype(float)
    la = e * mine.p + (1 - e) * (1 - mine.p)        # each answer's likelihood under each fit
    lb = e * other.p + (1 - e) * (1 - other.p)
    g = (lb - la) / la
    if g.sum() <= 0:
        return 0.0, 1.0
    w = 0.5
    for _ in range(50):
        t = (lb - la) / ((1 - w) * la + w * lb)
        step = t.sum() / max(float((t * t).sum()), 1e-12)
        new = min(1.0, max(0.0, w + step))
        if abs(new - w) < 1e-9:
            break
        w = new
    stat = 2.0 * float(np.log(((1 - w) * la + w * lb) / la).sum())
    return w, (0.5 * float(chi2.sf(stat, 1)) if stat > 0 else 1.0)


def attachment(f: Fit, e: np.ndarray, y: np.ndarray, pi: np.ndarray) -> tuple[float, float]:
    """(b, one-sided p) that the endpoint repeats the model's own answers beyond what their difficulty says (b > 0),
    from the fit's Wald statistic."""
    from scipy.stats import norm

    x = design(y, pi)
    p = f.p
    cov = np.linalg.pinv((x * (p * (1 - p))[:, None]).T @ x)
    se = math.sqrt(max(float(cov[1, 1]), 1e-12))
    return float(f.params[1]), float(norm.sf(f.params[1] / se))
