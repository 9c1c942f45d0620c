"""What a server replica polls to learn that another process wrote to the same PostgreSQL database: a
generation, one cheap read (a few counts and maxima over primary keys, and a digest of the models table), that
changes whenever a write that reads depend on commits anywhere: a version, an import batch (every
registration and upload makes one), availability, endpoints, an encoder activation, a stability estimate, new
queries, model metadata. Counts as well as maxima: ids come from sequences, so a transaction that drew a smaller
id may commit after one that drew a larger.

On DuckDB there is nothing to poll: the server's process holds the file's lock, so no other process writes.
"""
from __future__ import annotations

from typing import Any

from registry.core import dialect
from registry.core.transaction import Tx

POLL_S = 0.2          # how often each replica looks: a write elsewhere is served here within about this + a refresh

_SQL = """SELECT {parts}, (SELECT {models} FROM models)"""
_TABLES = ("embedding_versions", "import_batches", "model_availability", "model_endpoints", "encoder_activations",
           "queries")


def read(tx: Tx) -> tuple[Any, ...]:
    """The generation as of now (a read on PostgreSQL; always () on DuckDB)."""
    if not tx.postgres:
        return ()
    parts = ", ".join(f"(SELECT count(*) FROM {t}), (SELECT coalesce(max(id), 0) FROM {t})" for t in _TABLES)
    sql = _SQL.format(parts=parts + ", (SELECT count(*) FROM version_stability)",
                      models=dialect.xor_hash(tx.dialect, "id, name, family, provider, params_b, cost, "
                                                          "open_weights, tags::VARCHAR"))
    return tuple(tx.sql(sql)[0])


def queries_changed(before: tuple[Any, ...], after: tuple[Any, ...]) -> bool:
    """Whether queries were added between two generations (the server then reloads the stored text vectors)."""
    i = 2 * _TABLES.index("queries")
    return not before or before[i:i + 2] != after[i:i + 2]
