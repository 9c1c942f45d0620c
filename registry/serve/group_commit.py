"""The writer's group commit: what one cycle does with the jobs it took (serve/writer.py runs the cycles).

- A cycle stages every waiting registration's rows, with the routing-log rows and routed texts' vectors handed
  over since the last one, in one transaction; when one registration is refused (bad input), the group is rolled
  back and each job staged alone, so one bad request never fails the others. A job is answered only after its rows
  are committed (durable), its model onboarded and the new snapshot swapped in: a client that registers and then
  routes sees its model.
- Other writes (availability, endpoints) run whole, in turn, in the same cycle.
- After a commit the answer book (what registration reports compare) and the readers' snapshot are refreshed under
  `refresh_lock`, which the follower of other processes' writes (PostgreSQL) takes too; `seen` is the database's
  generation they reflect.
"""
from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from registry.answers import registration
from registry.core.errors import RegistryError
from registry.data import vector_files
from registry.embedding import onboarding
from registry.routing import decision as route_log
from registry.serve import snapshot
from registry.serve.answerbook import AnswerBook
from registry.traffic import requests as proxy_requests

PREPARED_WAIT_S = 5.0       # the longest the writer waits for a registration's embedding computed by its request


@dataclass
class Job:
    kind: str                              # "register" | "run"
    args: tuple
    future: Future = field(default_factory=Future)
    rows: list[dict] | None = None         # a registration's rows, read by its request (registration.plain_rows)
    prepared: Future | None = None         # its embedding computed ahead from them by its request (a Future of
    #                                        onboarding.Prepared or None), while the job waits in the queue


class GroupCommit:
    """The commit side of the writer: the jobs of a cycle, the answer book, and the snapshot refreshes."""

    def __init__(self, reg, snapshots, stats: dict, on_new_queries: Callable[[], Any] | None = None):
        self.reg, self.snapshots = reg, snapshots
        self.stats = stats                        # the writer's figures (Writer.stats), counted here too
        self.on_new_queries = on_new_queries      # called after a commit that added queries (their vectors)
        self.refresh_lock = threading.Lock()      # one snapshot refresh at a time (the writer's, the follower's)
        self.book = AnswerBook()     # every model's current answers: what a registration's report compares
        # the database's generation that the snapshot and the book reflect (PostgreSQL: none yet, so the follower's
        # first look refreshes once)
        self.seen: tuple = ()

    def generation(self) -> tuple:
        if self.reg.store.dialect != "postgresql":
            return ()            # DuckDB: this process holds the file's lock, no other process writes
        with self.reg.store.tx() as tx:
            return snapshot.read_generation(tx)

    def refresh(self, queries_added: bool, endpoints_changed: bool) -> None:
        """After a commit that changed more than versions: the answer book, the stored text vectors if queries were
        added, and a snapshot from a full read (under `refresh_lock`)."""
        self.sync_book()
        if self.on_new_queries and queries_added:
            self.on_new_queries()
        self.snapshots.refresh(endpoints_changed=endpoints_changed)

    def sync_book(self) -> None:
        with self.reg.store.tx() as tx:
            self.book.sync(tx)

    def commit(self, jobs: list[Job], rows: list[tuple], vecs: dict) -> None:
        """One cycle: these jobs, and the routing-log rows and texts' vectors the writer took for it, committed;
        then the book and the snapshot refreshed and the jobs answered (a refused job with its error)."""
        regs = [j for j in jobs if j.kind == "register"]
        one = bool(regs) and len(regs) == len(jobs) and self.reg.store.dialect == "duckdb"
        if one and self._in_one_transaction(regs, rows, vecs):
            return
        # (else, or when that transaction was refused: nothing of it was written, and the group is staged below one
        # registration at a time, so a bad one is answered with its error and the others go through)
        t0, c0 = time.perf_counter(), time.thread_time()
        staged = self._stage(regs, rows, vecs, together=not one) if (regs or rows or vecs) else {}
        t1, c1 = time.perf_counter(), time.thread_time()
        for j in jobs:
            if j.kind == "run":
                try:
                    staged[id(j)] = j.args[0]()
                except Exception as exc:
                    j.future.set_exception(exc)
        done = [j for j in jobs if id(j) in staged]
        if not done:
            return
        outcomes = {}
        if any(j.kind == "register" for j in done):
            try:
                outcomes = {o.model: o for o in self.reg.onboard(sweep=False, prepared=_prepared(done))}
                self.stats["prepared"] += sum(1 for o in outcomes.values() if o.prepared)
            except Exception as exc:   # the rows are committed; pending jobs finish on the next onboarding
                traceback.print_exc(file=sys.stderr)
                for j in done:
                    j.future.set_exception(exc)
                return
        with self.refresh_lock:
            now = self.generation()     # (before the reads below: a commit after it moves it again)
            t2, c2 = time.perf_counter(), time.thread_time()
            if self._only_new_versions(done, staged):       # the book and the snapshot from one read transaction
                with self.reg.store.tx() as tx:
                    self.book.sync(tx)
                    self.snapshots.add_versions({staged[id(j)].name for j in done}, tx)
                self.stats["version_refreshes"] += 1
            else:
                self.refresh(any(j.kind == "register" and staged[id(j)].queries_added for j in done)
                             or bool(now and snapshot.queries_changed(self.seen, now)),
                             endpoints_changed=any(j.kind == "run" for j in done) or bool(now))
            self.seen = now
        self._done(done, staged, outcomes, (t0, t1, t2), (c0, c1, c2))

    def _done(self, done: list[Job], staged: dict, outcomes: dict, walls: tuple, cpus: tuple) -> None:
        """A cycle's figures into the stats, then its jobs answered."""
        (t0, t1, t2), (c0, c1, c2) = walls, cpus
        t3, c3 = time.perf_counter(), time.thread_time()
        for key, dt in (("stage_ms", t1 - t0), ("onboard_ms", t2 - t1), ("refresh_ms", t3 - t2),
                        ("stage_cpu_ms", c1 - c0), ("onboard_cpu_ms", c2 - c1), ("refresh_cpu_ms", c3 - c2)):
            self.stats[key] = round(self.stats[key] + 1000 * dt, 1)
        self.stats["groups"] += 1
        self.stats["jobs"] += len(done)
        for j in done:
            value = staged[id(j)]
            j.future.set_result((value, outcomes.get(value.name)) if j.kind == "register" else value)

    def _in_one_transaction(self, regs: list[Job], rows: list[tuple], vecs: dict) -> bool:
        """Registrations on DuckDB (this process is the only writer): their rows, the log rows, their onboarding and
        the reads that the next snapshot and the answer book need, all in one transaction, and those swapped in once
        it has committed (they never show a write that was rolled back). One transaction instead of three: a
        cycle's fixed cost is mostly per transaction and per statement, not per registration. -> False when the
        transaction failed (a refused registration, or a bug of ours): nothing of it was written."""
        t0, c0 = time.perf_counter(), time.thread_time()
        committed: list[bool] = []
        try:
            with self.reg.store.tx() as tx:
                tx.after_commit(lambda: committed.append(True))       # (the first hook: it runs before any other)
                group = registration.stage_group(tx, [j.args for j in regs], [j.rows for j in regs])
                self._append_log(tx, rows, vecs)
                t1, c1 = time.perf_counter(), time.thread_time()
                outcomes = onboarding.run_pending(tx, self.reg.min_evaluations, stability=True,
                                                  prepared=_prepared(regs))
                t2, c2 = time.perf_counter(), time.thread_time()
                # only new versions (and models): the snapshot and the book from this transaction's reads
                staged = dict(zip(map(id, regs), group))
                plain = self._only_new_versions(regs, staged)
                if plain:
                    book = self.book.read(tx)
                    snap = self.snapshots.with_versions({st.name for st in staged.values()}, tx)
        except Exception as exc:
            if not isinstance(exc, RegistryError):      # a bug of ours: its trace to the server's log
                traceback.print_exc(file=sys.stderr)
            if not committed:
                self.stats["one_transaction_refused"] += 1
                return False
            return self._failed_after_commit(regs, exc)     # (an after-commit hook failed: never staged again)
        self.stats["log_rows"] += len(rows)
        self.stats["prepared"] += sum(1 for o in outcomes if o.prepared)
        try:
            # a version whose stability the onboarding left to the sweep (an older version without one): the
            # snapshot read in the transaction lacks it, so it is read again after the sweep
            unswept = self.reg.finish_stabilities(outcomes, sweep=False)
            with self.refresh_lock:
                if plain:
                    self.book.apply(book)
                    if unswept:
                        self.snapshots.add_versions({st.name for st in staged.values()})
                    else:
                        self.snapshots.publish(snap)
                    self.stats["version_refreshes"] += 1
                else:
                    self.refresh(any(st.queries_added for st in staged.values()), endpoints_changed=False)
        except Exception as exc:     # a bug of ours after the commit: the rows are durable, the requests get the error
            traceback.print_exc(file=sys.stderr)
            return self._failed_after_commit(regs, exc)
        self._done(regs, staged, {o.model: o for o in outcomes}, (t0, t1, t2), (c0, c1, c2))
        return True

    def _failed_after_commit(self, regs: list[Job], exc: BaseException) -> bool:
        """The cycle committed but what follows failed (a bug of ours): its requests get the error, and the book and
        the snapshot are read again whole, as far as that goes. -> True (the cycle is over)."""
        for j in regs:
            if not j.future.done():
                j.future.set_exception(exc)
        try:
            with self.refresh_lock:
                self.refresh(True, endpoints_changed=False)
        except Exception:
            traceback.print_exc(file=sys.stderr)
        return True

    def _only_new_versions(self, done: list[Job], staged: dict) -> bool:
        """Whether what these jobs committed changes routing only by new versions (and new models): registrations
        that changed no stored metadata and added no queries, on DuckDB (on PostgreSQL other processes write too).
        The snapshot then takes just those versions (Snapshots.add_versions)."""
        return self.reg.store.dialect == "duckdb" and all(
            j.kind == "register" and not staged[id(j)].changes and not staged[id(j)].queries_added for j in done)

    def _stage(self, regs: list[Job], rows: list[tuple], vecs: dict, retry: bool = True,
               together: bool = True) -> dict:
        """Stage every registration and the log rows in one transaction; when that fails (or not `together`), each
        alone. -> {id(job): registration.Staged} for the jobs that committed (the others' futures carry their
        error). Alone, a conflict with another process's commit (PostgreSQL: the same new model name registered
        through another replica at the same instant) is tried once more: it then finds the model that one
        committed."""
        if not together and len(regs) + bool(rows) > 1:
            return self._stage_each(regs, rows, vecs)
        try:
            with self.reg.store.tx() as tx:
                staged = registration.stage_group(tx, [j.args for j in regs], [j.rows for j in regs])
                out = dict(zip(map(id, regs), staged))
                self._append_log(tx, rows, vecs)
            self.stats["log_rows"] += len(rows)
            return out
        except Exception as exc:
            if len(regs) + bool(rows) <= 1:
                if retry and _conflict(exc):
                    return self._stage(regs, rows, vecs, retry=False)
                for j in regs:
                    j.future.set_exception(exc)
                if rows:
                    print(f"registry-writer: {len(rows)} routing-log rows not written: {exc}", file=sys.stderr)
                return {}
        return self._stage_each(regs, rows, vecs)

    def _stage_each(self, regs: list[Job], rows: list[tuple], vecs: dict) -> dict:
        out = {}
        for j in regs:
            out.update(self._stage([j], [], {}))
        if rows or vecs:
            self._stage([], rows, vecs)
        return out

    @staticmethod
    def _append_log(tx, rows: list[tuple], vecs: dict) -> None:
        # (the proxy's request records travel with the log rows they belong to: feedback may name them next)
        route_log.append_log(tx, [r for r in rows if not isinstance(r, proxy_requests.Record)])
        proxy_requests.append(tx, [r for r in rows if isinstance(r, proxy_requests.Record)])
        if vecs:
            vector_files.insert(tx, list(vecs), np.stack(list(vecs.values())), count=False)



def _prepared(jobs: list[Job]) -> dict:
    """{model name: onboarding.Prepared} of the registrations among these jobs whose request computed one. A
    request computes it while its job waits in the queue, so it is nearly always done when the writer onboards; if
    not, the writer waits for it (the embedding is being computed anyway: computing it again here would cost the
    same time and a core), at most PREPARED_WAIT_S for all of them, then embeds the rest itself."""
    out = {}
    deadline = time.monotonic() + PREPARED_WAIT_S
    for j in jobs:
        if j.kind != "register" or j.prepared is None:
            continue
        try:
            p = j.prepared.result(timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            p = None
        if p is not None:
            out[j.args[0]] = p
    return out



def _conflict(exc: BaseException) -> bool:
    """A PostgreSQL error that another transaction's commit caused, which a retry may not meet again: unique
    violation, serialization failure, deadlock."""
    code = getattr(getattr(exc, "orig", None), "sqlstate", None) or getattr(exc, "sqlstate", None)
    return code in ("23505", "40001", "40P01")
