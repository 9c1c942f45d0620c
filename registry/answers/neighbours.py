"""Which registered models are nearest, and how often they really disagree. The core is `by_vector` (one vector in,
the k nearest current embeddings out, from the FAISS index); by name and by an evaluations file call it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from registry.answers import catalog
from registry.data import evaluation_rows
from registry.embedding import embed, encoders, index
from registry.embedding.embed import MIN_EVALUATIONS
from registry.core.errors import InputError, NotFound, unknown_model
from registry.core.transaction import Tx
@dataclass
class Neighbour:
    model: str
    distance: float
    disagreement: float | None = None   # share of shared evaluated queries where the two differ
    shared_queries: int | None = None
    embedded_from: int | None = None    # evaluations behind its embedding (`similar` fills it in)


def by_vector(tx: Tx, db_path: str, vector, k: int, encoder_id: int, *, as_of: str | None = None,
              exclude: set[str] | None = None, answers: tuple | None = None,
              vi: index.VectorIndex | None = None, rates: dict | None = None) -> list[Neighbour]:
    """The k nearest current embeddings to one vector (all of them if the pool is smaller), leaving out `exclude`;
    with `answers` (query ids, 0/1), each neighbour's disagreement with them on the queries both answered (`rates`:
    evaluations.disagreement of those answers, when the caller has it already)."""
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
            rates = evaluation_rows.disagreement(tx, answers[0], answers[1], [i for i, _ in found])
        for (i, _), n in zip(found, out):
            if i in rates:
                n.shared_queries, n.disagreement = rates[i][0], round(rates[i][1], 4)
    return out


def similar(tx: Tx, db_path: str, *, model: str | None, evals: str | None, k: int, as_of: str | None,
            min_evaluations: int) -> list[Neighbour]:
    """`registry similar`: the nearest models to a registered one, or to an evaluations file's results (read, never
    written), each with the evaluations behind its embedding."""
    encoder_id = encoders.require_active(tx, as_of)
    if model is not None:
        out = of_model(tx, db_path, model, k, encoder_id, as_of=as_of)
    else:
        z, a = embed.embed_file(tx, evals, encoders.load(tx, encoder_id)[0], min_evaluations)
        out = by_vector(tx, db_path, z, k, encoder_id, as_of=as_of, answers=(a.query_ids, a.correct))
    n = catalog.current_versions(tx, encoder_id, as_of, [x.model for x in out])
    for x in out:
        x.embedded_from = n[x.model][1] if x.model in n else None
    return out


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
