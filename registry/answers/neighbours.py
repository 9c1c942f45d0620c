"""Which registered models are nearest, and how often they really disagree. The core is `by_vector` (one vector in,
the k nearest current embeddings out, from the FAISS index); by name and by an evaluations file call it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from registry.answers import catalog
from registry.data import evaluation_rows
from registry.core.lazy import LazyModule
from registry.embedding import MIN_EVALUATIONS, encoders, index
from registry.core.errors import InputError, NotFound, unknown_model
from registry.core.transaction import Tx

embed = LazyModule("registry.embedding.embed")   # (only an evaluations file is embedded here)


@dataclass
class Neighbour:
    model: str
    distance: float
    disagreement: float | None = None   # share of shared evaluated queries where the two differ
    shared_queries: int | None = None
    embedded_from: int | None = None    # evaluations behind its embedding (`similar` fills it in)
    combined: float | None = None       # `similar`'s ranking distance: the embedding's and the shared answers'
    placed_by: str | None = None        # which evidence placed it (`similar`): embedding | answers | both
    alias: bool = False                 # the two are recorded as one model under two names (`similar`)
    error_correlation: float | None = None   # how much they err together beyond difficulty (`similar`)


def by_vector(tx: Tx, db_path: str, vector, k: int, encoder_id: int, *, as_of: str | None = None,
              exclude: set[str] | None = None, answers: tuple | None = None,
              vi: index.VectorIndex | None = None, rates: dict | None = None,
              errors: bool = False, before_batch: int | None = None) -> list[Neighbour]:
    """The k nearest current embeddings to one vector (all of them if the pool is smaller), leaving out `exclude`;
    with `answers` (query ids, 0/1), each neighbour's disagreement with them on the queries both answered (`rates`:
    evaluation_rows.disagreement of those answers, when the caller has it already), and with `errors` their error
    correlation too (evaluation_rows.agreement: a heavier read; `before_batch`: the answers as they stood then)."""
    vi = vi or index.get(tx, db_path, encoder_id, as_of)
    if vi.size == 0:
        raise InputError("the registry has no embedded models yet: import evaluations first (`registry import`)")
    if k <= 0:
        raise InputError(f"k must be at least 1, got {k}")
    exclude = exclude or set()
    dist, ids = vi.search(np.asarray(vector)[None, :], min(vi.size, k + len(exclude)))
    found = [(int(i), float(d)) for d, i in zip(dist[0], ids[0]) if i >= 0 and vi.names[int(i)] not in exclude][:k]
    out = [Neighbour(vi.names[i], round(d, 4)) for i, d in found]
    if (answers is not None or rates is not None) and out:
        if rates is None:
            others = [i for i, _ in found]
            rates = (evaluation_rows.agreement(tx, answers[0], answers[1], others, before_batch) if errors
                     else evaluation_rows.disagreement(tx, answers[0], answers[1], others))
        for (i, _), n in zip(found, out):
            if i in rates:
                n.shared_queries, n.disagreement = rates[i][0], round(rates[i][1], 4)
                if len(rates[i]) > 2 and rates[i][2] is not None:
                    n.error_correlation = round(rates[i][2], 4)
    return out


def similar(tx: Tx, db_path: str, *, model: str | None, evals: str | None, k: int, as_of: str | None,
            min_evaluations: int, probation_min: int) -> list[Neighbour]:
    """`registry similar`: the nearest models to a registered one, or to an evaluations file's results (read, never
    written), each with the evaluations behind its embedding. Ranked by `combined`: the embedding distance,
    corrected by the answers the two share (`rank`)."""
    encoder_id = encoders.require_active(tx, as_of)
    vi = index.get(tx, db_path, encoder_id, as_of)
    then = evaluation_rows.first_batch_after(tx, as_of)     # the answers as they stood at `as_of`
    if model is not None:
        vector = vi.vector_of(model)
        if vector is None:
            vector, _ = vector_of(tx, model, encoder_id, as_of)
        own = vi.id_of(model) or tx.sql("SELECT id FROM models WHERE name = ?", [model])[0][0]
        rows = evaluation_rows.of_models(tx, [own], then)
        answers = (rows["query_id"], rows["correct"])
    else:
        vector, a = embed.embed_file(tx, evals, encoders.load(tx, encoder_id)[0], min_evaluations)
        answers, own_n = (a.query_ids, a.correct), int((~a.is_test).sum()) + len(a.new_texts)
    if k <= 0:
        raise InputError(f"k must be at least 1, got {k}")
    near = by_vector(tx, db_path, vector, vi.size, encoder_id, as_of=as_of, exclude={model} if model else None,
                     answers=answers, vi=vi, errors=True, before_batch=then)
    n = catalog.current_versions(tx, encoder_id, as_of)
    for x in near:
        x.embedded_from = n[x.model][1] if x.model in n else None
    if model is not None:                # how surely the model itself is placed: the evaluations behind it
        own_n = n[model][1] if model in n else None
    out = rank(near, lambda: scale_of(tx, vi), own_n, probation_min)[:k]
    groups = catalog.alias_groups(tx) if model is not None else {}
    ids = {name: i for i, name in vi.names.items()}
    root = groups.get(ids.get(model), ids.get(model))
    for x in out:
        x.alias = model is not None and groups.get(ids.get(x.model), ids.get(x.model)) == root
    return out


@dataclass
class Scale:
    """The registry's embedding distance as a line in the disagreement rate of two models' answers, over its pairs
    that share MIN_PAIR_SHARED answers: distance ~ slope * rate (through the origin: two models that never disagree
    sit together)."""
    slope: float


MIN_PAIR_SHARED = 100        # a pair's disagreement is fitted only from this many shared answers
MAX_FIT_MODELS = 200         # the fit reads the answers of at most this many models (the first by id)
MIN_SHARED = 32              # shared answers that weigh as much as the embedding (the fingerprint's minimum too)


def scale_of(tx: Tx, vi: index.VectorIndex) -> Scale | None:
    """`Scale` over the indexed models (None: too few pairs, or none that disagree). Kept until a version or an
    import changes it."""
    newest = int(tx.sql("SELECT coalesce(max(id), 0) FROM import_batches")[0][0])
    key = (vi.encoder_id, vi.through_version, vi.size, newest)
    kept = tx.section("neighbour scales")
    if key not in kept:
        kept[key] = _fit(tx, vi)
    return kept[key]


def _fit(tx: Tx, vi: index.VectorIndex) -> Scale | None:
    from registry.answers.geometry import pairwise
    from registry.answers import disagreement

    ids, vecs = vi.vectors()
    order = np.argsort(ids)[:MAX_FIT_MODELS]
    ids, vecs = ids[order], vecs[order]
    res = tx.numpy(f"""SELECT model_id, query_id, correct::INT AS c
                       FROM {evaluation_rows.current(model_ids=[int(i) for i in ids])} e""")
    if len(ids) < 3 or not len(res["model_id"]):
        return None
    qids = np.unique(res["query_id"])
    correct = np.full((len(ids), len(qids)), -1, dtype=np.int8)
    correct[np.searchsorted(ids, res["model_id"]), np.searchsorted(qids, res["query_id"])] = res["c"]
    rate, _ = disagreement.disagreement_matrix(correct, MIN_PAIR_SHARED)
    iu = np.triu_indices(len(ids), 1)
    r, d = rate[iu], pairwise(vecs)[iu]
    keep = np.isfinite(r)
    if keep.sum() < 3 or not r[keep].any():
        return None
    return Scale(float(r[keep] @ d[keep] / (r[keep] @ r[keep])))


def rank(near: list[Neighbour], scale_of: Callable[[], Scale | None], own_evaluations: int | None,
         probation_min: int) -> list[Neighbour]:
    """Neighbours by `combined`, the embedding distance corrected by the answers the two share (n of them, weighted
    n / (n + MIN_SHARED) against the embedding's; with none shared, the embedding alone).

    Where either is placed unsurely (on probation, or a file's results: `own_evaluations`), their disagreement
    places it, read as a distance on the registry's line (`Scale`, fitted by `scale_of` only then: the fit reads
    every model's answers). Where both are well placed (embedded from `probation_min` evaluations) and share
    MIN_PAIR_SHARED answers, their error correlation does, read as a distance on this list's own line (`error_line`):
    mistakes made together beyond difficulty tell a family apart better than the embedding or the raw rate."""
    unsure = [bool(x.shared_queries) and min(own_evaluations or 0, x.embedded_from or 0) < probation_min
              for x in near]
    scale = scale_of() if any(unsure) else None
    slope = error_line([x for x, u in zip(near, unsure) if not u])
    for x, placed_unsurely in zip(near, unsure):
        x.combined, x.placed_by = x.distance, "embedding"
        if placed_unsurely and scale is not None:
            answers = scale.slope * x.disagreement
        elif not placed_unsurely and slope is not None and _errors_known(x):
            answers = slope * (1 - x.error_correlation)
        else:
            continue
        w = x.shared_queries / (x.shared_queries + MIN_SHARED)
        x.combined = round(w * answers + (1 - w) * x.distance, 4)
        x.placed_by = "answers" if w >= 0.75 else "both"
    return sorted(near, key=lambda x: (x.combined, x.distance, x.model))


def _errors_known(x: Neighbour) -> bool:
    return x.error_correlation is not None and (x.shared_queries or 0) >= MIN_PAIR_SHARED


def error_line(near: list[Neighbour]) -> float | None:
    """The embedding distance as a line through the origin in 1 - error correlation, over these neighbours (two
    models that err together always sit together); None under three of them with both."""
    pairs = [(1 - x.error_correlation, x.distance) for x in near if _errors_known(x)]
    if len(pairs) < 3:
        return None
    uu = sum(u * u for u, _ in pairs)
    return sum(u * d for u, d in pairs) / uu if uu > 0 else None


def of_model(tx: Tx, db_path: str, name: str, k: int, encoder_id: int, *, as_of: str | None = None,
             exclude: set[str] | None = None, rates: dict | None = None) -> list[Neighbour]:
    """The k nearest other models to a registered one, with their disagreement with its current evaluations."""
    vi = index.get(tx, db_path, encoder_id, as_of)
    vector = vi.vector_of(name)                                  # no SQL when indexed
    if vector is None:
        vector, _ = vector_of(tx, name, encoder_id, as_of)
    return of_vector_as_model(tx, db_path, name, vector, k, encoder_id, as_of=as_of, exclude=exclude, vi=vi,
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
        n = tx.sql(f"""SELECT count(*) FROM {evaluation_rows.current(model_ids=[found[0][0]])} e
                       LEFT JOIN query_splits s ON s.query_id = e.query_id
                       WHERE s.split IS DISTINCT FROM 'test'""")[0][0]
        if n < MIN_EVALUATIONS:
            raise NotFound(f"model {name!r} has no embedding: {n} evaluations outside the test split, and at least "
                           f"{MIN_EVALUATIONS} are needed (`registry register {name} --evals FILE` adds more)")
        raise NotFound(f"model {name!r} has no embedding under the active encoder yet: run `registry onboard`")
    return np.asarray(row[0][0], dtype=np.float32), row[0][1]


def of_vector_as_model(tx: Tx, db_path: str, name: str, vector, k: int, encoder_id: int, *,
                       as_of: str | None = None, exclude: set[str] | None = None,
                       vi: index.VectorIndex | None = None, rates: dict | None = None) -> list[Neighbour]:
    """The k nearest other models to one of a model's own vectors (an older version, say), as the registry stood
    at `as_of`, with their disagreement with the model's current evaluations."""
    vi = vi or index.get(tx, db_path, encoder_id, as_of)
    own = vi.id_of(name)
    answers = None
    if own is not None and rates is None:
        rows = evaluation_rows.of_models(tx, [own])
        answers = (rows["query_id"], rows["correct"])
    return by_vector(tx, db_path, vector, k, encoder_id, as_of=as_of, exclude=(exclude or set()) | {name},
                     answers=answers, vi=vi, rates=rates)
