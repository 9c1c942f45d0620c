"""The answer index: every model's current answers packed two bits an answer (10^8 answers: 25 MB), with the totals
and the sketch `similar` needs, so that it reads the answers of its candidates without the evaluations table (10^8
rows at ten thousand models). Like the vector index, derived from the database and never its source of truth.

- Answers: [models, queries] bits, answered and right, over the answers that count
  (current_evaluations.current(distinct=True): registered models, no alias, each question's newest answer).
- Totals: each question's right answers and answers, each model's over all its questions; they give each question's
  difficulty and each model's ability as logits, smoothed by one right and one wrong (`difficulty`, `ability`).
- A sketch: SKETCH questions drawn (fixed seed) from those most models answered. Two models' surprises there (an
  answer less what difficulty and ability predict) correlate where they err alike beyond difficulty;
  `nearest_by_sketch` ranks every model so, in one [models, SKETCH] pass.
- `errs_alike`: one formula for how much two models err together, over the answers of a few (`agreement`, here; a
  server's answer book, from its memory).

An open database keeps its answer index in the Store's cache; a DuckDB file's is saved beside it (`<db>.index/
answers.npz`) with the import batches, model changes and alias marks it holds (`key`), so the next process starts
from it. New import batches update it from the rows of the models they touched; a deletion, a rename or an alias
mark, or batches of most models, rebuild it (a pass over the evaluations, a thousand models at a time).
"""
from __future__ import annotations

import functools
import json
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from registry.core import dialect
from registry.core.lazy import LazyModule
from registry.core.transaction import Tx, cache_section
from registry.data import current_evaluations

if TYPE_CHECKING:
    import numpy as np
else:
    np = LazyModule("numpy")

SKETCH = 512               # questions in the sketch
SKETCH_SEED = 0
MIN_SKETCH_SHARED = 32     # sketch questions two models must share to be ranked by it
CHUNK_MODELS = 1000        # models read per pass of a build: 10^7 answers, bounded memory


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
        rows = _at(self.model_ids, model_ids)
        cols = np.arange(len(self.query_ids)) if query_ids is None else _at(self.query_ids, query_ids)
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

    def difficulty(self, query_ids) -> np.ndarray:
        """[n] each question's log odds of a right answer (0 for a question nobody answered)."""
        at = _at(self.query_ids, query_ids)
        right = np.where(at >= 0, self.query_right[at], 0)
        n = np.where(at >= 0, self.query_answered[at], 0)
        return np.log((right + 1.0) / (n - right + 1.0))

    def ability(self, model_ids) -> np.ndarray:
        """[n] each model's log odds of a right answer over all its questions (0 for a model without answers)."""
        at = _at(self.model_ids, model_ids)
        right = np.where(at >= 0, self.model_right[at], 0)
        n = np.where(at >= 0, self.model_answered[at], 0)
        return np.log((right + 1.0) / (n - right + 1.0))

    @property
    def mid(self) -> float:
        """The models' mean ability: the centre an average model's predicted answers are drawn from."""
        return float(self.ability(self.model_ids).mean()) if len(self.model_ids) else 0.0

    def expected(self, query_ids, abilities) -> np.ndarray:
        """[m, n] the chance each of m models (their `ability`) answers each of n questions right."""
        # (float32: a [candidates, queries] block is millions of exponentials a question asked)
        logit = (self.difficulty(query_ids).astype(np.float32)[None, :]
                 + np.asarray(abilities, dtype=np.float32)[:, None] - np.float32(self.mid))
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

    def nearest_by_sketch(self, qids, y, n: int, exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
        """The ids of the n models whose surprises on the sketch questions correlate most with those of the answers
        y (0/1) on query ids qids, among models sharing MIN_SKETCH_SHARED of them ([] where y has fewer)."""
        qids, y = np.asarray(qids, dtype=np.int64), np.asarray(y, dtype=np.float64)
        at = _at(self.sketch_queries, qids)
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
        shared = seen @ mine
        den = np.sqrt((sm2 @ mine) * (seen @ (sy * sy)))
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
    sy = y - scale.expected(query_ids, [own_la])[0]                                        # [n]
    sm = np.where(seen, block - scale.expected(query_ids, scale.ability(other_ids)), 0.0)   # [m, n]
    shared = seen.sum(axis=1)
    differ = (seen & (block != y[None, :])).sum(axis=1)
    num = (sm @ sy).astype(np.float64)
    den = np.sqrt((sm * sm).sum(axis=1, dtype=np.float64) * (seen.astype(np.float32) @ (sy * sy)))
    return {int(other_ids[i]): (int(shared[i]), float(differ[i] / shared[i]),
                                None if den[i] == 0 else float(num[i] / den[i]))
            for i in np.flatnonzero(shared > 0).tolist()}


def _at(sorted_ids: np.ndarray, ids) -> np.ndarray:
    """Where each of `ids` sits in `sorted_ids` (-1 where absent)."""
    ids = np.asarray(ids, dtype=np.int64)
    if not len(sorted_ids):
        return np.full(len(ids), -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(sorted_ids, ids), len(sorted_ids) - 1)
    return np.where(sorted_ids[pos] == ids, pos, -1)


def key_of(tx: Tx) -> tuple:
    """What an index must hold to be current: the import batches (how many, the newest and when it was made), the
    newest model change and the newest alias mark."""
    n, newest, made = tx.sql("SELECT count(*), coalesce(max(id), 0), max(created)::VARCHAR FROM import_batches")[0]
    change, alias = tx.sql("SELECT (SELECT coalesce(max(id), 0) FROM model_changes), "
                           "(SELECT coalesce(max(id), 0) FROM model_aliases)")[0]
    return int(n), int(newest), made, int(change), int(alias)


def get(tx: Tx, before_batch: int | None = None) -> AnswerIndex:
    """The answer index as the registry stands (with `before_batch`, as it stood before that import batch: built
    for the answer, not kept)."""
    if before_batch is not None:
        return _build(tx, (), before_batch)
    key = key_of(tx)
    # (kept by key, the newest two: a writer's transaction may hold a batch its readers do not see yet)
    held = cache_section(tx.cache, "answer index")
    found = held.get(key)
    if found is None:
        for old in reversed(list(held.values())):
            found = _updated(tx, old, key)
            if found is not None:
                break
        saved = _load(_sidecar(tx.path)) if found is None else None
        if saved is not None:
            found = saved if saved.key == key else _updated(tx, saved, key)
        fresh = found is None or found is not saved
        found = found or _build(tx, key)
        held[key] = found
        while len(held) > 2:
            try:
                held.pop(next(iter(held)), None)
            except (RuntimeError, StopIteration):    # (another thread trimmed it meanwhile)
                break
        if fresh and not tx.read_only:
            _save(found, _sidecar(tx.path))
    return found


def _updated(tx: Tx, old: AnswerIndex, key: tuple) -> AnswerIndex | None:
    """`old` brought up to `key` from the rows of the models new batches touched (their old rows are its own),
    where only batches were added, every new one newer than the newest it holds, and new queries only after its
    own (else None: rebuild)."""
    n, newest, _, change, alias = key
    if (change, alias) != tuple(old.key[3:]) or newest <= old.key[1] or tx.sql(
            "SELECT count(*) FROM import_batches WHERE id <= ?", [old.key[1]])[0][0] != old.key[0]:
        return None
    last_q = int(old.query_ids[-1]) if len(old.query_ids) else 0
    new_q = np.asarray(tx.numpy("SELECT id FROM queries WHERE id > ? ORDER BY id", [last_q])["id"], dtype=np.int64)
    if tx.sql("SELECT count(*) FROM queries")[0][0] != len(old.query_ids) + len(new_q):
        return None
    touched = [int(m) for (m,) in tx.sql("SELECT DISTINCT model_id FROM evaluations WHERE batch_id > ?",
                                         [old.key[1]])]
    if len(touched) > max(64, len(old.model_ids) // 2):
        return None
    again = None if old.repeated is None else _repeated(tx, touched)
    repeated = None if again is None or old.repeated is None else \
        np.union1d(old.repeated[~np.isin(old.repeated, touched)], np.asarray(again, dtype=np.int64))
    q_ids = np.concatenate([old.query_ids, new_q])
    width = (len(q_ids) + 7) // 8
    gone = old.answers(np.intersect1d(old.model_ids, touched))                       # their old rows
    q_right = np.concatenate([old.query_right, np.zeros(len(new_q), np.int64)])
    q_n = np.concatenate([old.query_answered, np.zeros(len(new_q), np.int64)])
    q_right[:len(old.query_ids)] -= (gone == 1).sum(axis=0)
    q_n[:len(old.query_ids)] -= (gone >= 0).sum(axis=0)
    fresh = _chunk(tx, current_evaluations.counted(None if repeated is None else repeated.tolist(), None, touched),
                   q_ids)
    q_right += fresh.q_right
    q_n += fresh.q_n
    keep = ~np.isin(old.model_ids, touched)
    pad = ((0, 0), (0, width - old.seen.shape[1]))
    m_ids = np.concatenate([old.model_ids[keep], fresh.model_ids])
    order = np.argsort(m_ids)
    stack = lambda a, b: np.concatenate([a, b])[order]                               # noqa: E731
    return replace(old, key=key, query_ids=q_ids, query_right=q_right, query_answered=q_n, model_ids=m_ids[order],
                   model_right=stack(old.model_right[keep], fresh.m_right),
                   model_answered=stack(old.model_answered[keep], fresh.m_n),
                   seen=stack(np.pad(old.seen[keep], pad), fresh.seen),
                   right=stack(np.pad(old.right[keep], pad), fresh.right), repeated=repeated)


@dataclass
class _Chunk:
    """Some models' answers as `AnswerIndex` holds them, with their totals."""
    model_ids: np.ndarray
    m_right: np.ndarray
    m_n: np.ndarray
    seen: np.ndarray
    right: np.ndarray
    q_right: np.ndarray
    q_n: np.ndarray


def _chunk(tx: Tx, source: str, q_ids: np.ndarray) -> _Chunk:
    """The rows of `source` (a subquery of the answers that count), packed by model over the columns q_ids."""
    rows = tx.numpy(f"SELECT model_id, query_id, correct::INT AS correct FROM {source} e")
    m_ids, row = np.unique(np.asarray(rows["model_id"], dtype=np.int64), return_inverse=True)
    col = _at(q_ids, rows["query_id"])
    ok = col >= 0
    dense = np.full((len(m_ids), len(q_ids)), -1, dtype=np.int8)
    dense[row[ok], col[ok]] = np.asarray(rows["correct"])[ok]
    seen, right = dense >= 0, dense == 1
    return _Chunk(m_ids, right.sum(axis=1).astype(np.int64), seen.sum(axis=1).astype(np.int64),
                  np.packbits(seen, axis=1), np.packbits(right, axis=1),
                  right.sum(axis=0).astype(np.int64), seen.sum(axis=0).astype(np.int64))


def _build(tx: Tx, key: tuple, before_batch: int | None = None) -> AnswerIndex:
    """The whole index from the evaluations, CHUNK_MODELS models a pass (memory: one pass's rows)."""
    repeated = _repeated(tx) if before_batch is None else None
    q_ids = np.asarray(tx.numpy("SELECT id FROM queries ORDER BY id")["id"], dtype=np.int64)
    ids = [int(m) for (m,) in tx.sql(f"""SELECT id FROM models WHERE id NOT IN ({current_evaluations.ALIASES})
                                          ORDER BY id""")]
    parts = [_chunk(tx, current_evaluations.counted(repeated, before_batch, ids[a:a + CHUNK_MODELS]), q_ids)
             for a in range(0, len(ids), CHUNK_MODELS)]
    cat = lambda name: np.concatenate([getattr(p, name) for p in parts]) if parts else np.zeros(0, np.int64)  # noqa
    width = (len(q_ids) + 7) // 8
    seen = np.concatenate([p.seen for p in parts]) if parts else np.zeros((0, width), np.uint8)
    right = np.concatenate([p.right for p in parts]) if parts else np.zeros((0, width), np.uint8)
    q_right = sum((p.q_right for p in parts), np.zeros(len(q_ids), np.int64))
    q_n = sum((p.q_n for p in parts), np.zeros(len(q_ids), np.int64))
    common = np.flatnonzero(q_n >= 0.5 * q_n.max()) if len(q_n) and q_n.max() > 0 else np.zeros(0, np.int64)
    picked = np.random.default_rng(SKETCH_SEED).choice(common, min(SKETCH, len(common)), replace=False)
    return AnswerIndex(key, q_ids, q_right, q_n, cat("model_ids"), cat("m_right"), cat("m_n"), seen, right,
                       np.sort(q_ids[picked]),
                       None if repeated is None else np.array(sorted(repeated), dtype=np.int64))


def _repeated(tx: Tx, among: list[int] | None = None) -> list[int] | None:
    """The models (of `among`, else every one) that answered some question more than once: their rows are grouped
    to their current ones (current_evaluations.counted); DuckDB finds them with one bitmap per model. None: not
    known (PostgreSQL, or more bits than current_evaluations.BITMAP_BITS)."""
    if tx.postgres:
        return None
    lo, hi = tx.sql("SELECT min(id), max(id) FROM queries")[0]
    models = tx.sql("SELECT count(*) FROM models")[0][0]
    if lo is None or models * (int(hi) - int(lo) + 1) > current_evaluations.BITMAP_BITS:
        return None
    where = f"WHERE model_id IN (SELECT unnest([{', '.join(map(str, among)) or 'NULL'}]))" if among is not None else ""
    return [int(m) for (m,) in tx.sql(f"""SELECT model_id FROM evaluations {where} GROUP BY model_id
                                          HAVING count(*) > bit_count(bitstring_agg(query_id, {int(lo)}, {int(hi)}))
                                          """)]


FIELDS = ("query_ids", "query_right", "query_answered", "model_ids", "model_right", "model_answered", "seen", "right",
          "sketch_queries")


def _sidecar(db_path: str) -> Path | None:
    return None if dialect.is_url(db_path) or not db_path else Path(f"{db_path}.index") / "answers.bin"


MAGIC = b"LOCUS-ANSWERS-1\n"


def _load(side: Path | None) -> AnswerIndex | None:
    """The saved index (any key: the caller checks it), or None; a damaged file is only a cache miss. Its arrays
    are mapped, not read: a process touches the pages it uses (a few candidates' rows, the sketch)."""
    if side is None or not side.is_file():
        return None
    try:
        with open(side, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                return None
            head = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        arrays = {name: np.memmap(side, dtype=np.dtype(dt), mode="r", offset=at, shape=tuple(shape))
                  if int(np.prod(shape)) else np.zeros(tuple(shape), dtype=np.dtype(dt))
                  for name, (dt, shape, at) in head["arrays"].items()}
        ix = AnswerIndex(tuple(head["key"]), **{name: arrays[name] for name in FIELDS},
                         repeated=arrays["repeated"] if head["repeated_known"] else None)
        # (what `sketch` and `surprises` give, saved: a process asks them once and would pay a third of a second)
        sm = np.asarray(arrays["surprise"], dtype=np.float32)
        ix.__dict__["sketch"] = arrays["sketch"]
        ix.__dict__["surprises"] = (sm, sm * sm, (arrays["sketch"] >= 0).astype(np.float32))
        return ix
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _save(ix: AnswerIndex, side: Path | None) -> None:
    """Best effort, whole or not at all (os.replace): the sidecar only saves the next process a pass. One file: a
    JSON head (the key, each array's dtype, shape and offset), then the arrays, each at a 64-byte boundary."""
    if side is None:
        return
    arrays = {name: np.ascontiguousarray(getattr(ix, name)) for name in FIELDS}
    arrays.update(repeated=np.asarray(ix.repeated if ix.repeated is not None else [], dtype=np.int64),
                  surprise=ix.surprises[0].astype(np.float16), sketch=np.ascontiguousarray(ix.sketch))
    offsets, at = {}, 0
    for name, a in arrays.items():
        offsets[name] = at
        at += -(-a.nbytes // 64) * 64
    spans = lambda start: {name: [a.dtype.str, list(a.shape), start + offsets[name]]   # noqa: E731
                           for name, a in arrays.items()}
    head = lambda start: json.dumps({"key": list(ix.key), "repeated_known": ix.repeated is not None,  # noqa: E731
                                     "arrays": spans(start)}).encode()
    start = -(-(len(MAGIC) + 8 + len(head(0)) + 64) // 64) * 64           # (room for the offsets' own digits)
    body = head(start)
    try:
        side.parent.mkdir(exist_ok=True)
        tmp = side.with_name(f"{side.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        with open(tmp, "wb") as f:
            f.write(MAGIC + len(body).to_bytes(8, "little") + body)
            for name, a in arrays.items():
                f.seek(start + offsets[name])
                f.write(a.tobytes())
        os.replace(tmp, side)
    except OSError:
        pass
