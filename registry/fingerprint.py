"""Fingerprinting: is an unknown endpoint one of the registered models?

The verdict's threshold is calibrated on the registry itself: every model with enough evaluations is embedded twice
from two disjoint random samples (of `sample` evaluations each, several draws); distances between the two embeddings
of the same model are "same" distances, between different models "different" ones. The threshold is the distance
that best separates the two (balanced accuracy), computed once per encoder and set of versions, per process.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import encoders, onboarding
from .store import Tx

_calibrations: dict[tuple[int, int], "Calibration"] = {}


@dataclass
class Calibration:
    encoder_id: int
    sample: int
    draws: int
    models: int
    threshold: float
    same: dict = field(default_factory=dict)        # quantiles of same-model distances
    different: dict = field(default_factory=dict)   # quantiles of different-model distances
    same_below: float = 0.0                         # share of same-model pairs at or under the threshold
    different_above: float = 0.0                    # share of different-model pairs over it
    nearest_is_same: float = 0.0                    # share of second embeddings whose nearest first one is the model


def _quantiles(x: np.ndarray) -> dict:
    return {f"p{q}": round(float(np.percentile(x, q)), 4) for q in (5, 50, 95)} if len(x) else {}


def disjoint_pairs(tx: Tx, model, sets: list[onboarding.EvalSet], sample: int, draws: int, seed: int = 0):
    """For each draw, each model embedded from two disjoint random samples: -> (za, zb) each [draws, M, D]."""
    rng = np.random.default_rng(seed)
    row_of, qmat = onboarding.query_vectors(tx, np.concatenate([s.query_ids for s in sets]))
    inputs = []
    for _ in range(draws):
        for s in sets:
            perm = rng.permutation(s.n)[: 2 * sample]
            for part in (perm[:sample], perm[sample:]):
                q = qmat[[row_of[int(i)] for i in s.query_ids[part]]]
                inputs.append((q, s.y[part]))
    z = onboarding.embed_sets(model, inputs).reshape(draws, len(sets), 2, -1)
    return z[:, :, 0], z[:, :, 1]


def calibrate(tx: Tx, sample: int = 128, draws: int = 3, seed: int = 0) -> Calibration | None:
    encoder_id = encoders.active_id(tx)
    if encoder_id is None:
        return None
    newest = int(tx.sql("SELECT coalesce(max(id), 0) FROM embedding_versions")[0][0])
    key = (encoder_id, newest)
    if key in _calibrations and _calibrations[key].sample == sample:
        return _calibrations[key]
    model, meta = encoders.load(tx, encoder_id)
    ids = [r[0] for r in tx.sql("SELECT DISTINCT model_id FROM embedding_versions WHERE encoder_id = ?",
                                [encoder_id])]
    through = int(tx.sql("SELECT coalesce(max(id), 0) FROM import_batches")[0][0])
    sets = [s for s in onboarding.evaluation_sets(tx, ids, through).values() if s.n >= 2 * sample]
    if len(sets) < 2:
        return None
    za, zb = disjoint_pairs(tx, model, sets, sample, draws, seed)
    d = np.linalg.norm(za[:, :, None, :] - zb[:, None, :, :], axis=-1)        # [draws, M, M]
    eye = np.eye(len(sets), dtype=bool)
    same, diff = d[:, eye].ravel(), d[:, ~eye].ravel()
    candidates = np.unique(np.concatenate([same, diff]))
    score = [(np.mean(same <= t) + np.mean(diff > t)) / 2 for t in candidates]
    best = int(np.argmax(score))
    # between the separating sample and the next one, so neither side sits exactly on it
    threshold = float(candidates[best] if best + 1 == len(candidates) else (candidates[best] + candidates[best + 1]) / 2)
    nearest = (d.argmin(axis=1) == np.arange(len(sets))[None, :]).mean()
    cal = Calibration(encoder_id, sample, draws, len(sets), round(threshold, 4), _quantiles(same), _quantiles(diff),
                      round(float(np.mean(same <= threshold)), 4), round(float(np.mean(diff > threshold)), 4),
                      round(float(nearest), 4))
    _calibrations[key] = cal
    return cal


def threshold(tx: Tx) -> float | None:
    cal = calibrate(tx)
    return None if cal is None else cal.threshold
