"""Outcomes in: `{request_id, outcome, source}` for requests the proxy answered, each landing as an evaluation of the
model that answered on that request's production query.

- The outcome is 0/1 (or true/false), or a score in [0, 1] that becomes 0/1 at its source's threshold; the score is
  kept as given beside the result (table feedback).
- A request's query joins the registry once, as a query of split `production` (external id `production:<hash>`,
  no gold answer), with the vector and category its request recorded; its text only where the owner keeps texts.
- Each landing's outcomes are one import batch per source, so a source switched off leaves its batches out of the
  embeddings (traffic/sources.py).
- All or nothing: an id never issued (or lost with its request in a crash), past its window, already used, or named
  twice refuses the whole landing in one line, naming the outcome (its line in a file), and stores nothing.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from registry.core.errors import Conflict, InputError, NotFound
from registry.core.transaction import Tx
from registry.data import vector_files
from registry.traffic import requests, sources

WINDOW_S = 7 * 24 * 3600.0       # feedback is taken for a request this long after it was answered (default)
MAX_OUTCOMES = 10_000            # outcomes in one landing (a file, one POST)
MAX_FILE_BYTES = 16 << 20
PRODUCTION = "production"        # the split and the source of the queries traffic brings
HIDDEN_TEXT = "(production query: its text was not kept)"


@dataclass(frozen=True)
class Outcome:
    request_id: str
    outcome: float
    source: str
    where: str                   # how an error names it: "outcomes.jsonl, line 3" or "outcome 3"


@dataclass
class Landed:
    outcomes: int = 0
    models: dict[str, int] = field(default_factory=dict)     # model -> outcomes landed for it
    queries_added: int = 0
    batches: list[int] = field(default_factory=list)
    correct: int = 0


def check(item: object, where: str) -> Outcome:
    """One outcome, checked; the problem named with `where`."""
    if not isinstance(item, dict):
        raise InputError(f"{where}: an outcome is an object {{request_id, outcome, source}}, got {item!r:.60}")
    extra = sorted(set(item) - {"request_id", "outcome", "source"})
    if extra:
        raise InputError(f"{where}: unknown field {extra[0]!r} (an outcome has request_id, outcome, source)")
    rid, value, source = item.get("request_id"), item.get("outcome"), item.get("source", "default")
    if not isinstance(rid, str) or not requests.ID.fullmatch(rid):
        raise InputError(f"{where}: request_id must be an id the proxy returned ({requests.ID_PREFIX}...), "
                         f"got {rid!r:.80}")
    if isinstance(value, bool):
        value = float(value)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= 1:
        raise InputError(f"{where}: outcome must be 0 or 1, or a score from 0 to 1, got {value!r:.40}")
    try:
        sources.check_name(source)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from None
    return Outcome(rid, float(value), source, where)


def read_file(path: str | Path) -> list[Outcome]:
    """A JSONL file of outcomes, one object a line (blank lines skipped), checked whole before anything is stored."""
    p = Path(path)
    if not p.is_file():
        raise NotFound(f"{path}: no such file")
    if p.stat().st_size > MAX_FILE_BYTES:
        raise InputError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB; send it in parts")
    out = []
    with open(p, encoding="utf-8", errors="strict") as f:
        try:
            lines = list(f)
        except UnicodeDecodeError:
            raise InputError(f"{path}: not UTF-8 text") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except (ValueError, RecursionError):
            raise InputError(f"{path}, line {i}: not a JSON object") from None
        out.append(check(item, f"{path}, line {i}"))
        if len(out) > MAX_OUTCOMES:
            raise InputError(f"{path}: more than {MAX_OUTCOMES:,} outcomes; send it in parts")
    if not out:
        raise InputError(f"{path}: no outcomes in it")
    return out


def land(tx: Tx, items: list[Outcome], window_s: float = WINDOW_S) -> Landed:
    """Store the outcomes (all, or none with the first refusal)."""
    seen: dict[str, Outcome] = {}
    for o in items:
        if o.request_id in seen:
            raise Conflict(f"{o.where}: request {o.request_id} already has an outcome here "
                           f"({seen[o.request_id].where})")
        seen[o.request_id] = o
    ids = list(seen)
    found = requests.lookup(tx, ids)
    used = {r for (r,) in tx.sql("SELECT request_id FROM feedback WHERE request_id IN (SELECT unnest(?::VARCHAR[]))",
                                 [ids])}
    models = dict(tx.sql("SELECT name, id FROM models"))
    for o in items:
        rec = found.get(o.request_id)
        if rec is None:
            raise NotFound(f"{o.where}: request {o.request_id} was not answered by this registry's proxy (or its "
                           f"record was lost in a crash)")
        if rec.age_s > window_s:
            raise Conflict(f"{o.where}: request {o.request_id} is past its feedback window ({window_s:g} s)")
        if o.request_id in used:
            raise Conflict(f"{o.where}: request {o.request_id} already has an outcome")
        if rec.model not in models:
            raise Conflict(f"{o.where}: model {rec.model!r}, which answered request {o.request_id}, is no longer "
                           f"registered")
    setting = sources.current(tx)
    query_of, added = production_queries(tx, [found[i] for i in ids])
    out = Landed(queries_added=added)
    rows = []
    for o in items:
        rec = found[o.request_id]
        src = setting.get(o.source, sources.Source(o.source))
        ok = o.outcome >= src.threshold
        model = str(rec.model)          # (checked registered above)
        rows.append((o.request_id, models[model], query_of[rec.query_hash], o.source, o.outcome, ok))
        out.models[model] = out.models.get(model, 0) + 1
        out.correct += ok
    for source in sorted({r[3] for r in rows}):
        mine = [r for r in rows if r[3] == source]
        batch = int(tx.sql("SELECT nextval('import_batches_id_seq')")[0][0])
        digest = hashlib.sha256(",".join(r[0] for r in mine).encode()).hexdigest()
        tx.sql("INSERT INTO import_batches (id, files, row_counts, digest) VALUES (?, ?, ?, ?)",
               [batch, json.dumps({"feedback": source}), json.dumps({"evaluations_added": len(mine)}), digest])
        cols = list(zip(*mine))
        tx.sql("""INSERT INTO evaluations (model_id, query_id, correct, batch_id)
                  SELECT unnest(?::INTEGER[]), unnest(?::INTEGER[]), unnest(?::BOOLEAN[]), ?""",
               [list(cols[1]), list(cols[2]), list(cols[5]), batch])
        tx.sql("""INSERT INTO feedback (request_id, model_id, query_id, batch_id, source, outcome, correct)
                  SELECT unnest(?::VARCHAR[]), unnest(?::INTEGER[]), unnest(?::INTEGER[]), ?, ?,
                         unnest(?::DOUBLE PRECISION[]), unnest(?::BOOLEAN[])""",
               [list(cols[0]), list(cols[1]), list(cols[2]), batch, source, list(cols[4]), list(cols[5])])
        out.batches.append(batch)
    tx.invalidate("evaluated_models")
    out.outcomes = len(rows)
    return out


def production_queries(tx: Tx, recs: list[requests.Stored]) -> tuple[dict[str, int], int]:
    """{query hash: query id} for the records' production queries, adding those the registry lacks (with their
    split, category and text vector) -> (that map, how many were added)."""
    by_hash = {r.query_hash: r for r in recs}
    ext = {h: f"{PRODUCTION}:{h[:32]}" for h in by_hash}
    have = dict(tx.sql("SELECT external_id, id FROM queries WHERE external_id IN (SELECT unnest(?::VARCHAR[]))",
                       [list(ext.values())]))
    new = [h for h in by_hash if ext[h] not in have]
    if new:
        tx.sql("""INSERT INTO queries (external_id, source, category, text, content_hash)
                  SELECT unnest(?::VARCHAR[]), ?, unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[])""",
               [[ext[h] for h in new], PRODUCTION, [by_hash[h].category for h in new],
                [by_hash[h].text or HIDDEN_TEXT for h in new], new])
        have.update(tx.sql("SELECT external_id, id FROM queries WHERE external_id IN (SELECT unnest(?::VARCHAR[]))",
                           [[ext[h] for h in new]]))
        tx.sql("INSERT INTO query_splits (query_id, split) SELECT unnest(?::INTEGER[]), ?",
               [[have[ext[h]] for h in new], PRODUCTION])
        vecs = {h: v for h in new if (v := by_hash[h].vector) is not None}
        if vecs:
            vector_files.insert(tx, list(vecs), np.stack([np.frombuffer(v, dtype=np.float32) for v in vecs.values()]),
                                count=False)
        tx.invalidate("query_meta")
    return {h: int(have[ext[h]]) for h in by_hash}, len(new)
