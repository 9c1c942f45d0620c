"""What the registry says of its models, each in one read: the catalogue (`models`, `show`), nearest models
(`similar`), whether results come from a registered model (`fingerprint`, `fingerprint_plan`), and the embedding
space (`portfolio`, `fallback`, `fallback_all`, `map`, `geometry`). `probation`: the probation minimum set for the
registry (None: its data sets it, read in the same transaction)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from registry.answers import catalog, neighbours
from registry.core.errors import InputError
from registry.core.lazy import LazyModule
from registry.core.store import Store
from registry.core.transaction import Tx
from registry.embedding import encoders, evidence

if TYPE_CHECKING:
    from registry.answers import fallback as fallbacks
    from registry.answers import fingerprint as fingerprints
    from registry.answers import geometry as geometries
    from registry.answers import maps, probe_plans
    from registry.answers import portfolio as portfolios
    from registry.routing import accuracy as routing_accuracy
else:       # (a command reads one of these: `similar`, as a new process, need not load the others)
    fallbacks, fingerprints, geometries = (LazyModule(f"registry.answers.{m}")
                                           for m in ("fallback", "fingerprint", "geometry"))
    maps, probe_plans, portfolios = (LazyModule(f"registry.answers.{m}") for m in ("maps", "probe_plans", "portfolio"))
    routing_accuracy = LazyModule("registry.routing.accuracy")


def pool(tx: Tx, as_of: str | None = None) -> geometries.Pool:
    """The current embeddings under the active encoder (as of `as_of`), read in `tx`."""
    return geometries.pool(tx, encoders.require_active(tx, as_of), as_of)


def models(store: Store, probation: int | None = None, *, limit: int | None = None,
           offset: int = 0) -> list[catalog.ModelInfo]:
    with store.tx() as tx:
        return catalog.models(tx, evidence.minimum(tx, probation), limit=limit, offset=offset)


def model_count(store: Store) -> int:
    with store.tx() as tx:
        return catalog.model_count(tx)


def show(store: Store, name: str, probation: int | None = None) -> catalog.ModelDetail:
    with store.tx() as tx:
        return catalog.show(tx, name, evidence.minimum(tx, probation))


def similar(store: Store, model: str | None, k: int, *, evals: str | None, as_of: str | None, min_evaluations: int,
            probation: int | None) -> list[neighbours.Neighbour]:
    """Nearest registered models to a registered model or to an unregistered one's results (`evals`, read only)."""
    if (model is None) == (evals is None):
        raise InputError("give a model name or an evaluations file (not both)")
    with store.tx() as tx:
        return neighbours.similar(tx, model=model, evals=evals, k=k, as_of=as_of, min_evaluations=min_evaluations,
                                  probation_min=evidence.minimum(tx, probation))


def embedded_from(store: Store, names: list[str], as_of: str | None = None) -> dict[str, int]:
    """The evaluations behind each named model's current embedding (absent: not embedded)."""
    with store.tx() as tx:
        return {m: n for m, (_, n) in catalog.current_versions(tx, encoders.require_active(tx, as_of), as_of,
                                                               names).items()}


def fingerprint(store: Store, evals: str, *, min_evaluations: int,
                as_of: str | None = None) -> fingerprints.Fingerprint:
    """Is the endpoint behind these results a registered model?"""
    with store.tx() as tx:
        encoder_id = encoders.require_active(tx, as_of)
        geometries.pool(tx, encoder_id, as_of)  # an empty registry fails here, before the file is read
        return fingerprints.identify(tx, evals, encoder_id, min_evaluations, as_of)


def fingerprint_plan(store: Store, n: int, candidates: list[str], seed: int, out: str | None, *,
                     probation: int | None = None) -> probe_plans.FingerprintPlan:
    with store.tx() as tx:
        return probe_plans.fingerprint_plan(tx, n, candidates, seed, out, evidence.minimum(tx, probation))


def portfolio(store: Store, k: int | None, method: str | None, *, as_of: str | None, include_probation: bool,
              probation: int | None, **options: Any) -> portfolios.Portfolio:
    """A few models covering the embedding space (`options`: portfolio.answer's constraints and target); models on
    probation are members only when required or with `include_probation`."""
    with store.tx() as tx:
        p = pool(tx, as_of)
        weak = set() if include_probation else p.on_probation(evidence.minimum(tx, probation))
        chosen: portfolios.Portfolio = portfolios.answer(tx, p, k, method=method, probation=weak,
                                                         accuracy=routing_accuracy.scorer(tx, probation), **options)
    return chosen


def fallback(store: Store, model: str, unavailable: Iterable[str] = (), k: int = 5, *, as_of: str | None = None,
             include_probation: bool = False, probation: int | None = None) -> fallbacks.Chain:
    with store.tx() as tx:
        return fallbacks.for_model(tx, pool(tx, as_of), model, unavailable=unavailable, k=k, as_of=as_of,
                                   probation_min=evidence.minimum(tx, probation), include_probation=include_probation)


def fallback_all(store: Store, unavailable: Iterable[str] = (), k: int = 5, *, as_of: str | None = None,
                 include_probation: bool = False, probation: int | None = None) -> fallbacks.Chains:
    with store.tx() as tx:
        return fallbacks.for_all(tx, pool(tx, as_of), unavailable=unavailable, k=k, as_of=as_of,
                                 probation_min=evidence.minimum(tx, probation), include_probation=include_probation)


def map_(store: Store, out: str, seed: int = 0, as_of: str | None = None) -> maps.MapResult:
    with store.tx() as tx:
        return maps.render(pool(tx, as_of), dict(tx.sql("SELECT name, family FROM models")), out, seed)


def geometry(store: Store, min_shared: int = 10, as_of: str | None = None) -> geometries.Geometry:
    with store.tx() as tx:
        return geometries.correlation(tx, pool(tx, as_of), min_shared)
