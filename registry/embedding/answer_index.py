"""The answer index: every model's current answers packed two bits an answer (10^8 answers: 25 MB), with the totals
and the sketch `similar` needs, so that it reads the answers of its candidates without the evaluations table (10^8
rows at ten thousand models). Like the vector index, derived from the database and never its source of truth
(embedding/answer_store.py builds it, keeps it current and saves it beside the file).

- Answers: [models, queries] bits, answered and right, over the answers that count
  (current_evaluations.current(distinct=True): registered models, no alias, each question's newest answer).
- Totals: each question's right answers and answers, each model's over all its questions; they give each question's
  difficulty and each model's ability as logits, smoothed by one right and one wrong (`difficulty`, `ability`).
- A sketch: SKETCH questions drawn (fixed seed) from those most models answered. Two models' surprises there (an
  answer less what difficulty and ability predict) correlate where they err alike beyond difficulty;
  `nearest_by_sketch` ranks every model so, in one [models, SKETCH] pass.
- `errs_alike`: one formula for how much two models err together, over the answers of a few (`agreement`, here; a
  server's answer book, from its memory).
"""
from __future__ import annotations

import functools
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
        for at in range(0, len(ids), 512):            # (memory: [512, queries] at a time, however many others)
            out.update(errs_alike(self.answers(ids[at:at + 512], q), a, self, q, ids[at:at + 512]))
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

    def expected(self, query_ids, abilities, *, difficulty: np.ndarray | None = None) -> np.ndarray:
        """[m, n] the chance each of m models (their `ability`) answers each of n questions right (`difficulty`:
        the questions' own, where the caller has them)."""
        # (float32: a [candidates, queries] block is millions of exponentials a question asked)
        lp = self.difficulty(query_ids) if difficulty is None else difficulty
        own = np.asarray(abilities, dtype=np.float32) - np.float32(self.mid)
        logit = lp.astype(np.float32)[None, :] + own[:, None]
        return 1 / (1 + np.exp(-logit))

    @functools.cached_property
    def sketch(self) -> np.ndarray:
        """[M, S] int8 every model's answers on the sketch questions."""
        return self.answers(self.model_ids, self.sketch_queries)

    @functools.cached_property
    def surprises(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[M, S] float32 each: each model's sketch answers less what difficulty and ability predict (0 where it
        gave none; at float16's precision, as the sidecar keeps them), their squares, and 1 where it answered.
        Once per index, not per question asked of it."""
        seen = self.sketch >= 0
        expected = self.expected(self.sketch_queries, self.ability(self.model_ids))
        sm = np.where(seen, self.sketch - expected, 0.0).astype(np.float16).astype(np.float32)
        return sm, sm * sm, seen.astype(np.float32)

    @functools.cached_property
    def _sketch_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """([M] sketch questions each model answered, [M] its squared surprises' sum there)."""
        sm, sm2, seen = self.surprises
        return seen.sum(axis=1), sm2.sum(axis=1)

    def nearest_by_sketch(self, qids, y, n: int, exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
        """The ids of the n models whose surprises on the sketch questions correlate most with those of the answers
        y (0/1) on query ids qids, among models sharing MIN_SKETCH_SHARED of them ([] where y has fewer)."""
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
        sm, sm2, seen = self.surprises                                                     # [M, S] each
        # (matrix-vector products only: no copy of the [M, S] matrices per question asked)
        whole = bool(mine.all())         # (the usual case: one product over the [M, S] matrices, not three)
        shared = self._sketch_rows[0] if whole else seen @ mine
        den = np.sqrt((self._sketch_rows[1] if whole else sm2 @ mine) * (seen @ (sy * sy)))
        corr = np.where((den > 0) & (shared >= MIN_SKETCH_SHARED), (sm @ sy) / np.where(den > 0, den, 1), -np.inf)
        corr[np.isin(self.model_ids, list(exclude))] = -np.inf
        order = np.argsort(-corr, kind="stable")[:n]
        return [int(m) for m in self.model_ids[order[np.isfinite(corr[order])]]]


def errs_alike(block: np.ndarray, y: np.ndarray, scale: AnswerIndex, query_ids: np.ndarray,
               other_ids: np.ndarray) -> dict[int, tuple[int, float, float | None]]:
    """What `similar` ranks by, for m models' answers `block` [m, n] (1/0, -1: none) on n queries beside one model's
    answers y [n] (0/1) there: {model id: (shared, disagreement rate, error correlation)} for those sharing any.

    Each answer's surprise is its 0/1 less the chance a model of its ability answers that question right (a logit
    sum from `scale`: the question's difficulty, plus the model's ability over all its questions, less the models'
    mean ability; y's ability is its own); the error correlation is the two surprises' correlation over the shared
    queries (None when either never surprises). Fine-tunes of one base share mistakes that two unrelated models of
    the same accuracy do not: this ranks a model's family first more often than the disagreement rate does
    (bench/families.py)."""
    seen = block >= 0
    y = np.asarray(y, dtype=np.float32)
    own_la = np.log((float(y.sum()) + 1.0) / (len(y) - float(y.sum()) + 1.0))
    lp = scale.difficulty(query_ids)
    sy = y - scale.expected(query_ids, [own_la], difficulty=lp)[0]                                    # [n]
    sm = scale.expected(query_ids, scale.ability(other_ids), difficulty=lp)                           # [m, n]
    np.subtract(block, sm, out=sm)                                 # (in place: one [m, n] float block in all)
    sm[~seen] = 0
    shared = seen.sum(axis=1)
    differ = shared - (block == y.astype(np.int8)[None, :]).sum(axis=1)
    num = (sm @ sy).astype(np.float64)
    den = np.sqrt(np.einsum("ij,ij->i", sm, sm, dtype=np.float64) * (seen @ (sy * sy)))
    return {int(other_ids[i]): (int(shared[i]), float(differ[i] / shared[i]),
                                None if den[i] == 0 else float(num[i] / den[i]))
            for i in np.flatnonzero(shared > 0).tolist()}


def at_sorted(sorted_ids: np.ndarray, ids) -> np.ndarray:
    """Where each of `ids` sits in `sorted_ids` (-1 where absent)."""
    ids = np.asarray(ids, dtype=np.int64)
    if not len(sorted_ids):
        return np.full(len(ids), -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return np.where(sorted_ids[pos] == ids, pos, -1)
