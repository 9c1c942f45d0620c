"""Where the answer index (embedding/answer_index.py) comes from: built from the evaluations a thousand models a
pass, kept current, and saved beside a DuckDB file.

An open database keeps its answer index in the Store's cache; a DuckDB file's is saved beside it (`<db>.index/
answers.bin`, mapped when read) with the import batches, model changes and alias marks it holds (`key_of`), so the
next process starts from it. New import batches update it from the rows of the models they touched; a deletion, a
rename or an alias mark, or batches of most models, rebuild it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from registry.core import database_file
from registry.core.lazy import LazyModule
from registry.core.transaction import Tx, cache_section
from registry.data import current_evaluations
from registry.embedding.answer_index import FIELDS, SKETCH, AnswerIndex

if TYPE_CHECKING:
    import numpy as np
else:
    np = LazyModule("numpy")

SKETCH_SEED = 0
CHUNK_MODELS = 1000        # models read per pass of a build: 10^7 answers, bounded memory


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
        return build(tx, (), before_batch)
    key = key_of(tx)
    # (kept by key, the newest two: a writer's transaction may hold a batch its readers do not see yet)
    held = cache_section(tx.cache, "answer index")
    found = held.get(key)
    if found is None:
        for old in reversed(list(held.values())):
            found = _updated(tx, old, key)
            if found is not None:
                break
        saved = load(sidecar_path(tx.path)) if found is None else None
        if saved is not None:
            found = saved if saved.key == key else _updated(tx, saved, key)
        fresh = found is None or found is not saved
        found = found or build(tx, key)
        held[key] = found
        while len(held) > 2:
            try:
                held.pop(next(iter(held)), None)
            except (RuntimeError, StopIteration):    # (another thread trimmed it meanwhile)
                break
        if fresh and not tx.read_only:
            save(found, sidecar_path(tx.path))
    return found


def current_or_none(tx: Tx) -> AnswerIndex | None:
    """The answer index where one is at hand and current (held, or saved beside the file), else None: nothing is
    built or updated (a caller with a cheaper way of its own takes that)."""
    key = key_of(tx)
    found = cache_section(tx.cache, "answer index").get(key)
    if found is None:
        saved = load(sidecar_path(tx.path))
        found = saved if saved is not None and saved.key == key else None
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


def _lookup(sorted_ids: np.ndarray) -> np.ndarray:
    """[max - min + 1] each id's position among sorted_ids (offset by the smallest), -1 for ids between them."""
    out = np.full(int(sorted_ids[-1] - sorted_ids[0]) + 1, -1, dtype=np.int64)
    out[sorted_ids - sorted_ids[0]] = np.arange(len(sorted_ids))
    return out


def _chunk(tx: Tx, source: str, q_ids: np.ndarray, *, newest: bool = False) -> _Chunk:
    """The rows of `source` (a subquery of the answers that count), packed by model over the columns q_ids; with
    `newest`, its rows as they lie, each (model, query)'s newest kept here (current_evaluations.newest_per_query)."""
    if newest:
        rows = current_evaluations.newest_per_query(
            tx.numpy(f"SELECT model_id, query_id, correct::INT AS correct, batch_id FROM {source} e"))
    else:
        rows = tx.numpy(f"SELECT model_id, query_id, correct::INT AS correct FROM {source} e")
    mid, qid = np.asarray(rows["model_id"], dtype=np.int64), np.asarray(rows["query_id"], dtype=np.int64)
    if not len(mid) or not len(q_ids):
        none = np.zeros(0, dtype=np.int64)
        width = (len(q_ids) + 7) // 8
        return _Chunk(none, none, none, np.zeros((0, width), np.uint8), np.zeros((0, width), np.uint8),
                      np.zeros(len(q_ids), np.int64), np.zeros(len(q_ids), np.int64))
    # (ids to rows and columns through lookup arrays over the ids' ranges: 10^7 rows a pass, no sort)
    m_ids = np.flatnonzero(np.bincount(mid - mid.min())) + mid.min()
    row = _lookup(m_ids)[mid - m_ids[0]]
    col = np.full(len(qid), -1, dtype=np.int64)
    inside = (qid >= q_ids[0]) & (qid <= q_ids[-1])
    col[inside] = _lookup(q_ids)[qid[inside] - q_ids[0]]
    dense = np.full((len(m_ids), len(q_ids)), -1, dtype=np.int8)
    flat, value = row * len(q_ids) + col, np.asarray(rows["correct"], dtype=np.int8)
    if not (col >= 0).all():                      # (a query deleted meanwhile: not a column)
        flat, value = flat[col >= 0], value[col >= 0]
    dense.reshape(-1)[flat] = value
    seen, right = dense >= 0, dense == 1
    return _Chunk(m_ids, right.sum(axis=1).astype(np.int64), seen.sum(axis=1).astype(np.int64),
                  np.packbits(seen, axis=1), np.packbits(right, axis=1),
                  right.sum(axis=0).astype(np.int64), seen.sum(axis=0).astype(np.int64))


def build(tx: Tx, key: tuple, before_batch: int | None = None) -> AnswerIndex:
    """The whole index from the evaluations, CHUNK_MODELS models a pass (memory: one pass's rows)."""
    repeated = _repeated(tx) if before_batch is None else None
    q_ids = np.asarray(tx.numpy("SELECT id FROM queries ORDER BY id")["id"], dtype=np.int64)
    ids = [int(m) for (m,) in tx.sql(f"""SELECT id FROM models WHERE id NOT IN ({current_evaluations.ALIASES})
                                          ORDER BY id""")]

    def source(chunk: list[int]) -> str:
        # (where which models answered again is not known, as on PostgreSQL: each pass's rows as they lie, the
        # newest of a pair kept in numpy; a GROUP BY of 10^7 pairs a pass spilled to disk there)
        return (current_evaluations.counted(repeated, before_batch, chunk) if repeated is not None
                else current_evaluations.rows(before_batch, chunk, distinct=True))
    parts = [_chunk(tx, source(ids[a:a + CHUNK_MODELS]), q_ids, newest=repeated is None)
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
    known (current_evaluations.bitmap_bounds: PostgreSQL, or too many bits)."""
    bounds = current_evaluations.bitmap_bounds(tx)
    if bounds is None:
        return None
    where = f"WHERE model_id IN (SELECT unnest([{', '.join(map(str, among)) or 'NULL'}]))" if among is not None else ""
    return [int(m) for (m,) in tx.sql(f"""SELECT model_id FROM evaluations {where} GROUP BY model_id
                                          HAVING count(*) > bit_count(bitstring_agg(query_id, {bounds[0]}, {bounds[1]}))
                                          """)]


def sidecar_path(db_path: str) -> Path | None:
    return database_file.sidecar(db_path, "answers.bin")


MAGIC = b"LOCUS-ANSWERS-2\n"


def load(side: Path | None) -> AnswerIndex | None:
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
        ix.__dict__["sketch"] = arrays["sketch"]
        ix.__dict__["surprises"] = arrays["surprise"]      # (float16 values, kept as float32: mapped as is)
        return ix
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(ix: AnswerIndex, side: Path | None) -> None:
    """Best effort, whole or not at all (os.replace): the sidecar only saves the next process a pass. One file: a
    JSON head (the key, each array's dtype, shape and offset), then the arrays, each at a 64-byte boundary."""
    if side is None:
        return
    arrays = {name: np.ascontiguousarray(getattr(ix, name)) for name in FIELDS}
    arrays.update(repeated=np.asarray(ix.repeated if ix.repeated is not None else [], dtype=np.int64),
                  surprise=np.ascontiguousarray(ix.surprises, dtype=np.float32), sketch=np.ascontiguousarray(ix.sketch))
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

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(MAGIC + len(body).to_bytes(8, "little") + body)
            for name, a in arrays.items():
                f.seek(start + offsets[name])
                f.write(a.tobytes())
    database_file.write_whole(side, write)
