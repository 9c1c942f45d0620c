"""Every model's current answers, in memory, for a running server: what a registration's report compares the new
model's answers with (its disagreement with every other model, the duplicate test, its held-out count) without a
read of the evaluations table per registration.

A dense [models, queries] int8 matrix (1/0, -1 = not evaluated): 1,000 models x 12,000 queries is 12 MB. `sync`
brings it up to date after a commit: evaluations are only ever appended, in import batches with growing ids, so the
models whose answers changed are those with rows in a batch newer than the last one seen, and only their rows are
read again. It reads committed rows only, so it never holds a write that was rolled back.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from registry.answers import fingerprint
from registry.core.transaction import Tx
from registry.data import current_evaluations
from registry.embedding import answer_index

READ_MODELS = 500      # models whose answers `read` fetches at a time


@dataclass
class _Changes:
    """What a sync read: the models whose answers changed, their current answers, the queries new to the book."""
    changed: list[int]
    rows: dict | None                 # evaluations.of_models of `changed`
    new_q: np.ndarray | None          # query ids not yet columns
    test: set[int]                    # those of them in the test split
    named: dict[int, str]             # names of models new to the book
    last: int                         # the newest import batch among the rows
    batches: list[int]                # PostgreSQL: the batches read


class AnswerBook:
    def __init__(self):
        self.correct = np.full((0, 0), -1, dtype=np.int8)     # [M, Q] current answers: the first M rows of _buf
        self._buf = self.correct                               # [capacity, Q]: rows past M are all -1, unread
        self.answered = np.zeros(0, dtype=np.int64)            # [M] how many queries each row answered
        self.row: dict[int, int] = {}                          # model id -> row
        self.col: dict[int, int] = {}                          # query id -> column
        self.model_ids = np.zeros(0, dtype=np.int64)           # [M] row -> model id
        self.test = np.zeros(0, dtype=bool)                    # [Q] test split: kept, never embedded
        self.changes = np.zeros(0, dtype=np.int64)             # [M] how often each row was read again
        self.names: dict[int, str] = {}                        # model id -> name (models with answers)
        self._ids: tuple[dict, dict[str, int]] | None = None   # (names, their reverse): `id_of`
        self.last_batch = -1
        self.batches_seen: set[int] = set()                    # PostgreSQL: every import batch read (see sync)
        self._cal: dict[tuple, fingerprint.AnswerCalibration] = {}
        self._last_change = 0                                  # model_changes seen (`tidy`)
        self._lock = threading.Lock()                          # sync (the writer) against readers' views
        self._qids: tuple[dict, np.ndarray] | None = None      # (the columns, their query ids): `query_ids`
        self._lp: tuple | None = None                          # (scale, query ids, their difficulty): `agreement`

    def current_count(self) -> tuple[int, int, int]:
        """(every model's current answers in the book, the newest import batch and model change it has read): the
        count `registry stats` gives while nothing newer is committed (answers/catalog.py checks that)."""
        with self._lock:
            return int(self.answered.sum()), self.last_batch, self._last_change

    # --- the writer's -------------------------------------------------------------------------------------------
    def sync(self, tx: Tx) -> int:
        """Read again the answers of every model with evaluations newer than the last sync, and take in the models
        deleted or renamed since (`tidy`) -> how many models' answers changed."""
        n = self.apply(self.read(tx))
        self.tidy(tx)
        return n

    def tidy(self, tx: Tx) -> None:
        """Deletions and renames since the last look (answers/tidying.py): a renamed model answers under its new
        name; a deleted one's row is emptied (it answers nothing, so it is nobody's nearest or duplicate)."""
        rows = tx.sql("SELECT id, model_id, change, new_name FROM model_changes WHERE id > ? ORDER BY id",
                      [self._last_change])
        if not rows:
            return
        with self._lock:
            names, gone = dict(self.names), [self.row[int(m)] for _, m, c, _ in rows
                                             if c == "deleted" and int(m) in self.row]
            for _, m, change, new in rows:
                if change == "deleted":
                    names.pop(int(m), None)
                elif int(m) in names:
                    names[int(m)] = new
            if gone:                  # (new arrays: readers keep the ones they took)
                correct, answered, changes = self.correct.copy(), self.answered.copy(), self.changes.copy()
                correct[gone], answered[gone] = -1, 0
                changes[gone] += 1
                self.correct, self.answered, self.changes, self._buf = correct, answered, changes, correct
            self.names, self._last_change = names, int(rows[-1][0])

    def read(self, tx: Tx) -> _Changes | None:
        """`sync`'s reads, without changing the book: the writer reads in the transaction that wrote the rows and
        applies what it read once that has committed (the book never holds a write that was rolled back)."""
        if tx.postgres:
            new_batches = self._new_batches(tx)
            if not new_batches:
                return None
            last = max(new_batches)
            changed = [int(m) for (m,) in tx.sql("""SELECT DISTINCT model_id FROM evaluations
                                                     WHERE batch_id IN (SELECT unnest(?::INTEGER[]))""",
                                                  [new_batches])]
            if not changed:                           # batches of models, queries or splits only
                return _Changes([], None, None, set(), {}, -1, new_batches)
        else:
            new_batches = []
            # (batches only grow: the models of the newer ones, and the newest, in one read)
            newer = tx.sql("SELECT model_id, max(batch_id) FROM evaluations WHERE batch_id > ? GROUP BY model_id",
                           [self.last_batch])
            if not newer:
                return None
            last = max(b for _, b in newer)
            changed = [int(m) for m, _ in newer]
        # (a few hundred models a read, kept compact: at 10^8 answers, one read of all held gigabytes)
        parts = [current_evaluations.of_models(tx, changed[a:a + READ_MODELS])
                 for a in range(0, len(changed), READ_MODELS)]
        rows = {c: np.concatenate([np.asarray(p[c], dtype=t) for p in parts])
                for c, t in (("model_id", np.int32), ("query_id", np.int32), ("correct", np.int8))}
        col = self.col        # (a set lookup per distinct query: not an array of every column, sorted, per sync)
        seen_q = np.unique(np.concatenate([np.unique(p["query_id"]) for p in parts]))
        new_q = np.array([q for q in seen_q.tolist() if q not in col], dtype=np.int64)
        test = {int(q) for (q,) in tx.sql("""SELECT query_id FROM query_splits WHERE split = 'test'
                                               AND query_id IN (SELECT unnest(?::INTEGER[]))""", [new_q.tolist()])} \
            if len(new_q) else set()
        # names of models new to the book: those this transaction created are known to it (outbox.new_models)
        created = tx.local.get("new_model_states", {})
        named = {m: created[m].name for m in changed if m not in self.names and m in created}
        unnamed = [m for m in changed if m not in self.names and m not in created]
        if unnamed:
            named.update(tx.sql("SELECT id, name FROM models WHERE id IN (SELECT unnest(?::INTEGER[]))", [unnamed]))
        return _Changes(changed, rows, new_q, test, named, int(last), new_batches)

    def apply(self, ch: _Changes | None) -> int:
        """What `read` found, into the book -> how many models changed. Only the writer changes the book, so
        nothing moved between the read and this."""
        if ch is None:
            return 0
        if not ch.changed:
            self.batches_seen = self.batches_seen | set(ch.batches)
            return 0
        changed, rows, new_q, test, named = ch.changed, ch.rows, ch.new_q, ch.test, ch.named
        assert rows is not None and new_q is not None     # (`read` gives both wherever a model changed)
        with self._lock:
            correct, row, col = self.correct, dict(self.row), dict(self.col)
            new_m = [m for m in changed if m not in row]
            for m in new_m:
                row[m] = len(row)
            for q in new_q.tolist():
                col[q] = len(col)
            r = np.array([row[m] for m in changed], dtype=np.int64)
            buf = self._buf
            if len(new_m) == len(changed) and not len(new_q) and len(row) <= len(buf):
                # new models only: their rows are written into the buffer's spare rows, which no reader's view
                # reaches (a reader keeps the first M rows it took); no copy of the others
                correct = buf[:len(row)]
            else:                     # a new buffer (readers keep the one they took), with room for new models
                buf = np.full((max(len(row), int(1.5 * len(row)) + 64), len(col)), -1, dtype=np.int8)
                buf[:correct.shape[0], :correct.shape[1]] = correct
                correct = buf[:len(row)]
                correct[r] = -1
            # (ids to rows and columns through sorted arrays, a slice at a time: no Python object per answer)
            by_m, by_q = (np.array(sorted(d), dtype=np.int64) for d in (row, col))
            row_of = np.array([row[m] for m in by_m.tolist()], dtype=np.int64)
            col_of = np.array([col[q] for q in by_q.tolist()], dtype=np.int64)
            for a in range(0, len(rows["model_id"]), 1 << 24):
                m, q = rows["model_id"][a:a + (1 << 24)], rows["query_id"][a:a + (1 << 24)]
                correct[row_of[np.searchsorted(by_m, m)], col_of[np.searchsorted(by_q, q)]] = \
                    rows["correct"][a:a + (1 << 24)]
            ids = np.zeros(len(row), dtype=np.int64)
            ids[list(row.values())] = list(row.keys())
            test_col = np.concatenate([self.test, np.array([int(q) in test for q in new_q.tolist()], dtype=np.bool_)])
            changes = np.concatenate([self.changes, np.zeros(len(new_m), dtype=np.int64)])
            changes[r] += 1
            answered = np.concatenate([self.answered, np.zeros(len(new_m), dtype=np.int64)])
            answered[r] = (correct[r] >= 0).sum(axis=1)
            self.correct, self.row, self.col, self.model_ids, self.test, self.changes, self.answered, self._buf = \
                correct, row, col, ids, test_col, changes, answered, buf
            self.names = {**self.names, **named}
            self.last_batch = max(self.last_batch, ch.last)
            self.batches_seen = self.batches_seen | set(ch.batches)       # (PostgreSQL's; none on DuckDB)
        return len(changed)

    def _new_batches(self, tx: Tx) -> list[int]:
        """PostgreSQL: the committed import batches not read yet. Other processes write to the same database and
        batch ids come from a sequence, so a batch with a smaller id than the newest seen can commit later: the
        ids seen are kept (one per import or registration), not just the newest."""
        return sorted({int(b) for (b,) in tx.sql("SELECT id FROM import_batches")} - self.batches_seen)

    # --- what the report reads --------------------------------------------------------------------------------------
    def view(self):
        with self._lock:
            return self.correct, self.row, self.model_ids, self.test, self.changes, self.answered

    def held_out(self, model_id: int) -> int:
        """The model's current evaluations on test queries."""
        correct, row, _, test, _, _ = self.view()
        return int(((correct[row[model_id]] >= 0) & test).sum()) if model_id in row else 0

    def disagreement(self, model_id: int) -> dict[int, tuple[int, float]]:
        """How often each other model disagrees with this one's current answers on the queries both answered:
        {other id: (shared queries, rate)} (evaluations.disagreement's answer, from memory)."""
        correct, row, ids, _, _, _ = self.view()
        if model_id not in row:
            return {}
        own = correct[row[model_id]]
        cols = np.flatnonzero(own >= 0)
        others = correct[:, cols]                                   # [M, n]
        shared = (others >= 0).sum(axis=1)
        differ = ((others >= 0) & (others != own[cols][None, :])).sum(axis=1)
        keep = np.flatnonzero(shared > 0)
        return {int(ids[i]): (int(shared[i]), float(differ[i] / shared[i])) for i in keep.tolist()
                if ids[i] != model_id}

    def agreement(self, model_id: int, among: list[int] | None, scale) -> dict[int, tuple[int, float, float | None]]:
        """What `similar` ranks by, from memory, for the models `among` (None: every model): each one's shared
        queries, disagreement and error correlation beyond difficulty with this one's current answers
        (answer_index.errs_alike on the same `scale`, the formula the library's read uses). Whole rows: a column
        this model left unanswered counts for nobody, and a gather of the columns it answered costs more than them."""
        correct, row, ids, _, _, _ = self.view()
        if model_id not in row:
            return {}
        own = correct[row[model_id]]
        if not (own >= 0).any():
            return {}
        others = np.array([row[m] for m in (ids.tolist() if among is None else among)
                           if m in row and m != model_id], dtype=np.int64)
        if not len(others):
            return {}
        columns, n = self.query_ids(), correct.shape[1]     # (columns only grow: the view's are the first n)
        return answer_index.errs_alike(correct, others, own, scale, columns[:n], ids[others],
                                       difficulty=self._difficulty(scale, columns)[:n])

    def _difficulty(self, scale, query_ids: np.ndarray) -> np.ndarray:
        """[Q] each column's difficulty on `scale` (kept while the scale and the columns are the same)."""
        held = self._lp
        if held is None or held[0] is not scale or held[1] is not query_ids:
            held = self._lp = (scale, query_ids, scale.difficulty(query_ids))
        return held[2]

    def query_ids(self) -> np.ndarray:
        """[Q] the query id of each column (kept until the columns change)."""
        with self._lock:
            col = self.col
        held = self._qids
        if held is not None and held[0] is col:
            return held[1]
        out = np.zeros(len(col), dtype=np.int64)
        out[list(col.values())] = list(col.keys())
        self._qids = (col, out)
        return out

    def disagreement_on(self, model_id: int, of: int, others: list[int]) -> dict[int, float]:
        """How often each of `others` disagrees with this model's current answers on the queries both answered
        among those model `of` answered (`neighbours.kin_by_sql`'s rates, from memory)."""
        correct, row, _, _, _, _ = self.view()
        if model_id not in row or of not in row:
            return {}
        own = correct[row[model_id]]
        cols = np.flatnonzero((own >= 0) & (correct[row[of]] >= 0))
        out = {}
        for m in others:
            if m in row:
                theirs = correct[row[m], cols]
                seen = theirs >= 0
                if seen.any():
                    out[m] = float((seen & (theirs != own[cols])).sum() / seen.sum())
        return out

    def id_of(self, name: str) -> int | None:
        names, held = self.names, self._ids
        if held is None or held[0] is not names:        # (`names` is replaced, never changed in place)
            held = self._ids = (names, {n: m for m, n in names.items()})
        return held[1].get(name)

    def calibration(self, exclude: set[int] | frozenset[int] = frozenset()) -> fingerprint.AnswerCalibration:
        """fingerprint.answer_calibration from memory: the closest pair of distinct models among those with
        MIN_PAIR_SHARED evaluations (kept until one of them changes)."""
        correct, _, ids, _, changes, answered = self.view()
        big = np.flatnonzero(answered >= fingerprint.MIN_PAIR_SHARED)
        big = big[~np.isin(ids[big], list(exclude))]
        key = tuple(zip(ids[big].tolist(), changes[big].tolist()))
        if key not in self._cal:
            self._cal = {key: fingerprint.calibration_of(correct[big], [self.names[int(m)] for m in ids[big]])}
        return self._cal[key]
