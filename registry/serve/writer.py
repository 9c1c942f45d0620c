"""The server's one writer: every write of a running server goes through one thread, which commits what is waiting
in one transaction (group commit, serve/group_commit.py), onboards, then swaps in a new snapshot (serve/snapshot.py)
for the readers.

- Registrations and uploads queue as jobs; the writer takes what waits (at most MAX_GROUP) each cycle. A job is
  answered only after its rows are committed (durable), its model onboarded and the new snapshot swapped in.
- Routing-log rows (and routed texts' vectors) are handed over without waiting (`log`) and committed by the next
  cycle, in the same transaction as whatever else is waiting (the vectors, a cache, by the next cycle without a
  registration, or once VECTORS_HELD are held). A row handed over at time t is taken by the first cycle
  that starts after t (at most the rest of the running cycle + LOG_FLUSH_S later) and committed within that cycle, so
  a crash loses at most the log rows of routes answered in the 2 x longest cycle + LOG_FLUSH_S before it
  (`stats()["longest_cycle_ms"]`; the README states it, tests/test_serving_crash.py checks it with a real SIGKILL);
  acknowledged writes are never lost.
- Other writes (availability, endpoints) run whole, in turn (`run`).
- On PostgreSQL other processes (another replica, a CLI import) write to the same database: a follower thread reads
  the database's generation (serve/snapshot.py) every POLL_S, and when it moved past what this server last read, it
  syncs the answer book, reloads the stored text vectors if queries were added, and swaps in a new snapshot itself
  (reads only; the writer's refresh takes the same lock). The writer notes the generation it read before each
  refresh of its own, so its own writes cost no second refresh.
"""
from __future__ import annotations

import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from registry.answers import registration
from registry.core import settings
from registry.embedding import onboarding
from registry.routing import fit as routing_fit
from registry.serve import snapshot
from registry.serve.group_commit import GroupCommit, Job
from registry.usecases import register as register_uc

LOG_FLUSH_S = 0.1           # the longest an idle writer leaves routing-log rows in memory
MAX_GROUP = 64              # jobs staged in one transaction
REFIT_S = 30.0              # at most one fit of routing's interaction terms per this many seconds
VECTORS_HELD = 256          # routed texts' vectors held back from registrations' cycles, at most


class Writer:
    def __init__(self, reg, snapshots, flush_s: float = LOG_FLUSH_S, on_new_queries: Callable[[], Any] | None = None):
        self.reg, self.snapshots, self.flush_s = reg, snapshots, flush_s
        # the writer thread's priority (nice) when the CPU is full: < 0 (a boost; needs CAP_SYS_NICE, e.g. root, else
        # it stays at 0) lets a registration's cycle go before routes; > 0 lets routes go first
        # (REGISTRY_WRITER_NICE, default 0: a boost, -5, measured no better under the closed loop, BENCHMARKS.md)
        self.nice = settings.current().writer_nice
        self._last_refit = 0.0
        self.refit_every_s = REFIT_S
        self._stale = threading.Event()
        self._jobs: queue.Queue = queue.Queue()
        self._log_lock = threading.Lock()
        self._log_rows: list[tuple] = []
        self._log_vectors: dict[str, np.ndarray] = {}
        self._stopping = False
        self._stopped = threading.Event()     # set by close: wakes the helper threads' waits at once
        self._stats: dict[str, Any] = {"cycles": 0, "groups": 0, "jobs": 0, "log_rows": 0, "longest_cycle_ms": 0.0,
                       "stage_ms": 0.0, "onboard_ms": 0.0, "refresh_ms": 0.0,     # totals: where the cycles go
                       #   (refresh: the answer book's sync and the new snapshot)
                       "stage_cpu_ms": 0.0, "onboard_cpu_ms": 0.0, "refresh_cpu_ms": 0.0,  # (this thread's CPU)
                       "register_wait_ms": 0.0, "report_ms": 0.0,                 # and a registration's time
                       "prepare_ms": 0.0,           # (of which its rows read and its embedding computed ahead)
                       "refits": 0}
        self._stats["version_refreshes"] = 0    # snapshots that read only the new versions (add_versions)
        self._stats["prepared"] = 0     # registrations whose embedding came computed by their request (Prepared)
        self._stats["follows"] = 0      # refreshes for writes of other processes (PostgreSQL)
        self._stats["writer_nice"] = None   # the priority the writer thread got (set once it runs)
        self._stats["one_transaction_refused"] = 0   # cycles of registrations staged again one by one (a refusal)
        reg.finish_pending()        # a crash may have left onboarding jobs behind
        # (on_new_queries: called after a commit that added queries, their vectors; the snapshot was read before
        # `finish_pending` above, so on PostgreSQL the follower's first look refreshes once)
        self.commits = GroupCommit(reg, snapshots, self._stats, on_new_queries)
        self.book = self.commits.book     # every model's current answers: what a registration's report compares
        self.commits.sync_book()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="registry-writer")
        self._thread.start()
        self._helpers = [threading.Thread(target=self._refitter, daemon=True, name="registry-refitter")]
        if reg.store.dialect == "postgresql":
            self.poll_s = snapshot.POLL_S
            self._helpers.append(threading.Thread(target=self._follower, daemon=True, name="registry-follower"))
        for thread in self._helpers:
            thread.start()

    # --- what request threads call --------------------------------------------------------------------------------
    def register(self, name: str, evals: str, metadata: dict, update: bool = False, k: int = 5):
        """`Registry.register` through the writer (`registration.RegisterResult`); blocks until durable."""
        name = registration.check(name, metadata)
        t0 = time.perf_counter()
        rows = registration.plain_rows(evals)
        ahead = bool(rows) and not update and self.book.id_of(name) is None
        job = self._put("register", (name, evals, metadata, update), rows, Future() if ahead else None)
        if ahead:
            # a new model's embedding, from the rows it brought, in this thread while its job waits for the writer
            # (behind the cycle running): the writer then only checks its digest (onboarding.Prepared)
            assert job.prepared is not None and rows is not None
            job.prepared.set_result(self._prepare(rows))
            self._stats["prepare_ms"] += 1000 * (time.perf_counter() - t0)
        staged, outcome = job.future.result()
        t1 = time.perf_counter()
        out = register_uc.report_served(self.reg.store, self.snapshots.current, self.book, staged, outcome, k=k,
                                        probation=self.reg.probation_setting)
        if out.alias_of is not None:          # its answers say it is another model: recorded as its alias
            self.run(lambda: register_uc.record_alias(self.reg.store, out))
        self._stats["register_wait_ms"] += 1000 * (t1 - t0)
        self._stats["report_ms"] += 1000 * (time.perf_counter() - t1)
        return out

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run a write (`fn()`, its own transactions) on the writer thread, in turn; blocks until it is done."""
        return self._submit("run", (fn,))

    def log(self, rows: list[tuple], hashes: list[str] | tuple[()] = (), vecs: np.ndarray | None = None) -> None:
        """Routing-log rows (decision.log_rows) and routed texts' vectors, for the next cycle: never waits."""
        with self._log_lock:
            self._log_rows.extend(rows)
            for h, v in zip(hashes, vecs if vecs is not None else ()):
                self._log_vectors[h] = v

    def stats(self) -> dict:
        with self._log_lock:
            return {**self._stats, "log_rows_pending": len(self._log_rows)}

    def close(self) -> None:
        """Finish what is queued (the log rows too), then stop."""
        self._stopping = True
        self._stopped.set()
        self._stale.set()            # (the refitter waits on it: woken, it sees the stop)
        self._jobs.put(None)
        self._thread.join(timeout=60)
        for thread in self._helpers:     # a refit still reading must end before the registry closes its file
            thread.join(timeout=60)

    def _prepare(self, rows: list[dict]):
        try:
            with self.reg.store.tx() as tx:
                return onboarding.prepare(tx, [r["question_id"] for r in rows], [bool(r["correct"]) for r in rows],
                                          self.reg.min_evaluations)
        except Exception:           # a bug of ours: the writer embeds the model as always
            traceback.print_exc(file=sys.stderr)
            return None

    def _submit(self, kind: str, args: tuple):
        return self._put(kind, args).future.result()

    def _put(self, kind: str, args: tuple, rows: list[dict] | None = None, prepared: Future | None = None) -> Job:
        if self._stopping:
            raise RuntimeError("the server is stopping")
        job = Job(kind, args, rows=rows, prepared=prepared)
        self._jobs.put(job)
        return job

    # --- the writer thread ----------------------------------------------------------------------------------------
    def _loop(self) -> None:
        self._stats["writer_nice"] = self._set_nice(self.nice)
        while True:
            try:
                first = self._jobs.get(timeout=self.flush_s)
            except queue.Empty:
                first = False
            jobs = [first] if first else []
            while len(jobs) < MAX_GROUP:
                try:
                    jobs.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            stop = first is None or None in jobs
            t0 = time.perf_counter()
            try:
                self._cycle([j for j in jobs if j])
            except Exception as exc:   # a bug of ours: the trace to the server's log, the writer lives on, and no
                traceback.print_exc(file=sys.stderr)      # request waits for an answer that will not come
                for j in jobs:
                    if j and not j.future.done():
                        j.future.set_exception(exc)
            if jobs:
                self._stats["longest_cycle_ms"] = max(self._stats["longest_cycle_ms"],
                                                      round(1000 * (time.perf_counter() - t0), 1))
            self._stats["cycles"] += 1
            if not self.snapshots.current.routing.interaction_fitted:
                self._stale.set()
            if stop:
                self._cycle([])      # the last log rows
                while True:          # a job that raced the stop is answered, never left waiting
                    try:
                        late = self._jobs.get_nowait()
                    except queue.Empty:
                        return
                    if late:
                        late.future.set_exception(RuntimeError("the server is stopping"))

    def refit(self) -> None:
        """Fit routing's interaction terms for the current versions (about a second; in this thread, with its own
        read), then have the writer swap in a snapshot that uses them (a refresh: the fit is cached by versions)."""
        with self.reg.store.tx() as tx:
            routing_fit.keep(tx, self.reg.probation_setting, refit=True)
        self._stats["refits"] += 1
        self.run(lambda: self.snapshots.refresh(endpoints_changed=False))

    def _refitter(self) -> None:
        """After a commit leaves the terms carried over (a new model routes on the predictor alone), refit them, at
        most once every REFIT_S and never above the readers' priority: the writer never waits for a fit."""
        self._set_nice(max(self.nice, 0))
        while not self._stopping:
            if not self._stale.wait(timeout=1.0) or self._stopping:
                continue
            if time.monotonic() - self._last_refit < self.refit_every_s:
                self._stopped.wait(1.0)         # not yet due: look again (the writer may be stopping)
                continue
            self._stale.clear()
            self._last_refit = time.monotonic()
            try:
                self.refit()
            except Exception:
                if not self._stopping:
                    traceback.print_exc(file=sys.stderr)

    def _follower(self) -> None:
        """PostgreSQL: look at the generation every poll_s; when another process moved it, sync the answer book,
        reload the stored text vectors if queries were added, and swap in a new snapshot. In this thread (reads
        only, at the readers' priority), not the writer's: a refresh for another replica's write never waits
        behind this server's own registrations. The writer's refresh takes the same lock, so snapshots are
        swapped in the order they were read."""
        while not self._stopping:
            if self._stopped.wait(self.poll_s):
                break
            try:
                if self.commits.generation() == self.commits.seen or self._stopping:
                    continue
                with self.commits.refresh_lock:
                    now = self.commits.generation()
                    if now == self.commits.seen:     # the move was this writer's own commit, refreshed meanwhile
                        continue
                    # what routes are served from first (the snapshot; new queries' vectors before it), then
                    # the answer book (only registration reports read it)
                    if self.commits.on_new_queries and snapshot.queries_changed(self.commits.seen, now):
                        self.commits.on_new_queries()
                    self.snapshots.refresh(endpoints_changed=True)
                    self.commits.sync_book()
                    self.commits.seen = now
                    self._stats["follows"] += 1
            except Exception:           # the database away for a moment: look again next time
                if not self._stopping:
                    traceback.print_exc(file=sys.stderr)

    @staticmethod
    def _set_nice(nice: int) -> int:
        """This thread's nice value set to `nice` (Linux: per thread) -> the one it has: a boost (< 0) that the OS
        refuses (no CAP_SYS_NICE) leaves it where it was."""
        if not hasattr(os, "setpriority"):          # (not on every OS)
            return 0
        tid = threading.get_native_id()
        try:
            if nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:
            pass
        return os.getpriority(os.PRIO_PROCESS, tid)

    def _cycle(self, jobs: list[Job]) -> None:
        regs = [j for j in jobs if j.kind == "register"]
        with self._log_lock:
            rows, self._log_rows = self._log_rows, []
            # routed texts' vectors are a cache (a lost one is encoded again): a registration does not wait for
            # them; a cycle with none takes them, or one that finds VECTORS_HELD held
            vecs = {}
            if not regs or len(self._log_vectors) >= VECTORS_HELD:
                vecs, self._log_vectors = self._log_vectors, {}
        self.commits.commit(jobs, rows, vecs)
