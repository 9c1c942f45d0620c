"""An import run whole, in one transaction: files (models, queries, evaluations, splits), one model's file, or rows
in memory, validated and written; the steps per kind are the import_* modules beside it, the files read by input_files.

Files are read by DuckDB itself into temporary stage tables (data/input_files.py), checked with a few set-based
queries, and written with `INSERT ... SELECT`: no row goes through the ORM. Any problem raises `InputError` naming
the file, the line and the problem, and the transaction rolls back, so a failed import leaves the database exactly
as it was. The steps per kind are data/import_models_queries.py (models, queries, splits) and
data/import_evaluations.py (evaluations); here: the whole import of files, of one model's file, of rows in memory,
and the per-model writes of a registration.

Files are read in `tx.stage`, the in-process DuckDB: on a DuckDB registry its own connection, so the checks join the
registry's tables directly and rows go in with `INSERT ... SELECT`; on PostgreSQL a private DuckDB into which the
registry rows the checks need are mirrored (`input_files.mirror`), and the rows to append are computed there and
copied into PostgreSQL with COPY (`import_evaluations`), in the import's one transaction.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from registry.core.errors import (
    Conflict,
    InputError,
    Interrupted,
    UnknownReference,
)
from registry.core.interrupts import is_interrupt, sigint_seen, sigint_stops_statements
from registry.core.transaction import Tx
from registry.data import current_evaluations, import_evaluations, outbox, vector_files
from registry.data.import_models_queries import ImportResult, import_models, import_queries, import_splits
from registry.data.input_files import (
    COLUMNS,
    Columns,
    Staged,
    check_path,
    column_names,
    fetch,
    file_columns,
    mirror,
    sql_str,
    stage,
)
from registry.data.query_cache import query_meta
from registry.locus import text_encoder

TEXT_IN_FILE = "a `question` column (and `options`, if any) of this file"   # where `register` finds a new text


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
    staged = import_evaluations.stage_evaluations(tx, path, "_answers", model="(file)")
    columns = {c.strip().lower() for c in column_names(tx, path)}
    with_text = any(a in columns for a in COLUMNS["queries"]["text"])
    import_evaluations.check_evaluations(tx, staged, None if with_text else "only results on queries the registry has "
                                        "can be compared; give the texts in a `question` column")
    models = fetch(tx, "SELECT DISTINCT model FROM _answers WHERE model <> '(file)' LIMIT 2")
    if len(models) > 1:
        raise InputError(f"the file holds results of several models ({models[0][0]!r}, {models[1][0]!r}, ...)",
                         file=path)
    dup = fetch(tx, "SELECT qid FROM _answers GROUP BY qid HAVING count(DISTINCT c) > 1 LIMIT 1")
    if dup:
        raise Conflict(f"query {dup[0][0]!r} appears twice with different results", file=path)   # (as register says)
    mirror(tx, "queries", "query_splits")
    known = tx.stage.execute("""SELECT q.id AS qid, bool_or(a.c)::INT AS c, coalesce(any_value(s.split) = 'test', false)
                                      AS test
                               FROM _answers a JOIN queries q ON q.external_id = a.qid
                               LEFT JOIN query_splits s ON s.query_id = q.id
                               GROUP BY q.id ORDER BY q.id""").fetchnumpy()
    texts, new_c = [], []
    if with_text:
        queries = stage(tx, "queries", path, "_answer_queries")
        has_options = "options" in {r[0] for r in fetch(tx, f"DESCRIBE {queries.table}")}
        rows = fetch(tx, f"""SELECT any_value(n.text), {'any_value(n.options)' if has_options else 'NULL'},
                                 bool_or(a.c)::INT FROM _answers a
                          JOIN {queries.table} n ON n.id = a.qid WHERE a.qid NOT IN (SELECT external_id FROM queries)
                          GROUP BY a.qid ORDER BY a.qid""")
        for text, options, c in rows:
            if text is None:       # an unknown query id, as in a results file without texts
                raise UnknownReference("a query the registry lacks has no text", file=path)
            if not text.strip(" "):     # (as a registration's check, DuckDB's trim: only spaces)
                raise InputError("a query the registry lacks has an empty text", file=path)
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
                name, json.dumps(m.get("tags") or {}), m.get("family"), m.get("provider"), p, c,
                m.get("open_weights"))])
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
        JOIN {current_evaluations.current(before_batch=batch_id, model_ids=[model_id])} o
             ON o.model_id = e.model_id AND o.query_id = e.query_id
        WHERE m.name = ? AND e.batch_id = ? ORDER BY q.external_id LIMIT 1""", [name, batch_id])
    return (int(rows[0][0]), tuple(rows[0][1:])) if rows else None


# --- text vectors -------------------------------------------------------------------------------------------------

def embed_missing_texts(tx: Tx, progress: bool = False,
                        encode: Callable[[list[str]], np.ndarray] | None = None,
                        result: ImportResult | None = None) -> int:
    """Give every query text a vector under the current text encoder: from the vector files shipped in data/ where
    they hold it (by content hash, so only for that very text), else embedded with MiniLM, each text exactly once.
    -> how many MiniLM embedded."""
    import pyarrow as pa

    if encode is None:          # a caller's own encoder (tests, benches) embeds everything itself
        filled = vector_files.fill_missing(tx, vector_files.shipped())
        if result is not None:
            result.texts_from_files += filled
    missing = tx.sql("""
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
    staged: dict[str, Staged] = {kind: stage(tx, kind, files[kind], f"_stage_{kind}")
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
    if ev_cols is not None and not import_evaluations.append_evaluations(tx, ev_cols, batch_id, result):
        staged["evaluations"] = import_evaluations.stage_evaluations(tx, files["evaluations"], "_stage_evaluations")
        import_evaluations.import_evaluations(tx, staged["evaluations"], batch_id, result)   # names the first bad row
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


def run_rows_import(tx: Tx, model: list[str], qid: list[str], correct: list[bool], *, label: str,
                    evaluated: list[int], ids: dict[str, int]) -> ImportResult | None:
    """An evaluations import of rows already in memory (a server's registrations: model, query id and result per
    row), by the same bulk path and checks as a file's (`append_evaluations`), read from an Arrow table instead of a
    file DuckDB would parse again. -> None, having written nothing, when a row has a problem (the caller then
    imports from a file, which names the line). `label` is what the batch records as its file. Every model must
    exist already; `evaluated`: the ids of those with evaluations; `ids`: {name: model id} of all of them."""
    import pyarrow as pa

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
        held = import_evaluations.HeldRows(
            [tuple(c) for c in counts.values()], distinct, {i: n for n, i in ids.items()}, evaluated,
            queries_known=not tx.postgres and query_meta(tx).rows_of_external(distinct) is not None)
        if not import_evaluations.append_evaluations(tx, cols, batch_id, result, held=held):
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
        # a row without a text is a result only: its query, if unknown, is named by the evaluations' own check
        tx.stage.execute("DELETE FROM _stage_queries WHERE text IS NULL")
        if fetch(tx, "SELECT count(*) FROM _stage_queries")[0][0]:
            import_queries(tx, queries, result)
            result.texts_embedded = embed_missing_texts(tx, progress=progress, result=result)
    if not import_evaluations.append_evaluations(tx, file_columns(tx, "evaluations", path, constants={"model": model}),
                                                batch_id, result, model=model):
        # the careful path: it names the first bad row
        staged = import_evaluations.stage_evaluations(tx, path, "_stage_evaluations", model=model)
        other = fetch(tx, f"SELECT model FROM _stage_evaluations WHERE model IS DISTINCT FROM {sql_str(model)} LIMIT 1")
        if other:
            raise InputError(f"the file holds results of model {other[0][0]!r}, not {model!r}", file=path)
        import_evaluations.import_evaluations(tx, staged, batch_id, result, unknown_hint=(
            f"give its text in {TEXT_IN_FILE}, or import it first with "
            "`registry import --queries FILE`"))
    tx.stage.execute("DROP TABLE IF EXISTS _stage_evaluations; DROP TABLE IF EXISTS _stage_queries")
    _record_batch(tx, batch_id, {"evaluations": path}, files_digest({"evaluations": path}), result)
    return result


@dataclass
class Committed:
    """What an import had committed when it was interrupted (`interruptible`): its result once its transaction
    committed, else None; `files`: what it imports, by whose digest a batch committed as the interrupt came (during
    the COMMIT itself, before the caller could record it) is found."""
    result: ImportResult | None = None
    files: dict[str, str] | None = None


@contextlib.contextmanager
def interruptible(store) -> Iterator[Committed]:
    """Ctrl-C (Python's, or DuckDB's stop of its query) inside: Interrupted, saying what was kept. The caller sets
    the yielded `Committed.result` once its import commits (its onboarding may then be interrupted); until then
    nothing was. Ctrl-C during a DuckDB statement stops the statement (core/interrupts.sigint_stops_statements: never
    inside DuckDB's own calls)."""
    done = Committed()
    try:
        with sigint_stops_statements():
            yield done
    except BaseException as exc:
        if not is_interrupt(exc) and not sigint_seen():    # (after Ctrl-C, a failure it caused is the interrupt)
            raise
        r = done.result
        if r is None and done.files is not None:
            try:
                digest = files_digest(done.files)
            except OSError:             # (a file that cannot be read was never imported)
                digest = None
            with store.tx() as tx:
                found = tx.sql("SELECT id, row_counts FROM import_batches WHERE digest = ? ORDER BY id DESC LIMIT 1",
                               [digest]) if digest else []
            if found:
                counts = json.loads(found[0][1]) if isinstance(found[0][1], str) else found[0][1]
                r = ImportResult(batch_id=int(found[0][0]), models_added=counts.get("models_added", 0),
                                 queries_added=counts.get("queries_added", 0),
                                 evaluations_added=counts.get("evaluations_added", 0))
        if r is None:
            raise Interrupted("interrupted: nothing was imported (the import's transaction was rolled back)") from None
        with store.tx() as tx:
            waiting = len(outbox.pending(tx))
        raise Interrupted(f"interrupted after the import was committed (batch {r.batch_id}: {r.models_added} models, "
                          f"{r.queries_added} queries, {r.evaluations_added} evaluations added); {waiting} model(s) "
                          f"are not embedded yet: `registry onboard`, or any writing command, embeds them",
                          committed=True) from None
