"""Harness runs into the registry, in one transaction: every run read and checked first (a problem is one line
naming the file, the sample and the problem, and nothing is written); a sample whose text and options hash to a
registered query is that query, any other becomes a new query (the file's own id for it where that is free, else
task/sample id; its gold answer where the file has one); a new model takes the metadata the file gives; the results
go in by the import's own bulk path, so a re-import adds nothing, and the batch records each file read (its sha256 and
evaluation, as the reader says). Onboarding and the report per model (`register`'s) are the use case's
(usecases/exchange.py), over what `write` returns."""
from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field

from registry.core.errors import InputError
from registry.data import import_run, splits
from registry.data.formats.samples import HarnessRun, named
from registry.data.import_models_queries import ImportResult, import_queries, model_name_problem
from registry.data.input_files import stage
from registry.locus import text_encoder


@dataclass
class ModelImport:
    model: str
    files: list[str]
    samples: int                    # read
    missing: int                    # errored or unscored: not imported
    evaluations_added: int = 0
    queries_added: int = 0
    matched: int = 0                # samples that are registered queries
    outcome: object = None          # its onboarding outcome (None: nothing new to embed)
    report: object = None           # `register`'s report (registration.RegisterResult)


@dataclass
class HarnessImport:
    harness: str
    models: list[ModelImport] = field(default_factory=list)
    queries_added: int = 0
    evaluations_added: int = 0
    batch_id: int | None = None
    detected: bool = False          # the reader was chosen by recognising the files (no --from)


def read_runs(harness: str, paths: list[str], *, progress: bool = False, **options) -> list[HarnessRun]:
    """The runs of `paths` read by the reader named `harness` (data/formats/readers.py); an option given that the
    reader does not take is an InputError, as is a model name the registry cannot take."""
    from registry.data.formats import readers

    reader = readers.get(harness)
    if reader.read is None:
        raise InputError(f"{harness} is read by the folder import (registry import FOLDER), not into runs")
    given = {k: v for k, v in options.items() if v is not None and v is not False}
    wrong = sorted(set(given) - set(reader.options) - {"model"})
    if wrong:
        raise InputError(f"--{wrong[0]} does not apply to {harness} (it takes: "
                         f"{', '.join('--' + o for o in ('model',) + tuple(reader.options))})")
    try:
        runs = list(reader.read(list(paths), progress=progress, **given))
    except RecursionError:      # (JSON nested past Python's recursion limit: no results file is)
        raise InputError(f"a file nests its JSON deeper than {sys.getrecursionlimit():,} levels: not a {harness} "
                         f"file", file=", ".join(paths)) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"invalid UTF-8 at byte {exc.start} (the file must be UTF-8 encoded)",
                         file=", ".join(paths)) from None
    for run in runs:
        problem = model_name_problem(run.model)
        if problem:
            raise InputError(problem + " (pass --model NAME)", file=run.path)
    return runs


def write(tx, runs: list[HarnessRun], harness: str, progress: bool = False) -> HarnessImport:
    """The runs' new queries and their results into `tx` (InputError, nothing kept, on the first problem)."""
    for run in runs:
        run.model, run.provider = named(run, lambda n: bool(tx.sql("SELECT 1 FROM models WHERE name = ?", [n]))), None
        if run.samples and run.missing == len(run.samples):
            raise InputError(f"no scored sample: all {len(run.samples)} samples errored or were not scored, so there "
                             f"is nothing to import for {run.model}", file=run.path)
    keyed = []          # (run index, run, sample, text, hash)
    texts: dict[tuple, tuple] = {}      # (question, options) -> (text, hash): many models answer the same questions
    for i, run in enumerate(runs):
        by_id: dict[str, tuple] = {}
        for s in run.samples:
            got = texts.get((s.question, tuple(s.options) if s.options else None))
            if got is None:
                try:
                    text = text_encoder.query_text(s.question, s.options)
                except ValueError as exc:      # (more options than letters)
                    raise InputError(f"{harness} sample {s.sample_id!r}: {exc}", file=run.path) from None
                got = texts[(s.question, tuple(s.options) if s.options else None)] = (
                    text, text_encoder.content_hash(text))
            text, h = got
            first = by_id.setdefault(s.sample_id, (h, s.correct))
            if first != (h, s.correct):      # (Inspect's epochs repeat an id: they must agree)
                what = "results" if first[0] == h else "questions"
                raise InputError(f"sample {s.sample_id} appears twice with two different {what}", file=run.path)
            keyed.append((i, run, s, text, h))
    hashes = sorted({h for *_, h in keyed})
    known = dict(tx.sql("""SELECT content_hash, min(external_id) FROM queries
                           WHERE content_hash IN (SELECT unnest(?::VARCHAR[])) GROUP BY content_hash""", [hashes]))
    wanted = sorted({s.query_id for _, _, s, _, _ in keyed if s.query_id})
    taken = dict(tx.sql("""SELECT external_id, content_hash FROM queries
                           WHERE external_id IN (SELECT unnest(?::VARCHAR[]))""", [wanted])) if wanted else {}
    new_queries: dict[str, dict] = {}
    new_hash: dict[str, str] = {}                 # a new query's id -> its text's hash
    id_of_hash: dict[str, str] = {}
    qid_of: dict[tuple[int, str], str] = {}       # (run, sample id) -> query id
    for i, _run, s, _text, h in keyed:
        own = s.query_id
        if own and taken.get(own) == h:             # the file's own id, registered with this very text
            qid = own
        elif h in known:
            qid = known[h]
        else:
            # a new query: the file's own id where that is free (a registry's export comes back with its ids, and
            # two queries of one text stay two), else the one this import gave the text, else task/sample id
            if own and own not in taken and new_hash.get(own, h) == h:
                qid = own
            else:
                qid = id_of_hash.get(h) or f"{s.source}/{s.sample_id}"
            if qid not in new_queries:
                new_hash[qid] = h
                id_of_hash.setdefault(h, qid)
                new_queries[qid] = {"id": qid, "question": s.question, "options": s.options, "source": s.source,
                                    "category": s.category, "answer": s.answer, "split": s.split}
        qid_of[(i, s.sample_id)] = qid
    # one result per model and query: a sample repeated (or two samples of one query) with two results is refused
    seen: dict[tuple, tuple] = {}
    for i, run, s, _, _ in keyed:
        if s.correct is None:
            continue
        key = (run.model, qid_of[(i, s.sample_id)])
        first = seen.setdefault(key, (run.path, s.sample_id, s.correct))
        if first[2] != s.correct:
            raise InputError(f"sample {s.sample_id}: model {run.model!r} has two different results for it (sample "
                             f"{first[1]} of {os.path.basename(first[0])} says {first[2]}, this one {s.correct})",
                             file=run.path)
    result = ImportResult(batch_id=None)
    if new_queries:
        _import_queries(tx, list(new_queries.values()), result, progress)
    names = sorted({m for m, _ in seen})
    found = dict(tx.sql("SELECT name, id FROM models WHERE name IN (SELECT unnest(?::VARCHAR[]))", [names]))
    ids = {n: int(i) for n, i in found.items()}
    evaluated = [int(m) for (m,) in tx.sql("""SELECT DISTINCT model_id FROM evaluations
                                              WHERE model_id IN (SELECT unnest(?::INTEGER[]))""", [list(ids.values())])]
    meta = {run.model: run.meta for run in runs}
    ids.update(import_run.insert_new_models(tx, {n: meta.get(n) or {} for n in names if n not in ids}))
    out = HarnessImport(harness, queries_added=result.queries_added)
    if seen:
        keys = sorted(seen)
        rows = import_run.run_rows_import(tx, [m for m, _ in keys], [q for _, q in keys], [seen[k][2] for k in keys],
                                      label=f"{harness}: {len(runs)} runs", evaluated=evaluated, ids=ids)
        if rows is None:      # checked above: not expected
            raise InputError("the samples' results could not be imported")
        out.batch_id, out.evaluations_added = rows.batch_id, rows.evaluations_added
        added = rows.added_by_model
        if rows.batch_id is not None:       # which files, of what digest, the batch came from
            tx.sql("UPDATE import_batches SET files = ?::JSON WHERE id = ? RETURNING id", [json.dumps(
                {"evaluations": f"{harness}: {len(runs)} runs", "read": provenance(runs)}), rows.batch_id])
    else:
        added = {}
    for name in sorted({run.model for run in runs}):
        mine = [(i, r) for i, r in enumerate(runs) if r.model == name]
        m_keys = [qid_of[(i, s.sample_id)] for i, r in mine for s in r.samples]
        out.models.append(ModelImport(
            name, sorted({r.path for _, r in mine}), len(m_keys), sum(r.missing for _, r in mine),
            evaluations_added=added.get(name, 0), queries_added=sum(q in new_queries for q in set(m_keys)),
            matched=sum(q not in new_queries for q in m_keys)))
    return out


def provenance(runs: list[HarnessRun]) -> list[dict]:
    """What each file read was (as its reader says: file, sha256, evaluation name), once per file and evaluation."""
    out, seen = [], set()
    for run in runs:
        p = run.provenance or {"file": os.path.abspath(run.path)}
        key = json.dumps(p, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append({**p, "model": run.model})
    return out


def _import_queries(tx, rows: list[dict], result: ImportResult, progress: bool) -> None:
    """New queries through the import's own queries step (a file it stages), their texts embedded."""
    fd, path = tempfile.mkstemp(suffix=".jsonl", prefix="harness-queries-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps({**r, "options": json.dumps(r["options"]) if r["options"] else None}) + "\n")
        import_queries(tx, stage(tx, "queries", path, "_stage_harness_queries"), result)
        tx.stage.execute("DROP TABLE IF EXISTS _stage_harness_queries")
        with_split = [(r["id"], r["split"]) for r in rows if r.get("split")]
        if with_split:          # (new queries: no model's embedding input changes)
            import pyarrow as pa

            with tx.table("_harness_splits", pa.table({"qid": [q for q, _ in with_split],
                                                       "split": [sp for _, sp in with_split]})):
                result.splits_set += splits.apply(tx, "_harness_splits", None)
        result.texts_embedded = import_run.embed_missing_texts(tx, progress=progress, result=result)
    finally:
        os.unlink(path)
