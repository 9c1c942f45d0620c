"""`registry route`: query texts to the model most likely to answer each (or the cost-aware choice the options ask
for), in one transaction that reads the routing state and logs the decisions (routing/choice.py decides); the texts'
vectors computed ahead (`prepare_queries`: a server does it outside its write lock). `route --frontier`, a measure
over a split, is usecases/evaluate.py."""
from __future__ import annotations

from registry.core.errors import InputError
from registry.core.store import Store
from registry.routing import choice, query_texts
from registry.routing.decision import Decision, RouteOptions


def route(store: Store, query: str, options: RouteOptions | None = None, *, probation: int | None = None) -> Decision:
    """One query text's `Decision`: the chosen model, every candidate's P(correct) and evidence, the versions used;
    logged unless the options say not to. `probation`: the probation minimum set (None: the registry's data sets it)."""
    if not isinstance(query, str):
        raise InputError(f"a query must be a string, got {type(query).__name__}")
    return route_batch(store, [query], options, probation=probation)[0]


def route_batch(store: Store, texts: list[str], options: RouteOptions | None = None, *, probation: int | None = None,
                reuse_vectors: bool = True, batch_size: int = 64, progress: bool = False) -> list[Decision]:
    """One `Decision` per text (vectors cached or stored where known, the rest encoded in batches), with one bulk
    log insert. `reuse_vectors=False` encodes every text (what benchmarks compare with the bare text encoder)."""
    query_texts.clean_texts(texts)       # (a bad text refused before anything is built or read)
    with store.tx() as tx:
        return choice.route(tx, texts, options or RouteOptions(), reuse_vectors=reuse_vectors,
                            batch_size=batch_size, progress=progress, probation_min=probation)


def prepare_queries(store: Store, texts: list[str]) -> None:
    """Compute and cache the texts' vectors now."""
    cut, hashes = query_texts.clean_texts(texts)
    with store.tx() as tx:
        query_texts.query_vectors(query_texts.recent_vectors(tx), cut, hashes, tx=tx)
