"""The registry's current evaluations written as Every Eval Ever 0.3: per model one aggregate `<uuid>.json` (its
accuracy per query source) beside its `<uuid>_samples.jsonl` (one line per evaluation: the question and its options,
the gold answer where stored, the result, and the provenance the registry holds: the import batch, or the endpoint
asked with its template and time), in EEE's datastore layout `data/<benchmark>/<developer>/<model>/`. The samples
are written by DuckDB itself (COPY ... FORMAT JSON), one statement per model; then every file is read back and
checked against both schemas with jsonschema (`validate`)."""
from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from registry.core.errors import InputError, RegistryError, storage_problem
from registry.core.transaction import Tx
from registry.data import current_evaluations
from registry.data.formats import eee_read, eee_schema
from registry.data.input_files import sql_str
from registry.locus import text_encoder

PREFIX = eee_read.PREFIX
LIBRARY = eee_read.OWN
_OPTION = re.compile(r"\n\(([A-Z])\) ")


@dataclass
class ExportedModel:
    model: str
    aggregate: str
    samples: str
    rows: int


@dataclass
class ExportResult:
    directory: str
    models: list[ExportedModel] = field(default_factory=list)
    evaluations: int = 0
    queries: int = 0
    unsplit_texts: int = 0          # texts that are not question + lettered options (written whole as input.raw)
    validated: dict = field(default_factory=dict)   # aggregates, sample lines, shapes checked, errors (0)
    seconds: dict = field(default_factory=dict)


def split_text(text: str) -> tuple[str, list[str] | None]:
    """A stored query text back into its question and options (the inverse of text_encoder.query_text), checked:
    (text, None) where no split gives the very text back."""
    starts = [m.start() for m in _OPTION.finditer(text) if m.group(1) == "A"]
    for start in reversed(starts):
        opts, pos, letter = [], start + 1, "A"
        while True:
            nxt = text.find(f"\n({chr(ord(letter) + 1)}) ", pos) if letter < "Z" else -1
            opts.append(text[pos + 4:nxt if nxt >= 0 else len(text)])
            if nxt < 0:
                break
            pos, letter = nxt + 1, chr(ord(letter) + 1)
        question = text[:start]
        if question.strip() and text_encoder.query_text(question, opts) == text:
            return question, opts
    return text, None


def _queries(tx: Tx, source: str | None):
    """The queries as the samples show them (an Arrow table the COPY joins), and how many texts stayed whole."""
    import pyarrow as pa

    rows = tx.sql("""SELECT q.id, q.external_id, q.source, q.category, q.text, q.content_hash, a.answer, a.grading,
                            s.split
                     FROM queries q LEFT JOIN query_answers a ON a.query_id = q.id
                     LEFT JOIN query_splits s ON s.query_id = q.id"""
                  + (" WHERE q.source = ?" if source else "") + " ORDER BY q.id", [source] if source else None)
    cols: dict[str, list] = {k: [] for k in ("query_id", "sample_id", "evaluation_name", "raw", "choices",
                                             "reference", "meta")}
    whole = 0
    for qid, ext, src, cat, text, h, answer, grading, split in rows:
        question, choices = split_text(text)
        whole += choices is None and text_encoder.query_text(text) != text
        meta = {PREFIX + "query_id": ext, PREFIX + "content_hash": h}
        meta.update({PREFIX + k: v for k, v in (("source", src), ("category", cat), ("grading", grading),
                                                              ("split", split)) if v})
        for k, v in zip(("query_id", "sample_id", "evaluation_name", "raw", "choices", "reference", "meta"),
                        (qid, ext, src or LIBRARY, question, choices, [answer] if answer else [], json.dumps(meta))):
            cols[k].append(v)
    return pa.table({**cols, "choices": pa.array(cols["choices"], pa.list_(pa.string())),
                     "reference": pa.array(cols["reference"], pa.list_(pa.string()))}), whole


def _folder(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", part).strip("._") or "unknown"


SAMPLE_SQL = """
COPY (
  SELECT '{version}' AS schema_version, {eid} AS evaluation_id, {model} AS model_id, q.evaluation_name,
         q.evaluation_name AS evaluation_result_id, q.sample_id, 'single_turn' AS interaction_type,
         {{'raw': q.raw, 'reference': q.reference, 'choices': q.choices}} AS input,
         {{'raw': CASE WHEN k.response IS NULL THEN []::VARCHAR[] ELSE [k.response] END}} AS output,
         CASE WHEN k.extracted IS NULL THEN [] ELSE [{{'turn_idx': 0, 'source': 'output.raw',
              'extracted_value': k.extracted, 'extraction_method': 'registry ask, template ' || k.template,
              'is_terminal': true}}] END AS answer_attribution,
         {{'score': e.correct::INT::DOUBLE, 'is_correct': e.correct}} AS evaluation,
         json_merge_patch(q.meta::JSON, json_object(
             '{p}batch', e.batch_id::VARCHAR, '{p}batch_time', strftime(b.created, '%Y-%m-%dT%H:%M:%S'),
             '{p}asked_endpoint', k.base_url, '{p}asked_model', k.upstream_model,
             '{p}asked_template', k.template, '{p}asked_at', strftime(k.created, '%Y-%m-%dT%H:%M:%S'))) AS metadata
  FROM {current} e JOIN _eee_queries q ON q.query_id = e.query_id
  LEFT JOIN import_batches b ON b.id = e.batch_id
  LEFT JOIN (SELECT model_id, query_id, batch_id, arg_max(base_url, created) AS base_url,
                    arg_max(upstream_model, created) AS upstream_model, arg_max(template, created) AS template,
                    arg_max(extracted, created) AS extracted, arg_max(response, created) AS response,
                    max(created) AS created
             FROM asked_answers WHERE model_id = {model_id} GROUP BY ALL) k
         ON k.query_id = e.query_id AND k.batch_id = e.batch_id
  ORDER BY q.query_id
) TO {path} (FORMAT JSON)"""


def export(tx: Tx, directory: str, *, models: list[str] | None = None, source: str | None = None,
           benchmark: str = LIBRARY, progress: bool = False) -> ExportResult:
    """Write every (or each named) model's current evaluations under `directory` (made if missing)."""
    started = time.perf_counter()
    out = Path(directory)
    known = dict(tx.sql("SELECT name, id FROM models ORDER BY name"))
    if models:
        unknown = [m for m in models if m not in known]
        if unknown:
            raise InputError(f"unknown model {unknown[0]!r}")
    for table, select in (("models", "SELECT * FROM models"), ("evaluations", "SELECT * FROM evaluations"),
                          ("import_batches", "SELECT id, created FROM import_batches"),
                          ("asked_answers", "SELECT * FROM asked_answers")):
        tx.mirror(table, select)
    alias_of = dict(tx.sql(f"""SELECT m.name, t.name FROM ({current_evaluations.ALIAS_OF}) a
                               JOIN models m ON m.id = a.model_id JOIN models t ON t.id = a.alias_of"""))
    queries, whole = _queries(tx, source)
    if not queries.num_rows:
        raise InputError(f"no query of source {source!r}" if source else "the registry holds no query")
    result = ExportResult(str(out), queries=queries.num_rows, unsplit_texts=whole)
    (out / eee_read.MANIFEST).unlink(missing_ok=True)     # (an earlier export's: this one is not finished yet)
    stamp = str(int(time.time()))
    tx.stage.register("_eee_queries", queries)
    name = ""
    try:
        for name in (models or list(known)):
            model_id = int(known[name])
            current = current_evaluations.current(model_ids=[model_id])
            stats = tx.stage.execute(f"""SELECT q.evaluation_name, count(*), avg(e.correct::INT), max(b.created)
                                        FROM {current} e JOIN _eee_queries q ON q.query_id = e.query_id
                                        LEFT JOIN import_batches b ON b.id = e.batch_id
                                        GROUP BY 1 ORDER BY 1""").fetchall()
            if not stats:
                continue
            if progress:
                import sys
                print(f"writing {name} ({sum(s[1] for s in stats)} evaluations)", file=sys.stderr, flush=True)
            meta = tx.stage.execute("SELECT family, provider, params_b, cost, open_weights, tags::VARCHAR FROM models "
                                    "WHERE id = ?", [model_id]).fetchall()[0]
            developer, _, short = name.rpartition("/")
            eid = f"{benchmark}/{name.replace('/', '_')}/{stamp}"
            # EEE names files by a version-4 UUID: one drawn from the evaluation's id, so a rerun names it alike
            uid = str(uuid.UUID(bytes=hashlib.sha256(eid.encode()).digest()[:16], version=4))
            folder = out / "data" / _folder(benchmark) / _folder(developer or meta[1] or "unknown") / _folder(short)
            folder.mkdir(parents=True, exist_ok=True)
            samples = folder / f"{uid}_samples.jsonl"
            tx.stage.execute(SAMPLE_SQL.format(version=eee_schema.VERSION, eid=sql_str(eid), model=sql_str(name),
                                               p=PREFIX, current=current, model_id=model_id,
                                               path=sql_str(str(samples))))
            rows = sum(s[1] for s in stats)
            aggregate = folder / f"{uid}.json"
            record = _aggregate(name, meta, eid, stamp, stats, benchmark=benchmark, developer=developer,
                                alias_of=alias_of.get(name))
            record["detailed_evaluation_results"] = {
                "format": "jsonl", "file_path": str(samples.relative_to(out)), "hash_algorithm": "sha256",
                "checksum": eee_read.digest(samples), "total_rows": rows}
            aggregate.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
            result.models.append(ExportedModel(name, str(aggregate), str(samples), rows))
            result.evaluations += rows
    except Exception as exc:
        problem = storage_problem(exc)
        if problem is None:
            raise
        raise ExportFailed(f"{out}: the export stopped while writing {name} ({problem}); {len(result.models)} models "
                           f"were written and no {eee_read.MANIFEST}, so no import takes the folder for a complete "
                           f"export: free the space (or fix the folder) and export again") from None
    finally:
        try:
            tx.stage.unregister("_eee_queries")
        except Exception:       # (a failed statement has aborted the stage's transaction: nothing to unregister)
            pass
    result.seconds["write"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    result.validated = validate([(Path(m.aggregate), Path(m.samples)) for m in result.models], tx.stage)
    result.seconds["validate"] = round(time.perf_counter() - started, 3)
    try:
        write_manifest(out, result)
    except OSError as exc:
        raise ExportFailed(f"{out}: every model was written but not the {eee_read.MANIFEST} ({storage_problem(exc)}), "
                           f"so no import takes the folder for a complete export: free the space and export "
                           f"again") from None
    return result


class ExportFailed(RegistryError):
    """A write under the export folder failed (a full disk, a folder gone read-only): what was written is left,
    without the manifest that would call it complete."""


def write_manifest(out: Path, result: ExportResult) -> None:
    """The export's manifest, written last and atomically: its presence says the export finished; an import of a
    folder of this registry's aggregates without it says the export was interrupted (eee_read.check_finished)."""
    body = {"library": LIBRARY, "complete": True, "evaluations": result.evaluations,
            "models": {m.model: str(Path(m.aggregate).relative_to(out)) for m in result.models}}
    tmp = out / (eee_read.MANIFEST + ".tmp")
    tmp.write_text(json.dumps(body, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(out / eee_read.MANIFEST)


def _aggregate(name: str, meta: tuple, eid: str, stamp: str, stats: list, *, benchmark: str, developer: str,
               alias_of: str | None = None) -> dict:
    family, provider, params_b, cost, open_weights, tags = meta
    # registry.name marks the details as the registry's own, so that an import reads back its metadata, none too
    details = {"deployment_type": "unknown", PREFIX + "name": name,
               "model_availability": {True: "open_weights", False: "closed_weights"}.get(open_weights, "unknown")}
    for k, v in (("family", family), ("provider", provider), ("params_b", params_b), ("cost", cost),
                 ("open_weights", None if open_weights is None else str(open_weights).lower()),
                 ("tags", tags if tags and tags != "{}" else None), ("alias_of", alias_of)):
        if v is not None:
            details[PREFIX + k] = repr(v) if isinstance(v, float) else str(v)
    newest = max((s[3] for s in stats if s[3] is not None), default=None)
    record = {
        "schema_version": eee_schema.VERSION, "evaluation_id": eid, "retrieved_timestamp": stamp,
        "source_metadata": {"source_name": benchmark, "source_type": "documentation",
                            "source_organization_name": LIBRARY, "evaluator_relationship": "other"},
        "eval_library": {"name": LIBRARY, "version": _version()},
        "model_info": {"name": name.rpartition("/")[2], "id": name, "developer": developer or provider or "unknown",
                       "additional_details": details},
        "evaluation_results": [{
            "evaluation_result_id": ev, "evaluation_name": ev,
            "source_data": {"dataset_name": ev, "source_type": "other"},
            "metric_config": {"evaluation_description": f"share of {ev}'s questions answered correctly",
                              "metric_id": "accuracy", "metric_name": "accuracy", "metric_kind": "accuracy",
                              "metric_unit": "proportion", "lower_is_better": False, "score_type": "continuous",
                              "min_score": 0.0, "max_score": 1.0},
            "score_details": {"score": float(acc), "uncertainty": {"num_samples": int(n)}}}
            for ev, n, acc, _ in stats],
    }
    if newest is not None:
        record["evaluation_timestamp"] = str(int(newest.timestamp()))
    return record


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("locus-registry")
    except PackageNotFoundError:
        return "unknown"


def validate(pairs: list[tuple[Path, Path]], stage=None) -> dict:
    """Each aggregate whole, and the sample lines by shape, against EEE's schemas: DuckDB reads every line back and
    groups the lines by their JSON structure (keys and value types: an integer below 0 is a type of its own) and by
    `interaction_type`, the one text the instance schema constrains; one line of each group is checked with
    jsonschema, and, if it fails, the file's lines until the first that fails (named). An error is a RegistryError
    (a bug of the writer: the files are left for a look)."""
    import duckdb

    for agg, _ in pairs:
        problem = eee_schema.first_error("aggregate", json.loads(agg.read_text(encoding="utf-8")))
        if problem:
            raise RegistryError(f"{agg}: the export is not a valid Every Eval Ever aggregate: {problem}")
    if not pairs:
        return {"aggregates": 0, "sample_lines": 0, "shapes_checked": 0, "errors": 0}
    con = stage or duckdb.connect()
    groups = con.execute("""SELECT json_structure(json)::VARCHAR, json->>'$.interaction_type', count(*),
                                   any_value(json)::VARCHAR, any_value(filename)
                            FROM read_json_objects(?, format='newline_delimited', filename=true) GROUP BY 1, 2""",
                         [[str(s) for _, s in pairs]]).fetchall()
    for _, _, _, line, filename in groups:
        if eee_schema.first_error("sample", orjson.loads(line)):
            with open(filename, "rb") as f:
                for line_no, raw in enumerate(f, 1):
                    problem = eee_schema.first_error("sample", orjson.loads(raw))
                    if problem:
                        raise RegistryError(f"{filename}:{line_no}: the export is not a valid Every Eval Ever "
                                            f"sample: {problem}")
    return {"aggregates": len(pairs), "sample_lines": int(sum(g[2] for g in groups)), "shapes_checked": len(groups),
            "errors": 0}
