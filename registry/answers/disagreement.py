"""How often two models' answers differ on the queries both answered: what fingerprints, geometry and the
teacher's pair loss read (numpy only, so the read commands that use it never import torch)."""
from __future__ import annotations

import numpy as np


def disagreement_matrix(correct: np.ndarray, min_shared: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """correct [M,N] (1/0, -1 = not evaluated) -> pairwise disagreement rate on queries both models answered
    (rate [M,M], nan under `min_shared` shared queries; shared count [M,M])."""
    obs = (correct >= 0).astype(np.float64)
    yes = (correct == 1).astype(np.float64)
    no = (correct == 0).astype(np.float64)
    shared = obs @ obs.T
    differ = yes @ no.T + no @ yes.T
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(shared >= min_shared, differ / shared, np.nan)
    return rate, shared
