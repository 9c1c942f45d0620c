"""Fingerprinting: is an unknown endpoint one of the registered models? A verdict "same" is given only when the
chance of giving it for a distinct model is at most 1% (ALPHA) at the evidence in hand; otherwise the answer is
"closest: X, not conclusive". Every verdict shows its evidence.

- From shared answers (when the unknown's results share at least MIN_SHARED queries with a registered model): the
  unknown and each model disagree on some of the queries both answered; the nearest is the model it disagrees with
  least. For two distinct models the number of disagreements on n random shared queries is about Binomial(n, p),
  p their disagreement rate, and the registry knows p for every pair of its well-known models (at least
  MIN_PAIR_SHARED shared queries). The test's threshold at n is the largest count k with P(Binomial(n, p_min) <= k)
  <= ALPHA, p_min the closest distinct pair's rate: so no distinct pair, the closest included, passes for more than 1%
  of random samples of n queries. Comparing answers beats comparing embeddings wherever queries are shared (issue
  15: 139 of 140 random 128-question draws named right from answers, against false "same" claims from embeddings).
- From the embedding (too few shared queries): distance to the nearest embedding, with a "same" threshold set below
  every distance between distinct models' embeddings from disjoint samples of that size (`calibrate`, below).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from registry.answers import disagreement
from registry.core.errors import Conflict, InputError
from registry.core.transaction import Tx
from registry.data import current_evaluations
from registry.embedding import embed, encoders


@dataclass
class Calibration:
    """The embedding test's calibration: each model embedded from two disjoint samples of `sample` evaluations."""
    encoder_id: int
    sample: int
    draws: int
    models: int
    threshold: float                                # "same" under this distance: the smallest distinct-pair distance
    same: dict = field(default_factory=dict)        # quantiles of same-model distances
    different: dict = field(default_factory=dict)   # quantiles of different-model distances
    same_below: float = 0.0                         # share of same-model pairs under the threshold (the power)
    nearest_is_same: float = 0.0                    # share of second embeddings whose nearest first one is the model


def _quantiles(x: np.ndarray) -> dict:
    return {f"p{q}": round(float(np.percentile(x, q)), 4) for q in (5, 50, 95)} if len(x) else {}


def disjoint_pairs(tx: Tx, model, sets: list[embed.EvalSet], sample: int, draws: int, seed: int = 0):
    """For each draw, each model embedded from two disjoint random samples: -> (za, zb) each [draws, M, D]. Each
    model's samples are seeded by (seed, draw, model id), so they do not depend on which other models are there."""
    samples = []
    for draw in range(draws):
        for s in sets:
            perm = np.random.default_rng([seed, draw, int(s.model_id)]).permutation(s.n)[: 2 * sample]
            samples += [embed.EvalSet(s.model_id, s.query_ids[part], s.y[part], s.digest)
                        for part in (perm[:sample], perm[sample:])]
    z = embed.compute(tx, model, samples).reshape(draws, len(sets), 2, -1)
    return z[:, :, 0], z[:, :, 1]


def calibrate(tx: Tx, sample: int = 128, draws: int = 3, seed: int = 0) -> Calibration | None:
    encoder_id = encoders.active_id(tx)
    if encoder_id is None:
        return None
    last = int(tx.sql("SELECT coalesce(max(id), 0) FROM embedding_versions")[0][0])
    newest: int | tuple[int, int] = last
    if tx.postgres:    # other processes commit versions too, not in id order: their count as well
        newest = (last, int(tx.sql("SELECT count(*) FROM embedding_versions")[0][0]))
    key = (encoder_id, newest, sample, draws, seed)
    kept = tx.section("fingerprint calibrations")
    if key in kept:
        return kept[key]
    if len(kept) >= 4:          # (older versions' calibrations: a server registering all day must not keep them all)
        kept.clear()
    model, meta = encoders.load(tx, encoder_id)
    ids = [r[0] for r in tx.sql("SELECT DISTINCT model_id FROM embedding_versions WHERE encoder_id = ? ORDER BY 1",
                                [encoder_id])]   # a fixed order: DISTINCT alone comes back in any order
    through = int(tx.sql("SELECT coalesce(max(id), 0) FROM import_batches")[0][0])
    sets = list(embed.evaluation_sets(tx, ids, through, meta.get("embed_max_set")).values())
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
    threshold = float(diff.min())       # no distinct pair of these samples came closer: "same" only under it
    nearest = (d.argmin(axis=1) == np.arange(len(sets))[None, :]).mean()
    cal = Calibration(encoder_id, sample, draws, len(sets), round(threshold, 4), _quantiles(same), _quantiles(diff),
                      round(float(np.mean(same < threshold)), 4), round(float(nearest), 4))
    kept[key] = cal
    return cal


# --- the question a user asks: is this unknown endpoint one of ours? ------------------------------------------------
ALPHA = 0.01            # the largest share of distinct models that may get the verdict "same"
MIN_SHARED = 32         # fewer shared queries than this: the embedding decides
MIN_PAIR_SHARED = 100   # a pair of registered models must share this many queries for its rate to calibrate


@dataclass
class AnswerCalibration:
    """The answers test's calibration: the closest pair of distinct registered models, and its disagreement rate."""
    p_min: float | None                 # None: no pair of models shares MIN_PAIR_SHARED queries
    closest_pair: list[str] = field(default_factory=list)
    pairs: int = 0                      # distinct pairs with enough shared queries
    alpha: float = ALPHA

    def max_disagreements(self, n: int) -> int:
        """The most disagreements on n shared queries that still reads "same" (-1: none can, at this n)."""
        if self.p_min is None or n < 1:
            return -1
        return _max_disagreements(int(n), self.p_min, self.alpha)

    def thresholds(self, ns=(32, 64, 128, 256, 512, 1024)) -> dict[str, float | None]:
        return {str(n): (None if self.max_disagreements(n) < 0 else round(self.max_disagreements(n) / n, 4))
                for n in ns}


@functools.lru_cache(maxsize=4096)
def _max_disagreements(n: int, p_min: float, alpha: float) -> int:
    """The largest k with P(Binomial(n, p_min) <= k) <= alpha, -1 if none: the binomial's cdf summed from its log
    pmf in numpy (scipy.stats alone takes 0.6 s to import, a third of a registration)."""
    return int(np.searchsorted(binomial_cdf(n, p_min), alpha, side="right")) - 1


def binomial_cdf(n: int, p: float) -> np.ndarray:
    """P(Binomial(n, p) <= k) for k = 0..n, exact to float64 rounding (log-gamma pmf, cumulated)."""
    k = np.arange(n + 1, dtype=np.float64)
    if p <= 0.0 or p >= 1.0:
        return (k >= (0 if p <= 0.0 else n)).astype(np.float64)
    log_choose = math.lgamma(n + 1) - np.array([math.lgamma(i + 1) + math.lgamma(n - i + 1) for i in range(n + 1)])
    return np.minimum(np.cumsum(np.exp(log_choose + k * math.log(p) + (n - k) * math.log1p(-p))), 1.0)


_answer_cals: dict[tuple, AnswerCalibration] = {}


def answer_calibration(tx: Tx, exclude: set[int] | None = None) -> AnswerCalibration:
    """p_min over the pairs of distinct registered models with MIN_PAIR_SHARED shared queries (leaving out the model
    ids in `exclude`, e.g. the model being registered, and the pairs of a model and its alias). Kept per process
    until evaluations or aliases change."""
    from registry.answers import catalog

    # only models with MIN_PAIR_SHARED evaluations can form a calibrating pair, so only their evaluations matter:
    # registering a model from fewer (the common case under load) reuses the calibration
    # (PostgreSQL: other processes commit batches too, not in id order: each model's count of rows as well)
    known = tx.sql(f"""SELECT model_id, max(batch_id){', count(*)' if tx.postgres else ''} FROM evaluations
                       GROUP BY model_id HAVING count(*) >= ? ORDER BY 1""", [MIN_PAIR_SHARED])
    # excluding a model that cannot calibrate (the common case: a new model) changes nothing, nor the key
    exclude = set(exclude or ()) & {int(m[0]) for m in known}
    roots = catalog.alias_groups(tx)
    key = (tx.path, tuple(map(tuple, known)), tuple(sorted(exclude)), tuple(sorted(roots.items())))
    if key in _answer_cals:
        return _answer_cals[key]
    ids = ", ".join(str(int(m[0])) for m in known) or "NULL"
    res = tx.numpy(f"""SELECT model_id, query_id, correct::INT AS c FROM {current_evaluations.CURRENT} e
                              WHERE model_id IN ({ids})""")
    mids, qids = np.unique(res["model_id"]), np.unique(res["query_id"])
    keep = ~np.isin(mids, list(exclude))
    correct = np.full((len(mids), len(qids)), -1, dtype=np.int8)
    correct[np.searchsorted(mids, res["model_id"]), np.searchsorted(qids, res["query_id"])] = res["c"]
    names = dict(tx.sql("SELECT id, name FROM models"))
    cal = calibration_of(correct[keep], [names[int(m)] for m in mids[keep]],
                         groups=[roots.get(int(m), int(m)) for m in mids[keep]])
    _answer_cals[key] = cal
    return cal


def calibration_of(correct: np.ndarray, names: list[str], groups: list | None = None) -> AnswerCalibration:
    """The answers test's calibration from the current answers [M,N] (1/0, -1 none) of the models that may
    calibrate (those with MIN_PAIR_SHARED evaluations), named `names`. Only pairs the registry believes distinct
    set the bar: not a model and its alias (the same entry of `groups`), nor a pair the test itself reads "same"
    against the pairs of the other models (a duplicate registered under another name, recorded as an alias or not).
    """
    rate, shared = disagreement.disagreement_matrix(correct, MIN_PAIR_SHARED)
    if groups is not None:
        g = np.asarray(groups)
        rate[g[:, None] == g[None, :]] = np.nan
    np.fill_diagonal(rate, np.nan)
    while np.isfinite(rate).any():
        i, j = np.unravel_index(np.nanargmin(rate), rate.shape)
        others = np.ones(len(rate), dtype=bool)
        others[[i, j]] = False
        rest = rate[np.ix_(others, others)]
        if not np.isfinite(rest).any():
            break
        n = int(shared[i, j])
        if round(rate[i, j] * n) > _max_disagreements(n, float(np.nanmin(rest)), ALPHA):
            break
        rate[i, j] = rate[j, i] = np.nan       # the two read "same" against every other pair: not a distinct pair
    if not np.isfinite(rate).any():
        return AnswerCalibration(None)
    i, j = np.unravel_index(np.nanargmin(rate), rate.shape)
    return AnswerCalibration(round(float(rate[i, j]), 6), sorted([names[i], names[j]]),
                             int(np.isfinite(rate).sum() // 2))


@dataclass
class Fingerprint:
    match: str                      # the nearest registered model
    verdict: str                    # "same" (passes the 1% test) | "not conclusive"
    method: str                     # "answers" (shared queries) | "embedding" (too few shared)
    shared_queries: int             # between the unknown and `match`
    disagreement: float | None      # on those queries (answers method)
    threshold: float | None         # "same" at or under this disagreement rate (answers) or distance (embedding)
    distance: float | None = None   # embedding distance to `match` (embedding method)
    runner_up: str | None = None    # the second nearest, to show how clear the match is
    runner_up_disagreement: float | None = None
    closest_pair: list[str] = field(default_factory=list)   # the calibration's closest distinct pair
    p_min: float | None = None                              # and its disagreement rate
    alpha: float = ALPHA

    @property
    def summary(self) -> str:
        what = (f"disagrees on {self.disagreement:.1%} of {self.shared_queries} shared queries"
                if self.method == "answers" else f"embedding distance {self.distance:.4f}")
        bar = "no threshold" if self.threshold is None else f"'same' needs <= {self.threshold:.4g}"
        head = f"same: {self.match}" if self.verdict == "same" else f"closest: {self.match}, not conclusive"
        return f"{head} ({what}; {bar}, at most {self.alpha:.0%} of distinct models pass)"


def by_answers(tx: Tx | None, qids, y, *, exclude: set[int] | None = None, rates: dict | None = None,
               names: dict[int, str] | None = None, cal: AnswerCalibration | None = None) -> Fingerprint | None:
    """The answers test against every registered model (but `exclude`); None when no model shares MIN_SHARED
    queries with the answers. `rates`: evaluations.disagreement of these answers, when the caller has it; with
    `names` (model id -> name) and `cal` too, nothing is read (a server's answer book has them)."""
    if names is None:
        assert tx is not None, "without a transaction, the caller passes `names`"
        names = dict(tx.sql("SELECT id, name FROM models"))
    others = [m for m in names if m not in (exclude or set())]
    if rates is None:
        assert tx is not None, "without a transaction, the caller passes `rates`"
        rates = current_evaluations.disagreement(tx, qids, y, others)
    else:
        rates = {m: r for m, r in rates.items() if m not in (exclude or set())}
    ranked = sorted(((r, -n, m) for m, (n, r) in rates.items() if n >= MIN_SHARED))
    if not ranked:
        return None
    if cal is None:
        assert tx is not None, "without a transaction, the caller passes `cal`"
        cal = answer_calibration(tx, exclude)
    rate, neg_n, m = ranked[0]
    n = -neg_n
    k = cal.max_disagreements(n)
    same = k >= 0 and round(rate * n) <= k
    second = ranked[1] if len(ranked) > 1 else None
    return Fingerprint(names[m], "same" if same else "not conclusive", "answers", n, round(rate, 4),
                       None if k < 0 else round(k / n, 4), None, names[second[2]] if second else None,
                       round(second[0], 4) if second else None, cal.closest_pair, cal.p_min)


def by_embedding(tx: Tx, neighbours_, n: int) -> Fingerprint:
    """neighbours_: the nearest registered models to the unknown's embedding (from n evaluations), nearest first.
    "same" only under every distance between distinct models' embeddings from samples of that size."""
    first = neighbours_[0]
    second = neighbours_[1] if len(neighbours_) > 1 else None
    cal = calibrate(tx, sample=max(16, min(int(n), 512)))
    limit = None if cal is None else cal.threshold
    same = limit is not None and first.distance < limit
    return Fingerprint(first.model, "same" if same else "not conclusive", "embedding", 0, None, limit,
                       first.distance, second.model if second else None, None)


def duplicate_of(tx: Tx | None, model_id: int, rates: dict | None = None, names: dict[int, str] | None = None,
                 cal: AnswerCalibration | None = None) -> Fingerprint | None:
    """`register`'s same-model test: the registered model whose answers the model's pass the 1% test against (None:
    none). `rates`: the disagreement of its current answers with the other models, when the caller has it (`names`,
    `cal`: see by_answers)."""
    rows: dict = {"query_id": None, "correct": None}
    if rates is None:
        assert tx is not None, "without a transaction, the caller passes `rates`"
        rows = current_evaluations.of_models(tx, [model_id])
    f = by_answers(tx, rows["query_id"], rows["correct"], exclude={model_id}, rates=rates, names=names, cal=cal)
    return f if f is not None and f.verdict == "same" else None


def duplicate_warning(name: str, f: Fingerprint | None) -> str | None:
    """The warning `register` gives when `duplicate_of` found a model."""
    if f is None:
        return None
    return (f"{name} answers like {f.match}: {f.disagreement:.1%} disagreement on {f.shared_queries} shared queries "
            f"(a distinct model reads that low in at most {f.alpha:.0%} of samples): probably the same model under "
            f"another name")


@dataclass
class CalibrationReport:
    """`fingerprint --calibration`: how each test decides "same"."""
    answers: AnswerCalibration
    answer_thresholds: dict            # shared queries n -> the largest disagreement rate that reads "same"
    embedding: Calibration | None      # at the default sample size (None: too few models to calibrate)


def calibration(tx: Tx, sample: int = 128, draws: int = 3) -> CalibrationReport:

    answers = answer_calibration(tx)
    emb = calibrate(tx, sample=sample, draws=draws)
    if answers.p_min is None and emb is None:
        raise InputError(f"cannot calibrate: needs at least 2 models sharing {MIN_PAIR_SHARED} evaluated queries, "
                         f"or 2 embedded models with {2 * sample} evaluations each")
    return CalibrationReport(answers, answers.thresholds(), emb)


def identify(tx: Tx, path: str, encoder_id: int, min_evaluations: int,
             as_of: str | None = None) -> Fingerprint:
    """`Registry.fingerprint`: the answers test where the file shares queries with registered models, else the
    embedding test. Nothing is written."""
    from registry.answers import neighbours
    from registry.data import import_run

    a = import_run.read_answers(tx, path)
    found = by_answers(tx, a.query_ids, a.correct)
    if found is not None:
        return found
    n = int((~a.is_test).sum()) + len(a.new_texts)
    if n < min_evaluations:   # neither test can speak: say what each needs, not only the embedding's minimum
        raise Conflict(f"{len(a.query_ids) + len(a.new_texts)} answers: the answers test needs {MIN_SHARED} on "
                         f"queries a registered model answered, the embedding {min_evaluations} outside the test "
                         f"split (`registry fingerprint --plan -n 64` lists queries to ask)", file=str(path))
    z, _ = embed.embed_file(tx, path, encoders.load(tx, encoder_id)[0], min_evaluations)
    return by_embedding(tx, neighbours.by_vector(tx, z, 2, encoder_id, as_of=as_of), n)
