"""`registry db`: schema migrations (Alembic): upgrade, downgrade, current; `db check` of the file's schema; and
`db copy` of the whole registry to another database."""
from __future__ import annotations

import click

from registry.cli.common import command, emit_json, group, open_registry


@group()
def db(ctx) -> None:
    """Schema migrations (Alembic), and copying the registry to another database."""


@command("upgrade", group=db, json=False)
@click.argument("revision", default="head")
def db_upgrade(ctx, revision):
    """Migrate the database file to REVISION (default: head)."""
    from registry.core.store import Store
    store = Store(ctx.find_root().obj["db"], migrate=False)
    store.upgrade(revision)
    click.echo(f"{store.path}: at revision {store.current_revision()}")
    store.close()


@command("downgrade", group=db, json=False,
         context_settings={"ignore_unknown_options": True})     # a relative revision: -1
@click.argument("revision")
@click.option("--yes", is_flag=True, help="Delete the tables and columns (and their rows) that REVISION lacks.")
def db_downgrade(ctx, revision, *, yes):
    """Migrate the database file down to REVISION (e.g. 0001, -1, or base: no tables). A downgrade that deletes
    rows needs --yes; without it nothing changes."""
    from registry.core.errors import RowsWouldBeLost, rows_lost
    from registry.core.store import Store
    store = Store(ctx.find_root().obj["db"], migrate=False, create=False)
    try:
        lost = store.downgrade(revision, keep_rows=not yes)
        at = store.current_revision()
    except RowsWouldBeLost as exc:
        raise click.ClickException(f"{exc}: run again with --yes to delete them") from None
    finally:
        store.close()
    if lost:
        click.echo(f"deleted {rows_lost(lost)}")
    click.echo(f"{store.path}: at revision {at or 'base (no registry schema)'}")


@command("current", group=db)
def db_current(ctx, as_json):
    """Show the file's schema revision and the head revision."""
    from registry.core.store import Store, head_revision
    store = Store(ctx.find_root().obj["db"], migrate=False, create=False)
    current, head = store.current_revision(), head_revision()
    store.close()
    if as_json:
        emit_json({"current": current, "head": head})
    else:
        click.echo(f"current: {current or '(empty)'}  head: {head}")


@command("check", group=db)
def db_check(ctx, as_json):
    """Check the file's schema against this registry's: one alembic_version row, at this registry's revision (not
    older, not newer), every table and column there. Exit 1 on a problem."""
    result = open_registry(ctx, migrate=False).check()
    if as_json:
        emit_json(result)
        if not result.ok:
            ctx.exit(1)
    elif not result.ok:
        raise click.ClickException(f"{result.path}: {'; '.join(result.problems)}")
    else:
        click.echo(f"{result.path}: OK: schema at revision {result.revision} (this registry's newest), "
                   f"{result.tables} tables")


@command("copy", group=db)
@click.argument("dest")
def db_copy(ctx, dest, as_json):
    """Copy the registry (every table, same ids) to DEST: a new DuckDB file or an empty PostgreSQL database (URL)."""
    def shown(table, rows):   # progress on stderr: stdout stays the result (or its JSON)
        click.echo(f"  {table:<22} {rows:>12,} rows", err=True)

    result = open_registry(ctx).db_copy(dest, progress=shown)
    if as_json:
        emit_json({"source": result.source, "dest": result.dest, "revision": result.revision,
                   "tables": result.tables, "rows": result.rows, "sequences": result.sequences,
                   "seconds": result.seconds})
    else:
        click.echo(f"copied {len(result.tables)} tables, {result.rows:,} rows, from {result.source} to "
                   f"{result.dest} (revision {result.revision}) in {result.seconds:.1f} s")


COMMANDS = [db]
