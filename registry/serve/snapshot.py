"""What a running server answers routes from: an immutable snapshot of the registry, swapped whole when a write
commits. A request takes `Snapshots.current` once and answers from it with no database and no lock, so routes never
wait for the writer or for each other; the writer (serve/writer.py) builds the next snapshot after each commit, and a
request that started earlier finishes on the one it took.

A snapshot holds the routing state (the active encoder's predictor, every model's current version, evidence, cost,
availability and name: routing_state.State), a vector index and pool of the same versions (fallback chains), and the
models' upstream endpoints (the proxy). Query text vectors are not part of it: they never change once known, so one
shared cache serves every snapshot (`QueryVectors`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from registry.answers import fallback
from registry.answers.geometry import Pool
from registry.core import dialect
from registry.core.transaction import Tx
from registry.data import endpoints
from registry.embedding import index
from registry.locus import text_encoder
from registry.routing import fit as routing_fit
from registry.routing import query_texts
from registry.routing import state as routing_state


@dataclass(frozen=True)
class Snapshot:
    generation: int                          # one more with every swap
    routing: routing_state.State
    index: index.VectorIndex                 # the same versions as `routing`, never changed after the swap
    pool: Pool                               # the same, ordered by name
    endpoints: dict[str, endpoints.Endpoint]

    def chain(self, model: str, among: set[str], down: set[str]) -> list[str]:
        """`model`'s fallback chain: the other models in `among`, not in `down`, nearest first (fallback.chains)."""
        if model not in self.pool.names or len(self.pool.names) < 2:
            return []
        links = fallback.chains(self.index, self.pool, len(self.pool.names), down,
                                only=[self.pool.names.index(model)])[model]
        return [link.model for link in links if link.model in among]


def build(reg, generation: int, previous: Snapshot | None = None, refit: bool = True) -> Snapshot:
    """Read the registry once (a read transaction) into a new snapshot; with `previous`, its endpoints are kept (the
    write changed models, not endpoints); without `refit`, routing's interaction terms are carried over from the
    last fit (routing_fit.keep). Routing takes traffic's corrections as saved (routing_state.corrected), as
    `registry route` does."""
    with reg.store.tx() as tx:
        st = routing_state.corrected(tx, routing_fit.keep(tx, reg.probation_setting, refit=refit))
        eps = previous.endpoints if previous is not None else endpoints.current(tx)
    return _assemble(generation, st, eps)


def _assemble(generation: int, st: routing_state.State, eps: dict) -> Snapshot:
    vi = index.VectorIndex(st.encoder_id, index.new_index(), dict(zip(st.model_ids.tolist(), st.names)), -1)
    if len(st.names):
        vi.index.add_with_ids(np.ascontiguousarray(st.z, dtype=np.float32), st.model_ids)
    order = sorted(range(len(st.names)), key=st.names.__getitem__)
    pool = Pool(st.encoder_id, st.model_ids[order], [st.names[i] for i in order],
                np.ascontiguousarray(st.z[order], dtype=np.float32), st.evidence.n[order])
    return Snapshot(generation, st, vi, pool, eps)


class Snapshots:
    """The current snapshot; `refresh` (the writer's, after each commit) builds the next and swaps it in."""

    def __init__(self, reg):
        self._reg = reg
        self.current = build(reg, 0)

    def refresh(self, endpoints_changed: bool = True, refit: bool = False) -> Snapshot:
        self.current = build(self._reg, self.current.generation + 1,      # one reference assignment: atomic
                             None if endpoints_changed else self.current, refit)
        return self.current

    def add_versions(self, registered: set[str] | frozenset[str] = frozenset(), tx=None) -> Snapshot:
        """After commits that only appended embedding versions (the writer's registrations): the next snapshot
        from this one and those versions, one read (routing_fit.with_new_versions) instead of the whole state;
        `registered`: the names those commits registered; `tx`: a read transaction to use (else one of its own)."""
        if tx is None:
            with self._reg.store.tx() as tx:
                return self.publish(self.with_versions(registered, tx))
        return self.publish(self.with_versions(registered, tx))

    def with_versions(self, registered: set[str] | frozenset[str], tx) -> Snapshot:
        """`add_versions`' next snapshot, not yet swapped in: the writer builds it in the transaction that wrote the
        versions and swaps it in (`publish`) once that has committed."""
        cur = self.current
        st = routing_fit.with_new_versions(tx, cur.routing, registered)
        # (only versions changed: the corrections stay the ones routing had)
        return _assemble(cur.generation + 1, dataclasses.replace(st, corrections=cur.routing.corrections),
                         cur.endpoints)

    def publish(self, snap: Snapshot) -> Snapshot:
        self.current = snap           # one reference assignment: atomic
        return snap


class QueryVectors:
    """Query text -> vector for a server: the Store's LRU of routed texts, then the registry's stored vectors (held in
    memory, up to KEEP of them, so that a known text routes without a read), then MiniLM through a dynamic batcher, so
    that new texts arriving together share one pass."""

    KEEP = 500_000            # 384 float32 each: 0.8 GB at most; a larger registry reads the rest when asked

    def __init__(self, reg, batcher: text_encoder.Batcher | None = None):
        self._reg = reg
        self.recent = query_texts.recent_vectors(reg.store)
        self.batcher = batcher or text_encoder.Batcher(separate_process=True)
        self.reload()

    def __call__(self, texts: list[str], hashes: list[str], fresh: list | None = None) -> np.ndarray:
        return query_texts.query_vectors(self.recent, texts, hashes, fresh=fresh, stored=self._stored,
                                         encode=self.batcher.encode)

    def known(self, texts: list[str]) -> bool:
        """Whether every text's vector is at hand (held in memory or recently routed): routing them waits for
        nothing."""
        hashes = [text_encoder.content_hash(t) for t in texts if isinstance(t, str)]
        return len(hashes) == len(texts) and all(h in self._known or self.recent.has(h) for h in hashes)

    def unknown(self, texts: list[str]) -> int:
        """How many distinct texts would need MiniLM (neither held in memory nor recently routed)."""
        hashes = {text_encoder.content_hash(t) for t in texts}
        return sum(1 for h in hashes if h not in self._known and not self.recent.has(h))

    def reload(self) -> None:
        """Read the stored vectors again (the writer's, after a write that added queries)."""
        with self._reg.store.tx() as tx:
            self._known, self._complete = query_texts.every_stored_vector(tx, self.KEEP)

    def _stored(self, hashes: list[str]) -> dict:
        known = self._known
        found = {h: known[h] for h in hashes if h in known}
        rest = [h for h in hashes if h not in found]
        if rest and not self._complete:
            with self._reg.store.tx() as tx:
                found.update(query_texts.stored_vectors(tx, rest))
        return found


# --- the generation: when another process's write means a new snapshot (PostgreSQL) ----------------------------
# What a server replica polls to learn that another process wrote to the same PostgreSQL database: a
# generation, one cheap read (a few counts and maxima over primary keys, and a digest of the models table), that
# changes whenever a write that reads depend on commits anywhere: a version, an import batch (every
# registration and upload makes one), availability, endpoints, an encoder activation, a stability estimate, new
# queries, model metadata. Counts as well as maxima: ids come from sequences, so a transaction that drew a smaller
# id may commit after one that drew a larger.
#
# On DuckDB there is nothing to poll: the server's process holds the file's lock, so no other process writes.
POLL_S = 0.2          # how often each replica looks: a write elsewhere is served here within about this + a refresh

_GENERATION_SQL = """SELECT {parts}, (SELECT {models} FROM models)"""
_GENERATION_TABLES = ("embedding_versions", "import_batches", "model_availability", "model_endpoints",
                      "encoder_activations", "queries", "model_aliases", "model_changes")


def read_generation(tx: Tx) -> tuple[Any, ...]:
    """The generation as of now (a read on PostgreSQL; always () on DuckDB)."""
    if not tx.postgres:
        return ()
    parts = ", ".join(f"(SELECT count(*) FROM {t}), (SELECT coalesce(max(id), 0) FROM {t})" for t in _GENERATION_TABLES)
    sql = _GENERATION_SQL.format(parts=parts + ", (SELECT count(*) FROM version_stability)",
                      models=dialect.xor_hash(tx.dialect, "id, name, family, provider, params_b, cost, "
                                                          "open_weights, tags::VARCHAR"))
    return tuple(tx.sql(sql)[0])


def queries_changed(before: tuple[Any, ...], after: tuple[Any, ...]) -> bool:
    """Whether queries were added between two generations (the server then reloads the stored text vectors)."""
    i = 2 * _GENERATION_TABLES.index("queries")
    return not before or before[i:i + 2] != after[i:i + 2]
