"""The registry's own data as arrays: every model's current evaluations on every query with a split, as a dense
matrix with the queries' vectors and labels (`dataset`), and the models' current embeddings in its order."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from registry.core.errors import RegistryError
from registry.core.transaction import Tx
from registry.data import current_evaluations, query_cache
from registry.embedding import embed, encoders, index
from registry.locus.numpy_network import join_labels, label_columns

SPLITS = ("train", "val", "test")


@dataclass
class Dataset:
    models: list[str]
    model_ids: np.ndarray        # [M]
    query_ids: np.ndarray        # [Nq] registry query ids
    qvecs: np.ndarray            # [Nq, Dq]
    correct: np.ndarray          # [M, Nq] int8, 1/0, -1 = missing
    splits: dict[str, np.ndarray]  # split -> indices into query_ids
    categories: np.ndarray       # [Nq] str
    sources: np.ndarray | None = None   # [Nq] str: the queries' source column ("(none)" where missing)

    def query_field(self, field: str) -> np.ndarray:
        """[Nq] the queries' values of a metadata column a predictor may read as categories, or their
        labels under several columns ("category+source": numpy_network.label_columns)."""
        cols = label_columns(field)
        if cols is None or ("source" in cols and self.sources is None):
            raise RegistryError(f"category features read the query column 'category', 'source' or both "
                                f"('category+source'), not {field!r}")
        return join_labels([self.categories if c == "category" else self.sources for c in cols])

    def without(self, drop: np.ndarray) -> Dataset:
        """The same dataset without the models where `drop` is True."""
        keep = ~drop
        return Dataset([n for n, k in zip(self.models, keep) if k], self.model_ids[keep], self.query_ids, self.qvecs,
                       self.correct[keep], self.splits, self.categories, self.sources)

    def digest(self) -> str:
        h = hashlib.sha256()
        for a in (self.query_ids, self.correct, *[self.splits[s] for s in SPLITS]):
            h.update(np.ascontiguousarray(a).tobytes())
        h.update("\n".join(self.models).encode())
        return h.hexdigest()


def dataset(tx: Tx) -> Dataset:
    """Current evaluations of every model on every query with a split, as a dense matrix."""
    q = tx.numpy("""SELECT q.id, s.split, coalesce(q.category, '(none)') AS category,
                           coalesce(q.source, '(none)') AS source FROM queries q
                    JOIN query_splits s ON s.query_id = q.id ORDER BY q.id""")
    if len(q["id"]) == 0:
        raise RegistryError("no queries with a train/val/test split: import a splits file or run "
                            "`registry draw-splits`")
    # (an alias is its model under another name: one model, not two, in what the matrix measures)
    m = tx.sql(f"SELECT id, name FROM models WHERE id NOT IN ({current_evaluations.ALIASES}) ORDER BY name")
    model_ids = np.array([r[0] for r in m], dtype=np.int64)
    qids = np.asarray(q["id"], dtype=np.int64)                               # sorted (ORDER BY q.id)
    correct = np.full((len(model_ids), len(qids)), -1, dtype=np.int8)
    by_id = np.argsort(model_ids)
    for chunk in _model_chunks(tx, model_ids):
        # each chunk's current answers (newest_per_query: CURRENT's rule for these registered, distinct models), so
        # memory holds one chunk of rows, never a GROUP BY of every evaluation (10^8 of them: 8 GB in DuckDB)
        ev = current_evaluations.of_models(tx, chunk)
        ev_q = np.asarray(ev["query_id"], dtype=np.int64)
        col = np.minimum(np.searchsorted(qids, ev_q), len(qids) - 1)
        keep = qids[col] == ev_q                                                 # queries with a split only
        row = by_id[np.searchsorted(model_ids[by_id], np.asarray(ev["model_id"], dtype=np.int64)[keep])]
        correct[row, col[keep]] = np.asarray(ev["correct"])[keep]
    row_of, qmat = query_cache.query_vectors(tx, np.asarray(q["id"], dtype=np.int64))
    qvecs = qmat[[row_of[int(x)] for x in q["id"]]]
    split = np.asarray(q["split"])
    return Dataset([r[1] for r in m], model_ids, np.asarray(q["id"], dtype=np.int64), qvecs, correct,
                   {s: np.flatnonzero(split == s) for s in SPLITS}, np.asarray(q["category"]),
                   np.asarray(q["source"]))


def _model_chunks(tx: Tx, model_ids: np.ndarray, chunk_rows: int = embed.CHUNK_ROWS):
    """The models in groups of about `chunk_rows` evaluations (each model's rows counted first)."""
    if not len(model_ids):
        return
    rows = dict(tx.sql("SELECT model_id, count(*) FROM evaluations GROUP BY model_id"))
    chunk: list[int] = []
    n = 0
    for m in model_ids.tolist():
        if chunk and n + rows.get(m, 0) > chunk_rows:
            yield chunk
            chunk, n = [], 0
        chunk.append(m)
        n += rows.get(m, 0)
    yield chunk


def current_embeddings(tx: Tx, data: Dataset, with_evidence: bool = False):
    """The active encoder's current embedding of every model that has an up-to-date one -> (z [M,D] in data's model
    order, NaN rows for the others; {model: why it has none}; encoder id). A version is up to date when its digest is
    that of the model's current non-test evaluations: one made before queries moved into the test split, for a model
    left with too few evaluations to re-embed, would carry test answers, so it is not used. `with_evidence` adds
    the evaluations behind each embedding and its stability ([M] each, in data's model order)."""
    encoder_id = encoders.require_active(tx)
    _, meta = encoders.load(tx, encoder_id)
    vids, mids, _, vecs = index.current_versions(tx, encoder_id)
    about = {r[0]: r[1:] for r in tx.sql(f"""
        SELECT v.model_id, v.digest, v.n_evaluations, coalesce(s.stability, v.stability) FROM embedding_versions v
        LEFT JOIN version_stability s ON s.version_id = v.id
        WHERE v.id IN ({', '.join(str(int(v)) for v in vids) or 'NULL'})""")}
    digest_of = {m: a[0] for m, a in about.items()}
    sets = embed.evaluation_sets(tx, [int(m) for m in mids], 2 ** 62, meta.get("embed_max_set"))
    pos = {int(m): i for i, m in enumerate(mids)}
    z = np.full((len(data.models), vecs.shape[1]), np.nan, dtype=np.float32)
    excluded = {}
    for i, (name, m) in enumerate(zip(data.models, data.model_ids)):
        m = int(m)
        if m not in pos:
            excluded[name] = "no embedding (fewer evaluations outside the test split than onboarding needs)"
        elif sets[m].digest != digest_of[m]:
            excluded[name] = (f"its embedding predates its current evaluations outside the test split ({sets[m].n}; "
                              f"too few to re-embed, or onboarding pending)")
        else:
            z[i] = vecs[pos[m]]
    if with_evidence:
        n = np.array([about.get(int(m), (None, 0, None))[1] for m in data.model_ids], dtype=np.int64)
        stab = [about.get(int(m), (None, 0, None))[2] for m in data.model_ids]
        return z, excluded, encoder_id, n, stab
    return z, excluded, encoder_id


def query_labels(data: Dataset, model) -> np.ndarray | None:
    """[Nq] what the encoder's predictor reads as the queries' categories (its category_field), or None for a
    text-only encoder."""
    return data.query_field(model.cfg.category_field) if model.cfg.categories else None
