"""Portfolios: a few models that cover the embedding space (`Registry.portfolio`).

Two methods: k-center (farthest-first: each new member is the eligible model farthest from every member so far;
minimises the coverage radius) and k-medoids (FasterPAM from the `kmedoids` package; minimises the summed distance).
k-center keeps one distance per model, O(n*k) time and O(n) memory, so it runs on 100,000 models without a distance
matrix. k-medoids needs an n*n matrix; past `KMEDOIDS_SAMPLE` models it works CLARA-style: FasterPAM on
`CLARA_DRAWS` random samples of that size (required members always in), each result scored on every model, the best
kept.

Constraints: `exclude`, `max_params` and `max_cost` remove models from the *eligible* members (a model whose
params or cost is unknown is not eligible under that budget: it cannot be shown to fit); `require` forces members in.
Every model still counts as a point to cover: clusters and radius are over the whole pool.

A portfolio's routing accuracy is routing as served among its members, scored as `registry evaluate` scores it
(routing/accuracy.py, passed in by the caller as `accuracy(member names)`; no members: the whole pool routing may
choose, `evaluate`'s `served` hit@1): one figure on the CLI, over HTTP and on the web page.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from registry.answers.geometry import Pool, pairwise
from registry.core.errors import Conflict, InputError, unknown_model

KMEDOIDS_SAMPLE = 5000
CLARA_DRAWS = 3
REFINE_MAX = 1000      # constrained swap refinement runs on pools (or samples) up to this size


@dataclass
class Portfolio:
    models: list[str]
    k: int
    method: str
    radius: float                                     # largest distance from any model to its nearest member
    clusters: dict[str, list[str]] = field(default_factory=dict)   # member -> models it covers (itself first)
    share_of_pool: float | None = None                # portfolio routing accuracy / the pool's (`scored`)
    accuracy: float | None = None                     # routing accuracy as served on test among the members
    pool_accuracy: float | None = None                # the same over every model routing may choose
    note: str | None = None
    gains: dict[str, float] | None = None             # routing method: member -> what adding it (in order) added to
                                                      #   the mean over validation queries of max predicted P(correct)


def eligibility(p: Pool, meta: dict[str, tuple], exclude=(), require=(), max_params=None, max_cost=None):
    """(eligible mask [M], required indices) after checking every name; raises on names or budgets that cannot work."""
    row = {n: i for i, n in enumerate(p.names)}
    for label, names in (("--require", require), ("--exclude", exclude)):
        for n in names:
            if n not in row:
                raise unknown_model(n, p.names, f" (in {label}; or it has no embedding yet)")
    clash = set(require) & set(exclude)
    if clash:
        raise InputError(f"{sorted(clash)[0]!r} is both required and excluded")
    ok = np.ones(len(p.names), dtype=bool)
    ok[[row[n] for n in exclude]] = False
    for label, col, budget in (("--max-params", 0, max_params), ("--max-cost", 1, max_cost)):
        if budget is None:
            continue
        vals = np.array([np.nan if meta.get(n, (None, None))[col] is None else meta[n][col] for n in p.names])
        fits = vals <= budget                                               # NaN (unknown) never fits
        if not (fits & ok).any() and not require:
            known = vals[~np.isnan(vals)]
            smallest = f"the smallest known is {known.min():g}" if len(known) else "no model has that field set"
            raise Conflict(f"no model fits {label} {budget:g} ({smallest})")
        ok &= fits
    req = np.array([row[n] for n in require], dtype=np.int64)
    ok[req] = True
    return ok, req


def _dist_to(vectors: np.ndarray, sq: np.ndarray, i: int) -> np.ndarray:
    """Distances [n] from every vector to vector i, without an [n,128] temporary."""
    return np.sqrt(np.maximum(sq + sq[i] - 2.0 * (vectors @ vectors[i]), 0.0))


def cover(vectors: np.ndarray, members) -> tuple[np.ndarray, np.ndarray]:
    """(index of the nearest member [n], distance to it [n]), one member at a time: O(n) memory."""
    sq = (vectors.astype(np.float64) ** 2).sum(1)
    best = np.full(len(vectors), np.inf)
    label = np.zeros(len(vectors), dtype=np.int64)
    for j, m in enumerate(members):
        d = _dist_to(vectors, sq, int(m))
        closer = d < best
        best[closer], label[closer] = d[closer], j
    return label, best


def kcenter(vectors: np.ndarray, k: int, eligible: np.ndarray, required: np.ndarray) -> list[int]:
    vectors = vectors.astype(np.float64)
    sq = (vectors ** 2).sum(1)
    members = [int(r) for r in required]
    if not members:  # start from the eligible model nearest the centre of the pool: deterministic and central
        centre = vectors.mean(0)
        members = [int(np.argmin(np.where(eligible, ((vectors - centre) ** 2).sum(1), np.inf)))]
    mind = np.full(len(vectors), np.inf)
    for m in members:
        mind = np.minimum(mind, _dist_to(vectors, sq, m))
    while len(members) < k:
        nxt = int(np.argmax(np.where(eligible, mind, -1.0)))                # members have mind 0, never re-picked
        members.append(nxt)
        mind = np.minimum(mind, _dist_to(vectors, sq, nxt))
    return members[:k]


def _refine(D: np.ndarray, members: list[int], fixed: set[int], eligible: np.ndarray) -> list[int]:
    """Best-improvement swaps of the non-fixed members with eligible models (PAM's swap step, with constraints)."""
    members = list(members)
    cands = np.flatnonzero(eligible)
    while True:
        current = D[:, members].min(1).sum()
        best_gain, best_swap = 1e-9, None
        for pos, m in enumerate(members):
            if m in fixed:
                continue
            others = members[:pos] + members[pos + 1:]
            base = D[:, others].min(1) if others else np.full(len(D), np.inf)
            loss = np.minimum(base[:, None], D[:, cands]).sum(0)            # [n_cands]
            loss[np.isin(cands, members)] = np.inf
            j = int(np.argmin(loss))
            if current - loss[j] > best_gain:
                best_gain, best_swap = current - loss[j], (pos, int(cands[j]))
        if best_swap is None:
            return members
        members[best_swap[0]] = best_swap[1]


RESTARTS = 8  # random FasterPAM starts beside BUILD (small pools only)


def _kmedoids_small(vectors: np.ndarray, k: int, eligible: np.ndarray, required: np.ndarray, seed: int) -> list[int]:
    import kmedoids

    D = pairwise(vectors)
    cands = np.flatnonzero(eligible)
    sub = np.ascontiguousarray(D[np.ix_(cands, cands)])
    assert sub.shape[0] == sub.shape[1] and sub.shape[0] >= k   # FasterPAM panics (uncatchable) on a bad shape
    # FasterPAM is a local search: BUILD plus a few random starts, keeping the lowest loss, for a small price
    runs = [kmedoids.fasterpam(sub, k, init="build", random_state=seed, n_cpu=1)]
    runs += [kmedoids.fasterpam(sub, k, init="random", random_state=seed + 1 + r, n_cpu=1) for r in range(RESTARTS)]
    members = [int(cands[m]) for m in min(runs, key=lambda r: r.loss).medoids]
    fixed = {int(r) for r in required}
    for r in fixed - set(members):   # force each required model in, in place of the free member nearest to it
        free = [m for m in members if m not in fixed]
        members[members.index(min(free, key=lambda m: D[r, m]))] = r
    if (fixed or not eligible.all()) and len(vectors) <= REFINE_MAX:
        members = _refine(D, members, fixed, eligible)      # FasterPAM saw neither the fixed members nor all points
    return members


def kmedoids_members(vectors: np.ndarray, k: int, eligible: np.ndarray, required: np.ndarray,
                     seed: int = 0) -> tuple[list[int], str | None]:
    n = len(vectors)
    if n <= KMEDOIDS_SAMPLE:
        return _kmedoids_small(vectors, k, eligible, required, seed), None
    rng = np.random.default_rng(seed)
    pool_idx = np.setdiff1d(np.flatnonzero(eligible), required)
    best, best_cost = None, np.inf
    for draw in range(CLARA_DRAWS):
        take = rng.choice(pool_idx, KMEDOIDS_SAMPLE - len(required), replace=False)
        idx = np.concatenate([required, np.sort(take)]).astype(np.int64)
        local = _kmedoids_small(vectors[idx], k, np.ones(len(idx), bool), np.arange(len(required)), seed + draw)
        members = [int(idx[m]) for m in local]
        cost = cover(vectors, members)[1].sum()
        if cost < best_cost:
            best, best_cost = members, cost
    assert best is not None, "each draw's total distance is finite"
    return best, (f"k-medoids on {n} models: CLARA, FasterPAM on {CLARA_DRAWS} random samples of "
                  f"{KMEDOIDS_SAMPLE}, best total distance over all models kept")


METHODS = ("kmedoids", "kcenter", "routing")


def routing_members(value: np.ndarray, k: int, eligible: np.ndarray, required: np.ndarray, *,
                    fill: bool = True) -> list[int]:
    """Greedy by routing value: start from the required models, then add the eligible model that raises the pool's
    predicted routing accuracy most, mean over queries of max P(correct) among the members (value [M,N]: predicted
    P(correct) on the selection queries; no answers are used). Covering methods put two close but complementary
    models (gpt-4o and gemini-1.5-pro) in one cluster; this keeps both when the router needs both. `fill=False`
    stops before k once no eligible model adds anything (the router would never choose it)."""
    members = [int(r) for r in required]
    best = value[members].max(axis=0) if members else np.zeros(value.shape[1])
    while len(members) < k:
        gains = np.where(eligible, np.maximum(value, best[None]).mean(axis=1), -np.inf)
        gains[members] = -np.inf
        m = int(np.argmax(gains))
        if not fill and members and gains[m] - best.mean() <= NO_GAIN:
            break
        members.append(m)
        best = np.maximum(best, value[m])
    return members


NO_GAIN = 1e-12   # a member whose gain is at most this is never the router's choice on a selection query


def routing_gains(value: np.ndarray, members) -> list[float]:
    """What each member adds, in order, to the mean over queries of max predicted P(correct) among the members."""
    best, total, out = np.zeros(value.shape[1]), 0.0, []
    for m in members:
        best = np.maximum(best, value[m])
        out.append(float(best.mean()) - total)
        total = float(best.mean())
    return out


def select(p: Pool, k: int, method: str, eligible: np.ndarray, required: np.ndarray, *,
           seed: int = 0, value: np.ndarray | None = None, fill: bool = True) -> tuple[list[int], str | None]:
    if method not in METHODS:
        raise InputError(f"unknown method {method!r}: use {', '.join(METHODS)}")
    n_ok = int(eligible.sum())
    if k < 1:
        raise InputError(f"k must be at least 1, got {k}")
    if k > n_ok:
        raise Conflict(f"k={k} is larger than the pool: {n_ok} eligible models"
                         + (f" (of {len(p.names)})" if n_ok < len(p.names) else ""))
    if k < len(required):
        raise InputError(f"k={k} is smaller than the {len(required)} required models")
    if method == "kcenter":
        return kcenter(p.vectors, k, eligible, required), None
    if method == "routing":
        assert value is not None, "routing chooses by predicted routing value (`routing_value`)"
        members = routing_members(value, k, eligible, required, fill=fill)
        note = "greedy by predicted routing accuracy on the validation queries"
        if len(members) < k:
            note += (f"; stopped at {len(members)} of k={k}: no other eligible model adds routing value (fill, "
                     f"--fill, for exactly k)")
        return members, note
    return kmedoids_members(p.vectors, k, eligible, required, seed)


def describe(p: Pool, members: list[int], method: str, note: str | None = None,
             value: np.ndarray | None = None) -> Portfolio:
    label, dist = cover(p.vectors, members)
    clusters = {p.names[m]: [p.names[m]] for m in members}
    for i in np.argsort(dist, kind="stable"):           # nearest first within each cluster
        if int(i) not in members:
            clusters[p.names[members[label[i]]]].append(p.names[i])
    gains = None
    if method == "routing" and value is not None:
        gains = {p.names[m]: round(g, 6) for m, g in zip(members, routing_gains(value, members))}
    return Portfolio([p.names[m] for m in members], len(members), method, round(float(dist.max()), 4), clusters,
                     note=note, gains=gains)


def smallest_reaching(p: Pool, method: str, eligible, required, *, accuracy, target: float, seed: int = 0,
                      value: np.ndarray | None = None, at_most: int | None = None) -> Portfolio:
    """The smallest k (up to `at_most`) whose routing accuracy (`accuracy(names)`, routing as served among them)
    reaches `target` times the whole pool's (`accuracy(None)`: every model routing may choose)."""
    if not 0 < target <= 1:
        raise InputError(f"--target must be a share in (0, 1], got {target}")
    if at_most is not None and at_most < max(1, len(required)):
        raise InputError(f"k={at_most} is fewer than the {max(1, len(required))} models a portfolio must hold")
    full = accuracy(None)
    if full is None:
        raise InputError("no test queries with evaluations: --target needs a test split (query_splits)")
    largest = int(eligible.sum()) if at_most is None else min(at_most, int(eligible.sum()))
    for k in range(max(1, len(required)), largest + 1):
        members, note = select(p, k, method, eligible, required, seed=seed, value=value)
        acc = accuracy([p.names[m] for m in members])
        if acc >= target * full - 1e-12:
            break
    else:
        within = " of" if at_most is None else f" of at most {at_most}"
        note = f"no portfolio{within} eligible models reaches {target:g} of the pool; the largest is shown"
    out = describe(p, members, method, note, value)
    scored(out, accuracy)
    return out


def scored(out: Portfolio, accuracy) -> Portfolio:
    """The portfolio with its routing accuracy as served on test among its members, the pool's, and the share it
    keeps (`accuracy`: see the module's note; None, or no test split: left unset). The one place these are set:
    every portfolio the CLI, HTTP and the page show has them, with a target or without."""
    full = None if accuracy is None else accuracy(None)
    if full is not None:
        acc = accuracy(out.models)
        out.accuracy, out.pool_accuracy = round(acc, 4), round(full, 4)
        out.share_of_pool = round(acc / full, 4) if full else None
    return out


DEFAULT_METHOD = "routing"    # the CLI, HTTP and the page alike; kmedoids where there is no validation split
DEFAULT_K = 5                 # the size asked for when neither k nor a target is given: the CLI, HTTP, the page


def routing_value(tx, p: Pool, method: str | None) -> tuple[str, np.ndarray | None, str | None]:
    """(method, predicted P(correct) [M, val] for the routing method, a note): no method given means routing, or
    kmedoids (said in the note) when the registry has no validation split to choose on."""
    from registry.answers import geometry

    if method not in (None, "routing"):
        return method, None, None
    val = np.array([r[0] for r in tx.sql("SELECT query_id FROM query_splits WHERE split = 'val' ORDER BY 1")],
                   dtype=np.int64)
    if not len(val):
        if method is None:
            return "kmedoids", None, "no validation split to choose by routing value on: covered by kmedoids"
        raise InputError("--method routing chooses on the validation split: the registry has none "
                         "(`registry draw-splits`)")
    return "routing", geometry.predicted(tx, p.encoder_id, p.vectors, val), None


def joined(*notes) -> str | None:
    return "; ".join(n for n in notes if n) or None


def answer(tx, p: Pool, k: int | None = None, *, method: str | None = None, max_params: float | None = None,
           max_cost: float | None = None, require=(), exclude=(), target: float | None = None, seed: int = 0,
           probation=frozenset(), fill: bool = False, accuracy=None):
    """`Registry.portfolio`: k members by `method` (default routing; neither k nor a target: DEFAULT_K), or with
    `target` the smallest k (with both, at most k) whose routing as served on the test split (`accuracy`, see the
    module's note) keeps that share of the pool's. `probation`: models never chosen as members unless required
    (embedded from too few evaluations); they are still covered. By routing value, the members stop before k once
    none adds anything, unless `fill`."""
    if k is None and target is None:
        k = DEFAULT_K
    meta = {n: (pb, c) for n, pb, c in tx.sql("SELECT name, params_b, cost FROM models")}
    ok, req = eligibility(p, meta, exclude, require, max_params, max_cost)
    left_out = sorted(set(probation) - set(require), key=str.casefold)
    ok[[p.names.index(n) for n in left_out]] = False
    if left_out and (not ok.any() or (k is not None and k > ok.sum())):
        raise Conflict(("no model is eligible" if k is None else f"k={k} is larger than the {int(ok.sum())} "
                          f"eligible models") + f": {len(left_out)} on probation (too few evaluations) are left out; "
                         f"--include-probation to allow them")
    # routing chooses on the validation queries' predictions; test answers only score it
    method, value, fallback_note = routing_value(tx, p, method)
    if target is None:
        assert k is not None     # (DEFAULT_K, above)
        members, note = select(p, k, method, ok, req, seed=seed, value=value, fill=fill)
        out = scored(describe(p, members, method, note, value), accuracy)
    else:
        if accuracy is None:
            raise InputError("a target share needs routing's accuracy on the test split")
        out = smallest_reaching(p, method, ok, req, accuracy=accuracy, target=target, seed=seed, value=value,
                                at_most=k)
    said = None
    if left_out:
        said = (f"{len(left_out)} model(s) on probation (too few evaluations) not chosen as members: "
                f"{', '.join(left_out[:5])}{', ...' if len(left_out) > 5 else ''}")
    out.note = joined(fallback_note, out.note, said)
    return out

