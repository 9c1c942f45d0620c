"""Is an endpoint serving the model it claims faithfully? The verdict of `registry verify` (and of watch's events, the
endpoint page and HTTP: this one function), from 0/1 outcomes of the endpoint and the reference on the same questions
and every registered model's results there (pure numpy/scipy: the bench runs it as it is). The null is "the claimed
model under another configuration" (asking/answer_models.py): its own answers, an ability shift, flips where the
question is uncertain for it. In order:

- substituted: a registered model explains the answers better than the claimed one at any ability shift (Cox's
  test of the claimed model's three-parameter fit against the other's, one-sided, Bonferroni over the models tried);
  named;
- mixed: a share of the answers is best explained as another model's (a two-fit mixture against the claimed fit
  alone, the same correction);
- unknown: neither the claimed model's own answers nor any registered model's explain the endpoint's beyond what the
  questions' difficulty does (no fit's attachment to its model's answers is positive at 5%);
- degraded: right less often than the reference, the lower end of the drop's 95% interval past `tolerance` (a drop
  judged on its point estimate would call a real 2.0-point drop degraded half the time);
- configuration: the claimed model explains the answers best, yet they differ from the reference beyond what the two
  sides' own nondeterminism allows (another prompt, temperature or precision). A side that flips each outcome with
  probability e disagrees with itself at s = 2e(1-e) on a repeat; two faithful sides then disagree at
  d0 = eA + eR - 2 eA eR (s read from repeats, smoothed, its uncertainty carried into the test's variance);
- faithful: none of these;
- not conclusive: too few shared questions.
The false-alarm rates, measured on nulls as messy as the world (reruns and prompt shifts simulated from question
difficulty across registered models, accuracy shifts up to 10 points, public quantized runs), are
bench/verify_nulls.py's, in BENCHMARKS.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

ALPHA = 0.002          # per test, Bonferroni over the models a test tries
TOLERANCE = 0.02       # accuracy points a drop's 95% interval must clear to be called degraded
ATTACHED = 0.05        # a fit "attaches" to its model's answers when b > 0 at this level (unknown when none does)
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


@dataclass
class Verdict:
    verdict: str                        # VERDICTS
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
    shift: float | None = None          # the claimed model's fitted ability shift (logits: + more often right)
    attachment: float | None = None     # how closely it repeats the claimed model's own answers (the fit's b)
    p_attachment: float | None = None
    nearest: str | None = None          # the registered model that explains the answers best (the claimed one: None)
    p_substituted: float | None = None  # Cox's test of the claimed against the nearest, Bonferroni over the models
    substitute: str | None = None
    leaning: str | None = None          # the model whose mixture with the claimed one explains the answers best
    leaning_share: float | None = None  # that mixture's weight: about that share of the answers is the other's
    p_mixed: float | None = None        # that mixture's likelihood ratio's p-value, Bonferroni over the models
    models_tried: int = 0
    more_questions: int | None = None   # where not conclusive: about how many more would likely decide
    alpha: float = ALPHA
    tolerance: float = TOLERANCE


VERDICTS = ("faithful", "configuration", "degraded", "substituted", "mixed", "unknown", "not conclusive")


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
    """Registered outcomes on the shared questions (1/0, -1: none): the claimed model's (None: it has none; the
    reference's answers stand in) and the other candidate models' by name."""
    claimed: np.ndarray | None
    models: dict = field(default_factory=dict)


def judge(sides: Sides, others: Others | None = None, *, alpha: float = ALPHA, tolerance: float = TOLERANCE,
          min_shared: int = MIN_SHARED) -> Verdict:
    e, r = np.asarray(sides.endpoint, dtype=bool), np.asarray(sides.reference, dtype=bool)
    n = len(e)
    v = Verdict("not conclusive", "", n, None, alpha=alpha, tolerance=tolerance)
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
    explained = _explain(v, e, r, others, alpha)
    if v.p_substituted is not None and v.p_substituted < alpha:
        v.verdict, v.substitute = "substituted", v.nearest
        v.reason = (f"answers as {v.nearest}: it explains the answers better than the claimed model at any ability "
                    f"shift (Cox p={v.p_substituted:.2g}, Bonferroni over {v.models_tried} models)")
    elif v.p_mixed is not None and v.p_mixed < alpha:
        v.verdict = "mixed"
        v.reason = (f"partly answered as {v.leaning}: about {v.leaning_share:.0%} of the answers are best explained as "
                    f"its (p={v.p_mixed:.2g}, Bonferroni over {v.models_tried} models)")
    elif explained is False:
        v.verdict = "unknown"
        v.reason = (f"neither the claimed model's answers nor any registered model's explain the endpoint's beyond "
                    f"the questions' difficulty (attachment p={v.p_attachment:.2g})")
    elif v.drop_ci[0] > tolerance:
        v.verdict = "degraded"
        v.reason = (f"right {drop:.1%} less often than the reference (95% CI {v.drop_ci[0]:.1%} to {v.drop_ci[1]:.1%}, "
                    f"beyond the {tolerance:.1%} tolerance)")
    elif v.p_disagreement < alpha:
        v.verdict = "configuration"
        v.reason = (f"the claimed model under another configuration: disagrees with the reference on "
                    f"{disagree / n:.1%} where nondeterminism allows {d0:.1%} (p={v.p_disagreement:.2g}), and no "
                    f"registered model explains it better; accuracy {-drop:+.1%}")
    else:
        v.verdict = "faithful"
        v.reason = (f"disagrees with the reference on {disagree / n:.1%}, its nondeterminism allows {d0:.1%} "
                    f"(p={v.p_disagreement:.2g}); accuracy {-drop:+.1%} (95% CI of the drop {v.drop_ci[0]:.1%} to "
                    f"{v.drop_ci[1]:.1%})")
    return v


def _explain(v: Verdict, e: np.ndarray, r: np.ndarray, others: Others | None, alpha: float) -> bool | None:
    """Fill v's model comparison (answer_models.py); -> whether some registered model's own answers explain the
    endpoint's (None: nothing to compare with)."""
    from registry.asking import answer_models as am

    claimed = r.astype(np.int8) if others is None or others.claimed is None else np.asarray(others.claimed)
    models = {} if others is None else {m: np.asarray(o) for m, o in others.models.items()}
    if not models:
        return None
    b = am.difficulty(np.vstack([claimed] + list(models.values())))
    pi = am.chances(claimed, b)
    mine = am.fit(e, claimed, pi)
    v.shift = round(float(mine.params[0]), 4)
    v.attachment, v.p_attachment = (round(x, 6) for x in am.attachment(mine, e, claimed, pi))
    attached = v.p_attachment < ATTACHED
    fits, tests, mixes = {}, {}, {}
    for m, y in models.items():
        pm = am.chances(y, b)
        fits[m] = am.fit(e, y, pm)
        tests[m] = am.cox(mine, fits[m], e) if fits[m].total > mine.total else (0.0, 1.0)
        mixes[m] = am.mixture(e, mine, fits[m])
        attached = attached or am.attachment(fits[m], e, y, pm)[1] < ATTACHED
    v.models_tried = len(models)
    best = max(tests, key=lambda m: tests[m][0])
    if tests[best][0] > 0:
        v.nearest, v.p_substituted = best, min(1.0, tests[best][1] * len(models))
    lean = min(mixes, key=lambda m: (mixes[m][1], -mixes[m][0]))
    v.leaning, v.leaning_share, v.p_mixed = lean, round(mixes[lean][0], 4), min(1.0, mixes[lean][1] * len(models))
    return attached


def more_needed(n: int, p: float, alpha: float) -> int | None:
    """About how many more questions would bring an effect of the size seen to p < alpha (z grows as sqrt(n))."""
    from scipy.stats import norm

    z = norm.isf(min(max(p, 1e-300), 0.5 - 1e-9))
    if z <= 0.05:
        return None
    return max(1, int(math.ceil(n * (norm.isf(alpha) / z) ** 2)) - n)
