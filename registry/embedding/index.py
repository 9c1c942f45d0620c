"""The vector index: FAISS over the current embedding version of every model, one index per encoder.

Derived from the database, never its source of truth. An open database keeps its index in memory (the Store's
cache) and a sidecar file (`<db>.index/encoder-<id>.faiss`, with the newest version id it holds and that version's
creation time) lets the next process start from it; before answering, versions newer than that are applied (remove
the model's old vector, add the new), so an answer is never stale and nothing is rebuilt when nothing changed.
Onboarding hands its new versions to the in-memory index when it commits (`appended`), and every writer of versions
says so (`versions_written`), so between writes an index answers without asking the database. `as_of` answers
build a transient index from the versions that existed then.

An index in the cache is never changed in place: an update builds a changed copy and swaps it in, so a reader in
another thread (the server answers `similar` while its writer onboards) keeps searching the index it took.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.core import database_file
from registry.core.lazy import LazyModule
from registry.core.transaction import Tx
from registry.data import current_evaluations

if TYPE_CHECKING:
    import numpy as np
else:
    np = LazyModule("numpy")   # (every close asks `flush`; most commands hold no index)


@dataclass
class VectorIndex:
    encoder_id: int
    index: Any                    # faiss.IndexIDMap2 over IndexFlatL2, ids = model ids (faiss ships no types)
    names: dict[int, str]         # model id -> name
    through_version: int          # newest embedding_versions.id applied
    stamp: str | None = None      # that version's creation time: tells this database from a rebuilt one
    unsaved: bool = False         # holds versions the sidecar does not (written by `flush`)
    checked: int | None = None    # the open database's versions generation it is known to be current for
    count: int | None = None      # PostgreSQL: how many versions of the encoder it was built from (see `get`)
    changes: int = 0              # the newest model_changes and model_aliases ids it holds, in one number (a
                                  #   deletion, a rename or an alias rebuilds it)
    _ids_by_name: dict[str, int] | None = field(default=None, repr=False)  # built on first use

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """[n,128] -> (distances [n,k] (L2, not squared), model ids [n,k]); -1 ids where fewer than k exist."""
        d, ids = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)
        return np.sqrt(np.maximum(d, 0)), ids

    def id_of(self, name: str) -> int | None:
        """A model's id, if it is indexed."""
        if self._ids_by_name is None or len(self._ids_by_name) != len(self.names):
            self._ids_by_name = {v: k for k, v in self.names.items()}
        return self._ids_by_name.get(name)

    def vector_of(self, name: str) -> np.ndarray | None:
        """A model's current vector straight from the index (None if it is not indexed)."""
        model_id = self.id_of(name)
        return None if model_id is None else self.index.reconstruct(int(model_id))

    def copy(self) -> VectorIndex:
        faiss = load_faiss()
        return VectorIndex(self.encoder_id, faiss.clone_index(self.index), dict(self.names), self.through_version,
                           self.stamp, self.unsaved, self.checked, self.count, self.changes)

    @property
    def size(self) -> int:
        return int(self.index.ntotal)

    def vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(model ids [n], vectors [n,128]) currently indexed."""
        faiss = load_faiss()
        ids = faiss.vector_to_array(self.index.id_map).astype(np.int64)
        # the flat index stores rows in id_map order: read them in one copy (reconstruct per id is slow at 100k)
        flat = faiss.vector_to_array(faiss.downcast_index(self.index.index).codes).view(np.float32)
        return ids, flat.reshape(len(ids), self.index.d).copy()


def current_versions(tx: Tx, encoder_id: int, as_of: str | None = None, after_version_id: int = 0):
    """The newest version per model under one encoder (as it stood at `as_of`), with id > after_version_id; an alias
    (another name of a registered model) is that model, not a second point.
    -> (version ids [n], model ids [n], names [n], vectors [n,128] float32)"""
    when = "AND v.created <= ?::TIMESTAMP" if as_of else ""
    tbl = tx.arrow(f"""
        SELECT id, model_id, name, vector FROM (
            SELECT v.id, v.model_id, m.name, v.vector,
                   row_number() OVER (PARTITION BY v.model_id ORDER BY v.version DESC) AS newest
            FROM embedding_versions v JOIN models m ON m.id = v.model_id
            WHERE v.encoder_id = ? {when} AND v.id > ? AND v.model_id NOT IN ({current_evaluations.ALIASES})) x
        WHERE newest = 1 ORDER BY model_id""", [encoder_id] + ([as_of] if as_of else []) + [after_version_id])
    n = tbl.num_rows
    flat = tbl.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False) if n else np.zeros(0)
    return (tbl.column("id").to_numpy(), tbl.column("model_id").to_numpy().astype(np.int64),
            tbl.column("name").to_pylist(),
            flat.reshape(n, -1).astype(np.float32) if n else np.zeros((0, 128), np.float32))


@functools.cache
def load_faiss():
    """faiss, set once to one OpenMP thread (a caller may set its own after: the server does): the registry's indexes
    hold hundreds of vectors, and the pool's threads, spinning after a search, starved numpy's BLAS in the same
    process (a 31 x 12,032 product took 1.7 s instead of 10 ms on two busy cores)."""
    import faiss

    faiss.omp_set_num_threads(1)
    return faiss


def new_index(dim: int = 128):
    faiss = load_faiss()
    return faiss.IndexIDMap2(faiss.IndexFlatL2(dim))


def _sidecar(db_path: str, encoder_id: int) -> Path | None:
    """Where the index is saved beside a DuckDB file (PostgreSQL: nowhere; the index is rebuilt from the database
    when a process first needs it)."""
    return database_file.sidecar(db_path, f"encoder-{encoder_id}.faiss")


def get(tx: Tx, encoder_id: int, as_of: str | None = None) -> VectorIndex:
    """The index of the active versions under `encoder_id`, brought up to date before it answers."""
    load_faiss()
    if as_of:
        _, mids, names, vecs = current_versions(tx, encoder_id, as_of)
        idx = new_index()
        if len(mids):
            idx.add_with_ids(vecs, mids)
        return VectorIndex(encoder_id, idx, dict(zip(mids.tolist(), names)), -1)
    generation = tx.cache.get(("generation", "versions"), 0)
    vi = tx.cache.get(("index", encoder_id))
    if vi is not None and vi.checked == generation:
        return vi                      # no version was written since it was last brought up to date
    vi = vi or _from_sidecar(tx, encoder_id)
    if tx.postgres:
        # other processes append versions too, and a smaller id may commit after a larger one (reading only ids
        # above the newest applied would miss it): when the count moved, rebuild (one vector per model: cheap)
        newest, count = tx.sql("SELECT coalesce(max(id), 0), count(*) FROM embedding_versions WHERE encoder_id = ?",
                               [encoder_id])[0]
        if count != vi.count:
            vi = VectorIndex(encoder_id, new_index(), {}, 0)
    else:
        newest = tx.sql("SELECT coalesce(max(id), 0) FROM embedding_versions WHERE encoder_id = ?",
                        [encoder_id])[0][0]
    # (the newest deletion or rename, and the newest alias mark: either changes which models it holds)
    changes = tx.sql("SELECT (SELECT coalesce(max(id), 0) FROM model_changes) * 1000003 + "
                     "(SELECT coalesce(max(id), 0) FROM model_aliases)")[0][0]
    if vi.through_version > newest or vi.changes != changes:
        # (a model deleted or renamed since, answers/tidying.py: rebuilt, one vector per model)
        vi = VectorIndex(encoder_id, new_index(), {}, 0, changes=changes)
    if newest > vi.through_version:
        _, mids, names, vecs = current_versions(tx, encoder_id, after_version_id=vi.through_version)
        vi = vi.copy()
        if len(mids):
            vi.index.remove_ids(mids)
            vi.index.add_with_ids(vecs, mids)
            vi.names.update(zip(mids.tolist(), names))
            vi._ids_by_name = None
        vi.through_version = newest
        vi.stamp = tx.sql("SELECT created::VARCHAR FROM embedding_versions WHERE id = ?", [newest])[0][0]
        _save(vi, _sidecar(tx.path, encoder_id))
    vi.checked = generation
    if tx.postgres:
        vi.count = count
    tx.cache[("index", encoder_id)] = vi
    return vi


def _from_sidecar(tx: Tx, encoder_id: int) -> VectorIndex:
    """The saved index, if it belongs to this database (its newest version exists here with the same creation
    time); else an empty one."""
    faiss = load_faiss()
    side = _sidecar(tx.path, encoder_id)
    empty = VectorIndex(encoder_id, new_index(), {}, 0)
    if side is None or not (side.is_file() and side.with_suffix(".json").is_file()):
        return empty
    try:
        meta = json.loads(side.with_suffix(".json").read_text())
        vi = VectorIndex(encoder_id, faiss.deserialize_index(np.fromfile(side, dtype=np.uint8)),
                         {int(k): v for k, v in meta["names"].items()}, int(meta["through_version"]), meta.get("stamp"),
                         changes=int(meta.get("changes", 0)))
    except (OSError, ValueError, KeyError, RuntimeError):
        return empty                                                 # a damaged sidecar is only a cache miss
    stamp = tx.sql("SELECT created::VARCHAR FROM embedding_versions WHERE id = ? AND encoder_id = ?",
                   [vi.through_version, encoder_id])
    return vi if stamp and stamp[0][0] == vi.stamp else empty


def versions_written(tx: Tx) -> None:
    """Whoever appends embedding versions calls this in the same transaction: once it commits, every in-memory
    index of this database checks the database again before answering (onboarding does; so must any bulk writer).
    Between such commits an index answers without a query: this process holds DuckDB's file lock, so nothing else
    writes versions. (On PostgreSQL other processes do: `Store.tx` bumps the generation at the start of every
    transaction there, so an index checks the newest version id once per transaction.)"""
    tx.invalidate("versions")


def appended(tx: Tx, encoder_id: int, versions) -> None:
    """After a commit that appended `versions` (onboarding.NewVersion) under an encoder: an in-memory index takes
    them as they are, without reading them back, when their ids directly follow the newest it holds (so no version
    lies between: ids come from one sequence). Otherwise it is left alone and `get` reads what it misses. The
    sidecar is written later (`flush`), not on every onboarding."""
    vi = tx.cache.get(("index", encoder_id))
    ids = sorted(v.id for v in versions)
    if vi is None or not ids or ids != list(range(vi.through_version + 1, vi.through_version + 1 + len(ids))):
        return
    mids = np.array([v.model_id for v in versions], dtype=np.int64)
    vi = vi.copy()
    vi.index.remove_ids(mids)
    vi.index.add_with_ids(np.stack([v.vector for v in versions]).astype(np.float32), mids)
    vi.names.update((v.model_id, v.name) for v in versions)
    vi._ids_by_name = None
    newest = max(versions, key=lambda v: v.id)
    vi.through_version, vi.stamp, vi.unsaved = newest.id, newest.created, True
    vi.checked = tx.cache.get(("generation", "versions"), 0)   # onboarding bumped it just before (versions_written)
    tx.cache[("index", encoder_id)] = vi


def flush(cache: dict, db_path: str) -> None:
    """Write the sidecar of every in-memory index of an open database that holds more than it (on close)."""
    for key, vi in list(cache.items()):
        if isinstance(key, tuple) and key[0] == "index" and vi.unsaved:
            _save(vi, _sidecar(db_path, key[1]))


def _save(vi: VectorIndex, side: Path | None) -> None:
    """Best effort: the sidecar only saves the next process some work; the database stays the truth. Each file
    whole or not at all, the vectors first: a description without its vectors is never read."""
    faiss = load_faiss()
    if side is None:
        return
    head = json.dumps({"through_version": vi.through_version, "stamp": vi.stamp, "changes": vi.changes,
                       "names": {str(k): v for k, v in vi.names.items()}})
    if (database_file.write_whole(side, lambda tmp: faiss.serialize_index(vi.index).tofile(tmp))
            and database_file.write_whole(side.with_suffix(".json"), lambda tmp: tmp.write_text(head))):
        vi.unsaved = False


def models_changed(tx: Tx) -> None:
    """A model was deleted or renamed in `tx` (answers/tidying.py): this process's indexes check again."""
    tx.cache[("generation", "versions")] = tx.cache.get(("generation", "versions"), 0) + 1
