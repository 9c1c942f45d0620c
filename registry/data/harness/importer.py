"""Harness runs into the registry, in one transaction: every run read and checked first (a problem is one line
naming the file, the sample and the problem, and nothing is written); a sample whose text and options hash to a
registered query is that query, any other becomes a new query (its task the source); the results go in by the
import's own bulk path, so a re-import adds nothing; then onboarding. The report per model (`register`'s) is the
facade's, over what this returns."""
from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field

from registry.core.errors import InputError
from registry.data import ingest
from registry.data.harness import inspect_logs, lm_eval_samples
from registry.data.harness.samples import HarnessRun, named
from registry.data.import_steps import ImportResult, import_queries, model_name_problem
from registry.data.staging import stage
from registry.locus import text_encoder

HARNESSES = ("inspect", "lm-eval")


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


def read_runs(harness: str, paths: list[str], *, model: str | None = None, scorer: str | None = None,
              metric: str | None = None, threshold: float | None = None, partial: bool = False,
              progress: bool = False) -> list[HarnessRun]:
    if harness not in HARNESSES:
        raise InputError(f"unknown harness {harness!r} (one of {', '.join(HARNESSES)})")
    if harness == "inspect":
        files = inspect_logs.log_files(paths)
        read = lambda f: [inspect_logs.read(f, model=model, scorer=scorer, threshold=threshold, partial=partial)]  # noqa: E731
    else:
        files = lm_eval_samples.result_files(paths)
        read = lambda f: lm_eval_samples.read(f, model=model, metric=metric, threshold=threshold)  # noqa: E731
    runs = []
    for i, f in enumerate(files, 1):
        if progress:
            print(f"reading {f} ({i}/{len(files)})", file=sys.stderr, flush=True)
        runs.extend(read(f))
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
    keyed = []          # (run, sample, text, hash)
    for run in runs:
        by_id: dict[str, tuple] = {}
        for s in run.samples:
            try:
                text = text_encoder.query_text(s.question, s.options)
            except ValueError as exc:      # (more options than letters)
                raise InputError(f"{harness} sample {s.sample_id!r}: {exc}") from None
            h = text_encoder.content_hash(text)
            first = by_id.setdefault(s.sample_id, (h, s.correct))
            if first != (h, s.correct):      # (Inspect's epochs repeat an id: they must agree)
                what = "results" if first[0] == h else "questions"
                raise InputError(f"sample {s.sample_id} appears twice with two different {what}", file=run.path)
            keyed.append((run, s, text, h))
    hashes = sorted({h for *_, h in keyed})
    known = dict(tx.sql("""SELECT content_hash, min(external_id) FROM queries
                           WHERE content_hash IN (SELECT unnest(?::VARCHAR[])) GROUP BY content_hash""", [hashes]))
    new_queries, qid_of = {}, {}
    for run, s, text, h in keyed:
        qid = known.get(h) or f"{s.source}/{s.sample_id}"
        qid_of[(run.path, s.sample_id)] = qid
        if h not in known:
            new_queries.setdefault(qid, {"id": qid, "question": s.question, "options": s.options,
                                         "source": s.source, "category": s.category})
    # one result per model and query: a sample repeated (or two samples of one query) with two results is refused
    seen: dict[tuple, tuple] = {}
    for run, s, _, _ in keyed:
        if s.correct is None:
            continue
        key = (run.model, qid_of[(run.path, s.sample_id)])
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
    ids.update(ingest.insert_new_models(tx, {n: {} for n in names if n not in ids}))
    out = HarnessImport(harness, queries_added=result.queries_added)
    if seen:
        keys = sorted(seen)
        rows = ingest.run_rows_import(tx, [m for m, _ in keys], [q for _, q in keys], [seen[k][2] for k in keys],
                                      label=f"{harness}: {len(runs)} runs", evaluated=evaluated, ids=ids)
        if rows is None:      # checked above: not expected
            raise InputError("the samples' results could not be imported")
        out.batch_id, out.evaluations_added = rows.batch_id, rows.evaluations_added
        added = rows.added_by_model
    else:
        added = {}
    for name in sorted({run.model for run in runs}):
        mine = [r for r in runs if r.model == name]
        m_keys = [(r, s) for r in mine for s in r.samples]
        out.models.append(ModelImport(
            name, sorted({r.path for r in mine}), len(m_keys), sum(s.correct is None for _, s in m_keys),
            evaluations_added=added.get(name, 0),
            queries_added=sum(q in new_queries for q in {qid_of[(r.path, s.sample_id)] for r, s in m_keys}),
            matched=sum(qid_of[(r.path, s.sample_id)] not in new_queries for r, s in m_keys)))
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
        result.texts_embedded = ingest.embed_missing_texts(tx, progress=progress, result=result)
    finally:
        os.unlink(path)


def run(reg, harness: str, paths: list[str], *, answers: tuple, progress: bool = False, **options) -> HarnessImport:
    """`Registry.import_harness`: read, write in one transaction, onboard, then each model's report. `answers`:
    the answers layer's (Staged, report, record_alias) that `register` reports with, handed down by the facade."""
    staged_type, report, record_alias = answers
    runs = read_runs(harness, paths, progress=progress, **options)
    reg.finish_pending()
    with reg.store.tx() as tx:
        done = write(tx, runs, harness, progress=progress)
    outcomes = {o.model: o for o in reg.onboard()}
    for m in done.models:
        m.outcome = outcomes.get(m.model)
        m.report = report(reg, staged_type(m.model, {}, m.evaluations_added, m.queries_added, 0), m.outcome)
        record_alias(reg, m.report)
    return done
