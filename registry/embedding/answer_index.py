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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

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
        for at in range(0, len(ids), 512):            # (memory: [512, queries] at a time, however many others)
            out.update(errs_alike(self.answers(ids[at:at + 512], q), a, self, q, ids[at:at + 512],
                                  rows_bytes=BLOCK_BYTES))
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

class Rows(Protocol):
    """An [m, n] int8 block of answers, or what gives one a slice of rows at a time (serve/answerbook.py)."""
    def __len__(self) -> int: ...
    def __getitem__(self, at: slice, /) -> np.ndarray: ...


ROWS_BYTES = 120_000       # `errs_alike`'s rows at a time: a float32 temporary of [rows, queries] at most this size
BLOCK_BYTES = 1 << 20      # the same for `agreement`, a command's read: without a server's bound on malloc, a
#                            larger block is fewer numpy calls (128 models x 10,000 questions: 41 -> 22 ms)


def errs_alike(block: Rows, y: np.ndarray, scale: AnswerIndex, query_ids: np.ndarray,
               other_ids: np.ndarray, *, rows_bytes: int = ROWS_BYTES) -> dict[int, tuple[int, float, float | None]]:
    """What `similar` ranks by, for m models' answers `block` [m, n] (1/0, -1: none; or anything whose row slices
    are such arrays) on n queries beside one model's answers y [n] (0/1) there: {model id: (shared, disagreement
    rate, error correlation)} for those sharing any.

    Each answer's surprise is its 0/1 less the chance a model of its ability answers that question right (a logit
    sum from `scale`: the question's difficulty, plus the model's ability over all its questions, less the models'
    mean ability; y's ability is its own); the error correlation is the two surprises' correlation over the shared
    queries (None when either never surprises). Fine-tunes of one base share mistakes that two unrelated models of
    the same accuracy do not: this ranks a model's family first more often than the disagreement rate does
    (bench/families.py)."""
    y = np.asarray(y, dtype=np.float32)
    own_la = np.log((float(y.sum()) + 1.0) / (len(y) - float(y.sum()) + 1.0))
    lp = scale.difficulty(query_ids)
    sy = y - scale.expected(query_ids, [own_la], difficulty=lp)[0]                                    # [n]
    sy2, y8 = sy * sy, y.astype(np.int8)
    odds, query_odds = scale.odds(scale.ability(other_ids)), np.exp(lp).astype(np.float32)
    m = len(other_ids)
    shared, same = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
    num, sq, their = np.zeros(m), np.zeros(m), np.zeros(m)
    # (a few rows at a time: each temporary stays under malloc's mapping threshold, 128 KB in a server, so it is
    # reused memory and not pages mapped afresh, which cost more than the arithmetic)
    step = max(1, rows_bytes // (4 * max(1, len(y))))
    for at in range(0, m, step):
        rows = block[at:at + step]                                                                   # [r, n]
        seen = rows >= 0
        # each answer less its chance of being right: answer - 1 + `missed_by_odds` where answered, 0 elsewhere
        sm = missed_by_odds(odds[at:at + step], query_odds)
        sm += rows
        sm -= 1
        sm *= seen
        shared[at:at + step] = seen.sum(axis=1)
        same[at:at + step] = (rows == y8).sum(axis=1)
        num[at:at + step] = sm @ sy
        sq[at:at + step] = np.einsum("ij,ij->i", sm, sm)
        their[at:at + step] = seen @ sy2
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
