"""A registry being served (`registry serve`, the proxy): reads answer from the current in-memory snapshot
(serve/snapshot.py), every write goes through the one writer (serve/writer.py), and new query texts are encoded in
shared batches. What the HTTP layer calls; it holds no lock a read could wait on.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from registry.core.errors import RegistryError
from registry.routing import choice
from registry.routing.decision import Decision, RouteOptions
from registry.serve.snapshot import QueryVectors, Snapshots
from registry.serve.writer import Writer

TIMES_KEPT = 10_000     # the newest request times kept per kind (GET /health: inside the server, p50 and p99)


class Serving:
    """What the HTTP layer calls. Its parts (the first snapshot, which builds the routing state, seconds; the held
    query vectors; the writer) are made by a warm-up thread, so that a server answers /health at once and says it is
    warming (`stats`); anything else waits for them."""

    def __init__(self, reg, *, on_ready: Callable[[float], Any] | None = None,
                 warm_also: Callable[[], Any] | None = None):
        """warm_also: more of the warm-up, best effort (a failure there is only work left for later: the web
        pages' map)."""
        self.reg = reg
        self._times: dict[str, deque] = {}
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self.warming: str | None = "building the routing state"    # what the warm-up does (None once ready)
        self._started = time.perf_counter()
        self._on_ready, self._warm_also = on_ready, warm_also
        self._similar_reads: tuple | None = None     # (snapshot, alias groups, answer index): `similar`
        self._warm = threading.Thread(target=self._warm_up, daemon=True, name="registry-warm-up")
        self._warm.start()

    def _warm_up(self) -> None:
        try:
            self._snapshots = Snapshots(self.reg)
            self.warming = "loading the query vectors"
            self._vectors = QueryVectors(self.reg)
            self.warming = "starting the writer"
            self._writer = Writer(self.reg, self._snapshots, on_new_queries=self._vectors.reload)
            if self._warm_also is not None:
                self.warming = "drawing the home page's map"
                try:
                    self._warm_also()
                except Exception:
                    pass
        except BaseException as exc:       # (every request then says why, `_parts`)
            self._failed = exc
        finally:
            self.warming = None
            self._ready.set()
        if self._on_ready is not None and self._failed is None:
            self._on_ready(time.perf_counter() - self._started)

    def wait_ready(self) -> None:
        """Until the warm-up is done; its failure, if it failed."""
        self._ready.wait()
        if self._failed is not None:
            raise RegistryError(f"the server could not start serving: {self._failed}") from None

    @property
    def snapshots(self) -> Snapshots:
        self.wait_ready()
        return self._snapshots

    @property
    def vectors(self) -> QueryVectors:
        self.wait_ready()
        return self._vectors

    @property
    def writer(self) -> Writer:
        self.wait_ready()
        return self._writer

    def route(self, texts: list[str], options: RouteOptions) -> list[Decision]:
        """`Registry.route_batch` from the current snapshot; the log rows go to the writer (not waited for)."""
        r = choice.route_texts(self.snapshots.current.routing, texts, self.vectors, options)
        if options.log:
            self.writer.log(r.log_rows, r.new_hashes, r.new_vectors)
        return r.decisions

    def route_unlogged(self, texts: list[str], options: RouteOptions) -> choice.Routed:
        """The routing of `route` with its log rows kept back, for the caller to amend and hand over (`log`): the
        proxy logs who answered once the upstreams have."""
        return choice.route_texts(self.snapshots.current.routing, texts, self.vectors, options)

    def log(self, routed: choice.Routed, rows: list[tuple] | None = None) -> None:
        """Hand a routing's log rows (`rows` in place of its own) and new vectors to the writer (not waited for)."""
        self.writer.log(routed.log_rows if rows is None else rows, routed.new_hashes, routed.new_vectors)

    def similar(self, name: str, k: int = 5):
        """`Registry.similar` of a registered model from memory, the same answer: the snapshot's index and
        embeddings, the answer index (its scale and sketch: the candidates) and the answer book's rows of the
        candidates (`AnswerBook.agreement`). A model not embedded or without answers: the library's own read (and
        its error)."""
        from registry.answers import catalog, neighbours
        from registry.embedding import answer_store

        snap, book = self.snapshots.current, self.writer.book
        vi = snap.index
        vector, own = vi.vector_of(name), book.id_of(name)
        if vector is None or own is None:
            return self.reg.similar(name, k=k)
        held = self._similar_reads
        if held is None or held[0] is not snap:     # (a snapshot is swapped in after every write: read once each)
            with self.reg.store.tx() as tx:
                held = self._similar_reads = (snap, catalog.alias_groups(tx), answer_store.get(tx),
                                              dict(zip(snap.pool.names, snap.pool.n_evaluations.tolist())),
                                              self.reg.probation_min)
        _, groups, scale, n, probation_min = held
        correct, row, _, _, _, _ = book.view()
        mine = np.flatnonzero(correct[row[own]] >= 0) if own in row else np.zeros(0, dtype=np.int64)
        answers = (book.query_ids()[mine], correct[row[own], mine]) if len(mine) else None
        among = neighbours.candidates(vi, vector, answers, {name}, scale)
        near = neighbours.by_vector(None, vector, vi.size, vi.encoder_id, exclude={name}, vi=vi, among=among,
                                    rates=book.agreement(own, among, scale))

        def kin(x, others: list[str]) -> dict[str, float]:       # (neighbours.kin_by_sql, from memory)
            rates = book.disagreement_on(own, vi.id_of(x.model), [vi.id_of(o) for o in others])
            return {vi.names[m]: r for m, r in rates.items()}
        return neighbours.ranked(near, n, n.get(name), k, model=name, vi=vi, probation_min=probation_min,
                                 kin=kin, groups=groups)

    def register(self, name: str, evals: str, metadata: dict | None = None, update: bool = False, k: int = 5):
        """`Registry.register` through the writer (group commit); answered once durable and visible to reads."""
        return self.writer.register(name, evals, metadata or {}, update, k)

    def write(self, fn):
        """Any other write (`fn()`, over the Registry's own transactions), run by the writer in turn."""
        return self.writer.run(fn)

    def flush(self) -> None:
        """Wait until every routing-log row handed over so far is committed (what reading the log needs)."""
        self.writer.run(lambda: None)

    def timed(self, kind: str, seconds: float) -> None:
        """A request's time inside the server (from its handler's start to its answer), kept for `stats`."""
        self._times.setdefault(kind, deque(maxlen=TIMES_KEPT)).append(seconds)

    def stats(self) -> dict:
        if not self._ready.is_set():        # (GET /health while warming: what it is doing, nothing that waits)
            return {"ready": False, "warming": self.warming,
                    "warming_s": round(time.perf_counter() - self._started, 1)}
        if self._failed is not None:
            return {"ready": False, "failed": str(self._failed)}
        inside = {k: {"n": len(v), "p50_ms": round(1000 * float(np.percentile(v, 50)), 2),
                      "p99_ms": round(1000 * float(np.percentile(v, 99)), 2)}
                  for k, v in list(self._times.items()) if v}
        return {"ready": True, "snapshot": self.snapshots.current.generation, "writer": self.writer.stats(),
                "inside": inside,
                "text_batches": self.vectors.batcher.batches, "texts_encoded": self.vectors.batcher.texts,
                "text_encode_ms": round(1000 * self.vectors.batcher.encode_s, 1),
                "text_wait_ms": round(1000 * self.vectors.batcher.wait_s_total, 1)}

    def close(self) -> None:
        self._ready.wait()
        if self._failed is None:
            self._writer.close()
