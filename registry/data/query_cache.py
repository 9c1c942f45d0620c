"""What the registry keeps in memory about its queries, per open database (the Store's cache): their metadata, their
text vectors, and an encoder's input projections of those vectors.

Queries and their text vectors never change once committed; splits can, and the imports that change them or add
queries invalidate the metadata (`Tx.invalidate`). Values read in a transaction join the cache only when it commits,
so a rolled-back query never does. DuckDB's file lock means no other process writes behind this cache.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from registry.core import dialect
from registry.core.errors import NotFound
from registry.core.transaction import Tx
from registry.locus import text_encoder
from registry.locus.numpy_network import label_columns, label_sql


@dataclass
class QueryMeta:
    """Per query, sorted by id: what choosing and ordering a model's evaluations needs (cached per open database;
    imports that add queries or change splits invalidate it)."""
    ids: np.ndarray           # [n] registry query ids, ascending
    external_id: np.ndarray   # [n] object (str)
    hash_rank: np.ndarray     # [n] position in (content hash, external id) order: the cap keeps the lowest
    ext_rank: np.ndarray      # [n] position in external id order (DuckDB's string order): the digest's order
    is_test: np.ndarray       # [n] bool: held out, never embedded
    tokens: np.ndarray = field(init=False, repr=False)   # [2, n] object: "external_id:0", "external_id:1"
    _row_of_external: dict | None = field(init=False, repr=False, default=None)   # built on first use

    def __post_init__(self):
        self.tokens = np.array([[f"{e}:{c}" for e in self.external_id] for c in (0, 1)], dtype=object).reshape(
            2, len(self.external_id))

    def rows(self, query_ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.ids, query_ids)

    def rows_of_external(self, external_ids: list[str]) -> np.ndarray | None:
        """The rows of these external ids, or None when one of them is not a query of the registry."""
        if self._row_of_external is None:
            self._row_of_external = {e: i for i, e in enumerate(self.external_id.tolist())}
        found = self._row_of_external
        if not all(e in found for e in external_ids):
            return None
        return np.fromiter((found[e] for e in external_ids), dtype=np.intp, count=len(external_ids))

    def digest(self, rows: np.ndarray, correct: np.ndarray) -> str:
        """`embedding.digest` of the queries at these rows and their 0/1 results (in the order given), from the
        prebuilt "external_id:correct" strings: no string is formatted per evaluation."""
        text = ",".join(self.tokens[(np.asarray(correct) != 0).astype(np.intp), rows].tolist()) \
            if len(rows) else ""
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


def query_meta(tx: Tx) -> QueryMeta:
    def build():
        r = tx.numpy("""
            SELECT q.id, q.external_id, row_number() OVER (ORDER BY q.content_hash, q.external_id) AS hash_rank,
                   row_number() OVER (ORDER BY q.external_id) AS ext_rank, coalesce(s.split = 'test', false) AS test
            FROM queries q LEFT JOIN query_splits s ON s.query_id = q.id ORDER BY q.id""")
        return QueryMeta(np.asarray(r["id"], dtype=np.int64), np.asarray(r["external_id"], dtype=object),
                         np.asarray(r["hash_rank"], dtype=np.int64), np.asarray(r["ext_rank"], dtype=np.int64),
                         np.asarray(r["test"], dtype=bool))
    if tx.postgres:
        # "query_meta" is dropped at the start of every transaction there (other processes add queries and change
        # splits), and rebuilding it costs about 80 ms per onboarding: keep it under what it is built from instead
        splits_hash = dialect.xor_hash(tx.dialect, 'query_id, split')
        key = tuple(tx.sql(f"""SELECT (SELECT count(*) FROM queries), (SELECT coalesce(max(id), 0) FROM queries),
                                      (SELECT count(*) FROM query_splits),
                                      (SELECT {splits_hash} FROM query_splits)""")[0])
        kept = tx.cache.get("query_meta_by_key")
        if kept is not None and kept[0] == key:
            return kept[1]
        value = build()
        tx.after_commit(lambda: tx.cache.__setitem__("query_meta_by_key", (key, value)))
        return value
    return tx.cached("query_meta", build)


# a registry up to this many queries keeps all their text vectors in memory after the first read (about 1.5 KB each):
# reading them costs one scan of text_vectors either way, and every later onboarding then reads none
PRELOAD_QUERIES = 200_000


def query_vectors(tx: Tx, query_ids: np.ndarray) -> tuple[dict[int, int], np.ndarray]:
    """(row of each query id, float32 matrix [rows, 384]) holding at least the given registry query ids.

    A query's text vector never changes, so vectors are kept per open database (`Tx.cache`); only ids not seen
    before are read, and they join the cache when the transaction commits (a rolled-back query never does)."""
    import pyarrow as pa

    key = ("query_vectors", text_encoder.TEXT_ENCODER)
    row_of, mat = tx.local.get(key) or tx.cache.get(key, ({}, None))
    uniq = np.unique(np.asarray(query_ids, dtype=np.int64))
    missing = np.array([q for q in uniq.tolist() if q not in row_of], dtype=np.int64)
    if len(missing) == 0:
        return row_of, mat
    preload = mat is None and tx.sql("SELECT count(*) FROM queries")[0][0] <= PRELOAD_QUERIES
    source = "queries q" if preload else "_qids i JOIN queries q ON q.id = i.id"
    with tx.table("_qids", pa.table({"id": missing})):
        tbl = tx.arrow(f"""SELECT q.id, v.vector FROM {source}
                           JOIN text_vectors v ON v.content_hash = q.content_hash AND v.text_encoder = ?
                           ORDER BY q.id""", [text_encoder.TEXT_ENCODER])
    ids = tbl.column("id").to_numpy()
    if not set(missing.tolist()) <= set(ids.tolist()):
        absent = sorted(set(missing.tolist()) - set(ids.tolist()))[:3]
        raise NotFound(f"queries without a text vector under {text_encoder.TEXT_ENCODER}: ids {absent}")
    flat = tbl.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    new = flat.reshape(len(ids), -1).astype(np.float32)
    base = 0 if mat is None else len(mat)
    row_of = {**row_of, **{int(q): base + i for i, q in enumerate(ids.tolist())}}
    mat = new if mat is None else np.concatenate([mat, new])
    tx.local[key] = (row_of, mat)
    tx.after_commit(lambda: tx.cache.__setitem__(key, (row_of, mat)))
    return row_of, mat


def _row_proj(model, qmat: np.ndarray):
    """(P, S) of query vectors as numpy: the numpy network's own, or a torch model's (no torch import otherwise)."""
    if getattr(model, "torch_model", None) is not None:
        return model.row_proj(qmat)
    import torch

    with torch.no_grad():
        P, S = model.row_proj(torch.from_numpy(qmat))
    return P.numpy(), S.numpy()


def projections(tx: Tx, model, query_ids: np.ndarray):
    """(row_at, [rows, 2, D]): the encoder's input projections of the query vectors (`row_proj`, the part of the
    input layer that depends on the query alone), computed once per encoder for the vectors kept by
    `query_vectors`, and kept with them; row_at(query ids [n]) -> their rows [n] (vectorised: no Python per id)."""
    row_of, qmat = query_vectors(tx, query_ids)
    key = ("projections", id(model))
    for kept in (tx.local.get(key), tx.cache.get(key)):
        if kept is not None and kept[0] is qmat and kept[1] is model:
            return kept[3], kept[2]
    proj = np.stack(_row_proj(model, qmat), axis=1)                                     # [rows, 2, D]
    keys = np.fromiter(row_of.keys(), dtype=np.int64, count=len(row_of))
    vals = np.fromiter(row_of.values(), dtype=np.int64, count=len(row_of))
    order = np.argsort(keys)
    keys, vals = keys[order], vals[order]

    def row_at(ids: np.ndarray) -> np.ndarray:    # every id was checked present by query_vectors
        return vals[np.searchsorted(keys, np.asarray(ids, dtype=np.int64))]

    tx.local[key] = (qmat, model, proj, row_at)
    tx.after_commit(lambda: tx.cache.__setitem__(key, (qmat, model, proj, row_at)))
    return row_at, proj


def query_categories(tx: Tx, query_ids, model=None, field: str = "category") -> np.ndarray | None:
    """The categories [n] of these registry query ids (None where a query has none): their labels under `field`
    (numpy_network.label_columns: one query column, or several joined), or under the model's category_field; None
    when `model` is given and reads none (a text-only encoder: nothing is read). Not cached: a query's metadata can
    be corrected by a later import."""
    import pyarrow as pa

    if model is not None:
        if not model.cfg.categories:
            return None
        field = model.cfg.category_field
    if label_columns(field) is None:
        raise NotFound(f"queries have no column {field!r} to read as categories")
    ids = np.asarray(query_ids, dtype=np.int64)
    tx.duck.register("_qcat", pa.table({"id": np.unique(ids)}))
    try:
        found = dict(tx.duck.execute(f"SELECT q.id, {label_sql(field, 'q')} FROM _qcat i "
                                     "JOIN queries q ON q.id = i.id").fetchall())
    finally:
        tx.duck.unregister("_qcat")
    return np.array([found.get(int(q)) for q in ids.tolist()], dtype=object)
