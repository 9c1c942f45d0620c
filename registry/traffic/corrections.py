"""What routing takes from production outcomes, beside the re-embedded models: two terms added to a model's routing
logit, read from the feedback (`read`) and saved beside the routing state by every write that changes them
(`refresh`: a landing, a source's setting), in that write's transaction; a route reads the saved ones
(routing/state.py `corrected`: the server's snapshot and `registry route` alike):

- after a drift event on (model, category), the model's shift on that category since the change point: logit of
  its observed rate (with PSEUDO outcomes at the expected rate) minus logit of the expected rate, over every
  outcome since then; so a model that dropped there stops being chosen there, by as much as it dropped;
- on a query that came before (its content hash), each model's residual there, answer minus predicted, weighed and
  shrunk (GAIN x sum / (weight + EXACT_PSEUDO)): the production query joins what routing looks up by neighbour, at
  distance 0.

Both come from sources that are on, each outcome at its source's weight. A routed text's category is the one the
registry holds for it, else its nearest reference query's (routing/served_scores.py `category_for`)."""
from __future__ import annotations

import numpy as np

from registry.core.transaction import Tx
from registry.locus import interaction
from registry.routing import state
from registry.routing.served_scores import Corrections, category_for
from registry.traffic import drift, sources

__all__ = ["Corrections", "category_for", "read", "refresh", "uncorrected"]

PSEUDO = 5.0          # outcomes at the expected rate, added to a drifted pair's observed rate
GAIN = 4.0
EXACT_PSEUDO = 2.0
CLIP = 8.0            # the largest shift of a logit either way


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


def refresh(tx: Tx) -> Corrections:
    """Read the corrections again and save them for routes to read (in the transaction of the write that changed
    them)."""
    c = read(tx)
    state.save_corrections(tx, c)
    return c


def uncorrected(p: float, shift: float) -> float:
    """A corrected routing probability with its shift taken out: what drift compares outcomes with."""
    return float(interaction.sigmoid(np.array([_logit(p) - shift]))[0])
