"""The routing part of the Python API, mixed into `Registry` (api.py): route, availability, the routing log and the
cost frontier. Same rules as the rest of the API: one managed transaction per public method, dataclasses out.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import routing
from .errors import InputError


@dataclass
class Availability:
    model: str
    available: bool


class RoutingMixin:
    store: object
    path: str

    def route(self, query: str, cost_weight: float | None = None, min_prob: float | None = None,
              unavailable: list[str] | None = None, log: bool = True, log_text: bool = True,
              cost_by: str = "cost", include_probation: bool = False) -> routing.Decision:
        """Route one query text: the model most likely to answer it (or the cost-aware choice: by `cost`, or by
        `params_b` with cost_by="params"), every candidate's P(correct) and evidence, the encoder and embedding
        versions used. Models on probation are chosen only with `include_probation`. Logged unless `log=False`
        (text kept unless `log_text=False`)."""
        if not isinstance(query, str):
            raise InputError(f"a query must be a string, got {type(query).__name__}")
        return self.route_batch([query], cost_weight, min_prob, unavailable, log, log_text, cost_by=cost_by,
                                include_probation=include_probation)[0]

    def route_batch(self, texts: list[str], cost_weight: float | None = None, min_prob: float | None = None,
                    unavailable: list[str] | None = None, log: bool = True, log_text: bool = True,
                    reuse_vectors: bool = True, batch_size: int = 64, progress: bool = False,
                    cost_by: str = "cost", include_probation: bool = False) -> list[routing.Decision]:
        """Route many texts: vectors from the cache or the registry where known, the rest MiniLM-encoded in batches;
        one bulk log insert. `reuse_vectors=False` encodes every text (what benchmarks compare with bare MiniLM)."""
        cut, hashes = routing.clean_texts(texts)
        if not cut:
            return []
        with self.store.tx() as tx:
            st = routing.state(tx, self.path, self.probation_min)
            known = [r[0] for r in tx.sql("SELECT name FROM models")] if unavailable else ()
            pol = routing.policy(st, cost_weight, min_prob, unavailable, known, cost_by, include_probation)
            fresh: list[int] = []
            q = routing.query_vectors(tx, cut, hashes, reuse=reuse_vectors, batch_size=batch_size,
                                      progress=progress, fresh=fresh)
            if log and log_text and reuse_vectors and fresh:   # the log keeps these texts: keep their vectors too
                routing.keep_vectors(tx, [hashes[i] for i in fresh], q[fresh])
            probs, raw = routing.probabilities(st, q)
            picks = routing.choose(st, probs, pol)
            decs = routing.decisions(st, probs, raw, picks, pol, hashes,
                                     [len(t) > len(c) for t, c in zip(texts, cut)])
            if log:
                options = {"cost_weight": cost_weight, "min_prob": min_prob, "unavailable": sorted(pol.down),
                           "cost_basis": pol.cost_basis, "include_probation": include_probation}
                routing.log(tx, decs, cut if log_text else None, st.encoder_id, options)
        return decs

    def prepare_queries(self, texts: list[str]) -> None:
        """Compute and cache the texts' vectors now (the server does this outside its write lock)."""
        cut, hashes = routing.clean_texts(texts)
        with self.store.tx() as tx:
            routing.query_vectors(tx, cut, hashes)

    def mark_unavailable(self, models: list[str], reason: str | None = None) -> list[Availability]:
        with self.store.tx() as tx:
            routing.set_available(tx, list(models), False, reason)
        return self.availability()

    def mark_available(self, models: list[str], reason: str | None = None) -> list[Availability]:
        with self.store.tx() as tx:
            routing.set_available(tx, list(models), True, reason)
        return self.availability()

    def availability(self) -> list[Availability]:
        with self.store.tx() as tx:
            down = set(routing.unavailable_models(tx))
            names = [r[0] for r in tx.sql("SELECT name FROM models ORDER BY name")]
        return [Availability(n, n not in down) for n in names]

    def routing_log(self, since: str | None = None, limit: int | None = None,
                    oldest: bool = False) -> list[routing.LogEntry]:
        """Routing log entries, newest first (`oldest`: oldest first); `limit` keeps the first that many."""
        with self.store.tx() as tx:
            return routing.read_log(tx, since, limit, oldest)

    def frontier(self, split: str = "test", cost_by: str = "params", weights: list[float] | None = None):
        """Accuracy vs mean cost (params_b, or cost with cost_by="cost") over a sweep of cost weights, beside every
        single model, with their Pareto frontier and each point's coverage (frontier.py)."""
        from . import frontier

        with self.store.tx() as tx:
            return frontier.compute(tx, routing.state(tx, self.path, self.probation_min), split, cost_by, weights)
