"""Which registered models are nearest, and how often they really disagree. The core is `by_vector` (one vector in,
the k nearest current embeddings out, from the FAISS index); by name and by an evaluations file call it."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from registry.answers import catalog
from registry.core.errors import InputError, NotFound, unknown_model
from registry.core.lazy import LazyModule
from registry.core.transaction import Tx
from registry.data import current_evaluations
from registry.embedding import MIN_EVALUATIONS, answer_index, answer_store, encoders, index

embed = LazyModule("registry.embedding.embed")   # (only an evaluations file is embedded here)


@dataclass
class Neighbour:
    model: str
    distance: float
    disagreement: float | None = None   # share of shared evaluated queries where the two differ
    shared_queries: int | None = None
    embedded_from: int | None = None    # evaluations behind its embedding (`similar` fills it in)
    combined: float | None = None       # `similar`'s ranking distance: the embedding's and the shared answers'
    placed_by: str | None = None        # which evidence placed it (`similar`): embedding | answers | both, or
    #                                     "few answers" (known from under probation_min: placed pessimistically)
    alias: bool = False                 # the two are recorded as one model under two names (`similar`)
    error_correlation: float | None = None   # how much they err together beyond difficulty (`similar`)


# `similar` ranks its candidates only: the CANDIDATES nearest by embedding and the CANDIDATES nearest by the answer
# index's sketch (every other model where the pool holds at most twice as many). Among ten thousand models every
# model's answers on the query model's questions are 10^8; the union held 99 of the exact top 5's 100 over 20 query
# models (bench/similar_recall.py), the embedding's nearest 256 alone three in four.
CANDIDATES = 64


def candidates(vi: index.VectorIndex, vector, answers: tuple | None, exclude: set[str],
               scale: answer_index.AnswerIndex) -> list[int] | None:
    """The ids of the models whose answers `similar` reads (see CANDIDATES), or None: every model."""
    if vi.size - len(exclude) <= 2 * CANDIDATES:
        return None
    _, ids = vi.search(np.asarray(vector)[None, :], CANDIDATES + len(exclude))
    near = [int(i) for i in ids[0] if i >= 0 and vi.names[int(i)] not in exclude][:CANDIDATES]
    if answers is not None:
        skip = {i for i in (vi.id_of(name) for name in exclude) if i is not None}
        near += [i for i in scale.nearest_by_sketch(answers[0], answers[1], CANDIDATES, skip) if i in vi.names]
    return list(dict.fromkeys(near))


def by_vector(tx: Tx | None, vector, k: int, encoder_id: int, *, as_of: str | None = None,
              exclude: set[str] | None = None, answers: tuple | None = None,
              vi: index.VectorIndex | None = None,
              rates: Mapping[int, tuple[int, float] | tuple[int, float, float | None]] | None = None,
              errors: bool = False, before_batch: int | None = None, among: list[int] | None = None,
              scale: answer_index.AnswerIndex | None = None) -> list[Neighbour]:
    """The k nearest current embeddings to one vector (all of them if the pool is smaller; `among`: of those model
    ids only), leaving out `exclude`; with `answers` (query ids, 0/1), each neighbour's disagreement with them on
    the queries both answered (`rates`: current_evaluations.disagreement of those answers, when the caller has it
    already), and with `errors` their error correlation too (answer_index.errs_alike, from `scale`, the answer index;
    `before_batch`: the answers as they stood then)."""
    if vi is None:
        assert tx is not None, "without a transaction, the caller passes the index (`vi`)"
        vi = index.get(tx, encoder_id, as_of)
    if vi.size == 0:
        raise InputError("the registry has no embedded models yet: import evaluations first (`registry import`)")
    if k <= 0:
        raise InputError(f"k must be at least 1, got {k}")
    exclude = exclude or set()
    if among is not None:
        pick = [i for i in among if vi.names[i] not in exclude]
        d = np.linalg.norm(vi.index.reconstruct_batch(np.asarray(pick, dtype=np.int64)) - np.asarray(vector)[None, :],
                           axis=1) if pick else np.zeros(0)
        found = sorted(zip(pick, d.tolist()), key=lambda t: (t[1], t[0]))[:k]
    else:
        dist, ids = vi.search(np.asarray(vector)[None, :], min(vi.size, k + len(exclude)))
        found = [(int(i), float(d)) for d, i in zip(dist[0], ids[0])
                 if i >= 0 and vi.names[int(i)] not in exclude][:k]
    out = [Neighbour(vi.names[i], round(d, 4)) for i, d in found]
    if (answers is not None or rates is not None) and out:
        if rates is None:
            assert tx is not None and answers is not None, "without a transaction, the caller passes `rates`"
            others = [i for i, _ in found]
            rates = ((scale or answer_store.get(tx, before_batch)).agreement(answers[0], answers[1], others)
                     if errors else current_evaluations.disagreement(tx, answers[0], answers[1], others))
        for (i, _), n in zip(found, out):
            if i in rates:
                r = rates[i]
                n.shared_queries, n.disagreement = r[0], round(r[1], 4)
                if len(r) > 2 and r[2] is not None:
                    n.error_correlation = round(r[2], 4)
    return out


def similar(tx: Tx, *, model: str | None, evals: str | None, k: int, as_of: str | None,
            min_evaluations: int, probation_min: int) -> list[Neighbour]:
    """`registry similar`: the nearest models to a registered one, or to an evaluations file's results (read, never
    written), each with the evaluations behind its embedding, ranked by `rank` (how much evidence each pair has
    decides what places it)."""
    encoder_id = encoders.require_active(tx, as_of)
    vi = index.get(tx, encoder_id, as_of)
    then = current_evaluations.first_batch_after(tx, as_of)     # the answers as they stood at `as_of`
    own_n: int | None
    if model is not None:
        vector = vi.vector_of(model)
        if vector is None:
            vector, _ = vector_of(tx, model, encoder_id, as_of)
        own = vi.id_of(model) or tx.sql("SELECT id FROM models WHERE name = ?", [model])[0][0]
        rows = current_evaluations.of_models(tx, [own], then)
        answers = (rows["query_id"], rows["correct"])
    else:
        vector, a = embed.embed_file(tx, evals, encoders.load(tx, encoder_id)[0], min_evaluations)
        answers, own_n = (a.query_ids, a.correct), int((~a.is_test).sum()) + len(a.new_texts)
    if k <= 0:
        raise InputError(f"k must be at least 1, got {k}")
    scale = answer_store.get(tx, then)
    among = candidates(vi, vector, answers, {model} if model else set(), scale)
    near = by_vector(tx, vector, vi.size, encoder_id, as_of=as_of, exclude={model} if model else None,
                     answers=answers, vi=vi, errors=True, before_batch=then, among=among, scale=scale)
    wanted = [x.model for x in near] + ([model] if model is not None else [])     # (not all ten thousand)
    n = {name: v[1] for name, v in catalog.current_versions(tx, encoder_id, as_of, names=wanted).items()}
    if model is not None:                # how surely the model itself is placed: the evaluations behind it
        own_n = n.get(model)
    return ranked(near, n, own_n, k, model=model, vi=vi, probation_min=probation_min,
                  kin=kin_by_sql(tx, vi, answers, then), groups=catalog.alias_groups(tx) if model is not None else {},
                  own_id=own if model is not None else None)


def ranked(near: list[Neighbour], embedded_from: dict[str, int], own_n: int | None, k: int, *, model: str | None,
           vi: index.VectorIndex, probation_min: int, kin, groups: dict, own_id: int | None = None) -> list[Neighbour]:
    """`similar`'s answer from what it read: every other model with its rates (`by_vector`), the evaluations
    behind each embedding, the query model's own (`own_n`), `rank`'s `kin` and the alias groups
    (catalog.alias_groups). A running server reads the same from memory (serve/serving.py)."""
    for x in near:
        x.embedded_from = embedded_from.get(x.model)
    out = rank(near, own_n, probation_min, kin)[:k]
    # (an alias is not in the index, being its model under another name: its id comes from the registry, `own_id`)
    own = own_id if own_id is not None else vi.id_of(model) if model is not None else None
    root = groups.get(own, own)
    for x in out:
        x.alias = model is not None and groups.get(vi.id_of(x.model), vi.id_of(x.model)) == root
    return out


# What each list of nearest models ranks by, said with it (CLI, --json, HTTP, pages): `similar` and a registration's
# table read the answers two models share; a fallback chain and a version diff, the embedding alone. So the nearest
# model can differ between them: each says which rule made its order.
RANKED_BY_ANSWERS = ("shared answers where two models have enough (how alike they err, else how often they "
                     "disagree), else embedding distance; 'ranked at' is the figure ranked by; in a pool of more than "
                     f"{2 * CANDIDATES} models, among the {CANDIDATES} nearest by embedding and the {CANDIDATES} "
                     "whose answers on a sample of questions err most alike (bench/similar_recall.py: 99% of the "
                     "exact top 5 among 10,031 models)")
RANKED_BY_EMBEDDING = "embedding distance alone (the answers two models share are not read)"


def similar_notes(out: list[Neighbour], k: int, model: str | None, own: int | None,
                  probation_min: int) -> list[str]:
    """What `similar`'s answer says beside its rows (the CLI and the model page): fewer than k, a query model or
    neighbours on probation, and why the first is not the nearest by embedding. `own`: the evaluations behind the
    query model's embedding."""
    from registry.locus.evidence import on_probation

    notes = [f"k={k}, but the pool has {len(out)} other embedded models: all of them shown"] if len(out) < k else []
    if own is not None and on_probation(own, probation_min):
        notes.append(f"{model} is embedded from {own} evaluations (on probation below {probation_min}): where it "
                     f"sits, and so its nearest models, is uncertain at this size")
    weak = [x.model for x in out if x.embedded_from is not None and on_probation(x.embedded_from, probation_min)]
    if weak:
        notes.append(f"on probation (embedded from fewer than {probation_min} evaluations, placed less surely): "
                     + ", ".join(weak))
    if out and min(out, key=lambda x: x.distance) is not out[0]:
        nearest = min(out, key=lambda x: x.distance)
        notes.append(f"{nearest.model} is nearest by embedding ({nearest.distance:.3f}), {out[0].model} by "
                     f"{'the answers' if out[0].placed_by != 'embedding' else 'the ranking'}"
                     + (f" (disagreement {out[0].disagreement:.3f} on {out[0].shared_queries} shared)"
                        if out[0].disagreement is not None else "")
                     + ": where two models share answers, those place them (a fallback chain and a version diff "
                       "rank by the embedding alone)")
    if any(x.placed_by == "few answers" for x in out):
        notes.append("'few answers': known from too few answers to place by its embedding; listed below every "
                     "established model that disagrees no more on its questions than its disagreement's upper 95% "
                     "bound")
    return notes


MIN_PAIR_SHARED = 100        # a pair's disagreement is fitted only from this many shared answers
MIN_SHARED = 32              # shared answers that weigh as much as the embedding (the fingerprint's minimum too)


def kin_by_sql(tx: Tx, vi: index.VectorIndex, answers: tuple, before_batch: int | None = None):
    """`rank`'s `kin` for the answers (query ids, 0/1) of the query model: each other model's disagreement with them
    on one neighbour's own questions (a read of that neighbour's questions and the others' answers there)."""
    ids = {name: i for i, name in vi.names.items()}

    def kin(x: Neighbour, others: list[str]) -> dict[str, float]:
        mine = current_evaluations.of_models(tx, [ids[x.model]], before_batch)["query_id"]
        on = np.isin(answers[0], mine)
        rates = current_evaluations.disagreement(tx, answers[0][on], answers[1][on], [ids[o] for o in others])
        return {vi.names[i]: r for i, (_, r) in rates.items()}
    return kin


def of_registered(tx: Tx, name: str, k: int, encoder_id: int, *, answers: tuple,
                  own_evaluations: int, probation_min: int, rates: dict | None = None) -> list[Neighbour]:
    """A registration's table: a registered model's k nearest by `similar`'s rule (`rank`), its answers
    (query ids, 0/1) measured against every other model's (`rates`: current_evaluations.disagreement of them, where the
    caller has it; an established model's are read with their error correlation, as `similar` reads them)."""
    vi = index.get(tx, encoder_id)
    vector = vi.vector_of(name)
    if vector is None:
        vector, _ = vector_of(tx, name, encoder_id)
    established = own_evaluations >= probation_min
    scale = answer_store.get(tx)
    near = by_vector(tx, vector, vi.size, encoder_id, exclude={name}, answers=answers, vi=vi,
                     rates=None if established else rates, errors=established,
                     among=candidates(vi, vector, answers, {name}, scale), scale=scale)
    n = catalog.current_versions(tx, encoder_id)
    return placed(near, {m: v[1] for m, v in n.items()}, own_evaluations, probation_min, k,
                  kin_by_sql(tx, vi, answers))


def placed(near: list[Neighbour], embedded_from: dict[str, int], own_evaluations: int | None, probation_min: int,
           k: int, kin: Callable[[Neighbour, list[str]], dict[str, float]] | None = None) -> list[Neighbour]:
    """`rank` of neighbours (every other model, with their answers' rates), the first k, each with the evaluations
    behind its embedding."""
    for x in near:
        x.embedded_from = embedded_from.get(x.model)
    return rank(near, own_evaluations, probation_min, kin)[:k]


Z = 1.96          # a model known from few answers is placed by its disagreement's upper 95% bound (Wilson)


def upper_rate(rate: float, n: int, z: float = Z) -> float:
    """The Wilson score interval's upper end for a rate seen on n answers (1 with none)."""
    if not n:
        return 1.0
    d = 1 + z * z / n
    centre = rate + z * z / (2 * n)
    half = z * np.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n))
    return float(min(1.0, (centre + half) / d))


def rank(near: list[Neighbour], own_evaluations: int | None, probation_min: int,
         kin: Callable[[Neighbour, list[str]], dict[str, float]] | None = None) -> list[Neighbour]:
    """One ranking for `similar` and a registration's table, in which evidence counts.

    A model known from few answers (under `probation_min` behind its embedding, or a file's results) is placed by
    what those answers can support: the upper 95% bound of its disagreement rate (`upper_rate`), never its
    embedding, which a handful of answers place badly.
    - The query model itself so known: every neighbour by that bound on the answers they share (`combined` is the
      bound), the embedding breaking ties; neighbours sharing none come last.
    - An established query model: established neighbours by `combined` (`rank_established`); each neighbour known
      from few answers is placed below every established one that disagrees with the query model on that
      neighbour's own questions no more than its bound (`kin`: {name: rate on those questions}); so a coin flip or
      a constant answerer sits below the model's real relatives, and a 128-answer copy of a model right below it.
      Its `combined` is that of the model above it (the first's, placed first): where it ranks, on the list's scale.
    """
    if (own_evaluations or 0) < probation_min:
        return _rank_by_answers(near)
    few = [(x.embedded_from or 0) < probation_min for x in near]
    ordered = rank_established([x for x, f in zip(near, few) if not f])
    unsure = [x for x, f in zip(near, few) if f]
    if not unsure:
        return ordered
    slots: list[tuple[int, float, float, Neighbour]] = []
    for x in unsure:
        if not x.shared_queries:                 # nothing to place it by: after every placed model
            x.placed_by = "embedding"
            slots.append((len(ordered) + 1, 1.0, x.distance, x))
            continue
        bound = _bound(x)
        rates = kin(x, [o.model for o in ordered]) if kin is not None and ordered else {}
        after = max((i + 1 for i, o in enumerate(ordered) if rates.get(o.model, 1.0) <= bound), default=0)
        x.placed_by = "few answers"
        slots.append((after, bound, x.distance, x))
    slots.sort(key=lambda t: (t[0], t[1], t[2], t[3].model))
    out, i = [], 0
    for slot, _, _, x in slots:
        while i < min(slot, len(ordered)):
            out.append(ordered[i])
            i += 1
        above = out[-1] if out else (ordered[0] if ordered else None)
        x.combined = above.combined if above is not None and x is not above else x.distance
        out.append(x)
    return out + ordered[i:]


def _bound(x: Neighbour) -> float:
    """`upper_rate` of a neighbour's disagreement on the answers it shares."""
    assert x.disagreement is not None and x.shared_queries is not None, "a rate comes with its shared answers"
    return upper_rate(x.disagreement, x.shared_queries)


def _rank_by_answers(near: list[Neighbour]) -> list[Neighbour]:
    for x in near:
        if x.shared_queries:
            x.combined, x.placed_by = round(_bound(x), 4), "answers"
        else:
            x.combined, x.placed_by = x.distance, "embedding"
    return sorted(near, key=lambda x: (not x.shared_queries, x.combined, x.distance, x.model))


def rank_established(near: list[Neighbour]) -> list[Neighbour]:
    """Established neighbours of an established model by `combined`: the embedding distance corrected by the
    answers the two share (n of them, weighted n / (n + MIN_SHARED) against the embedding's; with none shared, the
    embedding alone). Where the two share MIN_PAIR_SHARED answers, their error correlation places them, read as a
    distance on this list's own line (`error_line`): mistakes made together beyond difficulty tell a family apart
    better than the embedding or the raw rate."""
    slope = error_line(near)
    for x in near:
        x.combined, x.placed_by = x.distance, "embedding"
        known = _errors_known(x)
        if slope is None or known is None:
            continue
        shared, correlation = known
        w = shared / (shared + MIN_SHARED)
        x.combined = round(w * slope * (1 - correlation) + (1 - w) * x.distance, 4)
        x.placed_by = "answers" if w >= 0.75 else "both"
    return sorted(near, key=lambda x: (x.combined, x.distance, x.model))


def _errors_known(x: Neighbour) -> tuple[int, float] | None:
    """(shared answers, error correlation) where the pair's error correlation can place it, else None."""
    if x.error_correlation is None or x.shared_queries is None or x.shared_queries < MIN_PAIR_SHARED:
        return None
    return x.shared_queries, x.error_correlation


def error_line(near: list[Neighbour]) -> float | None:
    """The embedding distance as a line through the origin in 1 - error correlation, over these neighbours (two
    models that err together always sit together); None under three of them with both."""
    pairs = [(1 - known[1], x.distance) for x in near if (known := _errors_known(x)) is not None]
    if len(pairs) < 3:
        return None
    uu = sum(u * u for u, _ in pairs)
    return sum(u * d for u, d in pairs) / uu if uu > 0 else None


def of_model(tx: Tx, name: str, k: int, encoder_id: int, *, as_of: str | None = None,
             exclude: set[str] | None = None, rates: dict | None = None) -> list[Neighbour]:
    """The k nearest other models to a registered one, with their disagreement with its current evaluations."""
    vi = index.get(tx, encoder_id, as_of)
    vector = vi.vector_of(name)                                  # no SQL when indexed
    if vector is None:
        vector, _ = vector_of(tx, name, encoder_id, as_of)
    return of_vector_as_model(tx, name, vector, k, encoder_id, as_of=as_of, exclude=exclude, vi=vi,
                              rates=rates)


def vector_of(tx: Tx, name: str, encoder_id: int, as_of: str | None = None):
    """A model's newest embedding under an encoder (as it stood at `as_of`): (vector, version)."""
    when = "AND v.created <= ?::TIMESTAMP" if as_of else ""
    row = tx.sql(f"""SELECT v.vector, v.version FROM embedding_versions v JOIN models m ON m.id = v.model_id
                     WHERE m.name = ? AND v.encoder_id = ? {when} ORDER BY v.version DESC LIMIT 1""",
                 [name, encoder_id] + ([as_of] if as_of else []))
    if not row:
        found = tx.sql("SELECT id FROM models WHERE name = ?", [name])
        if not found:
            raise unknown_model(name, catalog.names(tx))
        if as_of:
            raise NotFound(f"model {name!r} had no embedding under the active encoder as of {as_of}")
        n = tx.sql(f"""SELECT count(*) FROM {current_evaluations.current(model_ids=[found[0][0]])} e
                       LEFT JOIN query_splits s ON s.query_id = e.query_id
                       WHERE s.split IS DISTINCT FROM 'test'""")[0][0]
        if n < MIN_EVALUATIONS:
            raise NotFound(f"model {name!r} has no embedding: {n} evaluations outside the test split, and at least "
                           f"{MIN_EVALUATIONS} are needed (`registry register {name} --evals FILE` adds more)")
        raise NotFound(f"model {name!r} has no embedding under the active encoder yet: run `registry onboard`")
    return np.asarray(row[0][0], dtype=np.float32), row[0][1]


def of_vector_as_model(tx: Tx, name: str, vector, k: int, encoder_id: int, *,
                       as_of: str | None = None, exclude: set[str] | None = None,
                       vi: index.VectorIndex | None = None, rates: dict | None = None) -> list[Neighbour]:
    """The k nearest other models to one of a model's own vectors (an older version, say), as the registry stood
    at `as_of`, with their disagreement with the model's current evaluations."""
    vi = vi or index.get(tx, encoder_id, as_of)
    own = vi.id_of(name)
    answers = None
    if own is not None and rates is None:
        rows = current_evaluations.of_models(tx, [own])
        answers = (rows["query_id"], rows["correct"])
    return by_vector(tx, vector, k, encoder_id, as_of=as_of, exclude=(exclude or set()) | {name},
                     answers=answers, vi=vi, rates=rates)
