"""An evaluations file checked and appended: the bulk path (DuckDB reads the file straight into `evaluations`,
checked with aggregates) and the careful one (staged, checked row by row, which names the first bad line), with the
same outcome. On PostgreSQL the rows to append are computed in the private DuckDB stage and copied in with COPY
(`_append_evaluations`), in the import's one transaction."""
from __future__ import annotations

from dataclasses import dataclass

from registry.core.errors import Conflict, UnknownReference, editor_line
from registry.core.transaction import Tx
from registry.data import current_evaluations, outbox
from registry.data.import_models_queries import ImportResult, model_name_problem
from registry.data.input_files import Columns, Staged, duck_error, fetch, first_bad, ident, mirror, sql_str, stage

TRUE_FALSE = "CASE lower(trim({c})) WHEN '1' THEN true WHEN 'true' THEN true WHEN '0' THEN false " \
             "WHEN 'false' THEN false ELSE NULL END"


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
    changed = f"""LEFT JOIN {current_evaluations.current(model_ids=evaluated)} cur ON cur.model_id = m.id
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
    if (not per_model or any(m is None or m == "" or bad_c or bad_q or model_name_problem(m)
                             for m, _, bad_c, bad_q in per_model)
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
    changed = f"""LEFT JOIN {current_evaluations.current(model_ids=known)} cur
                      ON cur.model_id = m.id AND cur.query_id = q.id
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
    raise Conflict(f"model {m!r}, query {q!r} appears twice with different results (lines {shown[0]} and "
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
    for (name,) in fetch(tx, f"SELECT DISTINCT model FROM {t} ORDER BY model"):
        problem = model_name_problem(name)
        if problem:
            first_bad(tx, staged, f"model = {sql_str(name)}", problem.replace("{", "{{").replace("}", "}}"))
    if bad_qid:
        first_bad(tx, staged, "qid IS NULL OR qid = ''", "empty query id")
    if bad_c:
        first_bad(tx, staged, "c IS NULL", "correct must be 0, 1, true or false, got {value}", "raw")
    if unknown_hint is None:
        return
    mirror(tx, "queries")
    unknown = fetch(tx, f"""SELECT {staged.line_sql} AS l, qid, count(*) OVER () FROM {t}
                         WHERE qid NOT IN (SELECT external_id FROM queries) ORDER BY l LIMIT 1""")
    if unknown:         # the first by line, and how many rows more: a wrong file is seldom wrong on one line
        line, qid, rows = unknown[0]
        more = f"; {rows - 1:,} more rows name unknown ids" if rows > 1 else ""
        raise UnknownReference(f"unknown query id {qid!r}{more} ({unknown_hint})", file=staged.path, line=int(line))



def stage_evaluations(tx: Tx, path: str, table: str, model: str | None = None) -> Staged:
    """One pass over the file, normalised on the way in. `model` names the model when the file has no column."""
    return stage(tx, "evaluations", path, table, with_lines=False, constants={"model": model} if model else None,
                 project=lambda e: (
        f"trim({e['model']}) AS model, trim({e['qid']}) AS qid, {e['correct']} AS raw, "
        f"{TRUE_FALSE.format(c=e['correct'])} AS c"))
