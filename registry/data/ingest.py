"""Bulk import of models, queries, evaluations and splits, validated, in one transaction.

Files are read by DuckDB itself into temporary stage tables (data/staging.py), checked here with a few set-based
queries, and written with `INSERT ... SELECT`: no row goes through the ORM. Any problem raises `InputError` naming
the file, the line and the problem, and the transaction rolls back, so a failed import leaves the database exactly
as it was.

Files are read in `tx.stage`, the in-process DuckDB: on a DuckDB registry its own connection, so the checks join the
registry's tables directly and rows go in with `INSERT ... SELECT`; on PostgreSQL a private DuckDB into which the
registry rows the checks need are mirrored (`staging.mirror`), and the rows to append are computed there and copied into
PostgreSQL with COPY (`_append_evaluations`), in the import's one transaction.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from registry.data import evaluation_rows, outbox, splits, vector_files
from registry.locus import text_encoder
from registry.core.errors import InputError, editor_line
from registry.data.query_cache import query_meta
from registry.data.staging import (COLUMNS, Columns, Staged, check_path, column_names, duck_error, fetch, file_columns, first_bad, ident, mirror, sql_str, stage)
from registry.core.store import Tx

SPLIT_NAMES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "dev": "val", "test": "test"}
TEXT_IN_FILE = "a `question` column (and `options`, if any) of this file"   # where `register` finds a new text
TRUE_FALSE = "CASE lower(trim({c})) WHEN '1' THEN true WHEN 'true' THEN true WHEN '0' THEN false " \
             "WHEN 'false' THEN false ELSE NULL END"


@dataclass
class ImportResult:
    batch_id: int | None
    already_imported: bool = False
    models_added: int = 0
    models_updated: int = 0
    queries_added: int = 0
    evaluations_read: int = 0
    evaluations_added: int = 0
    splits_set: int = 0
    texts_embedded: int = 0           # by MiniLM, here
    texts_from_files: int = 0         # vectors taken from vector files (data/vector_files.py) instead
    vectors_loaded: int = 0           # from the folder's text_vectors.parquet (or --vectors)
    affected_models: list[str] = field(default_factory=list)
    added_by_model: dict[str, int] = field(default_factory=dict)   # evaluations appended per model
    ignored_columns: dict[str, list[str]] = field(default_factory=dict)
    onboarding: list[dict] = field(default_factory=list)  # what the onboarding jobs did right after the import
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per step: import (its transaction, commit
    # included), onboarding (versions committed and indexed), stability


# --- per kind -----------------------------------------------------------------------------------------------------

def _bool_or_none(raw: str | None, path: str, line: int, column: str) -> bool | None:
    if raw is None or raw.strip() == "":
        return None
    value = raw.strip().lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise InputError(f"{column} must be true or false, got {raw!r}", file=path, line=line)


def _float_or_none(raw: str | None, path: str, line: int, column: str) -> float | None:
    if raw is None or raw.strip() == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{column} must be a number, got {raw!r}", file=path, line=line) from None
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise InputError(f"{column} must be a non-negative finite number, got {raw!r}", file=path, line=line)
    return value


def _parse_tags(raw: str | None, path: str, line: int) -> dict:
    if raw is None or raw.strip() == "":
        return {}
    raw = raw.strip()
    if raw.startswith("{"):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            raise InputError("tags must be a JSON object or k=v;k=v", file=path, line=line) from None
        if isinstance(value, dict):
            return value
    tags = {}
    for part in raw.split(";"):
        if "=" not in part:
            raise InputError(f"tag {part!r} is not k=v", file=path, line=line)
        k, v = part.split("=", 1)
        tags[k.strip()] = v.strip()
    return tags


def import_models(tx: Tx, staged: Staged, result: ImportResult) -> None:
    """Models are metadata-sized: validated in Python, written with two bulk statements."""
    names = [d[0] for d in tx.stage.execute(f"SELECT * FROM {staged.table} LIMIT 0").description]
    rows = fetch(tx, f"SELECT * FROM {staged.table} ORDER BY line")
    parsed, seen = [], {}
    for row in rows:
        rec = dict(zip(names, row))
        line = int(rec["line"])
        name = (rec.get("name") or "").strip()
        if not name:
            raise InputError("empty model name", file=staged.path, line=line)
        if name in seen:
            raise InputError(f"model {name!r} listed twice (lines {seen[name]} and {line})", file=staged.path,
                             line=line)
        seen[name] = line
        tags = _parse_tags(rec.get("tags"), staged.path, line)
        # columns we do not model (e.g. instruction_tuned) become tags: nothing the user gave is lost
        tags.update({k[2:]: v for k, v in rec.items() if k.startswith("x:") and v not in (None, "")})
        parsed.append({"name": name, "family": rec.get("family") or None, "provider": rec.get("provider") or None,
                       "params_b": _float_or_none(rec.get("params_b"), staged.path, line, "params_b"),
                       "cost": _float_or_none(rec.get("cost"), staged.path, line, "cost"),
                       "open_weights": _bool_or_none(rec.get("open_weights"), staged.path, line, "open_weights"),
                       "tags": json.dumps(tags, sort_keys=True)})
    upsert_models(tx, parsed, result)


def upsert_models(tx: Tx, parsed: list[dict], result: ImportResult) -> None:
    """Insert new models; update the metadata of known ones where it changed."""
    if not parsed:
        return
    fields = ["name", "family", "provider", "params_b", "cost", "open_weights", "tags"]
    table = pa.Table.from_pylist(parsed, schema=pa.schema([
        ("name", pa.string()), ("family", pa.string()), ("provider", pa.string()), ("params_b", pa.float64()),
        ("cost", pa.float64()), ("open_weights", pa.bool_()), ("tags", pa.string())]))
    with tx.table("_models_in", table):
        changed = tx.sql("""
            SELECT count(*) FROM _models_in i JOIN models m ON m.name = i.name
            WHERE m.family IS DISTINCT FROM i.family OR m.provider IS DISTINCT FROM i.provider
               OR m.params_b IS DISTINCT FROM i.params_b OR m.cost IS DISTINCT FROM i.cost
               OR m.open_weights IS DISTINCT FROM i.open_weights OR m.tags::VARCHAR IS DISTINCT FROM i.tags""")[0][0]
        if changed:
            tx.sql("""
                UPDATE models SET family = i.family, provider = i.provider, params_b = i.params_b, cost = i.cost,
                                  open_weights = i.open_weights, tags = i.tags::JSON
                FROM _models_in i WHERE models.name = i.name AND (
                    models.family IS DISTINCT FROM i.family OR models.provider IS DISTINCT FROM i.provider
                    OR models.params_b IS DISTINCT FROM i.params_b OR models.cost IS DISTINCT FROM i.cost
                    OR models.open_weights IS DISTINCT FROM i.open_weights
                    OR models.tags::VARCHAR IS DISTINCT FROM i.tags)""")
        added = tx.sql(f"""
            INSERT INTO models ({', '.join(fields)})
            SELECT name, family, provider, params_b, cost, open_weights, tags::JSON FROM _models_in
            WHERE name NOT IN (SELECT name FROM models) RETURNING id, name""")
        outbox.new_models(tx, added)
    result.models_added += len(added)
    result.models_updated += int(changed)


def import_queries(tx: Tx, staged: Staged, result: ImportResult) -> None:
    """Queries: the text embedded is the question plus its lettered options; its sha256 is the content hash."""
    has = {d[0] for d in tx.stage.execute(f"SELECT * FROM {staged.table} LIMIT 0").description}
    pick = ", ".join(c if c in has else f"NULL AS {c}" for c in ("id", "text", "category", "source", "options"))
    first_bad(tx, staged, "id IS NULL OR trim(id) = ''", "empty query id")
    first_bad(tx, staged, "text IS NULL OR trim(text) = ''", "empty query text")
    rows = fetch(tx, f"SELECT line, {pick} FROM {staged.table} ORDER BY line")
    out, seen = [], {}
    for line, qid, question, category, source, options in rows:
        qid = qid.strip()
        try:
            opts = text_encoder.parse_options(options)
        except (ValueError, json.JSONDecodeError):
            raise InputError(f"options of query {qid!r} must be a JSON list", file=staged.path, line=line) from None
        text = text_encoder.query_text(question, opts)
        digest = text_encoder.content_hash(text)
        if qid in seen:
            if seen[qid] != digest:
                raise InputError(f"query id {qid!r} appears twice with different text", file=staged.path, line=line)
            continue
        seen[qid] = digest
        out.append({"external_id": qid, "source": source or None, "category": category or None, "text": text,
                    "content_hash": digest, "line": line})
    table = pa.Table.from_pylist(out, schema=pa.schema([
        ("external_id", pa.string()), ("source", pa.string()), ("category", pa.string()), ("text", pa.string()),
        ("content_hash", pa.string()), ("line", pa.int64())]))
    with tx.table("_queries_in", table):
        clash = tx.sql("""SELECT i.line, i.external_id FROM _queries_in i JOIN queries q ON q.external_id = i.external_id
                          WHERE q.content_hash <> i.content_hash ORDER BY i.line LIMIT 1""")
        if clash:
            raise InputError(f"query id {clash[0][1]!r} is already registered with a different text",
                             file=staged.path, line=int(clash[0][0]))
        added = tx.sql("""INSERT INTO queries (external_id, source, category, text, content_hash)
                          SELECT external_id, source, category, text, content_hash FROM _queries_in
                          WHERE external_id NOT IN (SELECT external_id FROM queries) RETURNING id""")
        if added:
            tx.invalidate("query_meta")
    result.queries_added += len(added)


UNKNOWN_QUERY_HINT = "import the query first, e.g. with `registry import --queries FILE`"


def import_evaluations(tx: Tx, staged: Staged, batch_id: int, result: ImportResult,
                       unknown_hint: str = UNKNOWN_QUERY_HINT) -> None:
    """Validate with set-based queries, then append only what is new or changed (the newest evaluation counts).

    `staged` was read by `stage_evaluations`: one pass over the file, normalised on the way in, no line column.
    """
    t = staged.table
    check_evaluations(tx, staged, unknown_hint)
    names = [r[0] for r in fetch(tx, f"SELECT DISTINCT model FROM {t} ORDER BY model")]
    new_models = tx.sql("""INSERT INTO models (name, tags)
                           SELECT name, '{}'::JSON FROM (SELECT unnest(?::VARCHAR[]) AS name) n
                           WHERE name NOT IN (SELECT name FROM models) ORDER BY name RETURNING id, name""", [names])
    outbox.new_models(tx, new_models)
    result.models_added += len(new_models)
    # Only what differs from the current (newest) evaluation is appended. The current evaluations are those of the
    # file's models that have any (none for new models: the join is skipped), not the whole table's.
    evaluated = [r[0] for r in tx.sql("""SELECT DISTINCT e.model_id FROM evaluations e
                                         JOIN models m ON m.id = e.model_id
                                         WHERE m.name IN (SELECT unnest(?::VARCHAR[]))""", [names])] if names else []
    mirror(tx, "models", "queries")
    _mirror_evaluations(tx, evaluated)
    changed = f"""LEFT JOIN {evaluation_rows.current(model_ids=evaluated)} cur ON cur.model_id = m.id
                  AND cur.query_id = q.id WHERE cur.correct IS DISTINCT FROM e.c""" if evaluated else ""
    select = f"""
        SELECT {{distinct}} m.id AS model_id, q.id AS query_id, e.c AS correct, {int(batch_id)} AS batch_id
        FROM {t} e JOIN models m ON m.name = e.model JOIN queries q ON q.external_id = e.qid {changed}"""
    added = _append_evaluations(tx, select.format(distinct=""), select.format(distinct="DISTINCT"), batch_id,
                                "count(DISTINCT query_id)")
    conflicting = [m for m, n, distinct in added if n != distinct]
    if conflicting:
        _raise_conflict(tx, staged, conflicting[0])
    result.evaluations_read += staged.rows
    _added(tx, added, batch_id, result)


INTEGER_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
                 "HUGEINT")
# the duplicate check keeps one bit per (model, query id in the registry's range); above this many bits it counts
# distinct pairs instead (slower, but its memory does not grow with the range)
BITMAP_BITS = 1 << 31


@dataclass
class HeldRows:
    """What a caller that holds an evaluations file's rows in memory (run_rows_import) knows of them without a read:
    every model exists already."""
    per_model: list[tuple]          # [(model, rows, bad results, bad query ids)], as append_evaluations counts them
    query_ids: list[str]            # distinct
    names: dict[int, str]           # model id -> name, of every model of the rows
    evaluated: list[int]            # the ids of those models with evaluations already
    queries_known: bool = False     # every query id is one of the registry's (looked up in memory: no read)


def append_evaluations(tx: Tx, cols: Columns, batch_id: int, result: ImportResult,
                       model: str | None = None, held: HeldRows | None = None) -> bool:
    """The bulk path for an evaluations file: read by DuckDB straight into `evaluations` (one INSERT ... SELECT
    joining the models and queries, no stage table), with the checks done as aggregates over the file and over the
    rows appended. -> False, having written nothing, when the file has any problem (a bad or empty value, an
    unknown query, another model than `model`): the caller then takes the careful path (`stage_evaluations` +
    `import_evaluations`), which finds the first bad row and names its line; a row DuckDB cannot read at all is
    an InputError here, with the line its reader names. Same outcome
    as the careful path: new models registered, only new or changed results appended, identical repeats collapsed,
    differing repeats an error. `held`: what the caller knows of rows it holds (run_rows_import), six statements
    fewer."""
    e = cols.exprs
    dtype = cols.types[cols.chosen["correct"]][1] if "correct" in cols.chosen else "VARCHAR"
    raw = ident(cols.types[cols.chosen["correct"]][0]) if "correct" in cols.chosen else e["correct"]
    c = raw if dtype == "BOOLEAN" else (f"CASE {raw} WHEN 1 THEN true WHEN 0 THEN false END" if dtype in INTEGER_TYPES
                                        else TRUE_FALSE.format(c=e["correct"]))
    rows = f"(SELECT trim({e['model']}) AS model, trim({e['qid']}) AS qid, {c} AS c FROM {cols.src})"
    try:
        if tx.postgres:   # the stage is private and in memory: read the file once, then check and join the table
            tx.stage.execute(f"CREATE OR REPLACE TEMP TABLE _file_rows AS SELECT * FROM {rows}")
            rows = "_file_rows"
        if held is not None:       # (run_rows_import has refused differing repeats already)
            per_model, qids, repeats = held.per_model, held.query_ids, set()
        else:
            per_model = fetch(tx, f"""SELECT model, count(*), count(*) FILTER (WHERE c IS NULL),
                count(*) FILTER (WHERE qid IS NULL OR qid = ''), count(DISTINCT qid) FROM {rows} GROUP BY model""")
            repeats = {m for m, n, _, _, d in per_model if d != n}
            per_model = [r[:4] for r in per_model]
            qids = fetch(tx, f"SELECT list(DISTINCT qid) FROM {rows}")[0][0] or []
    except Exception as exc:   # a row DuckDB cannot read: its reader names the line, as when staging
        raise duck_error(cols.path, exc) from None
    if (not per_model or any(m is None or m == "" or bad_c or bad_q for m, _, bad_c, bad_q in per_model)
            or (model is not None and any(m != model for m, *_ in per_model))):
        return False
    mirror(tx, "queries")
    if not (held is not None and held.queries_known) and fetch(
            tx, "SELECT 1 FROM (SELECT unnest(?) AS qid) WHERE qid NOT IN (SELECT external_id FROM queries) LIMIT 1",
            [qids]):
        return False
    names = [m for m, *_ in per_model]
    if held is None:
        new_models = tx.sql("""INSERT INTO models (name, tags)
                               SELECT name, '{}'::JSON FROM (SELECT unnest(?::VARCHAR[]) AS name) n
                               WHERE name NOT IN (SELECT name FROM models) ORDER BY name RETURNING id, name""", [names])
        outbox.new_models(tx, new_models)
        result.models_added += len(new_models)
    # only what differs from a model's current (newest) evaluation is appended: compared for the file's models that
    # have evaluations already (new models have none; comparing against every model's would read them all)
    known = held.evaluated if held is not None else [r[0] for r in tx.sql(
        """SELECT DISTINCT e.model_id FROM evaluations e JOIN models m ON m.id = e.model_id
           WHERE m.name IN (SELECT unnest(?::VARCHAR[]))""", [names])]
    changed = f"""LEFT JOIN {evaluation_rows.current(model_ids=known)} cur ON cur.model_id = m.id AND cur.query_id = q.id
                  WHERE cur.correct IS DISTINCT FROM f.c""" if known else ""
    mirror(tx, "models")
    if known and repeats:   # a file contradicting itself on a model with results: the filter below could hide a side
        ids = ", ".join(str(int(m)) for m in known)
        clash = fetch(tx, f"""SELECT m.id FROM {rows} f JOIN models m ON m.name = f.model WHERE m.id IN ({ids})
                              GROUP BY m.id, f.qid HAVING count(DISTINCT f.c) > 1 LIMIT 1""")
        if clash:
            _raise_conflict(tx, stage_evaluations(tx, cols.path, "_stage_repeats", model=model), clash[0][0])
    _mirror_evaluations(tx, known)
    select = f"""SELECT @distinct m.id AS model_id, q.id AS query_id, f.c AS correct, {int(batch_id)} AS batch_id
                 FROM {rows} f JOIN models m ON m.name = f.model JOIN queries q ON q.external_id = f.qid {changed}"""
    if held is not None:           # a few hundred rows: no bitmap, and no read of the queries' id range for it
        distinct = "count(DISTINCT query_id)"
    else:
        lo, hi = tx.sql("SELECT min(id), max(id) FROM queries")[0]
        distinct = (f"bit_count(bitstring_agg(query_id, {int(lo)}, {int(hi)}))"
                    if len(names) * (int(hi) - int(lo) + 1) <= BITMAP_BITS else "count(DISTINCT query_id)")
    # (the file's source may hold braces: no str.format)
    added = _append_evaluations(tx, select.replace("@distinct", ""), select.replace("@distinct", "DISTINCT"),
                                batch_id, distinct)
    if any(n != d for _, n, d in added):           # differing repeats: find their lines to name them
        staged = stage_evaluations(tx, cols.path, "_stage_repeats", model=model)
        _raise_conflict(tx, staged, next(m for m, n, d in added if n != d))
    result.evaluations_read += sum(n for _, n, _, _ in per_model)
    _added(tx, added, batch_id, result, held.names if held is not None else None)
    return True


def _mirror_evaluations(tx: Tx, model_ids) -> None:
    """PostgreSQL: the evaluations of these models into the stage, for `evaluations.current` there."""
    ids = ", ".join(str(int(m)) for m in model_ids) or "NULL"
    tx.mirror("evaluations", f"SELECT model_id, query_id, correct, batch_id FROM evaluations WHERE model_id IN ({ids})")


def _append_evaluations(tx: Tx, select: str, select_distinct: str, batch_id: int, distinct: str) -> list:
    """Append the rows `select` gives (model_id, query_id, correct, batch_id), computed in the stage; if a (model,
    query) pair repeats, the rows of `select_distinct` instead (identical repeats collapsed). -> [(model id, rows,
    distinct queries)] per model appended; rows != distinct queries means differing repeats (the caller raises,
    and the transaction rolls back). DuckDB: INSERT ... SELECT and count what the batch added. PostgreSQL: the rows
    are counted in the stage and copied in with COPY once they are the ones to keep."""
    count = f"""SELECT model_id, count(*), {distinct} FROM {{table}} {{where}}
                GROUP BY model_id ORDER BY model_id"""
    if not tx.postgres:
        where = f"WHERE batch_id = {int(batch_id)}"
        tx.duck.execute(f"INSERT INTO evaluations (model_id, query_id, correct, batch_id) {select}")  # fast path
        added = tx.sql(count.format(table="evaluations", where=where))
        if any(n != d for _, n, d in added):
            # repeated (model, query) rows: identical repeats collapse into one; different results are an error
            tx.duck.execute(f"DELETE FROM evaluations {where}")   # only this batch's own rows
            tx.duck.execute(f"INSERT INTO evaluations (model_id, query_id, correct, batch_id) {select_distinct}")
            added = tx.sql(count.format(table="evaluations", where=where))
        return added
    rows = tx.stage.sql(select).to_arrow_table()
    tx.stage.register("_appended", rows)
    added = fetch(tx, count.format(table="_appended", where=""))
    if any(n != d for _, n, d in added):
        rows = tx.stage.sql(select_distinct).to_arrow_table()
        tx.stage.register("_appended", rows)
        added = fetch(tx, count.format(table="_appended", where=""))
    tx.stage.unregister("_appended")
    if not any(n != d for _, n, d in added):
        tx.append("evaluations", rows, ["model_id", "query_id", "correct", "batch_id"])
    return added


def _raise_conflict(tx: Tx, staged: Staged, model_id: int) -> None:
    t = staged.table
    mirror(tx, "models")
    dup = fetch(tx, f"""SELECT model, qid, min({staged.line_sql}), max({staged.line_sql}) FROM {t}
                     WHERE model = (SELECT name FROM models WHERE id = {int(model_id)})
                     GROUP BY model, qid HAVING count(DISTINCT c) > 1 ORDER BY 3 LIMIT 1""")
    m, q, first, last = dup[0]
    shown = (editor_line(staged.path, int(first)), editor_line(staged.path, int(last)))   # InputError turns `line`
    raise InputError(f"model {m!r}, query {q!r} appears twice with different results (lines {shown[0]} and "
                     f"{shown[1]})", file=staged.path, line=int(last))


def _added(tx: Tx, added, batch_id: int, result: ImportResult, names: dict | None = None) -> None:
    """Account for the rows a batch appended [(model id, rows, distinct queries)] and enqueue their models
    (`names`: {model id: name}, when the caller knows them)."""
    result.evaluations_added += sum(n for _, n, _ in added)
    if added:
        outbox.enqueue(tx, [m for m, _, _ in added], "new evaluations", batch_id=batch_id)  # the outbox
        tx.invalidate("evaluated_models")
        if names is None or any(m not in names for m, _, _ in added):
            ids = ", ".join(str(m) for m, _, _ in added)
            names = dict(tx.sql(f"SELECT id, name FROM models WHERE id IN ({ids})"))
        result.affected_models = sorted(set(result.affected_models) | set(names.values()))
        for m, n, _ in added:
            result.added_by_model[names[m]] = result.added_by_model.get(names[m], 0) + int(n)


def check_evaluations(tx: Tx, staged: Staged, unknown_hint: str | None = UNKNOWN_QUERY_HINT) -> None:
    """One line naming the file, line and problem for the first bad row: an empty model or query id, a `correct`
    that is not 0/1/true/false, a query id the registry lacks (unless `unknown_hint` is None: the caller brings
    those queries' texts)."""
    t = staged.table
    bad_model, bad_qid, bad_c = fetch(tx, f"""SELECT count(*) FILTER (WHERE model IS NULL OR model = ''),
        count(*) FILTER (WHERE qid IS NULL OR qid = ''), count(*) FILTER (WHERE c IS NULL) FROM {t}""")[0]
    if bad_model:
        first_bad(tx, staged, "model IS NULL OR model = ''", "empty model name")
    if bad_qid:
        first_bad(tx, staged, "qid IS NULL OR qid = ''", "empty query id")
    if bad_c:
        first_bad(tx, staged, "c IS NULL", "correct must be 0, 1, true or false, got {value}", "raw")
    if unknown_hint is None:
        return
    mirror(tx, "queries")
    unknown = fetch(tx, f"""SELECT qid FROM (SELECT DISTINCT qid FROM {t})
                         WHERE qid NOT IN (SELECT external_id FROM queries) LIMIT 1""")
    if unknown:
        first_bad(tx, staged, f"qid = {sql_str(unknown[0][0])}",
                   "unknown query id {value} (" + unknown_hint.replace("{", "{{").replace("}", "}}") + ")", "qid")


@dataclass
class Answers:
    """One model's results from a file, read and checked, nothing written."""
    query_ids: np.ndarray     # [n] registry query ids of the queries the registry has
    correct: np.ndarray       # [n] 0/1
    is_test: np.ndarray       # [n] bool: on a test query (never embedded)
    new_texts: list[str]      # texts of queries the registry lacks (the file gave them)
    new_correct: np.ndarray   # [len(new_texts)] 0/1


def read_answers(tx: Tx, path: str) -> Answers:
    """A results file of one unregistered model (`similar --evals`, `fingerprint --evals`), as `register` would read
    it, but into temporary tables only: nothing of it is written to the registry."""
    check_path(path)
    staged = stage_evaluations(tx, path, "_answers", model="(file)")
    columns = {c.strip().lower() for c in column_names(tx, path)}
    with_text = any(a in columns for a in COLUMNS["queries"]["text"])
    check_evaluations(tx, staged, None if with_text else "only results on queries the registry has can be "
                                                          "compared; give the texts in a `question` column")
    models = fetch(tx, "SELECT DISTINCT model FROM _answers WHERE model <> '(file)' LIMIT 2")
    if len(models) > 1:
        raise InputError(f"the file holds results of several models ({models[0][0]!r}, {models[1][0]!r}, ...)",
                         file=path)
    dup = fetch(tx, "SELECT qid FROM _answers GROUP BY qid HAVING count(DISTINCT c) > 1 LIMIT 1")
    if dup:
        raise InputError(f"query {dup[0][0]!r} appears twice with different results", file=path)
    mirror(tx, "queries", "query_splits")
    known = tx.stage.execute("""SELECT q.id AS qid, bool_or(a.c)::INT AS c, coalesce(any_value(s.split) = 'test', false)
                                      AS test
                               FROM _answers a JOIN queries q ON q.external_id = a.qid
                               LEFT JOIN query_splits s ON s.query_id = q.id GROUP BY q.id ORDER BY q.id""").fetchnumpy()
    texts, new_c = [], []
    if with_text:
        queries = stage(tx, "queries", path, "_answer_queries")
        has_options = "options" in {r[0] for r in fetch(tx, f"DESCRIBE {queries.table}")}
        rows = fetch(tx, f"""SELECT any_value(n.text), {'any_value(n.options)' if has_options else 'NULL'},
                                 bool_or(a.c)::INT FROM _answers a
                          JOIN {queries.table} n ON n.id = a.qid WHERE a.qid NOT IN (SELECT external_id FROM queries)
                          GROUP BY a.qid ORDER BY a.qid""")
        for text, options, c in rows:
            if not (text or "").strip():
                raise InputError("a query the registry lacks has no text", file=path)
            try:
                texts.append(text_encoder.query_text(text, text_encoder.parse_options(options)))
            except (ValueError, TypeError):
                raise InputError(f"options of a query must be a JSON list, got {options!r}", file=path) from None
            new_c.append(c)
        tx.stage.execute(f"DROP TABLE IF EXISTS {queries.table}")
    tx.stage.execute("DROP TABLE IF EXISTS _answers")
    return Answers(np.asarray(known["qid"], np.int64), np.asarray(known["c"], np.int64),
                   np.asarray(known["test"], bool), texts, np.asarray(new_c, np.int64))


def upsert_model_metadata(tx: Tx, name: str, **fields) -> dict[str, list]:
    """Insert the model if new; set only the metadata fields given (None leaves a field as it is). Returns what
    changed on an existing model: {field: [old, new]} (tags per key, as `tags.KEY`)."""
    tags = fields.pop("tags", None) or {}
    row = tx.sql("SELECT family, provider, params_b, cost, open_weights, tags::VARCHAR FROM models WHERE name = ?",
                 [name])
    if not row:
        outbox.new_models(tx, tx.sql("INSERT INTO models (name, tags) VALUES (?, ?::JSON) RETURNING id, name",
                                     [name, json.dumps(tags)]))
        tags = {}
    old = dict(zip(("family", "provider", "params_b", "cost", "open_weights"), row[0][:5])) if row else {}
    old_tags = json.loads(row[0][5] or "{}") if row else {}
    sets = {k: v for k, v in fields.items() if v is not None}
    changes = {k: [old.get(k), v] for k, v in sets.items() if row and old.get(k) != v}
    changes.update({f"tags.{k}": [old_tags.get(k), v] for k, v in tags.items() if row and old_tags.get(k) != v})
    if sets:
        assignments = ", ".join(f"{k} = ?" for k in sets)
        tx.sql(f"UPDATE models SET {assignments} WHERE name = ? RETURNING id", list(sets.values()) + [name])
    if tags:
        tx.sql("UPDATE models SET tags = ?::JSON WHERE name = ? RETURNING id", [json.dumps({**old_tags, **tags}),
                                                                                 name])
    return changes


def insert_new_models(tx: Tx, models: dict[str, dict]) -> dict[str, int]:
    """Insert models that do not exist yet, {name: metadata as upsert_model_metadata takes it}, in one statement.
    -> {name: model id}"""
    import pyarrow as pa

    if not models:
        return {}
    meta = list(models.values())
    cost = [None if m.get("cost") is None else float(m["cost"]) for m in meta]
    params = [None if m.get("params_b") is None else float(m["params_b"]) for m in meta]
    if len(models) <= 16:        # a few rows (a server's registrations): VALUES cost less than an Arrow table
        created = tx.sql(
            "INSERT INTO models (name, tags, family, provider, params_b, cost, open_weights) VALUES "
            + ", ".join(["(?, ?::JSON, ?, ?, ?::FLOAT8, ?::FLOAT8, ?::BOOLEAN)"] * len(models)) + " RETURNING id, name",
            [x for name, m, c, p in zip(models, meta, cost, params) for x in (
                name, json.dumps(m.get("tags") or {}), m.get("family"), m.get("provider"), p, c, m.get("open_weights"))])
    else:
        with tx.table("_new_models", pa.table({
            "name": list(models), "tags": [json.dumps(m.get("tags") or {}) for m in meta],
            "family": pa.array([m.get("family") for m in meta], pa.string()),
            "provider": pa.array([m.get("provider") for m in meta], pa.string()),
            "params_b": pa.array(params, pa.float64()), "cost": pa.array(cost, pa.float64()),
            "open_weights": pa.array([m.get("open_weights") for m in meta], pa.bool_())})):
            created = tx.sql("""INSERT INTO models (name, tags, family, provider, params_b, cost, open_weights)
                                SELECT name, tags::JSON, family, provider, params_b, cost, open_weights
                                FROM _new_models RETURNING id, name""")
    outbox.new_models(tx, created)
    # their cost and size as the table holds them, for what this transaction builds from memory
    # (routing.with_new_versions)
    by_name = dict(zip(models, zip(cost, params)))
    tx.notes.new_model_meta.update({int(i): by_name[name] for i, name in created})
    return {name: int(i) for i, name in created}


def changed_results(tx: Tx, name: str, batch_id: int | None):
    """Results of an import batch that supersede a different stored result of the same (model, query):
    (count, (query id, old, new) of the first) or None."""
    if batch_id is None:
        return None
    model_id = tx.sql("SELECT id FROM models WHERE name = ?", [name])[0][0]
    rows = tx.sql(f"""
        SELECT count(*) OVER (), q.external_id, o.correct::INT, e.correct::INT
        FROM evaluations e JOIN models m ON m.id = e.model_id JOIN queries q ON q.id = e.query_id
        JOIN {evaluation_rows.current(before_batch=batch_id, model_ids=[model_id])} o
             ON o.model_id = e.model_id AND o.query_id = e.query_id
        WHERE m.name = ? AND e.batch_id = ? ORDER BY q.external_id LIMIT 1""", [name, batch_id])
    return (int(rows[0][0]), tuple(rows[0][1:])) if rows else None


def stage_evaluations(tx: Tx, path: str, table: str, model: str | None = None) -> Staged:
    """One pass over the file, normalised on the way in. `model` names the model when the file has no column."""
    return stage(tx, "evaluations", path, table, with_lines=False, constants={"model": model} if model else None,
                 project=lambda e: (
        f"trim({e['model']}) AS model, trim({e['qid']}) AS qid, {e['correct']} AS raw, "
        f"{TRUE_FALSE.format(c=e['correct'])} AS c"))


def import_splits(tx: Tx, staged: Staged, batch_id: int, result: ImportResult) -> None:
    """Set the file's splits (see data/splits.py: the models whose test queries change are enqueued)."""
    t = staged.table
    cases = " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in SPLIT_NAMES.items())
    tx.stage.execute(f"""CREATE OR REPLACE TEMP TABLE {t}_n AS
        SELECT line, trim(qid) AS qid, split AS raw, CASE lower(trim(split)) {cases} ELSE NULL END AS split FROM {t}""")
    normalised = Staged(staged.kind, staged.path, f"{t}_n", staged.rows, [])
    first_bad(tx, normalised, "split IS NULL", "split must be train, val or test, got {value}", "raw")
    mirror(tx, "queries")
    first_bad(tx, normalised, "qid NOT IN (SELECT external_id FROM queries)", "unknown query id {value}", "qid")
    dup = fetch(tx, f"SELECT qid, max(line) FROM {t}_n GROUP BY qid HAVING count(DISTINCT split) > 1 LIMIT 1")
    if dup:
        raise InputError(f"query {dup[0][0]!r} is given two different splits", file=staged.path, line=int(dup[0][1]))
    if not tx.postgres:
        result.splits_set += splits.apply(tx, f"{t}_n", batch_id)
        return
    with tx.table("_splits_in", tx.stage.sql(f"SELECT qid, split FROM {t}_n").to_arrow_table()):
        result.splits_set += splits.apply(tx, "_splits_in", batch_id)


# --- text vectors -------------------------------------------------------------------------------------------------

def embed_missing_texts(tx: Tx, progress: bool = False,
                        encode: Callable[[list[str]], "object"] | None = None,
                        result: ImportResult | None = None) -> int:
    """Give every query text a vector under the current text encoder: from the vector files shipped in data/ where
    they hold it (by content hash, so only for that very text), else embedded with MiniLM, each text exactly once.
    -> how many MiniLM embedded."""
    if encode is None:          # a caller's own encoder (tests, benches) embeds everything itself
        filled = vector_files.fill_missing(tx, vector_files.shipped())
        if result is not None:
            result.texts_from_files += filled
    missing = tx.sql(f"""
        SELECT DISTINCT q.content_hash, q.text FROM queries q
        WHERE q.content_hash NOT IN (SELECT content_hash FROM text_vectors WHERE text_encoder = ?)
        ORDER BY q.content_hash""", [text_encoder.TEXT_ENCODER])
    if not missing:
        return 0
    hashes = [r[0] for r in missing]
    embedded = (encode or (lambda texts: text_encoder.encode(texts, progress=progress)))([r[1] for r in missing])
    table = pa.table({"content_hash": hashes, "text_encoder": [text_encoder.TEXT_ENCODER] * len(hashes),
                      "vector": pa.array(list(embedded), type=pa.list_(pa.float32()))})
    tx.append("text_vectors", table, ["content_hash", "text_encoder", "vector"])
    return len(hashes)


# --- the whole import -----------------------------------------------------------------------------------------------

def files_digest(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for kind in sorted(files):
        h.update(kind.encode())
        with open(files[kind], "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def run_import(tx: Tx, files: dict[str, str], progress: bool = False, embed_texts: bool = True) -> ImportResult:
    """Import the given files (keys: models, queries, evaluations, splits) inside the caller's transaction."""
    for path in files.values():
        check_path(path)
    digest = files_digest(files)
    done = tx.sql("SELECT id FROM import_batches WHERE digest = ? LIMIT 1", [digest])
    if done:  # the very same files were imported before: nothing to add, nothing to re-embed
        return ImportResult(batch_id=int(done[0][0]), already_imported=True)
    batch_id = int(tx.sql("SELECT nextval('import_batches_id_seq')")[0][0])
    result = ImportResult(batch_id=batch_id)
    # the evaluations file is only looked at here (its columns); it is read once, by the bulk path, below
    staged = {kind: stage(tx, kind, files[kind], f"_stage_{kind}")
              for kind in ("models", "queries", "splits") if kind in files}
    ev_cols = file_columns(tx, "evaluations", files["evaluations"]) if "evaluations" in files else None
    for kind in ("queries", "evaluations", "splits"):
        ignored = ev_cols.ignored if kind == "evaluations" and ev_cols else (
            staged[kind].ignored if kind in staged else [])
        if ignored:
            result.ignored_columns[Path(files[kind]).name] = ignored
    if "vectors" in files:   # first: the queries below then find their vectors
        result.vectors_loaded = vector_files.load(tx, files["vectors"]).added
    if "models" in staged:
        import_models(tx, staged["models"], result)
    if "queries" in staged:
        import_queries(tx, staged["queries"], result)
    if ev_cols is not None and not append_evaluations(tx, ev_cols, batch_id, result):
        staged["evaluations"] = stage_evaluations(tx, files["evaluations"], "_stage_evaluations")
        import_evaluations(tx, staged["evaluations"], batch_id, result)   # names the first bad row
    if "splits" in staged:
        import_splits(tx, staged["splits"], batch_id, result)
    if embed_texts and "queries" in staged:  # in the queries' transaction: no query is left without its vector
        result.texts_embedded = embed_missing_texts(tx, progress=progress, result=result)
    for s in staged.values():
        tx.stage.execute(f"DROP TABLE IF EXISTS {s.table}; DROP TABLE IF EXISTS {s.table}_n")
    _record_batch(tx, batch_id, files, digest, result)
    return result


def _record_batch(tx: Tx, batch_id: int, files: dict[str, str], digest: str, result: ImportResult,
                  paths: bool = True) -> None:
    """Write the batch row if the import changed anything (a no-op import leaves no trace). `files`: kind -> path
    (recorded resolved), or without `paths` kind -> a label (rows that came from memory)."""
    changed = (result.models_added or result.models_updated or result.queries_added or result.evaluations_added
               or result.splits_set)
    if not changed:
        result.batch_id = None
        return
    counts = {"models_added": result.models_added, "models_updated": result.models_updated,
              "queries_added": result.queries_added, "evaluations_read": result.evaluations_read,
              "evaluations_added": result.evaluations_added, "splits_set": result.splits_set}
    tx.sql("INSERT INTO import_batches (id, files, row_counts, digest) VALUES (?, ?, ?, ?)",
                    [batch_id, json.dumps({k: str(Path(v).resolve()) if paths else v for k, v in files.items()}),
                     json.dumps(counts), digest])


def run_rows_import(tx: Tx, model: list[str], qid: list[str], correct: list[bool], label: str,
                    evaluated: list[int], ids: dict[str, int]) -> ImportResult | None:
    """An evaluations import of rows already in memory (a server's registrations: model, query id and result per
    row), by the same bulk path and checks as a file's (`append_evaluations`), read from an Arrow table instead of a
    file DuckDB would parse again. -> None, having written nothing, when a row has a problem (the caller then
    imports from a file, which names the line). `label` is what the batch records as its file. Every model must
    exist already; `evaluated`: the ids of those with evaluations; `ids`: {name: model id} of all of them."""
    # (no lookup of an earlier batch with the same digest, as files have: rows seen before append nothing anyway)
    digest = hashlib.sha256(json.dumps([model, qid, correct]).encode()).hexdigest()
    batch_id = int(tx.sql("SELECT nextval('import_batches_id_seq')")[0][0])
    result = ImportResult(batch_id=batch_id)
    rows = pa.table({"model": pa.array(model, pa.string()), "question_id": pa.array(qid, pa.string()),
                     "correct": pa.array(correct, pa.bool_())})
    cols = Columns(label, "arrow", "_rows_in", {c: (c, t) for c, t in (("model", "VARCHAR"), ("question_id", "VARCHAR"),
                                                                       ("correct", "BOOLEAN"))},
                   {"model": "model", "qid": "question_id", "correct": "correct"},
                   {"model": "model", "qid": "question_id", "correct": "correct"})
    tx.stage.register("_rows_in", rows)      # (the stage reads it: the registry's own connection on DuckDB)
    try:
        counts: dict[str, list] = {}
        seen: dict[tuple, bool] = {}
        for m, q, y in zip(model, qid, correct):
            c = counts.setdefault(m, [m, 0, 0, 0])
            c[1] += 1
            c[3] += not q
            if seen.setdefault((m, q), y) != y:   # differing repeats: the caller's file names their lines
                return None
        distinct = sorted(set(qid))
        # (queries are never deleted: the ids the registry's query metadata knows are in `queries`; on DuckDB the
        # metadata is in memory, on PostgreSQL it costs a read of its own, no cheaper than the check)
        held = HeldRows([tuple(c) for c in counts.values()], distinct, {i: n for n, i in ids.items()}, evaluated,
                        queries_known=not tx.postgres and query_meta(tx).rows_of_external(distinct) is not None)
        if not append_evaluations(tx, cols, batch_id, result, held=held):
            return None
    finally:
        tx.stage.unregister("_rows_in")
    _record_batch(tx, batch_id, {"evaluations": label}, digest, result, paths=False)
    return result


def run_model_import(tx: Tx, model: str, path: str, progress: bool = False) -> ImportResult:
    """One model's results (`registry register`): query id and correct per row, the model column optional; query
    texts may come along (a text/question column) for queries the registry does not have yet."""
    check_path(path)
    batch_id = int(tx.sql("SELECT nextval('import_batches_id_seq')")[0][0])
    result = ImportResult(batch_id=batch_id)
    columns = {c.strip().lower() for c in column_names(tx, path)}
    if any(a in columns for a in COLUMNS["queries"]["text"]):
        queries = stage(tx, "queries", path, "_stage_queries")
        mirror(tx, "queries")
        tx.stage.execute("DELETE FROM _stage_queries WHERE id IN (SELECT external_id FROM queries)")
        if fetch(tx, "SELECT count(*) FROM _stage_queries")[0][0]:
            import_queries(tx, queries, result)
            result.texts_embedded = embed_missing_texts(tx, progress=progress, result=result)
    if not append_evaluations(tx, file_columns(tx, "evaluations", path, constants={"model": model}), batch_id, result,
                              model=model):
        staged = stage_evaluations(tx, path, "_stage_evaluations", model=model)   # names the first bad row
        other = fetch(tx, f"SELECT model FROM _stage_evaluations WHERE model IS DISTINCT FROM {sql_str(model)} LIMIT 1")
        if other:
            raise InputError(f"the file holds results of model {other[0][0]!r}, not {model!r}", file=path)
        import_evaluations(tx, staged, batch_id, result, unknown_hint=(
            f"give its text in {TEXT_IN_FILE}, or import it first with "
            "`registry import --queries FILE`"))
    tx.stage.execute("DROP TABLE IF EXISTS _stage_evaluations; DROP TABLE IF EXISTS _stage_queries")
    _record_batch(tx, batch_id, {"evaluations": path}, files_digest({"evaluations": path}), result)
    return result
