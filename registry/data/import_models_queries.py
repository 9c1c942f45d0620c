"""An import's steps for models, queries and splits (the small kinds of file), and what an import did
(`ImportResult`): models validated in Python; queries and splits, checked with set-based queries over their stage
tables. Evaluations, the bulk, have
data/import_evaluations.py; data/import_run.py runs the whole import in one transaction."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from registry.core.errors import Conflict, InputError, UnknownReference, text_problem
from registry.core.transaction import Tx
from registry.data import outbox, splits
from registry.data.input_files import Staged, fetch, first_bad, mirror
from registry.locus import text_encoder

MAX_NAME = 200
# what the HTTP API puts after a model's name in a path (/models/NAME/history): a name ending so is unreachable
PATH_SUFFIXES = ("/ask", "/claims", "/diff", "/evaluations", "/fallback", "/history", "/rename", "/similar",
                 "/verdicts", "/verify")
# characters that reorder or hide the text around them where a terminal or a page shows a name (U+202E shows
# "abc\u202Efdp.exe" as "abcexe.pdf")
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def model_name_problem(name: str) -> str | None:
    """Why `name` cannot name a model (one rule for files, the CLI and HTTP), or None: UTF-8 text, printable, at
    most MAX_NAME characters, not ending in a suffix the API's paths use."""
    if not name or not name.strip():
        return "empty model name"
    if text_problem(name, "model name"):           # (a lone surrogate, a byte that is not UTF-8)
        return text_problem(name, "model name")
    if len(name) > MAX_NAME:
        return f"model name of {len(name):,} characters (at most {MAX_NAME}): {name[:40]!r}..."
    if any(ord(ch) < 32 or 127 <= ord(ch) < 160 or ch in BIDI_CONTROLS for ch in name):
        return f"model name {name!r} holds a control character (a name must be printable)"
    if name != name.strip():
        return f"model name {name!r} starts or ends with a space"
    for suffix in PATH_SUFFIXES:
        if name.endswith(suffix):
            return f"model name {name!r} ends in {suffix!r}, which the HTTP API reads as a path"
    return None


SPLIT_NAMES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "dev": "val", "test": "test"}


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
    finished_pending: list[str] = field(default_factory=list)  # models an earlier, interrupted run left unembedded
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per step: import (its transaction, commit
    # included), onboarding (versions committed and indexed), stability
    holds: dict[str, int] = field(default_factory=dict)   # what the registry holds after it: models, queries,
    # evaluations (current ones)


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
    parsed: list[dict] = []
    seen: dict[str, int] = {}       # name -> its line
    for row in rows:
        rec = dict(zip(names, row))
        line = int(rec["line"])
        name = (rec.get("name") or "").strip()
        problem = model_name_problem(name)
        if problem:
            raise InputError(problem, file=staged.path, line=line)
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
    import pyarrow as pa

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
    import pyarrow as pa

    has = {d[0] for d in tx.stage.execute(f"SELECT * FROM {staged.table} LIMIT 0").description}
    pick = ", ".join(c if c in has else f"NULL AS {c}"
                     for c in ("id", "text", "category", "source", "options", "answer"))
    first_bad(tx, staged, "id IS NULL OR trim(id) = ''", "empty query id")
    first_bad(tx, staged, "text IS NULL OR trim(text) = ''", "empty query text")
    rows = fetch(tx, f"SELECT line, {pick} FROM {staged.table} ORDER BY line")
    out: list[dict] = []
    seen: dict[str, str] = {}       # query id -> its text's hash
    for line, qid, question, category, source, options, answer in rows:
        qid = qid.strip()
        try:
            opts = text_encoder.parse_options(options)
        except (ValueError, json.JSONDecodeError):
            raise InputError(f"options of query {qid!r} must be a JSON list", file=staged.path, line=line) from None
        try:
            text = text_encoder.query_text(question, opts)
        except ValueError as exc:
            raise InputError(f"options of query {qid!r}: {exc}", file=staged.path, line=line) from None
        digest = text_encoder.content_hash(text)
        if qid in seen:
            if seen[qid] != digest:
                raise InputError(f"query id {qid!r} appears twice with different text", file=staged.path, line=line)
            continue
        seen[qid] = digest
        answer, grading = gold_answer(answer, opts)
        out.append({"external_id": qid, "source": source or None, "category": category or None, "text": text,
                    "content_hash": digest, "line": line, "answer": answer, "grading": grading})
    table = pa.Table.from_pylist(out, schema=pa.schema([
        ("external_id", pa.string()), ("source", pa.string()), ("category", pa.string()), ("text", pa.string()),
        ("content_hash", pa.string()), ("line", pa.int64()), ("answer", pa.string()), ("grading", pa.string())]))
    with tx.table("_queries_in", table):
        clash = tx.sql("""SELECT i.line, i.external_id FROM _queries_in i
                          JOIN queries q ON q.external_id = i.external_id
                          WHERE q.content_hash <> i.content_hash ORDER BY i.line LIMIT 1""")
        if clash:
            raise Conflict(f"query id {clash[0][1]!r} is already registered with a different text",
                             file=staged.path, line=int(clash[0][0]))
        added = tx.sql("""INSERT INTO queries (external_id, source, category, text, content_hash)
                          SELECT external_id, source, category, text, content_hash FROM _queries_in
                          WHERE external_id NOT IN (SELECT external_id FROM queries) RETURNING id""")
        # a query's first gold answer is kept (queries imported before they carried answers get theirs now)
        tx.sql("""INSERT INTO query_answers (query_id, answer, grading)
                  SELECT q.id, i.answer, i.grading FROM _queries_in i JOIN queries q ON q.external_id = i.external_id
                  WHERE i.answer IS NOT NULL AND q.id NOT IN (SELECT query_id FROM query_answers)""")
        if added:
            tx.invalidate("query_meta")
    result.queries_added += len(added)



def gold_answer(raw, options: list | None) -> tuple[str | None, str | None]:
    """A query's gold answer and its kind, which says how a reply is graded (data/formats/answer_kinds.py): a
    letter among its options, a set of them, a number, an expression or a text."""
    from registry.data.formats import answer_kinds

    answer = "" if raw is None else str(raw).strip()
    if not answer:
        return None, None
    kind = answer_kinds.answer_kind(answer, len(options or []))
    return (answer.strip("()").upper() if kind == "letter" else answer), kind


def import_splits(tx: Tx, staged: Staged, batch_id: int, result: ImportResult) -> None:
    """Set the file's splits (see data/splits.py: the models whose test queries change are enqueued)."""
    t = staged.table
    cases = " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in SPLIT_NAMES.items())
    tx.stage.execute(f"""CREATE OR REPLACE TEMP TABLE {t}_n AS
        SELECT line, trim(qid) AS qid, split AS raw, CASE lower(trim(split)) {cases} ELSE NULL END AS split FROM {t}""")
    normalised = Staged(staged.kind, staged.path, f"{t}_n", staged.rows, [])
    first_bad(tx, normalised, "split IS NULL", "split must be train, val or test, got {value}", "raw")
    mirror(tx, "queries")
    first_bad(tx, normalised, "qid NOT IN (SELECT external_id FROM queries)", "unknown query id {value}", "qid",
              error=UnknownReference)
    dup = fetch(tx, f"SELECT qid, max(line) FROM {t}_n GROUP BY qid HAVING count(DISTINCT split) > 1 LIMIT 1")
    if dup:
        raise InputError(f"query {dup[0][0]!r} is given two different splits", file=staged.path, line=int(dup[0][1]))
    if not tx.postgres:
        result.splits_set += splits.apply(tx, f"{t}_n", batch_id)
        return
    with tx.table("_splits_in", tx.stage.sql(f"SELECT qid, split FROM {t}_n").to_arrow_table()):
        result.splits_set += splits.apply(tx, "_splits_in", batch_id)
