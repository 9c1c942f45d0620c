"""Query texts as routing reads them: cleaned (refused when empty, cut when over-long) and hashed, and their MiniLM
vectors, from the Store's LRU of routed texts (`RecentVectors`), the registry's stored vectors, or MiniLM. A text
the registry already holds reuses its stored vector, so routing a registered query gives exactly the probabilities
`evaluate` computes; routed texts keep theirs (`keep_vectors`)."""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from registry.core.errors import InputError
from registry.core.transaction import Tx
from registry.locus import text_encoder

# MiniLM reads at most 256 word pieces; a word piece never spans more than ~100 characters of text, so a longer
# text routes exactly as its first MAX_CHARS characters do. Cutting first keeps a 1 MB query from costing a
# tokeniser pass over all of it.
MAX_CHARS = 32_768


class RecentVectors:
    """Routed texts' vectors by content hash, the most recent SIZE of them (an LRU): a server routes from several
    threads, so every look and change holds the lock."""

    SIZE = 4096

    def __init__(self):
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def has(self, content_hash: str) -> bool:
        with self._lock:
            return content_hash in self._vectors

    def get(self, content_hash: str) -> np.ndarray | None:
        with self._lock:
            return self._vectors.get(content_hash)

    def put(self, hashes: list[str], vectors: np.ndarray) -> None:
        with self._lock:
            for i, h in enumerate(hashes):
                self._vectors[h] = vectors[i]
                self._vectors.move_to_end(h)
            while len(self._vectors) > self.SIZE:
                self._vectors.popitem(last=False)


def recent_vectors(owner) -> RecentVectors:
    """The LRU of routed texts' vectors of a Store (or of a transaction's Store): a section of its cache."""
    return owner.section("routed text vectors", RecentVectors)


def clean_texts(texts) -> tuple[list[str], list[str]]:
    """(texts as routed, sha256 of each full text). Empty texts are refused; over-long ones are cut (MAX_CHARS)."""
    if isinstance(texts, str):
        texts = [texts]
    out, hashes = [], []
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise InputError(f"query {i + 1}: text must be a string, got {type(t).__name__}")
        if not t.strip():
            raise InputError(f"query {i + 1}: empty query" if len(texts) > 1 else "empty query")
        hashes.append(text_encoder.content_hash(t))
        out.append(t[:MAX_CHARS])
    return out, hashes


def query_vectors(recent: RecentVectors, texts: list[str], hashes: list[str], *, tx: Tx | None = None,
                  reuse: bool = True, batch_size: int = 64, progress: bool = False, fresh: list | None = None,
                  stored=None, encode=None) -> np.ndarray:
    """[N,384]: from `recent` (the LRU), then from the registry's stored vectors (by content hash: in `tx`, or from
    `stored`, hashes -> {hash: vector}), then MiniLM (batched; or `encode`, texts -> [n,384]). `fresh`, if given,
    receives the indices that were encoded here."""
    out = np.zeros((len(texts), text_encoder.TEXT_DIM), dtype=np.float32)
    todo = []
    for i, h in enumerate(hashes):
        v = recent.get(h) if reuse else None
        if v is None:
            todo.append(i)
        else:
            out[i] = v
    if todo and reuse and (tx is not None or stored is not None):
        found = stored([hashes[i] for i in todo]) if stored is not None else \
            stored_vectors(tx, [hashes[i] for i in todo]) if tx is not None else {}
        rest = []
        for i in todo:
            v = found.get(hashes[i])
            if v is None:
                rest.append(i)
            else:
                out[i] = v
        todo = rest
    if todo:
        todo_texts = [texts[i] for i in todo]
        out[todo] = (encode(todo_texts) if encode is not None
                     else text_encoder.encode(todo_texts, batch_size=batch_size, progress=progress))
        if fresh is not None:
            fresh.extend(todo)
    recent.put(hashes, out)
    return out


def stored_vectors(tx: Tx, hashes: list[str]) -> dict[str, np.ndarray]:
    """The registry's stored text vectors of these content hashes (those it has)."""
    if len(hashes) == 1:  # the single-query path: one indexed lookup, no Arrow registration
        rows = tx.sql("SELECT vector FROM text_vectors WHERE content_hash = ? AND text_encoder = ?",
                      [hashes[0], text_encoder.TEXT_ENCODER])
        return {hashes[0]: np.asarray(rows[0][0], dtype=np.float32)} if rows else {}
    import pyarrow as pa

    with tx.table("_route_hashes", pa.table({"h": hashes})):
        tbl = tx.arrow("""SELECT v.content_hash, v.vector FROM text_vectors v
                             JOIN (SELECT DISTINCT h FROM _route_hashes) r ON r.h = v.content_hash
                             WHERE v.text_encoder = ?""", [text_encoder.TEXT_ENCODER])
    return _by_hash(tbl)


def every_stored_vector(tx: Tx, limit: int) -> tuple[dict[str, np.ndarray], bool]:
    """Up to `limit` of the registry's stored text vectors (the newest first) -> ({hash: vector}, whether that is
    all of them): what a server keeps in memory so that a known text routes without a read."""
    tbl = tx.arrow("""SELECT content_hash, vector FROM text_vectors WHERE text_encoder = ?
                         ORDER BY created DESC LIMIT ?""", [text_encoder.TEXT_ENCODER, limit + 1])
    complete = tbl.num_rows <= limit
    return _by_hash(tbl.slice(0, limit)), complete


def _by_hash(tbl) -> dict[str, np.ndarray]:
    if not tbl.num_rows:
        return {}
    flat = tbl.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    mat = flat.reshape(tbl.num_rows, -1).astype(np.float32)
    return dict(zip(tbl.column("content_hash").to_pylist(), mat))


def keep_vectors(tx: Tx, hashes: list[str], vectors: np.ndarray) -> None:
    """Store routed texts' vectors by content hash (text_vectors is a cache keyed by it), so that the same text routes
    again, from any process, without loading MiniLM."""
    if not hashes:        # (a route of known texts only: nothing to keep, and no Arrow to load for it)
        return
    from registry.data import vector_files as text_vectors

    text_vectors.insert(tx, hashes, vectors)
