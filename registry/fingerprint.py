"""Fingerprinting: is an unknown endpoint one of the registered models?

The verdict's threshold is calibrated on the registry itself: every model with enough evaluations is embedded twice
from two disjoint random samples (of `sample` evaluations each, several draws); distances between the two embeddings
of the same model are "same" distances, between different models "different" ones. The threshold is the distance
that best separates the two (balanced accuracy), computed once per encoder and set of versions, per process.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import embedding, encoders
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


def disjoint_pairs(tx: Tx, model, sets: list[embedding.EvalSet], sample: int, draws: int, seed: int = 0):
    """For each draw, each model embedded from two disjoint random samples: -> (za, zb) each [draws, M, D]. Each
    model's samples are seeded by (seed, draw, model id), so they do not depend on which other models are there."""
    samples = []
    for draw in range(draws):
        for s in sets:
            perm = np.random.default_rng([seed, draw, int(s.model_id)]).permutation(s.n)[: 2 * sample]
            samples += [embedding.EvalSet(s.model_id, s.query_ids[part], s.y[part], s.digest)
                        for part in (perm[:sample], perm[sample:])]
    z = embedding.compute(tx, model, samples).reshape(draws, len(sets), 2, -1)
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
    ids = [r[0] for r in tx.sql("SELECT DISTINCT model_id FROM embedding_versions WHERE encoder_id = ? ORDER BY 1",
                                [encoder_id])]   # a fixed order: DISTINCT alone comes back in any order
    through = int(tx.sql("SELECT coalesce(max(id), 0) FROM import_batches")[0][0])
    sets = list(embedding.evaluation_sets(tx, ids, through, meta.get("embed_max_set")).values())
    if not sets:
        return None
    # a small registry calibrates on smaller samples (half its typical model's evaluations), never under 16
    sample = min(sample, max(16, int(np.median([s.n for s in sets])) // 2))
    sets = [s for s in sets if s.n >= 2 * sample]
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


# --- the question a user asks: is this unknown endpoint one of ours? ------------------------------------------------
@dataclass
class Fingerprint:
    match: str                      # the nearest registered model
    distance: float
    verdict: str                    # "same" (within the calibrated threshold) | "different"
    threshold: float
    runner_up: str | None = None    # the second nearest, to show how clear the match is
    runner_up_distance: float | None = None


def default_sample(tx: Tx, encoder_id: int) -> int:
    """128 evaluations per half as the bar asks, or less where models hold fewer (half the median model)."""
    n = tx.sql("""SELECT median(n_evaluations) FROM embedding_versions WHERE encoder_id = ?""", [encoder_id])[0][0]
    return int(max(8, min(128, (n or 0) // 2)))


def calibration(tx: Tx, sample: int | None = None, draws: int = 3) -> Calibration:
    from .errors import InputError

    encoder_id = encoders.active_id(tx)
    sample = sample or (default_sample(tx, encoder_id) if encoder_id is not None else 128)
    cal = calibrate(tx, sample=sample, draws=draws)
    if cal is None:
        raise InputError(f"cannot calibrate: needs at least 2 embedded models with {2 * sample} evaluations each")
    return cal


def verdict(neighbours, cal: Calibration) -> Fingerprint:
    """neighbours: the nearest registered models (neighbours.Neighbour), nearest first."""
    first = neighbours[0]
    second = neighbours[1] if len(neighbours) > 1 else None
    return Fingerprint(first.model, first.distance, "same" if first.distance <= cal.threshold else "different",
                       cal.threshold, second.model if second else None, second.distance if second else None)


def duplicate_warning(tx: Tx, name: str, neighbours) -> str | None:
    """`register`'s same-model warning: the nearest model within the calibrated threshold."""
    if not neighbours:
        return None
    limit = threshold(tx)
    nearest = neighbours[0]
    if limit is not None and nearest.distance <= limit:
        return (f"{name} sits {nearest.distance:.3f} from {nearest.model} (same-model threshold {limit:.3f}): "
                f"probably the same model under another name")
    return None
