"""Routing: query text -> MiniLM vector -> P(correct) for every model with a current embedding under the active
encoder, with the interaction terms (locus/interaction.py: category offsets and nearest-query residuals from the
registry's answers) added to its logit -> a choice (most likely, cost-aware, or cheapest above a threshold), never an
unavailable model.

A route reads the routing state the write path keeps (routing/state.py: read, never fitted here), with traffic's
corrections as last saved (what production outcomes add, as a server routes with them), and scores with it
(`State.scores`); routed texts' vectors come from an LRU and the registry (routing/query_texts.py). What a call
asks for comes in one checked value (routing/decision.py: RouteOptions); what needs the state to check (unknown
model names, missing prices) is checked here.

Evidence (locus/evidence.py): each model's P(correct) is shrunk toward the established models' mean prediction by
how uncertain its embedding is, and a model on probation (too few evaluations) is not chosen unless the caller asks.

Costs: price and size are kept apart. Cost-aware routing (a cost weight or a minimum probability) ranks by `cost`
when every candidate has one; by `params_b` only when asked (`cost_by="params"`), leaving out models without a
parameter count; the decision always says which basis it used (`cost_basis`). A cost weight weighs the cost relative
to the candidates' range (0 the cheapest, 1 the dearest: `relative_cost`), so prices per query, per million tokens or
per hour give the same routes, and a weight near 1 trades a full range of cost against a probability of 1.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from registry.core.errors import Conflict, RegistryError, unknown_model
from registry.core.transaction import Tx
from registry.locus import evidence, text_encoder
from registry.routing import query_texts, state
from registry.routing.decision import Candidate, Decision, RouteOptions, append_log, log_options, log_rows
from registry.routing.state import State


@dataclass
class Rules:
    """The rules of one routing call: its options read against the state (who may be chosen, what a choice costs)."""
    down: set[str]                    # never chosen (marked unavailable, or named by the caller)
    eligible: np.ndarray              # [M] bool: candidates (probation models only when asked; see cost_by)
    cost: np.ndarray | None           # [M] cost per choice on the basis used, or None when cost does not count
    cost_basis: str | None            # "cost" | "params_b" | None
    cost_weight: float | None = None
    min_prob: float | None = None
    note: str | None = None


def rules(st: State, options: RouteOptions) -> Rules:
    """The options (checked where they were made) read against the state: the models they name must be
    registered, and the candidates must have what the cost basis ranks them by."""
    cost_weight, min_prob, cost_by = options.cost_weight, options.min_prob, options.cost_by
    unknown = sorted(n for n in set(options.unavailable) if n not in st.known)
    if unknown:
        raise unknown_model(unknown[0], st.known, " in unavailable models")
    if not st.names:
        raise RegistryError("no model has an embedding under the active encoder: nothing to route to "
                            "(run `registry onboard`)")
    eligible = evidence.candidates(st.evidence, options.include_probation)
    if not eligible.any():
        raise RegistryError(f"every model is on probation (fewer than {st.evidence.minimum} evaluations behind its "
                            f"embedding): route with --include-probation, or lower the minimum with --probation-min N "
                            f"(REGISTRY_PROBATION_MIN)")
    down = set(options.unavailable) | st.down
    if cost_weight is None and min_prob is None:
        return Rules(down, eligible, None, None)
    note = None
    if cost_by == "cost":
        missing = [n for n, e, c in zip(st.names, eligible, st.cost) if e and np.isnan(c)]
        if missing:
            raise Conflict(f"cost-aware routing needs a price for every candidate, and {len(missing)} of "
                             f"{int(eligible.sum())} have none (e.g. {missing[0]}): set `cost` (a `cost` column in a "
                             f"models file, `registry import --models FILE`), or rank by size with --cost-by params")
        cost, basis = st.cost, "cost"
    else:
        sized = ~np.isnan(st.params_b)
        if not (eligible & sized).any():
            raise Conflict("no candidate has a parameter count (params_b): nothing to rank by size")
        left = int((eligible & ~sized).sum())
        if left:
            note = f"cost by params_b: {left} models without a parameter count left out"
        eligible = eligible & sized
        cost, basis = np.nan_to_num(st.params_b), "params_b"
    return Rules(down, eligible, cost, basis, cost_weight, min_prob, note)


def pick(st: State, probs: np.ndarray, allowed: Rules) -> list[tuple[int | None, bool]]:
    """For each query column of probs [M,N]: (chosen model row or None, fallback). The rules rank the eligible
    models; the top-ranked one is taken unless unavailable, then the best-ranked available one (a fallback)."""
    M, N = probs.shape
    avail = allowed.eligible & _up(st, allowed)
    if not avail.any():
        return [(None, True)] * N
    if allowed.min_prob is None:
        rank = ranking(probs, allowed)
        top = np.argmax(rank, axis=0)                                # ties: the lower row, as baselines do
        best = np.argmax(np.where(avail[:, None], rank, -np.inf), axis=0)
        return [(int(b), bool(not avail[t])) for t, b in zip(top, best)]
    out: list[tuple[int | None, bool]] = []
    rows = np.flatnonzero(allowed.eligible)
    assert allowed.cost is not None, "a minimum probability ranks by cost"
    for j in range(N):
        # the cheapest model reaching the threshold (the most likely among equally cheap ones), then the models
        # below it by probability: with none reaching it, the most likely is chosen
        p = probs[rows, j]
        reach = p >= allowed.min_prob
        order = rows[np.lexsort((-p, np.where(reach, allowed.cost[rows], 0.0), ~reach))]
        first_avail = next(i for i in order if avail[i])
        out.append((int(first_avail), bool(not avail[order[0]])))
    return out


def ranking(probs: np.ndarray, allowed: Rules) -> np.ndarray:
    """[M,N] what a cost weight ranks by (without a minimum probability): P(correct) - weight x relative cost, the
    models that are not candidates at -inf."""
    cost = relative_cost(allowed.cost, allowed.eligible) if allowed.cost is not None and allowed.cost_weight else None
    rank = probs - (allowed.cost_weight or 0.0) * (cost[:, None] if cost is not None else 0.0)
    return np.where(allowed.eligible[:, None], rank, -np.inf)


def relative_cost(cost: np.ndarray, eligible: np.ndarray) -> np.ndarray:
    """[M] cost on the eligible candidates' range: 0 the cheapest, 1 the dearest (all 0 when they cost the same), so
    the unit of the prices does not change a route."""
    c = np.asarray(cost, dtype=np.float64)
    seen = c[np.asarray(eligible, dtype=bool)] if np.any(eligible) else c
    lo, hi = float(np.min(seen)), float(np.max(seen))
    return (c - lo) / (hi - lo) if hi > lo else np.zeros_like(c)


def _up(st: State, allowed: Rules) -> np.ndarray:
    """[M] bool: not down (marked unavailable or named by the caller); without any down, no look at the names."""
    if not allowed.down:
        return np.ones(len(st.names), dtype=bool)
    return np.array([n not in allowed.down for n in st.names], dtype=bool)


def decisions(st: State, probs: np.ndarray, raw: np.ndarray, picks, allowed: Rules, *, hashes: list[str],
              truncated: list[bool], top: int | None = None) -> list[Decision]:
    """`top`: list that many candidates, most likely first, and the chosen one wherever it ranks (None or 0:
    every model); the versions are those of the listed models."""
    listed = len(st.names) if not top or top >= len(st.names) else int(top)
    ev = st.evidence
    up = _up(st, allowed)
    skipped = int((ev.probation & ~allowed.eligible).sum())
    served_line = st.served_line()
    out = []
    for j, (row, fallback) in enumerate(picks):
        order = most_likely(probs[:, j], listed)
        if row is not None and row not in order:
            order = np.append(order, row)
        # the listed models' fields as Python values, in numpy first: with hundreds of models, a route must not
        # touch every model in Python
        p = np.round(probs[order, j].astype(np.float64), 6).tolist()
        r = np.round(raw[order, j].astype(np.float64), 6).tolist()
        cands = [Candidate(st.names[i], pk, rk, n, flag, None if c != c else c, None if b != b else b, a, e)
                 for i, pk, rk, n, flag, c, b, a, e in zip(
                     order.tolist(), p, r, ev.n[order].astype(np.int64).tolist(), ev.probation[order].tolist(),
                     st.cost[order].tolist(), st.params_b[order].tolist(), up[order].tolist(),
                     allowed.eligible[order].tolist())]
        notes = [allowed.note] if allowed.note else []
        if row is None:
            notes.append(f"no model available: all {int(allowed.eligible.sum())} candidates are unavailable (marked "
                         f"unavailable or named by the caller)" if allowed.eligible.any() else
                         f"no model available: every model is on probation (under {ev.minimum} evaluations), "
                         f"which routing does not choose unasked (include_probation)")
        elif truncated[j]:
            notes.append(f"query longer than {query_texts.MAX_CHARS} characters: routed on its first "
                         f"{query_texts.MAX_CHARS}")
        if skipped:
            notes.append(f"{skipped} model(s) on probation (under {ev.minimum} evaluations) not considered")
        # (the versions of the listed models: every model's when all are listed)
        used = dict(zip([c.model for c in cands], st.versions[order].tolist()))
        out.append(Decision(None if row is None else st.names[row], fallback, cands, st.encoder_name, used,
                            hashes[j], "; ".join(notes) or None, allowed.cost_basis, served_line))
    return out


def most_likely(p: np.ndarray, n: int) -> np.ndarray:
    """The rows of the n highest of p [M], highest first, ties by row (the first n of a stable sort, without sorting
    all M: a route among ten thousand models lists fifty)."""
    if n >= len(p):
        return np.argsort(-p, kind="stable")
    cut = np.partition(-p, n - 1)[n - 1]
    rows = np.flatnonzero(-p <= cut)                  # (the n highest and whatever ties the n-th)
    return rows[np.lexsort((rows, -p[rows]))][:n]


def decide(st: State, allowed: Rules, qvecs: np.ndarray, hashes: list[str], truncated: list[bool], *,
           top: int | None = None) -> list[Decision]:
    """The decisions for texts already turned into vectors [N,384]: no database, no lock (the server answers from
    its in-memory snapshot with this)."""
    probs, raw = st.scores(qvecs, hashes)
    return decisions(st, probs, raw, pick(st, probs, allowed), allowed, hashes=hashes, truncated=truncated, top=top)


@dataclass
class Routed:
    decisions: list[Decision]
    log_rows: list[tuple]             # routing_log rows of these decisions (`append_log`)
    new_hashes: list[str]             # texts encoded here whose text the log keeps: keep their vectors too
    new_vectors: np.ndarray           # [n,384]


def route_texts(st: State, texts: list[str], vectors, options: RouteOptions) -> Routed:
    """Route texts on a routing state: `vectors(texts, hashes, fresh)` turns them into [N,384] (appending to
    `fresh` the indices it encoded). Writes nothing: the caller logs (`route` in its transaction, the server through
    its writer), as `options.log` says; `options.top`: the candidates each answer lists (`decisions`)."""
    cut, hashes = query_texts.clean_texts(texts)
    if not cut:
        return Routed([], [], [], np.zeros((0, text_encoder.TEXT_DIM), np.float32))
    allowed = rules(st, options)
    fresh: list[int] = []
    q = vectors(cut, hashes, fresh)
    decs = decide(st, allowed, q, hashes, [len(t) > len(c) for t, c in zip(texts, cut)], top=options.top)
    keep = fresh if options.log_text else []
    return Routed(decs, log_rows(decs, cut if options.log_text else None, st.encoder_id,
                                 log_options(options, allowed.down, allowed.cost_basis)),
                  [hashes[i] for i in keep], q[keep])


def route(tx: Tx, texts: list[str], options: RouteOptions, *, reuse_vectors: bool = True, batch_size: int = 64,
          progress: bool = False, probation_min: int | None = None) -> list[Decision]:
    """`Registry.route_batch`: texts -> vectors -> P(correct) -> the rules' choice, logged in the same transaction
    unless `options.log` is false (texts routed for the first time keep their vectors, when their text is logged)."""
    if not texts:
        return []
    if options.unavailable:       # (refused before the state is built, which may take seconds)
        known = [r[0] for r in tx.sql("SELECT name FROM models")]
        unknown = sorted(set(options.unavailable) - set(known))
        if unknown:
            raise unknown_model(unknown[0], known, " in unavailable models")
    st = state.read(tx, probation_min)
    if st is None:
        raise RegistryError("the registry has no current routing state (a write kept none: the facade's route "
                            "builds it first; see routing/fit.py)")
    st = state.corrected(tx, st)        # traffic's corrections, as a server's snapshot adds them
    recent = query_texts.recent_vectors(tx)
    r = route_texts(st, texts,
                    lambda cut, hashes, fresh: query_texts.query_vectors(
                        recent, cut, hashes, tx=tx, reuse=reuse_vectors, batch_size=batch_size, progress=progress,
                        fresh=fresh),
                    options)
    if options.log:
        if reuse_vectors:
            query_texts.keep_vectors(tx, r.new_hashes, r.new_vectors)
        append_log(tx, r.log_rows)
    return r.decisions
