"""`registry db`: schema migrations (Alembic): upgrade, downgrade, current."""
from __future__ import annotations

import click

from .cli_common import command, emit_json, group


@group()
def db(ctx) -> None:
    """Schema migrations (Alembic)."""


@command("upgrade", group=db, json=False)
@click.argument("revision", default="head")
def db_upgrade(ctx, revision):
    """Migrate the database file to REVISION (default: head)."""
    from .store import Store

    store = Store(ctx.find_root().obj["db"], migrate=False)
    store.upgrade(revision)
    click.echo(f"{store.path}: at revision {store.current_revision()}")
    store.close()


@command("downgrade", group=db, json=False)
@click.argument("revision")
def db_downgrade(ctx, revision):
    """Migrate the database file down to REVISION (e.g. 0001, or -1)."""
    from .store import Store

    store = Store(ctx.find_root().obj["db"], migrate=False)
    store.downgrade(revision)
    click.echo(f"{store.path}: at revision {store.current_revision()}")
    store.close()


@command("current", group=db)
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


COMMANDS = [db]
