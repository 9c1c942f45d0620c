"""The sequential test behind `registry watch`: did an endpoint that read as faithful change? Each round gives, on
its questions, the disagreements with the reference that held when both sides were asked again (nondeterminism
rarely repeats itself): `worse` (the endpoint wrong where the reference is right) and `better`. Two CUSUMs run over
the rounds:

- drop: S_d = max(0, S_d + worse - better - k_d), k_d half the smallest drop worth an event (MIN_DROP of the round);
- disagreement: S_t = max(0, S_t + worse + better - 2 lam n - k_t), lam the endpoint's own rate of held
  disagreements per side and question over its calm rounds (those that left both statistics at 0), with a prior;
  k_t half of MIN_DISAGREEMENT of the round.

An event is raised when either passes its threshold h. The thresholds are set by simulation: held disagreements
drawn as Poisson(lam n) per side and round, over HORIZON rounds, h the smallest level that at most ALPHA / 2 of the
simulated faithful runs pass (so a faithful endpoint raises an event in at most ALPHA of HORIZON-round runs).
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np

ALPHA = 0.005              # a faithful endpoint's chance of any event over HORIZON rounds
HORIZON = 30
MIN_DROP = 0.02            # accuracy points of a change worth an event
MIN_DISAGREEMENT = 0.05    # extra held disagreement worth an event (another model, partly or wholly)
PRIOR_HELD, PRIOR_QUESTIONS = 1.0, 128     # the rate's prior: one held disagreement per 128 questions and side
RUNS = 20_000


@dataclass
class State:
    rounds: int = 0
    calm_questions: int = 0         # questions of the rounds that left both statistics at 0
    calm_held: int = 0              # held disagreements (both directions) in those rounds
    s_drop: float = 0.0
    s_total: float = 0.0
    verdict: str = "faithful"       # what the endpoint last read as
    since: int | None = None        # the round the current excursion began (None: both statistics at 0)

    def rate(self) -> float:
        """Held disagreements per side and question while it read as faithful (with the prior)."""
        return (self.calm_held / 2 + PRIOR_HELD) / (self.calm_questions + PRIOR_QUESTIONS)

    def to_dict(self) -> dict:
        return asdict(self)


@functools.lru_cache(maxsize=256)
def thresholds(lam: float, k_drop: float, k_total: float, horizon: int = HORIZON, alpha: float = ALPHA,
               runs: int = RUNS) -> tuple[float, float]:
    """(h_drop, h_total) for a round's held disagreements ~ Poisson(lam) per side under "faithful"."""
    rng = np.random.default_rng(0)
    w, b = rng.poisson(lam, (runs, horizon)), rng.poisson(lam, (runs, horizon))
    peaks = []
    for x in ((w - b) - k_drop, (w + b) - 2 * lam - k_total):
        s, peak = np.zeros(runs), np.zeros(runs)
        for t in range(horizon):
            s = np.maximum(0.0, s + x[:, t])
            peak = np.maximum(peak, s)
        peaks.append(peak)
    h_drop, h_total = (float(np.quantile(p, 1 - alpha / 2, method="higher")) for p in peaks)
    return h_drop, h_total


def step(state: State, worse: int, better: int, n: int, *, min_drop: float = MIN_DROP,
         min_disagreement: float = MIN_DISAGREEMENT, alpha: float = ALPHA,
         horizon: int = HORIZON) -> tuple[State, str | None, dict]:
    """One round: -> (the new state, the alarm ("drop" | "disagreement" | None), the round's evidence)."""
    s = State(**state.to_dict())
    lam = round(s.rate() * n, 3)                      # (rounded: thresholds are cached per rate)
    k_drop, k_total = round(min_drop * n / 2, 3), round(min_disagreement * n / 2, 3)
    h_drop, h_total = thresholds(lam, k_drop, k_total, horizon, alpha)
    s.rounds += 1
    s.s_drop = max(0.0, s.s_drop + worse - better - k_drop)
    s.s_total = max(0.0, s.s_total + worse + better - 2 * lam - k_total)
    alarm = "drop" if s.s_drop > h_drop else "disagreement" if s.s_total > h_total else None
    if s.s_drop == 0 and s.s_total == 0:
        s.since = None
        s.calm_questions += n
        s.calm_held += worse + better
    elif s.since is None:
        s.since = s.rounds
    evidence = {"lam": lam, "k_drop": k_drop, "k_total": k_total, "h_drop": round(h_drop, 3),
                "h_total": round(h_total, 3), "s_drop": round(s.s_drop, 3), "s_total": round(s.s_total, 3),
                "worse_held": worse, "better_held": better}
    return s, alarm, evidence
