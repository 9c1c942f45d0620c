"""Bringing data in and out: `registry import` (any reader's format), `registry export --to eee`, `registry
draw-splits`, `registry vectors export|import`."""
from __future__ import annotations

import math

import click

from registry.cli.common import command, emit_json, group, open_registry
from registry.core.errors import Interrupted
from registry.core.interrupts import is_interrupt, sigint_seen


class ReaderChoice(click.Choice):
    """--from's choices: the import table's readers (data/formats/readers.py), plugins included, read when first
    needed, so that a command that imports nothing never scans the installed packages."""

    def __init__(self):
        self.case_sensitive = True

    @property
    def choices(self):
        from registry.data.formats import readers

        return tuple(readers.table()) + tuple(n for n in readers.BROKEN if " " not in n)


class ImportCommand(click.Command):
    """`import`, whose help ends with the table of formats it reads, as the table says (plugins too)."""

    def format_epilog(self, ctx, formatter):
        from registry.data.formats import readers

        with formatter.section("Formats (--from; without it, the one that recognises PATHS)"):
            formatter.write_dl([(r.name, r.summary + (f" [options: {', '.join('--' + o for o in r.options)}]"
                                                      if r.options else "") +
                                 (f" (from {r.origin})" if r.origin != "registry" else ""))
                                for r in readers.table().values()]
                               + [(name.split(" ")[0], "(not loaded) " + why) for name, why in readers.BROKEN.items()])


@command("import", cls=ImportCommand)
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--models", type=click.Path(), help="Models CSV (model, family, provider, params_b, cost, ...).")
@click.option("--queries", type=click.Path(), help="Queries: CSV, JSONL or Parquet (id, text, category, options...).")
@click.option("--evaluations", type=click.Path(), help="Evaluations, long format (model, query id, correct).")
@click.option("--splits", type=click.Path(), help="Query splits (query id, train|val|test).")
@click.option("--vectors", type=click.Path(), help="Query text vectors (Parquet, from `registry vectors export`).")
@click.option("--from", "harness", type=ReaderChoice(), metavar="FORMAT",
              help="Read PATHS as FORMAT (see Formats below); without it, the format that recognises them.")
@click.option("--model", "model_name", help="With --from: the model's name (default: the file's).")
@click.option("--scorer", help="With --from inspect: the scorer whose value is the result.")
@click.option("--metric", help="With --from lm-eval or helm: the metric that is the result, for every run (lm-eval:"
                               " the task's first; helm: each run's own main one); eee: only this evaluation name.")
@click.option("--threshold", type=float, help="With --from: a score >= T counts as correct (for non-0/1 scores).")
@click.option("--partial", is_flag=True, help="With --from inspect: import a log whose status is not success.")
@click.option("--example", is_flag=True, help="Import the example dataset the package carries (31 models' real "
                                              "MMLU-Pro results, Apache-2.0) instead of PATHS.")
def import_(ctx, paths, *, models, queries, evaluations, splits, vectors, harness, model_name, scorer, metric,
            threshold, partial, example, as_json):
    """Import benchmark results: a folder laid out like ../shared/data/mmlu-pro, or single files; or files of
    another format (--from FORMAT, or the one that recognises them)."""
    if threshold is not None and not math.isfinite(threshold):
        raise click.UsageError(f"--threshold must be a finite number, got {threshold}")
    if example:
        if paths or any((models, queries, evaluations, splits, vectors, harness)):
            raise click.UsageError("--example imports the example dataset alone: give no PATHS or file options")
        from registry.core.resources import example_data

        paths = (str(example_data()),)
    try:
        reg = open_registry(ctx, create=True)
        one_by_one = any((models, queries, evaluations, splits, vectors))
        detected = None
        if not harness and paths and not one_by_one:
            harness = detected = reg.reader_for(list(paths))     # (said with the result: an error stays one line)
    except BaseException as exc:
        if not is_interrupt(exc) and not sigint_seen():
            raise
        raise Interrupted("interrupted before the import began: nothing was imported") from None
    if harness and harness != "csv":
        if one_by_one:
            raise click.UsageError(f"--models, --queries, --evaluations, --splits and --vectors are the csv "
                                   f"format's, not {harness}'s")
        return _import_harness(reg, harness, list(paths), as_json=as_json, detected=detected, model=model_name,
                               scorer=scorer, metric=metric, threshold=threshold, partial=partial)
    if model_name or scorer or metric or threshold is not None or partial:
        raise click.UsageError("--model, --scorer, --metric, --threshold and --partial apply to --from FORMAT "
                               "files, not to a csv folder")
    if len(paths) > 1:
        raise click.UsageError("give one folder (or --from FORMAT for several files)")
    directory = paths[0] if paths else None
    path = ctx.find_root().obj["db"]
    result = reg.import_files(models=models, queries=queries, evaluations=evaluations, splits=splits,
                              directory=directory, progress=not as_json, vectors=vectors)
    if as_json:
        emit_json(result)
        return
    if result.finished_pending:
        click.echo(f"embedded {len(result.finished_pending)} model(s) an earlier, interrupted run left unembedded")
    holds = (f"{path}: {result.holds['models']:,} models, {result.holds['queries']:,} queries, "
             f"{result.holds['evaluations']:,} evaluations" if result.holds else "")
    if result.already_imported:
        click.echo(f"already imported (batch {result.batch_id}): nothing added")
        if holds:
            click.echo(holds)
        return
    click.echo(f"batch {result.batch_id}: {result.models_added} models added ({result.models_updated} updated), "
               f"{result.queries_added} queries, {result.evaluations_added} evaluations "
               f"(of {result.evaluations_read} read), {result.splits_set} splits, "
               f"{result.texts_embedded} texts embedded by MiniLM, {result.texts_from_files} text vectors from "
               f"vector files" + (f", {result.vectors_loaded} vectors loaded" if result.vectors_loaded else ""))
    for name, cols in result.ignored_columns.items():
        click.echo(f"note: {name}: columns not stored: {', '.join(cols)}")
    if holds:
        click.echo(holds)


def _import_harness(reg, harness, paths, *, as_json, detected, **options) -> None:
    from registry.cli.models import echo_register_report

    if not paths:
        raise click.UsageError(f"give the {harness} files to import")
    done = reg.import_from(paths, None if detected else harness, progress=not as_json, **options)
    if as_json:
        return emit_json(done)
    if detected:
        click.echo(f"{', '.join(paths)}: recognised as {harness}")
    click.echo(f"{harness}: {len(done.models)} models, {done.queries_added} new queries, "
               f"{done.evaluations_added} evaluations added")
    for m in done.models:
        click.echo(f"\n{m.model} ({len(m.files)} file(s)): {m.samples} samples, {m.matched} of them registered "
                   f"queries, {m.missing} missing (errored or unscored, not imported)")
        echo_register_report(m.report)


@command("export")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--to", "fmt", type=click.Choice(["eee"]), required=True,
              help="eee: Every Eval Ever 0.3 (an aggregate .json and a _samples.jsonl per model, in EEE's "
                   "data/<benchmark>/<developer>/<model>/ layout), checked against EEE's schemas.")
@click.option("--model", "models", multiple=True, help="Only this model (repeat for more; default: every model).")
@click.option("--source", help="Only the queries of this source (the queries' `source`, e.g. a benchmark).")
def export(ctx, directory, *, fmt, models, source, as_json):
    """Write every model's current evaluations to DIRECTORY in a shared format, with the question texts, the gold
    answers where stored, and where each result came from (its import batch, or the endpoint asked)."""
    r = open_registry(ctx).export_eee(directory, models=list(models) or None, source=source, progress=not as_json)
    if as_json:
        return emit_json(r)
    v = r.validated
    click.echo(f"{len(r.models)} models, {r.evaluations} evaluations of {r.queries} queries written to {r.directory} "
               f"as Every Eval Ever {fmt} 0.3.0; checked against both schemas: {v['aggregates']} aggregates, "
               f"{v['sample_lines']} sample lines ({v['shapes_checked']} shapes), {v['errors']} errors")


@group()
def vectors(ctx) -> None:
    """Query text vectors as a Parquet file: export them, or import them into another registry."""


@command("export", group=vectors)
@click.argument("file", type=click.Path())
@click.option("--source", help="Where the vectors come from (kept in the file's metadata).")
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True,
              help="Precision of the vectors written (float16: half the file, cosine to float32 above 0.9999).")
def vectors_export(ctx, file, source, dtype, as_json):
    """Write the registry's query text vectors (content hash, text encoder, vector) to FILE."""
    r = open_registry(ctx).export_vectors(file, source=source, dtype=dtype)
    if as_json:
        return emit_json(r)
    click.echo(f"{r.rows} vectors ({r.text_encoder}, {r.dtype}) written to {r.path}")


@command("import", group=vectors)
@click.argument("file", type=click.Path())
def vectors_import(ctx, file, as_json):
    """Add the vectors of FILE (checked whole first; texts are matched by content hash only)."""
    r = open_registry(ctx, create=True).import_vectors(file)
    if as_json:
        return emit_json(r)
    click.echo(f"{r.path}: {r.rows} vectors read, {r.added} new")


@command("draw-splits")
@click.option("--val", default=0.1, show_default=True, help="Share of each category's new queries for validation.")
@click.option("--test", type=float, help="Share of each category's new queries for test (--by random; default 0.1).")
@click.option("--seed", default=0, show_default=True, help="Seed of the random draw (--by random).")
@click.option("--by", type=click.Choice(["random", "category"]), default="random", show_default=True,
              help="random: new queries drawn within each category; category: whole categories held out as test "
                   "(every query's split is set anew).")
@click.option("--test-categories", help="With --by category: the categories held out as test, comma-separated.")
def draw_splits(ctx, *, val, test, seed, by, test_categories, as_json):
    """Give every query without a split a train/val/test split, drawn with a seed (when no splits file exists); or
    hold whole categories out as test (--by category)."""
    cats = [c for c in (test_categories or "").split(",") if c.strip()]
    result = open_registry(ctx).draw_splits(val=val, test=test, seed=seed, by=by, test_categories=cats or None)
    if as_json:
        emit_json(result)
        return
    embedded = sum(o["outcome"] == "embedded" for o in result.onboarding)
    if by == "category":
        click.echo(f"seed {seed}: test = {', '.join(result.test_categories)}; " + ", ".join(
            f"{n} {s}" for s, n in result.drawn.items()) + f"; {result.changed} queries changed split; "
            f"{embedded} models re-embedded")
        return
    click.echo(f"seed {seed}: " + ", ".join(f"{n} {s}" for s, n in result.drawn.items())
               + f" drawn; {result.kept} queries kept their split; {embedded} models re-embedded")


COMMANDS = [import_, export, vectors, draw_splits]
