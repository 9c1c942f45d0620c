"""How sure the registry is about each model, the rule and its maths in one place: routing, `evaluate`, `models` and
`show` all ask here (embedding/evidence.py reads the minimum the registry's own data sets).

A model's embedding is an estimate from its evaluations, and its noise shrinks as they grow (about 1/n in squared
distance). Two rules follow:

- Probation. A model embedded from fewer than the probation minimum of evaluations is listed as "probation" and is
  never chosen by routing unless the caller asks for it: from 128 random evaluations the encoder cannot even rank
  the 31 MMLU-Pro models (BENCHMARKS.md), so one model registered from 100 rows must not take over the traffic. The
  minimum is `REGISTRY_PROBATION_MIN` or the CLI's `--probation-min` when set, else it follows the registry's own
  data (`from_counts`): the smaller of 500 and half of what its best-known models were embedded from, so a team
  with a 300-question benchmark routes without flags while a model far below its peers is still held back.
- Shrinkage. Every model's P(correct) is pulled toward what the established models predict for the query on average,
  by an empirical-Bayes weight w = tau^2 / (tau^2 + u^2): tau^2 is the spread of the established embeddings around
  their mean, u^2 the variance of this model's embedding, read from its stability estimate (the distance between
  the embeddings of two random halves of its evaluations: each half has twice the full set's variance, so u^2 =
  stability^2 / 4). Where no stability is known yet, u^2 comes from the number of evaluations, scaled by the
  registry's own models (u^2 = c / n, c the median of stability^2 * n / 4). A model known from 10,000 evaluations
  keeps w > 0.99; one known from 100 moves far toward the population.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from registry.core import settings
from registry.core.lazy import LazyModule

if TYPE_CHECKING:
    import numpy as np
else:
    np = LazyModule("numpy")   # (the facade reads the configured minimum at every start)

PROBATION_MIN = 500      # the most the minimum asks for, and the minimum where the registry's data says nothing


def configured_min(value: int | None = None) -> int | None:
    """The probation minimum the caller set (`value`, the CLI's --probation-min) or else REGISTRY_PROBATION_MIN;
    None: neither, the registry's data decides (`from_counts`)."""
    if value is None:
        value = settings.current().probation_min
    return None if value is None else max(0, int(value))


def from_counts(counts) -> int:
    """The data-driven minimum from the evaluations behind the current embeddings: the smaller of PROBATION_MIN and
    half the median count of the best-known models, those that together hold half the evaluations (so models
    registered from a few results, however many, do not lower the bar: two hundred of 64 results beside 31 of
    12,000 hold 3% of them); PROBATION_MIN for a registry without embeddings."""
    n = sorted((float(c) for c in counts), reverse=True)      # (plain Python: `show` and `models` need no numpy)
    if not n or n[0] <= 0:
        return PROBATION_MIN
    half, held, best = sum(n) / 2, 0.0, 0
    while held < half:
        held, best = held + n[best], best + 1
    return int(min(PROBATION_MIN, statistics.median(n[:best]) // 2))


def probation_min(value: int | None = None, counts=None) -> int:
    """The fewest evaluations behind an embedding for a model to be routed to without being asked for: the one
    set (`configured_min`), else `from_counts(counts)`, else (no counts given) PROBATION_MIN."""
    value = configured_min(value)
    if value is not None:
        return value
    return PROBATION_MIN if counts is None else from_counts(counts)


def on_probation(n, minimum: int | None = None):
    """The probation rule, its one home: an embedding from fewer than the minimum evaluations (n: a count or an
    array of counts) -> bool (or [M] bool). `minimum` None: the one set, else PROBATION_MIN (callers that know the
    registry pass `minimum(tx)`)."""
    return np.asarray(n) < probation_min(minimum) if getattr(n, "ndim", 0) else int(n) < probation_min(minimum)


@dataclass
class Evidence:
    n: np.ndarray           # [M] evaluations behind each current embedding
    stability: np.ndarray   # [M] stability estimate (nan: not estimated yet)
    probation: np.ndarray   # [M] bool: below the minimum, not routed to unless asked
    weight: np.ndarray      # [M] shrinkage weight in (0, 1]: 1 = trust the model's own prediction fully
    minimum: int

    def status(self, i: int) -> str:
        return "probation" if self.probation[i] else "established"


def assess(z: np.ndarray, n, stability, minimum: int | None = None) -> Evidence:
    """z [M,D] current embeddings, n [M] evaluations behind them, stability [M] (None/nan: unknown); `minimum`
    None: the one set, else `from_counts(n)`."""
    n = np.asarray(n, dtype=np.float64)
    stab = (stability.astype(np.float64) if isinstance(stability, np.ndarray)
            else np.array([np.nan if s is None else float(s) for s in stability], dtype=np.float64))
    minimum = probation_min(minimum, counts=n)
    probation = on_probation(n, minimum)
    ref = ~probation if (~probation).sum() >= 2 else np.ones(len(n), dtype=bool)
    z = np.asarray(z, dtype=np.float64)
    tau2 = float(((z[ref] - z[ref].mean(axis=0)) ** 2).sum(axis=1).mean()) if len(z) else 0.0
    known = ~np.isnan(stab) & (n > 0)
    c = float(np.median(stab[known] ** 2 * n[known] / 4)) if known.any() else 0.0
    u2 = np.where(known, np.nan_to_num(stab) ** 2 / 4, c / np.maximum(n, 1))
    weight = np.ones(len(n)) if tau2 <= 0 else tau2 / (tau2 + u2)
    return Evidence(n.astype(np.int64), stab, probation, weight, minimum)


def shrink(probs: np.ndarray, ev: Evidence) -> np.ndarray:
    """P(correct) [M,N] pulled toward the established models' mean prediction for each query, by each model's
    weight."""
    probs = np.asarray(probs)
    if not len(probs):
        return probs
    ref = ~ev.probation if (~ev.probation).any() else np.ones(len(probs), dtype=bool)
    population = probs[ref].mean(axis=0, keepdims=True)                   # [1,N]
    w = ev.weight.astype(probs.dtype)[:, None]
    return (w * probs + (1 - w) * population).astype(probs.dtype)


def candidates(ev: Evidence, include_probation: bool = False) -> np.ndarray:
    """[M] bool: the models routing may choose."""
    return np.ones(len(ev.n), dtype=bool) if include_probation else ~ev.probation
