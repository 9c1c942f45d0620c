"""What every command module shares: the `command` and `group` decorators, JSON output, tables, opening the registry.

Every command file (db, data, models, encoders, geometry, routing, serving, asking, verify) follows one pattern: it
imports this module only (never cli/__init__.py), defines its commands with `@command(...)` and lists its top-level
ones in `COMMANDS`; cli/__init__.py attaches them to the root group. A command defined with `@command(...)` gets, always
in this order: its options, `--json` (parameter `as_json`, unless `json=False`), the click context as its first
argument, and our errors (RegistryError) and I/O failures turned into one-line click errors (exit 1). Only the CLI
raises click.ClickException.

Start-up stays light: nothing here imports torch, sentence-transformers or faiss (the registry is opened lazily).
"""
from __future__ import annotations

import functools
import json as json_
import math
from dataclasses import asdict, is_dataclass

import click

from registry.core.errors import (
    Interrupted,
    RegistryError,
    storage_problem,
    text_problem,
)
from registry.core.interrupts import is_interrupt, sigint_seen


def command(name: str | None = None, *, json: bool = True, group: click.Group | None = None,
            cls: type[click.Command] = click.Command, **attrs):
    """The one decorator of every command: click.command(name, **attrs), a `--json` flag (as `as_json`, after the
    command's own options) when `json`, click.pass_context, and `handles_errors`. `group`: attach the command to this
    group (a subcommand such as `db upgrade`); top-level commands are attached by cli/__init__.py from the module's
    COMMANDS."""
    def decorate(fn) -> click.Command:
        cmd = click.command(name, cls=cls, **attrs)(click.pass_context(handles_errors(fn)))
        if json:
            cmd.params.append(click.Option(["--json", "as_json"], is_flag=True,
                                           help="Print the result as JSON (what the Python API returns)."))
        if group is not None:
            group.add_command(cmd)
        return cmd
    return decorate


def group(name: str | None = None, *, json: bool = False, **attrs):
    """`command` for a group of subcommands (db, encoders, vectors): the same stack, no `--json` unless asked."""
    return command(name, json=json, cls=click.Group, **attrs)


def _jsonable(obj):
    """Plain JSON values; a NaN or infinite float (an AUC over one class, say) becomes null, as JSON has no NaN."""
    if is_dataclass(obj):
        return _jsonable(asdict(obj))
    if isinstance(obj, (list, tuple)):
        return [_jsonable(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def emit_json(obj) -> None:
    click.echo(json_.dumps(_jsonable(obj), indent=2, default=str, allow_nan=False))


def table(rows: list[list], headers: list[str]) -> None:
    cells = [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    click.echo("  ".join("-" * w for w in widths))
    for r in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def num(x) -> str:
    """A number for a table or a line: '' (not 'None') when unknown, no trailing zeros."""
    return "" if x is None else f"{x:g}" if isinstance(x, float) else str(x)


def neighbour_rows(neighbours) -> list[list]:
    """Table rows for nearest models (`similar`, `register`): model, distance, disagreement, shared queries."""
    return [[n.model, f"{n.distance:.4f}", "" if n.disagreement is None else f"{n.disagreement:.3f}",
             n.shared_queries or ""] for n in neighbours]


def handles_errors(fn):
    """Every argument and option checked as text first (`check_arguments`); then our own errors, and a file or the
    database that cannot be written or read (a full disk), become one-line click errors (exit 1), never a stack
    trace. A command that fails in any way on a registry file it created removes it (`discard_new_registry`)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            check_arguments(click.get_current_context(silent=True))
            result = fn(*args, **kwargs)
            if sigint_seen():      # (Ctrl-C came, and was lost where Python could not raise it: say it came)
                raise interrupted(finished=True)
            return result
        except click.ClickException:
            discard_new_registry()
            raise
        except Interrupted as exc:
            if not exc.committed:
                discard_new_registry()
            err = click.ClickException(str(exc))
            err.exit_code = 130
            raise err from None
        except RegistryError as exc:
            discard_new_registry()
            raise click.ClickException(str(exc)) from None
        except click.exceptions.Exit as exc:          # (ctx.exit: 0 is no failure)
            if exc.exit_code:
                discard_new_registry()
            raise
        except BrokenPipeError:       # (`registry models | head`: the reader has all it wanted; click ends quietly)
            raise
        except Exception as exc:
            if is_interrupt(exc) or sigint_seen():     # (DuckDB's stop of a statement Ctrl-C came during, say)
                raise interrupted(discard_new_registry()) from None
            discard_new_registry()
            problem = storage_problem(exc)
            if problem is None:
                raise
            raise click.ClickException(problem) from None
        except KeyboardInterrupt:     # (outside a write that says what it committed: see `interrupted`)
            raise interrupted(discard_new_registry()) from None
        except BaseException:
            discard_new_registry()
            raise
    return wrapper


class InterruptedExit(click.ClickException):
    """Ctrl-C's exit: 130, as a shell expects of an interrupted command."""
    exit_code = 130


def interrupted(removed: str | None = None, *, finished: bool = False) -> click.ClickException:
    """Ctrl-C where no write of this command was under way to say what it committed: exit 130, in one line (a file
    this command created and left empty is removed, and said; `finished`: the command had done all it prints)."""
    return InterruptedExit("interrupted" + (f": nothing was committed ({removed} was new and is removed)"
                                            if removed else ": the command had finished, and what it printed "
                                            "above was committed" if finished else ""))


def check_arguments(ctx: click.Context | None) -> None:
    """The one text rule (errors.text_problem) over every argument and option of the command and the groups above
    it (--db included): a byte that is not UTF-8 on the command line is one line here, before anything is opened."""
    while ctx is not None:
        for param in ctx.command.params:
            value = ctx.params.get(param.name)
            for item in value if isinstance(value, (list, tuple)) else (value,):
                label = param.opts[-1] if isinstance(param, click.Option) else param.human_readable_name
                problem = text_problem(item, label)
                if problem:
                    raise click.ClickException(problem)
        ctx = ctx.parent


def open_registry(ctx: click.Context, create: bool = False, migrate: bool = True):
    """The registry named by --db; only commands that bring data in (`create`) may make a new file. `migrate=False`:
    open a file at any schema revision, unchecked (`db check`)."""

    obj = ctx.find_root().obj
    if obj.get("registry") is None:
        reg = _open(ctx, obj["db"], dict(create=create, migrate=migrate, probation_min=obj.get("probation_min")))
        obj["registry"] = reg
        from registry.api import Registry

        store = reg.store if isinstance(reg, Registry) else None    # (else a server's HTTP API answers)
        # only a file this process's connection created is its to remove on failure (`discard_new_registry`)
        obj["new_file"] = store if store is not None and store.created else None
        ctx.call_on_close(reg.close)
    return obj["registry"]


def _open(ctx: click.Context, db: str, options: dict):
    """`Registry(db, **options)`; on a file that a `registry serve` holds, the server's HTTP API instead
    (serve/http/client.py: the commands with an HTTP counterpart answer through it, the others say in one line that
    the file is served), found first by its advert beside the file, else by the lock. A file that another command
    holds is waited for, up to REGISTRY_BUSY_TIMEOUT (core/store.wait_for_lock)."""
    import os

    from registry.core import dialect
    from registry.core.errors import DatabaseLocked
    from registry.serve.http import advert

    # (the HTTP client only where an advert lies beside the file: a tenth of a second of every command otherwise)
    if not dialect.is_url(db) and os.path.lexists(advert.path_of(db)):
        from registry.serve.http.client import advertised

        remote = advertised(db, ctx.command_path)
        if remote is not None:
            return remote
    from registry.api import Registry

    try:
        return Registry(db, **options)
    except DatabaseLocked as exc:
        if not exc.served:
            raise
        from registry.serve.http.client import through_server

        remote = through_server(db, exc, ctx.command_path)
    return remote if remote is not None else Registry(db, **options)     # (None: the server stopped meanwhile)


def discard_new_registry() -> str | None:
    """A command that failed on the file it created removes the file and its write-ahead log if nothing was committed
    to it (no table holds a row): a failed first import leaves no file behind, and its retry starts afresh. A file
    another process created, or one holding committed rows, is never removed (core/database_file.py). -> the path
    removed, if any."""
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    if not isinstance(obj, dict):
        return None
    store = obj.pop("new_file", None)
    if store is None:
        return None
    obj["registry"] = None
    return store.path if store.discard_if_created() else None
