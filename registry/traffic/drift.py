"""Drift: per model and category, a one-sided CUSUM of the model's production outcomes against what routing
predicted for them when it routed each request (observed minus expected): S = max(0, S + w (p - y) - K), an event
when S passes H. Routing's prediction is that of the model chosen among many, so it runs a little high (the winner's
curse); K absorbs that and the test's own noise, and H sets the false-alarm rate (`false_alarm_rate` measures it by
simulation; bench/feedback.py on real traffic without a drop). After an event the pair's statistic starts again
from the outcomes that follow it.

An event names the model, the category and the drop (expected minus observed since the change point: the last time
S was 0 before it passed H), with its evidence; it is stored (table drift_events), shown by `registry drift` and
`GET /drift`, and queued for the owner's webhook where one is set (the deliveries `watch` makes:
asking/webhook.py)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from registry.core.transaction import Tx
from registry.traffic import sources

K = 0.15          # the reference value: expected minus observed per outcome that is not yet evidence of a drop
H = 6.0           # the threshold
MIN_OUTCOMES = 10   # since the change point, before an event may fire


@dataclass
class Event:
    model: str
    category: str
    drop: float
    statistic: float
    evidence: dict = field(default_factory=dict)
    id: int | None = None
    created: str | None = None


def outcomes(tx: Tx) -> dict[tuple[str, str], dict[str, np.ndarray]]:
    """Every counted outcome with a prediction, per (model, category), in the order they landed: request ids,
    predicted p, 0/1 y, weight w."""
    rows = tx.sql(f"""
        SELECT r.model, coalesce(r.category, '(none)'), f.request_id, r.predicted, f.correct::INT,
               coalesce(s.weight, {sources.DEFAULT_WEIGHT})
        FROM feedback f JOIN proxy_requests r ON r.id = f.request_id
        LEFT JOIN ({sources.CURRENT}) s ON s.name = f.source
        WHERE r.predicted IS NOT NULL AND coalesce(s.enabled, true) AND coalesce(s.weight, 1) > 0
        ORDER BY f.batch_id, r.created, f.request_id""")
    out: dict[tuple[str, str], list] = {}
    for m, c, rid, p, y, w in rows:
        out.setdefault((m, c), []).append((rid, p, y, w))
    return {k: {"ids": np.array([r[0] for r in v], dtype=object), "p": np.array([r[1] for r in v], dtype=float),
                "y": np.array([r[2] for r in v], dtype=float), "w": np.array([r[3] for r in v], dtype=float)}
            for k, v in out.items()}


def consumed(tx: Tx) -> dict[tuple[str, str], int]:
    """Per pair, how many of its outcomes the events so far consumed (the next test starts after them)."""
    out: dict[tuple[str, str], int] = {}
    for m, c, ev in tx.sql("SELECT model, category, evidence FROM drift_events ORDER BY id"):
        ev = json.loads(ev) if isinstance(ev, str) else ev
        out[(m, c)] = max(out.get((m, c), 0), int(ev.get("through", 0)))
    return out


def cusum(p: np.ndarray, y: np.ndarray, w: np.ndarray, k: float = K, h: float = H,
          min_outcomes: int = MIN_OUTCOMES) -> tuple[int, int, float] | None:
    """The first alarm in the series -> (index of the outcome at which it fired, index where the change began,
    the statistic), or None."""
    s, start = 0.0, 0
    for i in range(len(p)):
        s = max(0.0, s + w[i] * (p[i] - y[i]) - k)
        if s == 0.0:
            start = i + 1
        elif s > h and i + 1 - start >= min_outcomes:
            return i, start, s
    return None


def check(tx: Tx, *, k: float = K, h: float = H, webhook: str | None = None) -> list[Event]:
    """Run the test over every pair's outcomes not yet consumed by an event; store and return the new events (and
    queue each for `webhook`)."""
    done = consumed(tx)
    new = []
    for (model, category), s in outcomes(tx).items():
        at = done.get((model, category), 0)
        while at < len(s["p"]):
            hit = cusum(s["p"][at:], s["y"][at:], s["w"][at:], k, h)
            if hit is None:
                break
            i, start, stat = hit
            lo, hi = at + start, at + i + 1
            expected, observed = float(np.average(s["p"][lo:hi], weights=s["w"][lo:hi])), \
                float(np.average(s["y"][lo:hi], weights=s["w"][lo:hi]))
            ev = Event(model, category, round(expected - observed, 4), round(stat, 3), {
                "outcomes": hi - lo, "expected": round(expected, 4), "observed": round(observed, 4),
                "first_request": s["ids"][lo], "last_request": s["ids"][hi - 1], "k": k, "h": h,
                "through": hi, "before": {"outcomes": lo, "observed": round(float(s["y"][:lo].mean()), 4)
                                          if lo else None}})
            new.append(ev)
            at = hi
    for ev in new:
        ev.id, ev.created = tx.sql("""INSERT INTO drift_events (model, category, drop, statistic, evidence)
                                      VALUES (?, ?, ?, ?, ?) RETURNING id, created::VARCHAR""",
                                   [ev.model, ev.category, ev.drop, ev.statistic, json.dumps(ev.evidence)])[0]
        if webhook:
            tx.sql("INSERT INTO watch_deliveries (url, event) VALUES (?, ?)", [webhook, json.dumps(as_message(ev))])
    return new


def as_message(ev: Event) -> dict:
    """An event as the event stream and the webhook carry it."""
    return {"kind": "drift", "endpoint": ev.model, "change": "drift", "model": ev.model, "category": ev.category,
            "drop": ev.drop, "statistic": ev.statistic, "evidence": ev.evidence, "id": ev.id, "at": ev.created}


def events(tx: Tx, model: str | None = None) -> list[Event]:
    # (no `? IS NULL`: PostgreSQL cannot type a parameter that is only tested for NULL)
    rows = tx.sql(f"""SELECT id, model, category, drop, statistic, evidence, created::VARCHAR FROM drift_events
                      {'' if model is None else 'WHERE model = ?'} ORDER BY id""", [] if model is None else [model])
    return [Event(m, c, float(d), float(s), json.loads(e) if isinstance(e, str) else e, int(i), t)
            for i, m, c, d, s, e, t in rows]


def false_alarm_rate(p: np.ndarray, *, k: float = K, h: float = H, runs: int = 200, seed: int = 0) -> float:
    """Events per 10,000 outcomes when the predictions are right (y drawn from p), over `runs` draws of the series
    p: how often the test cries drift where there is none."""
    rng = np.random.default_rng(seed)
    alarms = 0
    w = np.ones(len(p))
    for _ in range(runs):
        y = (rng.random(len(p)) < p).astype(float)
        at = 0
        while at < len(p):
            hit = cusum(p[at:], y[at:], w[at:], k, h)
            if hit is None:
                break
            alarms += 1
            at += hit[0] + 1
    return 10_000 * alarms / (runs * max(len(p), 1))
