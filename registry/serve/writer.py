"""The server's one writer: every write of a running server goes through one thread, which commits what is waiting
in one transaction (group commit), onboards, then swaps in a new snapshot (serve/snapshot.py) for the readers.

- Registrations and uploads queue as jobs. A cycle stages every waiting job's rows in one transaction; when one of
  them is refused (bad input), the group is rolled back and each job staged alone, so one bad request never fails
  the others. A job is answered only after its rows are committed (durable), its model onboarded and the new
  snapshot swapped in: a client that registers and then routes sees its model.
- Routing-log rows (and routed texts' vectors) are handed over without waiting (`log`) and committed by the next
  cycle, in the same transaction as whatever else is waiting (the vectors, a cache, by the next cycle without a
  registration, or once VECTORS_HELD are held). A row handed over at time t is taken by the first cycle
  that starts after t (at most the rest of the running cycle + LOG_FLUSH_S later) and committed within that cycle, so
  a crash loses at most the log rows of routes answered in the 2 x longest cycle + LOG_FLUSH_S before it
  (`stats()["longest_cycle_ms"]`; the README states it, tests/test_serving_crash.py checks it with a real SIGKILL);
  acknowledged writes are never lost.
- Other writes (availability, endpoints) run whole, in turn (`run`).
- On PostgreSQL other processes (another replica, a CLI import) write to the same database: a follower thread reads
  the database's generation (core/generation.py) every POLL_S, and when it moved past what this server last read, it
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
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from registry.core import generation
from registry.embedding import onboarding
from registry.answers import registration
from registry.routing import log as route_log, state as routing_state
from registry.data import vector_files
from registry.serve.answerbook import AnswerBook
from registry.core.errors import RegistryError

LOG_FLUSH_S = 0.1           # the longest an idle writer leaves routing-log rows in memory
MAX_GROUP = 64              # jobs staged in one transaction
REFIT_S = 30.0              # at most one fit of routing's interaction terms per this many seconds
PREPARED_WAIT_S = 5.0       # the longest the writer waits for a registration's embedding computed by its request
VECTORS_HELD = 256          # routed texts' vectors held back from registrations' cycles, at most
WRITER_NICE = 0             # the writer's priority (BENCHMARKS.md: a boost, -5, measured no better under the closed loop)


@dataclass
class _Job:
    kind: str                              # "register" | "run"
    args: tuple
    future: Future = field(default_factory=Future)
    rows: list[dict] | None = None         # a registration's rows, read by its request (registration.plain_rows)
    prepared: Future | None = None         # its embedding computed ahead from them by its request (a Future of
    #                                        onboarding.Prepared or None), while the job waits in the queue


class Writer:
    def __init__(self, reg, snapshots, flush_s: float = LOG_FLUSH_S, on_new_queries: Callable[[], Any] | None = None):
        self.reg, self.snapshots, self.flush_s = reg, snapshots, flush_s
        self.on_new_queries = on_new_queries      # called after a commit that added queries (their vectors)
        # the writer thread's priority (nice) when the CPU is full: < 0 (a boost; needs CAP_SYS_NICE, e.g. root, else
        # it stays at 0) lets a registration's cycle go before routes; > 0 lets routes go first
        self.nice = int(os.environ.get("REGISTRY_WRITER_NICE", str(WRITER_NICE)))
        self._last_refit = 0.0
        self.refit_every_s = REFIT_S
        self._stale = threading.Event()
        self._jobs: queue.Queue = queue.Queue()
        self._log_lock = threading.Lock()
        self._log_rows: list[tuple] = []
        self._log_vectors: dict[str, np.ndarray] = {}
        self._stopping = False
        self._stats = {"cycles": 0, "groups": 0, "jobs": 0, "log_rows": 0, "longest_cycle_ms": 0.0,
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
        self._refresh_lock = threading.Lock()     # one snapshot refresh at a time (the writer's, the follower's)
        reg._finish_pending()        # a crash may have left onboarding jobs behind
        self.book = AnswerBook()     # every model's current answers: what a registration's report compares
        # the database's generation that the snapshot and the book reflect (PostgreSQL: none yet, so the follower's
        # first look refreshes once: the snapshot was read before `_finish_pending` above)
        self.seen: tuple = ()
        self._sync_book()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="registry-writer")
        self._thread.start()
        threading.Thread(target=self._refitter, daemon=True, name="registry-refitter").start()
        if reg.store.dialect == "postgresql":
            self.poll_s = generation.POLL_S
            threading.Thread(target=self._follower, daemon=True, name="registry-follower").start()

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
            job.prepared.set_result(self._prepare(rows))
            self._stats["prepare_ms"] += 1000 * (time.perf_counter() - t0)
        staged, outcome = job.future.result()
        t1 = time.perf_counter()
        out = registration.report_served(self.reg, self.snapshots.current, self.book, staged, outcome, k)
        self._stats["register_wait_ms"] += 1000 * (t1 - t0)
        self._stats["report_ms"] += 1000 * (time.perf_counter() - t1)
        return out

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run a write (`fn()`, its own transactions) on the writer thread, in turn; blocks until it is done."""
        return self._submit("run", (fn,))

    def log(self, rows: list[tuple], hashes: list[str] = (), vecs: np.ndarray | None = None) -> None:
        """Routing-log rows (routing.log_rows) and routed texts' vectors, for the next cycle: never waits."""
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
        self._jobs.put(None)
        self._thread.join(timeout=60)

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

    def _put(self, kind: str, args: tuple, rows: list[dict] | None = None, prepared: Future | None = None) -> _Job:
        if self._stopping:
            raise RuntimeError("the server is stopping")
        job = _Job(kind, args, rows=rows, prepared=prepared)
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
                return

    def refit(self) -> None:
        """Fit routing's interaction terms for the current versions (about a second; in this thread, with its own
        read), then have the writer swap in a snapshot that uses them (a refresh: the fit is cached by versions)."""
        with self.reg.store.tx() as tx:
            routing_state.current(tx, self.reg.probation_min, refit=True)
        self._stats["refits"] += 1
        self.run(lambda: self.snapshots.refresh(endpoints_changed=False))

    def _refitter(self) -> None:
        """After a commit leaves the terms carried over (a new model routes on the predictor alone), refit them, at
        most once every REFIT_S and never above the readers' priority: the writer never waits for a fit."""
        self._set_nice(max(self.nice, 0))
        while not self._stopping:
            if not self._stale.wait(timeout=1.0):
                continue
            if time.monotonic() - self._last_refit < self.refit_every_s:
                time.sleep(1.0)                 # not yet due: look again (the writer may be stopping)
                continue
            self._stale.clear()
            self._last_refit = time.monotonic()
            try:
                self.refit()
            except Exception:
                if not self._stopping:
                    traceback.print_exc(file=sys.stderr)

    def _generation(self) -> tuple:
        if self.reg.store.dialect != "postgresql":
            return ()            # DuckDB: this process holds the file's lock, no other process writes
        with self.reg.store.tx() as tx:
            return generation.read(tx)

    def _follower(self) -> None:
        """PostgreSQL: look at the generation every poll_s; when another process moved it, sync the answer book,
        reload the stored text vectors if queries were added, and swap in a new snapshot. In this thread (reads
        only, at the readers' priority), not the writer's: a refresh for another replica's write never waits
        behind this server's own registrations. The writer's refresh takes the same lock, so snapshots are
        swapped in the order they were read."""
        while not self._stopping:
            time.sleep(self.poll_s)
            try:
                if self._generation() == self.seen or self._stopping:
                    continue
                with self._refresh_lock:
                    now = self._generation()
                    if now == self.seen:     # the move was this writer's own commit, refreshed meanwhile
                        continue
                    # what routes are served from first (the snapshot; new queries' vectors before it), then
                    # the answer book (only registration reports read it)
                    if self.on_new_queries and generation.queries_changed(self.seen, now):
                        self.on_new_queries()
                    self.snapshots.refresh(endpoints_changed=True)
                    self._sync_book()
                    self.seen = now
                    self._stats["follows"] += 1
            except Exception:           # the database away for a moment: look again next time
                if not self._stopping:
                    traceback.print_exc(file=sys.stderr)

    def _refresh(self, queries_added: bool, endpoints_changed: bool) -> None:
        """After a commit that changed more than versions: the answer book, the stored text vectors if queries were
        added, and a snapshot from a full read (under `_refresh_lock`)."""
        self._sync_book()
        if self.on_new_queries and queries_added:
            self.on_new_queries()
        self.snapshots.refresh(endpoints_changed=endpoints_changed)

    def _sync_book(self) -> None:
        with self.reg.store.tx() as tx:
            self.book.sync(tx)

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

    def _cycle(self, jobs: list[_Job]) -> None:
        regs = [j for j in jobs if j.kind == "register"]
        with self._log_lock:
            rows, self._log_rows = self._log_rows, []
            # routed texts' vectors are a cache (a lost one is encoded again): a registration does not wait for
            # them; a cycle with none takes them, or one that finds VECTORS_HELD held
            vecs = {}
            if not regs or len(self._log_vectors) >= VECTORS_HELD:
                vecs, self._log_vectors = self._log_vectors, {}
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
                self._stats["prepared"] += sum(1 for o in outcomes.values() if o.prepared)
            except Exception as exc:   # the rows are committed; pending jobs finish on the next onboarding
                traceback.print_exc(file=sys.stderr)
                for j in done:
                    j.future.set_exception(exc)
                return
        with self._refresh_lock:
            now = self._generation()     # (before the reads below: a commit after it moves it again)
            t2, c2 = time.perf_counter(), time.thread_time()
            if self._only_new_versions(done, staged):       # the book and the snapshot from one read transaction
                with self.reg.store.tx() as tx:
                    self.book.sync(tx)
                    self.snapshots.add_versions({staged[id(j)].name for j in done}, tx)
                self._stats["version_refreshes"] += 1
            else:
                self._refresh(any(j.kind == "register" and staged[id(j)].queries_added for j in done)
                              or bool(now and generation.queries_changed(self.seen, now)),
                              endpoints_changed=any(j.kind == "run" for j in done) or bool(now))
            self.seen = now
        self._done(done, staged, outcomes, (t0, t1, t2), (c0, c1, c2))

    def _done(self, done: list[_Job], staged: dict, outcomes: dict, walls: tuple, cpus: tuple) -> None:
        """A cycle's figures into the stats, then its jobs answered."""
        (t0, t1, t2), (c0, c1, c2) = walls, cpus
        t3, c3 = time.perf_counter(), time.thread_time()
        for key, dt in (("stage_ms", t1 - t0), ("onboard_ms", t2 - t1), ("refresh_ms", t3 - t2),
                        ("stage_cpu_ms", c1 - c0), ("onboard_cpu_ms", c2 - c1), ("refresh_cpu_ms", c3 - c2)):
            self._stats[key] = round(self._stats[key] + 1000 * dt, 1)
        self._stats["groups"] += 1
        self._stats["jobs"] += len(done)
        for j in done:
            value = staged[id(j)]
            j.future.set_result((value, outcomes.get(value.name)) if j.kind == "register" else value)

    def _in_one_transaction(self, regs: list[_Job], rows: list[tuple], vecs: dict) -> bool:
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
                staged = registration.stage_group(tx, [j.args for j in regs], [j.rows for j in regs])
                self._append_log(tx, rows, vecs)
                t1, c1 = time.perf_counter(), time.thread_time()
                outcomes = onboarding.run_pending(tx, self.reg.min_evaluations, stability=True,
                                                  prepared=_prepared(regs))
                t2, c2 = time.perf_counter(), time.thread_time()
                # only new versions (and models): the snapshot and the book from this transaction's reads
                staged = dict(zip(map(id, regs), staged))
                plain = self._only_new_versions(regs, staged)
                if plain:
                    book = self.book.read(tx)
                    snap = self.snapshots.with_versions({st.name for st in staged.values()}, tx)
        except Exception as exc:
            if not isinstance(exc, RegistryError):      # a bug of ours: its trace to the server's log
                traceback.print_exc(file=sys.stderr)
            if not committed:
                self._stats["one_transaction_refused"] += 1
                return False
            return self._failed_after_commit(regs, exc)     # (an after-commit hook failed: never staged again)
        self._stats["log_rows"] += len(rows)
        self._stats["prepared"] += sum(1 for o in outcomes if o.prepared)
        try:
            # a version whose stability the onboarding left to the sweep (more than FUSE_STABILITY_MAX models):
            # the snapshot read in the transaction lacks it, so it is read again after the sweep
            unswept = self.reg._stabilities(outcomes, sweep=False)
            with self._refresh_lock:
                if plain:
                    self.book.apply(book)
                    if unswept:
                        self.snapshots.add_versions({st.name for st in staged.values()})
                    else:
                        self.snapshots.publish(snap)
                    self._stats["version_refreshes"] += 1
                else:
                    self._refresh(any(st.queries_added for st in staged.values()), endpoints_changed=False)
        except Exception as exc:     # a bug of ours after the commit: the rows are durable, the requests get the error
            traceback.print_exc(file=sys.stderr)
            return self._failed_after_commit(regs, exc)
        self._done(regs, staged, {o.model: o for o in outcomes}, (t0, t1, t2), (c0, c1, c2))
        return True

    def _failed_after_commit(self, regs: list[_Job], exc: BaseException) -> bool:
        """The cycle committed but what follows failed (a bug of ours): its requests get the error, and the book and
        the snapshot are read again whole, as far as that goes. -> True (the cycle is over)."""
        for j in regs:
            if not j.future.done():
                j.future.set_exception(exc)
        try:
            with self._refresh_lock:
                self._refresh(True, endpoints_changed=False)
        except Exception:
            traceback.print_exc(file=sys.stderr)
        return True

    def _only_new_versions(self, done: list[_Job], staged: dict) -> bool:
        """Whether what these jobs committed changes routing only by new versions (and new models): registrations
        that changed no stored metadata and added no queries, on DuckDB (on PostgreSQL other processes write too).
        The snapshot then takes just those versions (Snapshots.add_versions)."""
        return self.reg.store.dialect == "duckdb" and all(
            j.kind == "register" and not staged[id(j)].changes and not staged[id(j)].queries_added for j in done)

    def _stage(self, regs: list[_Job], rows: list[tuple], vecs: dict, retry: bool = True,
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
            self._stats["log_rows"] += len(rows)
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

    def _stage_each(self, regs: list[_Job], rows: list[tuple], vecs: dict) -> dict:
        out = {}
        for j in regs:
            out.update(self._stage([j], [], {}))
        if rows or vecs:
            self._stage([], rows, vecs)
        return out

    @staticmethod
    def _append_log(tx, rows: list[tuple], vecs: dict) -> None:
        route_log.append_log(tx, rows)
        if vecs:
            vector_files.insert(tx, list(vecs), np.stack(list(vecs.values())), count=False)


def _prepared(jobs: list[_Job]) -> dict:
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
