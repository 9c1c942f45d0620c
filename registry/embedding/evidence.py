"""The probation minimum as this registry's data sets it (the rule, the shrinkage and their maths are
locus/evidence.py's): read from the current embeddings under the active encoder, unless one is set."""
from __future__ import annotations

from registry.core.transaction import Tx
from registry.embedding import encoders
from registry.locus.evidence import configured_min, from_counts


def minimum(tx: Tx, value: int | None = None) -> int:
    """The probation minimum of this registry now: the one set, else `from_counts` of the current embeddings under
    the active encoder (what routing's state computes from the same versions), read once per change of the
    versions (their cache generation, `index.versions_written`) and encoder."""
    value = configured_min(value)
    if value is not None:
        return value
    encoder_id = encoders.active_id(tx)
    key = (encoder_id, tx.cache.get(("generation", "versions"), 0))
    kept = tx.section("probation minimum")
    if key in kept:
        return kept[key]
    counts = [] if encoder_id is None else [n for (n,) in tx.sql("""
        SELECT n_evaluations FROM (
            SELECT n_evaluations, row_number() OVER (PARTITION BY model_id ORDER BY version DESC) AS newest
            FROM embedding_versions WHERE encoder_id = ?) x
        WHERE newest = 1""", [encoder_id])]
    found = from_counts(counts)
    if "versions" not in tx.local.get("invalidated", ()):   # (not from versions this transaction wrote)
        kept.clear()
        kept[key] = found
    return found


def store_minimum(store, value: int | None = None) -> int:
    """`minimum` in a read of its own (a Store's): the facade's `probation_min`."""
    value = configured_min(value)
    if value is not None:
        return value
    with store.tx() as tx:
        return minimum(tx)
