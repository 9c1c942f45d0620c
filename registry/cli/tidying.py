"""`registry delete` and `registry rename`: tidying the registry (answers/tidying.py), thin calls of the Registry's
methods of the same names."""
from __future__ import annotations

import click

from registry.cli.common import command, emit_json, open_registry


@command()
@click.argument("model")
@click.option("--reason", help="Why (kept with the deletion, shown by `registry history MODEL`).")
def delete(ctx, model, reason, as_json):
    """Delete MODEL: it leaves every list and answer; its versions and results stay readable (`registry history
    MODEL`); the endpoints claiming it go with it."""
    d = open_registry(ctx).delete(model, reason=reason)
    if as_json:
        return emit_json(d)
    also = f"; deleted with it: {', '.join(d.also)}" if d.also else ""
    click.echo(f"{d.model}: deleted ({d.versions} version(s) and {d.evaluations:,} result(s) kept for audits: "
               f"`registry history {d.model}`){also}")


@command()
@click.argument("old")
@click.argument("new")
@click.option("--reason", help="Why (kept with the rename, shown by `registry history NEW`).")
def rename(ctx, old, new, reason, as_json):
    """Call OLD by the name NEW from now on: its versions, results and aliases stay its own."""
    r = open_registry(ctx).rename(old, new, reason=reason)
    if as_json:
        return emit_json(r)
    click.echo(f"{r.old} -> {r.new}")


COMMANDS = [delete, rename]
