"""Is an endpoint serving the model it claims faithfully? The tests behind `registry verify`'s verdicts, on 0/1
outcomes of the endpoint and the reference on the same questions (pure numpy/scipy: the bench runs them as they are).

- degraded: right less often than the reference, beyond chance and by at least MIN_DROP past what nondeterminism
  alone takes off, with the drop's 95% interval. The chance test is McNemar's (exact, one-sided) on the discordant
  pairs that held when both sides were asked the question again: a disagreement that one side's nondeterminism made
  rarely comes back, a degradation does, and under "faithful" both directions stay symmetric;
- substituted: the fingerprint's nearest registered model is another, and it explains the answers better than the
  claimed one (a sign test on the questions where the two registered models' outcomes differ);
- mixed: on the questions where the claimed model and some model M differ, the endpoint sides with M more than the
  reference does (a sign test on the pairs where one of them sides with M; against fixed registered results, which
  never waver, a one-sided Fisher test of its disagreement there against elsewhere), Bonferroni over every M;
- differs: its disagreement with the reference is beyond what the two sides' own nondeterminism allows. A side that
  flips each outcome with probability e disagrees with itself at s = 2e(1-e) on a repeat; two faithful sides then
  disagree at d0 = eA + eR - 2 eA eR. s is read from repeats (a few dozen, so smoothed by one disagreement in two
  repeats and its uncertainty carried into the test's variance);
- faithful: none of these at ALPHA each (the false-alarm rate over all three is measured by bench/verify.py);
- not conclusive: too few shared questions, or another model nearest without the evidence to say so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

ALPHA = 0.002          # per test; three tests: a faithful endpoint is called otherwise in well under 1% of samples
MIN_DROP = 0.02        # accuracy points a drop must reach to be called degraded
MIN_SHARED = 32        # shared questions under which no verdict is given
Z95 = 1.959964


@dataclass
class Sides:
    """What one comparison needs: 0/1 outcomes of the endpoint and the reference on the shared questions, and each
    side's repeats (disagreements, repeats); the reference's None: fixed results (registered, not asked)."""
    endpoint: np.ndarray
    reference: np.ndarray
    self_repeats: tuple[int, int] = (0, 0)
    reference_repeats: tuple[int, int] | None = None
    endpoint_again: np.ndarray | None = None     # each question's second answer (1/0, -1: not asked again)
    reference_again: np.ndarray | None = None


@dataclass
class Verdict:
    verdict: str                        # faithful | degraded | substituted | differs | not conclusive
    reason: str
    n: int                              # questions both the endpoint and the reference answered
    accuracy: float | None
    accuracy_ci: list = field(default_factory=list)
    reference_accuracy: float | None = None
    disagreement: float | None = None   # with the reference
    self_disagreement: float | None = None
    self_repeats: int = 0
    reference_self_disagreement: float | None = None
    reference_repeats: int = 0
    expected_disagreement: float | None = None   # what the two sides' nondeterminism allows (d0)
    p_disagreement: float | None = None
    drop: float | None = None           # reference accuracy minus the endpoint's, on the shared questions
    drop_ci: list = field(default_factory=list)
    worse: int = 0                      # discordant: the endpoint wrong where the reference is right
    better: int = 0
    worse_held: int = 0                 # of those, the ones both sides repeated when asked again
    better_held: int = 0
    noise_drop: float = 0.0             # the drop the two sides' nondeterminism alone would make
    p_drop: float | None = None
    nearest: str | None = None          # the fingerprint's nearest registered model
    p_substituted: float | None = None  # sign test: sides with the nearest rather than the claimed model
    substitute: str | None = None
    leaning: str | None = None          # the model it sides with most beyond the reference (partly answered as)
    leaning_share: float | None = None  # about that share of its answers, where the two models differ
    p_mixed: float | None = None        # that leaning's p-value, Bonferroni over the models tried
    more_questions: int | None = None   # where not conclusive: about how many more would likely decide
    alpha: float = ALPHA
    min_drop: float = MIN_DROP


def wilson(k: int, n: int, z: float = Z95) -> list:
    if n == 0:
        return []
    p, d = k / n, 1 + z * z / n
    mid, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [round(max(0.0, mid - half), 4), round(min(1.0, mid + half), 4)]


def sign_p(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) >= k): one-sided."""
    from scipy.stats import binom

    return 1.0 if n == 0 else float(binom.sf(k - 1, n, 0.5))


def flip_rate(s: float) -> float:
    """The per-answer flip probability e behind a repeat disagreement rate s = 2e(1-e)."""
    return (1 - math.sqrt(max(0.0, 1 - 2 * min(s, 0.5)))) / 2


def smoothed(repeats: tuple[int, int] | None) -> tuple[float, float]:
    """(s, its variance) from (disagreements, repeats); a fixed side: (0, 0)."""
    if repeats is None:
        return 0.0, 0.0
    d, r = repeats
    s = (d + 1) / (r + 2)
    return s, s * (1 - s) / (r + 2)


def disagreement_test(disagree: int, n: int, mine, theirs) -> tuple[float, float]:
    """-> (d0, one-sided p) that `disagree` of n is beyond what the two sides' repeats allow."""
    from scipy.stats import norm

    (sa, va), (sr, vr) = smoothed(mine), smoothed(theirs)
    ea, er = flip_rate(sa), flip_rate(sr)
    d0 = ea + er - 2 * ea * er
    # d0's variance by the delta method (de/ds = 1 / (2 sqrt(1 - 2s)))
    var = d0 * (1 - d0) / n + va / (4 * max(1e-9, 1 - 2 * sa)) + vr / (4 * max(1e-9, 1 - 2 * sr))
    z = ((disagree - 0.5) / n - d0) / math.sqrt(max(var, 1e-12))
    return d0, float(norm.sf(z))


@dataclass
class Others:
    """Registered outcomes on the shared questions (1/0, -1: none): the claimed model's (None: it has none), the
    other candidate models' by name, and the fingerprint's nearest among them (None: the claimed model itself)."""
    claimed: np.ndarray | None
    models: dict = field(default_factory=dict)
    nearest: str | None = None
    claimed_is_reference: bool = False      # no registered results: the reference's answers stand in


def substitution_test(e: np.ndarray, claimed: np.ndarray, other: np.ndarray) -> tuple[int, int, float]:
    """On the questions where the two models' outcomes differ: (sides with other, sides with claimed, one-sided p)."""
    split = (claimed >= 0) & (other >= 0) & (claimed != other)
    k = int((e[split] == other[split]).sum())
    return k, int(split.sum()) - k, sign_p(k, int(split.sum()))


def leaning_test(e: np.ndarray, r: np.ndarray, claimed: np.ndarray, other: np.ndarray,
                 fixed: bool) -> tuple[float, float]:
    """Does the endpoint side with `other` more than the reference does? -> (the excess share, one-sided p)."""
    from scipy.stats import hypergeom

    both = (claimed >= 0) & (other >= 0)
    split = both & (claimed != other)
    m = int(split.sum())
    if m == 0:
        return 0.0, 1.0
    if fixed:                     # the reference never wavers: its disagreement where they differ vs elsewhere
        off = e != claimed.astype(bool)
        a, total, rest = int(off[split].sum()), int(off[both].sum()), int(both.sum())
        share = a / m - (total - a) / max(1, rest - m)
        return share, float(hypergeom.sf(a - 1, rest, total, m)) if a else 1.0
    u = int(((e == other) & (r != other))[split].sum())
    w = int(((r == other) & (e != other))[split].sum())
    return (u - w) / m, sign_p(u, u + w)


def judge(sides: Sides, others: Others | None = None, *, alpha: float = ALPHA, min_drop: float = MIN_DROP,
          min_shared: int = MIN_SHARED) -> Verdict:
    e, r = np.asarray(sides.endpoint, dtype=bool), np.asarray(sides.reference, dtype=bool)
    n = len(e)
    v = Verdict("not conclusive", "", n, None, alpha=alpha, min_drop=min_drop)
    sr, rr = sides.self_repeats, sides.reference_repeats
    v.self_repeats, v.self_disagreement = sr[1], (round(sr[0] / sr[1], 4) if sr[1] else None)
    if rr is not None:
        v.reference_repeats, v.reference_self_disagreement = rr[1], (round(rr[0] / rr[1], 4) if rr[1] else None)
    if n < min_shared:
        v.reason = f"{n} shared questions: a verdict needs {min_shared}"
        v.more_questions = min_shared - n
        return v
    k, kr = int(e.sum()), int(r.sum())
    worse, better = int((~e & r).sum()), int((e & ~r).sum())
    disagree = worse + better
    v.accuracy, v.accuracy_ci, v.reference_accuracy = round(k / n, 4), wilson(k, n), round(kr / n, 4)
    v.disagreement, v.worse, v.better = round(disagree / n, 4), worse, better
    d0, v.p_disagreement = disagreement_test(disagree, n, sr, rr)
    v.expected_disagreement = round(d0, 4)
    drop = (worse - better) / n
    se = math.sqrt(max(0.0, disagree - (worse - better) ** 2 / n)) / n
    v.drop, v.drop_ci = round(drop, 4), [round(drop - Z95 * se, 4), round(drop + Z95 * se, 4)]
    # the discordant pairs that held when both sides were asked again (a fixed reference holds by itself):
    # nondeterminism rarely repeats itself, a degradation does, and under "faithful" both kinds stay symmetric
    held = np.ones(n, dtype=bool)
    if sides.endpoint_again is not None:
        held &= np.asarray(sides.endpoint_again) == e.astype(np.int8)
        if rr is not None and sides.reference_again is not None:
            held &= np.asarray(sides.reference_again) == r.astype(np.int8)
    v.worse_held, v.better_held = int((~e & r & held).sum()), int((e & ~r & held).sum())
    v.p_drop = sign_p(v.worse_held, v.worse_held + v.better_held)
    # the drop nondeterminism alone makes (a side that flips more is right less often), under the effect asked for
    (sa, _), (sb, _) = smoothed(sr), smoothed(rr)
    v.noise_drop = round((flip_rate(sa) - flip_rate(sb)) * (2 * kr / n - 1), 4)
    with_nearest = with_claimed = 0
    if others is not None and others.claimed is not None:
        v.nearest = others.nearest
        if others.nearest is not None and others.nearest in others.models:
            with_nearest, with_claimed, v.p_substituted = substitution_test(e, others.claimed,
                                                                            others.models[others.nearest])
        fixed = rr is None or others.claimed_is_reference
        tried = {m: leaning_test(e, r, others.claimed, o, fixed) for m, o in others.models.items()}
        if tried:
            best = min(tried, key=lambda m: (tried[m][1], -tried[m][0]))
            v.leaning, v.leaning_share = best, round(tried[best][0], 4)
            v.p_mixed = min(1.0, tried[best][1] * len(tried))
    if v.p_substituted is not None and v.p_substituted < alpha:
        v.verdict, v.substitute = "substituted", others.nearest
        v.reason = (f"answers as {others.nearest}: where it and the claimed model differ, sides with "
                    f"{others.nearest} {with_nearest} times of {with_nearest + with_claimed} (p={v.p_substituted:.2g})")
    elif v.p_drop < alpha and drop - max(0.0, v.noise_drop) >= min_drop:
        v.verdict = "degraded"
        v.reason = (f"right {drop:.1%} less often than the reference (95% CI {v.drop_ci[0]:.1%} to {v.drop_ci[1]:.1%};"
                    f" of the disagreements that held when asked again, {v.worse_held} worse vs {v.better_held} "
                    f"better, McNemar p={v.p_drop:.2g})")
    elif v.p_mixed is not None and v.p_mixed < alpha:
        v.verdict = "mixed"
        v.reason = (f"partly answered as {v.leaning}: where it and the claimed model differ, sides with {v.leaning} "
                    f"about {v.leaning_share:.0%} more often than the reference (p={v.p_mixed:.2g}, Bonferroni over "
                    f"{len(others.models)} models)")
    elif v.p_disagreement < alpha:
        v.verdict = "differs"
        v.reason = (f"disagrees with the reference on {disagree / n:.1%}, its nondeterminism allows {d0:.1%} "
                    f"(p={v.p_disagreement:.2g}), yet neither less accurate nor nearer another model")
    elif v.p_substituted is not None:
        v.reason = f"nearest registered model is {others.nearest}, not significantly (p={v.p_substituted:.2g})"
        v.more_questions = more_needed(n, v.p_substituted, alpha)
    else:
        v.verdict = "faithful"
        v.reason = (f"disagrees with the reference on {disagree / n:.1%}, its nondeterminism allows {d0:.1%} "
                    f"(p={v.p_disagreement:.2g}); accuracy drop {drop:+.1%} (p={v.p_drop:.2g})")
    return v


def more_needed(n: int, p: float, alpha: float) -> int | None:
    """About how many more questions would bring an effect of the size seen to p < alpha (z grows as sqrt(n))."""
    from scipy.stats import norm

    z = norm.isf(min(max(p, 1e-300), 0.5 - 1e-9))
    if z <= 0.05:
        return None
    return max(1, int(math.ceil(n * (norm.isf(alpha) / z) ** 2)) - n)
