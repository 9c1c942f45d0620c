"""The answer index: every model's current answers packed two bits an answer (10^8 answers: 25 MB), with the totals
and the sketch `similar` needs, so that it reads the answers of its candidates without the evaluations table (10^8
rows at ten thousand models). Like the vector index, derived from the database and never its source of truth
(embedding/answer_store.py builds it, keeps it current and saves it beside the file).

- Answers: [models, queries] bits, answered and right, over the answers that count
  (current_evaluations.current(distinct=True): registered models, no alias, each question's newest answer).
- Totals: each question's right answers and answers, each model's over all its questions; they give each question's
  difficulty and each model's ability as logits, smoothed by one right and one wrong (`difficulty`, `ability`).
- A sketch: SKETCH questions drawn (fixed seed) from those most models answered. Two models' surprises there (an
  answer less what difficulty and ability predict) point the same way where they err alike beyond difficulty;
  `nearest_by_sketch` ranks every model so, in one [models, SKETCH] pass.
- `errs_alike`: one formula for how much two models err together, over the answers of a few (`agreement`, here; a
  server's answer book, from its memory).
"""
from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from registry.core.lazy import LazyModule
from registry.data import current_evaluations

if TYPE_CHECKING:
    import numpy as np
else:
    np = LazyModule("numpy")

SKETCH = 512               # questions in the sketch
MIN_SKETCH_SHARED = 32     # sketch questions two models must share to be ranked by it


FIELDS = ("query_ids", "query_right", "query_answered", "model_ids", "model_right", "model_answered", "seen", "right",
          "sketch_queries")


@dataclass(frozen=True)
class AnswerIndex:
    key: tuple                   # (import batches, newest batch id, its creation time, newest change, newest alias)
    query_ids: np.ndarray        # [Q] sorted: the columns
    query_right: np.ndarray      # [Q] right answers to each question, over the models that count
    query_answered: np.ndarray   # [Q]
    model_ids: np.ndarray        # [M] sorted: the rows, the models that count with answers
    model_right: np.ndarray      # [M] each model's right answers, over all its questions
    model_answered: np.ndarray   # [M]
    seen: np.ndarray             # [M, ceil(Q / 8)] uint8, packed bits: answered
    right: np.ndarray            # [M, ceil(Q / 8)] uint8, packed bits: answered right
    sketch_queries: np.ndarray   # [S] sorted, among query_ids
    repeated: np.ndarray | None  # the models that answered some question twice (None: not known, as on PostgreSQL)

    def answers(self, model_ids, query_ids=None) -> np.ndarray:
        """[m, n] int8 the models' current answers (1 right, 0 wrong, -1 none; a model not held: all -1) on the
        queries (default: every column)."""
        rows = at_sorted(self.model_ids, model_ids)
        cols = np.arange(len(self.query_ids)) if query_ids is None else at_sorted(self.query_ids, query_ids)
        r, c = np.maximum(rows, 0), np.maximum(cols, 0)
        if len(rows) * len(self.query_ids) <= 1 << 25:            # a few models: their rows unpacked whole
            count = len(self.query_ids)
            seen = np.unpackbits(self.seen[r], axis=1, count=count)[:, c]
            right = np.unpackbits(self.right[r], axis=1, count=count)[:, c]
        else:                                                   # every model on a few queries: those bits alone
            byte, shift = (c // 8).astype(np.intp), (7 - c % 8).astype(np.uint8)
            seen = (self.seen[:, byte][r] >> shift) & 1
            right = (self.right[:, byte][r] >> shift) & 1
        out = np.where(seen == 1, right, -1).astype(np.int8)                         # [m, n]
        out[rows < 0] = -1
        out[:, cols < 0] = -1
        return out

    def agreement(self, qids, y, others) -> dict[int, tuple[int, float, float | None]]:
        """How each of `others` (model ids) errs with the answers y (0/1) on query ids qids (`errs_alike`):
        {other id: (shared, disagreement rate, error correlation)}, over the queries both answered."""
        qids, y = np.asarray(qids, dtype=np.int64), np.asarray(y, dtype=np.int64)
        others = [int(m) for m in others if m is not None]
        if not len(qids) or not others:
            return {}
        last = current_evaluations.last_answers(qids, y)
        q, a = np.asarray(last[0], dtype=np.int64), np.asarray(last[1], dtype=np.int64)
        ids, out = np.asarray(others, dtype=np.int64), {}
        lp = self.difficulty(q)
        for at in range(0, len(ids), 512):            # (memory: [512, queries] at a time, however many others)
            out.update(errs_alike(self.answers(ids[at:at + 512], q), None, a, self, q, ids[at:at + 512],
                                  difficulty=lp))
        return out

    @functools.cached_property
    def _logits(self) -> tuple[np.ndarray, np.ndarray, float]:
        """([Q] every question's difficulty, [M] every model's ability, their mean ability): once per index."""
        lp = np.log((self.query_right + 1.0) / (self.query_answered - self.query_right + 1.0))
        la = np.log((self.model_right + 1.0) / (self.model_answered - self.model_right + 1.0))
        return lp, la, float(la.mean()) if len(la) else 0.0

    def difficulty(self, query_ids) -> np.ndarray:
        """[n] each question's log odds of a right answer (0 for a question nobody answered)."""
        at = at_sorted(self.query_ids, query_ids)
        return np.where(at >= 0, self._logits[0][np.maximum(at, 0)], 0.0)

    def ability(self, model_ids) -> np.ndarray:
        """[n] each model's log odds of a right answer over all its questions (0 for a model without answers)."""
        at = at_sorted(self.model_ids, model_ids)
        return np.where(at >= 0, self._logits[1][np.maximum(at, 0)], 0.0)

    @property
    def mid(self) -> float:
        """The models' mean ability: the centre an average model's predicted answers are drawn from."""
        return self._logits[2]

    def odds(self, abilities) -> np.ndarray:
        """[m] float32 each model's odds of a right answer over an average model's (its ability less `mid`)."""
        return np.exp(np.asarray(abilities, dtype=np.float64) - self.mid).astype(np.float32)

    def expected(self, query_ids, abilities, *, difficulty: np.ndarray | None = None) -> np.ndarray:
        """[m, n] float32 the chance each of m models (their `ability`) answers each of n questions right
        (`difficulty`: the questions' own, where the caller has them): the logistic of the two logits' sum, as 1 less
        `missed_by_odds`."""
        lp = self.difficulty(query_ids) if difficulty is None else difficulty
        out = missed_by_odds(self.odds(abilities), np.exp(lp).astype(np.float32))
        return np.subtract(1, out, out=out)

    @functools.cached_property
    def sketch(self) -> np.ndarray:
        """[M, S] int8 every model's answers on the sketch questions."""
        return self.answers(self.model_ids, self.sketch_queries)

    @functools.cached_property
    def surprises(self) -> np.ndarray:
        """[M, S] float32 each model's sketch answers less what difficulty and ability predict (0 where it gave
        none; at float16's precision, as the sidecar keeps them). Once per index, not per question asked of it."""
        seen = self.sketch >= 0
        expected = self.expected(self.sketch_queries, self.ability(self.model_ids))
        return np.where(seen, self.sketch - expected, 0.0).astype(np.float16).astype(np.float32)

    @functools.cached_property
    def _sketch_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """([M] sketch questions each model answered, [M] the length of its surprises there)."""
        sm = self.surprises
        return (self.sketch >= 0).sum(axis=1), np.sqrt(np.einsum("ij,ij->i", sm, sm, dtype=np.float64))

    def nearest_by_sketch(self, qids, y, n: int, exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
        """The ids of the n models whose surprises on the sketch questions point most the way those of the answers
        y (0/1) on query ids qids do (the cosine of the two, a question either left unanswered counting as no
        surprise), among models that answered MIN_SKETCH_SHARED of them ([] where y answered fewer)."""
        qids, y = np.asarray(qids, dtype=np.int64), np.asarray(y, dtype=np.float64)
        at = at_sorted(self.sketch_queries, qids)
        if (at >= 0).sum() < MIN_SKETCH_SHARED or not len(self.model_ids):
            return []
        mine = np.zeros(len(self.sketch_queries), dtype=np.float32)                      # [S] 1: answered
        mine[at[at >= 0]] = 1
        own = np.zeros(len(self.sketch_queries))
        own[at[at >= 0]] = y[at >= 0]
        own_la = np.log((y.sum() + 1.0) / (len(y) - y.sum() + 1.0))
        sy = (mine * (own - self.expected(self.sketch_queries, [own_la])[0])).astype(np.float32)   # [S], 0: none
        answered, length = self._sketch_rows
        den = length * float(np.sqrt(sy @ sy))
        # (one matrix-vector product: the [M, S] matrix is read once a question asked, never copied)
        corr = np.where((den > 0) & (answered >= MIN_SKETCH_SHARED), (self.surprises @ sy) / np.where(den > 0, den, 1),
                        -np.inf)
        out = at_sorted(self.model_ids, sorted(exclude))
        corr[out[out >= 0]] = -np.inf
        top = np.argpartition(-corr, n)[:n] if len(corr) > n else np.arange(len(corr))     # (not a sort of all M)
        order = top[np.lexsort((top, -corr[top]))]                        # the highest first, ties by model id
        return [int(m) for m in self.model_ids[order[np.isfinite(corr[order])]]]

BLOCK_BYTES = 512 << 10    # `errs_alike`'s rows at a time: each float32 temporary of [rows, queries] at most this size
NONE = 9                   # an answer no model gives: a column y left unanswered matches no row's answer there
SCRATCH_KEPT = 4           # scratch buffers kept for the next call (one per thread asking at once)
_scratch: list[np.ndarray] = []
_scratch_lock = threading.Lock()


@contextmanager
def _scratch_bytes(nbytes: int):
    """A uint8 buffer of at least nbytes, reused across calls: pages mapped afresh per question asked (a server maps
    every block above 128 KB anew, serve/app.py `bound_malloc`) cost more than the arithmetic done in them."""
    with _scratch_lock:
        fits = [i for i, b in enumerate(_scratch) if len(b) >= nbytes]
        buf = _scratch.pop(fits[0]) if fits else None
    if buf is None:
        buf = np.empty(nbytes, dtype=np.uint8)
    try:
        yield buf
    finally:
        with _scratch_lock:
            if len(_scratch) < SCRATCH_KEPT:
                _scratch.append(buf)


def errs_alike(matrix: np.ndarray, rows: np.ndarray | None, y: np.ndarray, scale: AnswerIndex,
               query_ids: np.ndarray, other_ids: np.ndarray, *,
               difficulty: np.ndarray | None = None) -> dict[int, tuple[int, float, float | None]]:
    """What `similar` ranks by, for m models' answers (matrix[rows], or the whole matrix where rows is None: [m, n]
    int8, 1/0, -1 none) on n queries beside one model's answers y [n] there (1/0, -1: none): {model id: (shared,
    disagreement rate, error correlation)} for those sharing any. `difficulty`: the queries' own, where the caller
    keeps them.

    Each answer's surprise is its 0/1 less the chance a model of its ability answers that question right (a logit
    sum from `scale`: the question's difficulty, plus the model's ability over all its questions, less the models'
    mean ability; y's ability is its own); the error correlation is the two surprises' correlation over the shared
    queries (None when either never surprises). Fine-tunes of one base share mistakes that two unrelated models of
    the same accuracy do not: this ranks a model's family first more often than the disagreement rate does
    (bench/families.py)."""
    y = np.asarray(y, dtype=np.int8)
    mine = y >= 0
    right = float((y == 1).sum())
    own_la = np.log((right + 1.0) / (float(mine.sum()) - right + 1.0))
    lp = scale.difficulty(query_ids) if difficulty is None else difficulty
    sy = np.zeros(len(y), dtype=np.float32)                                   # [n] y's surprises, 0: no answer
    sy[mine] = y[mine] - scale.expected(query_ids[mine], [own_la], difficulty=lp[mine])[0]
    sy2, mine_f, y1 = sy * sy, mine.astype(np.float32), (y == 1).astype(np.float32)
    y01 = mine_f - 2 * y1              # a wrong answer is the same as y's where y is 0 (+1), not where it is 1 (-1)
    counted = np.where(mine, 0, NONE).astype(np.int8)    # answered where y is: answer >= this; wrong: answer == this
    # the chance of a wrong answer, 1 / (1 + odds x query odds), as (1 / odds) / (1 / odds + query odds): infinite
    # query odds where y has no answer make it 0 there, so no column y left out counts
    query_odds = np.where(mine, np.exp(lp), np.inf).astype(np.float32)
    inv = np.reciprocal(scale.odds(scale.ability(other_ids)))[:, None]                            # [m, 1]
    m, n = len(other_ids), len(y)
    shared, same, num, sq, their = (np.zeros(m) for _ in range(5))
    step = max(1, min(m, BLOCK_BYTES // (4 * max(1, n))))
    with _scratch_bytes(14 * step * n) as buf:          # three float32 blocks, a bool one, an int8 one
        floats = buf[:12 * step * n].view(np.float32).reshape(3, step, n)
        flag_buf = buf[12 * step * n:13 * step * n].view(np.bool_).reshape(step, n)
        rows_buf = buf[13 * step * n:14 * step * n].view(np.int8).reshape(step, n)
        for at in range(0, m, step):
            r = min(step, m - at)
            # (mode="clip": with the default, numpy writes `out` through a buffer of its own; the rows are valid)
            block = matrix[at:at + r] if rows is None else np.take(matrix, rows[at:at + r], axis=0,
                                                                     out=rows_buf[:r], mode="clip")   # [r, n]
            sm, seen, wrong, flag, io = floats[0, :r], floats[1, :r], floats[2, :r], flag_buf[:r], inv[at:at + r]
            np.add(io, query_odds, out=sm)
            np.divide(io, sm, out=sm)                            # the chance of a wrong answer
            np.greater_equal(block, counted, out=flag)
            np.copyto(seen, flag)
            np.equal(block, counted, out=flag)
            np.copyto(wrong, flag)
            sm *= seen
            sm -= wrong                                          # the surprise: right 1 - p, wrong -p, none 0
            shared[at:at + r] = seen @ mine_f
            their[at:at + r] = seen @ sy2
            same[at:at + r] = seen @ y1 + wrong @ y01
            num[at:at + r] = sm @ sy
            sq[at:at + r] = np.einsum("ij,ij->i", sm, sm)
    shared, same = np.rint(shared).astype(np.int64), np.rint(same).astype(np.int64)   # (exact: float32 sums of 0/1)
    differ, den = shared - same, np.sqrt(sq * their)
    return {int(other_ids[i]): (int(shared[i]), float(differ[i] / shared[i]),
                                None if den[i] == 0 else float(num[i] / den[i]))
            for i in np.flatnonzero(shared > 0).tolist()}


def missed_by_odds(model_odds: np.ndarray, query_odds: np.ndarray) -> np.ndarray:
    """[m, n] float32 1 / (1 + each model's odds times each question's): the chance of a wrong answer, made in one
    buffer with no exponential per cell (a [candidates, queries] block is millions of cells a question asked)."""
    out = np.multiply.outer(model_odds, query_odds)
    out += 1
    return np.reciprocal(out, out=out)

def at_sorted(sorted_ids: np.ndarray, ids) -> np.ndarray:
    """Where each of `ids` sits in `sorted_ids` (-1 where absent)."""
    ids = np.asarray(ids, dtype=np.int64)
    if not len(sorted_ids):
        return np.full(len(ids), -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return np.where(sorted_ids[pos] == ids, pos, -1)
