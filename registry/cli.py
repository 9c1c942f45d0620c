"""The command line: each command is a thin call of the `Registry` method of the same name.

Only this module raises click.ClickException; start-up imports neither torch, sentence-transformers nor faiss.
"""
from __future__ import annotations

import functools
import json
import sys
from dataclasses import asdict, is_dataclass

import click

from .errors import RegistryError


def _jsonable(obj):
    if is_dataclass(obj):
        return asdict(obj)
    if isinstance(obj, list):
        return [_jsonable(o) for o in obj]
    return obj


def emit_json(obj) -> None:
    click.echo(json.dumps(_jsonable(obj), indent=2, default=str))


def table(rows: list[list], headers: list[str]) -> None:
    cells = [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    click.echo("  ".join("-" * w for w in widths))
    for r in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def handles_errors(fn):
    """Our own errors become one-line click errors (exit 1), never a stack trace."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RegistryError as exc:
            raise click.ClickException(str(exc)) from None
    return wrapper


def open_registry(ctx: click.Context):
    from .api import Registry

    obj = ctx.find_root().obj
    if obj.get("registry") is None:
        obj["registry"] = Registry(obj["db"])
        ctx.call_on_close(obj["registry"].close)
    return obj["registry"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", envvar="REGISTRY_DB", default="registry.duckdb", show_default=True,
              help="The registry's DuckDB file (or set REGISTRY_DB).")
@click.pass_context
def cli(ctx: click.Context, db: str) -> None:
    """A model registry for LLMs: import benchmark results, embed models with LOCUS, compare and route."""
    ctx.obj = {"db": db, "registry": None}


# --- db ------------------------------------------------------------------------------------------------------------
@cli.group()
def db() -> None:
    """Schema migrations (Alembic)."""


@db.command("upgrade")
@click.argument("revision", default="head")
@click.pass_context
@handles_errors
def db_upgrade(ctx, revision):
    """Migrate the database file to REVISION (default: head)."""
    from .store import Store

    store = Store(ctx.find_root().obj["db"], migrate=False)
    store.upgrade(revision)
    click.echo(f"{store.path}: at revision {store.current_revision()}")
    store.close()


@db.command("downgrade")
@click.argument("revision")
@click.pass_context
@handles_errors
def db_downgrade(ctx, revision):
    """Migrate the database file down to REVISION (e.g. 0001, or -1)."""
    from .store import Store

    store = Store(ctx.find_root().obj["db"], migrate=False)
    store.downgrade(revision)
    click.echo(f"{store.path}: at revision {store.current_revision()}")
    store.close()


@db.command("current")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def db_current(ctx, as_json):
    """Show the file's schema revision and the head revision."""
    from .store import Store, head_revision

    store = Store(ctx.find_root().obj["db"], migrate=False)
    current, head = store.current_revision(), head_revision()
    store.close()
    if as_json:
        emit_json({"current": current, "head": head})
    else:
        click.echo(f"current: {current or '(empty)'}  head: {head}")


# --- import --------------------------------------------------------------------------------------------------------
@cli.command("import")
@click.argument("directory", required=False, type=click.Path())
@click.option("--models", type=click.Path(), help="Models CSV (model, family, provider, params_b, cost, ...).")
@click.option("--queries", type=click.Path(), help="Queries: CSV, JSONL or Parquet (id, text, category, options...).")
@click.option("--evaluations", type=click.Path(), help="Evaluations, long format (model, query id, correct).")
@click.option("--splits", type=click.Path(), help="Query splits (query id, train|val|test).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def import_(ctx, directory, models, queries, evaluations, splits, as_json):
    """Import benchmark results: a folder laid out like ../shared/data/mmlu-pro, or single files."""
    reg = open_registry(ctx)
    result = reg.import_files(models=models, queries=queries, evaluations=evaluations, splits=splits,
                              directory=directory, progress=not as_json)
    if as_json:
        emit_json(result)
        return
    if result.already_imported:
        click.echo(f"already imported (batch {result.batch_id}): nothing added")
        return
    click.echo(f"batch {result.batch_id}: {result.models_added} models added ({result.models_updated} updated), "
               f"{result.queries_added} queries, {result.evaluations_added} evaluations "
               f"(of {result.evaluations_read} read), {result.splits_set} splits, "
               f"{result.texts_embedded} texts embedded")
    for name, cols in result.ignored_columns.items():
        click.echo(f"note: {name}: columns not stored: {', '.join(cols)}")


# --- reading -------------------------------------------------------------------------------------------------------
@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def models(ctx, as_json):
    """Each model with its number of evaluations and accuracy."""
    rows = open_registry(ctx).models()
    if as_json:
        emit_json(rows)
        return
    table([[m.name, m.family, m.params_b, m.evaluations, "" if m.accuracy is None else f"{m.accuracy:.3f}"]
           for m in rows], ["model", "family", "params_b", "evaluations", "accuracy"])


@cli.command()
@click.argument("model")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def show(ctx, model, as_json):
    """One model: metadata, accuracy overall and per category."""
    d = open_registry(ctx).show(model)
    if as_json:
        emit_json(d)
        return
    click.echo(f"{d.name}  family={d.family} provider={d.provider} params_b={d.params_b} cost={d.cost} "
               f"open_weights={d.open_weights}")
    if d.tags:
        click.echo("tags: " + ", ".join(f"{k}={v}" for k, v in sorted(d.tags.items())))
    acc = "n/a" if d.accuracy is None else f"{d.accuracy:.3f}"
    click.echo(f"evaluations: {d.evaluations}  accuracy: {acc}  batches: {d.batches}")
    table([[c, v["evaluations"], f"{v['accuracy']:.3f}"] for c, v in d.per_category.items()],
          ["category", "evaluations", "accuracy"])


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def stats(ctx, as_json):
    """Counts of what the registry holds."""
    s = open_registry(ctx).stats()
    if as_json:
        emit_json(s)
        return
    click.echo(f"{s.path}: {s.models} models, {s.queries} queries, {s.evaluations} evaluations "
               f"({s.evaluation_rows} rows stored), {s.text_vectors} text vectors, {s.import_batches} import batches")
    if s.splits:
        click.echo("splits: " + ", ".join(f"{k} {v}" for k, v in s.splits.items()))


def main() -> None:
    cli(prog_name="registry")


if __name__ == "__main__":
    sys.exit(main())
