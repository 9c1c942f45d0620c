"""What routing takes from production outcomes, beside the re-embedded models: two terms added to a model's routing
logit, read from the feedback (`read`) by the server's writer after each landing and put into the snapshot routes
answer from (`apply`):

- after a drift event on (model, category), the model's shift on that category since the change point: logit of
  its observed rate (with PSEUDO outcomes at the expected rate) minus logit of the expected rate, over every
  outcome since then; so a model that dropped there stops being chosen there, by as much as it dropped;
- on a query that came before (its content hash), each model's residual there, answer minus predicted, weighed and
  shrunk (GAIN x sum / (weight + EXACT_PSEUDO)): the production query joins what routing looks up by neighbour, at
  distance 0.

Both come from sources that are on, each outcome at its source's weight. A routed text's category is the one the
registry holds for it, else its nearest reference query's."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from registry.core.transaction import Tx
from registry.locus import interaction
from registry.routing import served_scores, state
from registry.traffic import drift, sources

PSEUDO = 5.0          # outcomes at the expected rate, added to a drifted pair's observed rate
GAIN = 4.0
EXACT_PSEUDO = 2.0
CLIP = 8.0            # the largest shift of a logit either way


@dataclass(frozen=True)
class Corrections:
    category: dict = field(default_factory=dict)     # (model, category) -> logit shift
    exact: dict = field(default_factory=dict)        # query hash -> {model: logit shift}
    outcomes: int = 0                                # the counted outcomes they were read from

    def shift(self, model: str, category: str | None, query_hash: str | None) -> float:
        out = self.category.get((model, category), 0.0) if category is not None else 0.0
        return out + (self.exact.get(query_hash, {}).get(model, 0.0) if query_hash is not None else 0.0)


def _logit(p: float) -> float:
    p = min(max(p, 1e-4), 1 - 1e-4)
    return float(np.log(p / (1 - p)))


def read(tx: Tx) -> Corrections:
    """The corrections the stored outcomes and drift events call for."""
    series = drift.outcomes(tx)
    category = {}
    for ev in drift.events(tx):
        s = series.get((ev.model, ev.category))
        if s is None:
            continue
        lo = int(ev.evidence.get("through", 0)) - int(ev.evidence.get("outcomes", 0))
        p, y, w = s["p"][lo:], s["y"][lo:], s["w"][lo:]
        if not len(p):
            continue
        expected = float(np.average(p, weights=w))
        observed = (float((w * y).sum()) + PSEUDO * expected) / (float(w.sum()) + PSEUDO)
        category[(ev.model, ev.category)] = float(np.clip(_logit(observed) - _logit(expected), -CLIP, CLIP))
    exact: dict[str, dict[str, float]] = {}
    rows = tx.sql(f"""
        SELECT r.query_hash, r.model, sum(coalesce(s.weight, 1) * (f.correct::INT - r.predicted)),
               sum(coalesce(s.weight, 1))
        FROM feedback f JOIN proxy_requests r ON r.id = f.request_id
        LEFT JOIN ({sources.CURRENT}) s ON s.name = f.source
        WHERE r.predicted IS NOT NULL AND coalesce(s.enabled, true) AND coalesce(s.weight, 1) > 0
        GROUP BY r.query_hash, r.model""")
    for h, m, resid, weight in rows:
        exact.setdefault(h, {})[m] = float(np.clip(GAIN * resid / (weight + EXACT_PSEUDO), -CLIP, CLIP))
    return Corrections(category, exact, sum(len(s["p"]) for s in series.values()))


@dataclass
class CorrectedState(state.State):
    """A routing state whose routing probabilities carry traffic's corrections, after the served policy's."""
    corrections: Corrections = field(default_factory=Corrections)

    def scores(self, qvecs: np.ndarray, hashes: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
        probs, raw = super().scores(qvecs, hashes)
        c = self.corrections
        if hashes is None or not (c.category or c.exact):
            return probs, raw
        logits = interaction.logit(np.asarray(probs, dtype=np.float64))
        for j, h in enumerate(hashes):
            cat = category_for(self.interaction, h)
            for i, m in enumerate(self.names):
                d = c.shift(m, cat, h)
                if d:
                    logits[i, j] += d
        return interaction.sigmoid(logits).astype(probs.dtype), raw


def category_for(terms: served_scores.Served | None, query_hash: str) -> str | None:
    """A routed text's category: the registry's, else its nearest reference query's (found by its route)."""
    if terms is None:
        return None
    c = terms.category_of.get(query_hash)
    if c is not None:
        return c
    nn = terms.nearest.get(query_hash)
    f = terms.fitted
    if nn is None or not len(nn) or not len(f.ref_cat):
        return None
    at = int(f.ref_cat[int(nn[0])])
    return f.categories[at] if 0 <= at < len(f.categories) else None


def apply(st: state.State, corrections: Corrections | None) -> state.State:
    """The routing state `st` with these corrections; as it is without any."""
    if corrections is None or not (corrections.category or corrections.exact):
        return st
    base = {f.name: getattr(st, f.name) for f in dataclasses.fields(state.State)}
    return CorrectedState(**base, corrections=corrections)


def uncorrected(p: float, shift: float) -> float:
    """A corrected routing probability with its shift taken out: what drift compares outcomes with."""
    return float(interaction.sigmoid(np.array([_logit(p) - shift]))[0])
