"""The database's file and schema, apart from using them: a path that cannot be a DuckDB database refused in one
line, a schema revision older or newer than this registry's, `registry db check`; and the file beside other
processes: waiting for another's turn (`wait_for_lock`), creating and removing it safely (`folder_lock`).

Two commands started together on one new path must never lose each other's work: only the process whose connection
created the file may remove it, it removes it only while still holding DuckDB's lock on it, and only if nothing was
committed to it (store.Store.discard_if_created). Every open of a DuckDB file by the registry, and every such removal,
runs under an exclusive lock on the file's folder (`folder_lock`), so no other process can open the path between the
creator's close and its removal, and "did the file exist before this connection" has one answer."""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry.core import resources, settings
from registry.core.errors import RegistryError, database_locked

if TYPE_CHECKING:
    from registry.core.transaction import Tx


def head_revision() -> str:
    """The newest migration's revision, read from the migration files themselves (Alembic is imported only to
    migrate: every command checks the schema, and Alembic's own reading of the scripts cost a third of a second)."""
    revisions, parents = migration_revisions()
    heads = revisions - parents
    if len(heads) != 1:
        raise RegistryError(f"the migrations have {len(heads)} heads, not one: {sorted(heads)}")
    return heads.pop()


def migration_revisions() -> tuple[set[str], set[str]]:
    """(every revision this registry's migrations know, those that another migration follows), read from the
    migration files themselves (Alembic is imported only to migrate)."""
    revisions, parents = set(), set()
    for path in (resources.alembic_dir() / "versions").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        revision = re.search(r'^revision\s*=\s*["\']([^"\']+)', text, re.M)
        down = re.search(r'^down_revision\s*=\s*["\']([^"\']+)', text, re.M)
        if revision:
            revisions.add(revision.group(1))
        if down:
            parents.add(down.group(1))
    return revisions, parents


def revision_state(current: str, head: str) -> str | None:
    """What a schema at revision `current` is to this registry, whose newest is `head`: None when it is `head`; an
    older one is upgraded; one this registry does not know was written by a newer registry (or another branch of
    it), and no upgrade of ours can read it."""
    if current == head:
        return None
    if current in migration_revisions()[0]:
        return f"schema is at revision {current}, this registry needs {head}; run `registry db upgrade`"
    return (f"schema is at revision {current}, newer than this registry knows (its newest is {head}): open it "
            f"with the newer registry that wrote it, or upgrade this one")


def revision_problem(path: str, current: str, head: str) -> str:
    """`revision_state` for a file whose schema is not at `head`, naming the file."""
    return f"{path}: {revision_state(current, head)}"


DUCKDB_MAGIC = b"DUCK"          # bytes 8 to 12 of every DuckDB database file


def not_database_file(path: str) -> None:
    """Refuse (one line) a path that exists but cannot be a DuckDB database: a directory, a FIFO, a device or a
    socket (DuckDB would wait on a FIFO for ever), a file of another format (DuckDB would take an SQLite file for
    one to attach, a CSV file for a table), or such a write-ahead log. A file this process cannot read is left for
    DuckDB to report."""
    import stat

    for file, what in ((path, "database file"), (path + ".wal", "write-ahead log")):
        try:
            mode = os.stat(file).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
                    else "a socket" if stat.S_ISSOCK(mode)
                    else "a device" if stat.S_ISBLK(mode) or stat.S_ISCHR(mode) else "not a regular file")
            raise RegistryError(f"{file}: is {kind}, not a {what}")
    try:
        with open(path, "rb") as fh:
            head = fh.read(16)
    except OSError:
        return
    if len(head) >= 12 and head[8:12] == DUCKDB_MAGIC:
        return
    what = ("an empty file" if not head else "an SQLite database" if head.startswith(b"SQLite format 3")
            else "too short to be one" if len(head) < 12 else f"it begins with {head[:12]!r}")
    raise RegistryError(f"{path}: not a DuckDB database ({what}); give a registry's file, or a new path to create "
                        f"one")


@dataclass
class SchemaCheck:
    """`registry db check`: the file's schema against this registry's."""
    path: str
    revision: str | None            # the file's (the first row of alembic_version; None: none)
    head: str                       # this registry's newest
    tables: int                     # the registry's tables the file holds
    problems: list[str] = field(default_factory=list)
    ok: bool = True


def check(path: str, tx: Tx) -> SchemaCheck:
    """What is wrong with the schema `tx` reads (the file at `path`): no alembic_version table, not exactly one row
    in it, a revision older or newer than this registry's; where it is at this registry's revision, a table or a
    column the schema has that the file lacks. Reads only."""
    from registry.core.schema import Base

    head = head_revision()
    found: dict[str, set[str]] = {}
    for table, column in tx.sql("SELECT table_name, column_name FROM information_schema.columns "
                                "WHERE table_schema = current_schema()"):
        found.setdefault(table, set()).add(column)
    revisions = ([r[0] for r in tx.sql("SELECT version_num FROM alembic_version")]
                 if "alembic_version" in found else [])
    problems = []
    if "alembic_version" not in found:
        problems.append("no alembic_version table: the file holds no registry schema (run `registry db upgrade`)")
    elif not revisions:
        problems.append("alembic_version holds no revision (run `registry db upgrade`)")
    elif len(revisions) > 1:
        problems.append(f"alembic_version holds {len(revisions)} rows ({', '.join(map(str, revisions))}), not one")
    for revision in dict.fromkeys(revisions):
        state = revision_state(revision, head)
        if state:
            problems.append(state)
    if head in revisions:
        for name, table in sorted(Base.metadata.tables.items()):
            if name not in found:
                problems.append(f"table {name} is missing")
                continue
            problems += [f"table {name} lacks column {c.name}" for c in table.columns if c.name not in found[name]]
    return SchemaCheck(path, revisions[0] if revisions else None, head,
                       sum(name in found for name in Base.metadata.tables), problems, not problems)


@contextmanager
def folder_lock(path: str) -> Iterator[None]:
    """An exclusive flock on the folder holding `path` while inside (held for an open or a removal: milliseconds).
    Where the folder cannot be opened or locked (no fcntl, a folder this process may not read), nothing is locked."""
    try:
        import fcntl
    except ImportError:          # (not POSIX: no lock, as before)
        yield
        return
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)        # (closing the descriptor releases the lock)


def remove_files(path: str) -> None:
    """The database file and its write-ahead log (the caller holds `folder_lock` and has closed its connection)."""
    for leftover in (path, path + ".wal"):
        if os.path.isfile(leftover):
            os.remove(leftover)


def wait_for_lock(path: str, connect: Callable[[], Any]) -> Any:
    """`connect()`, retried with backoff while another process holds the DuckDB file, as SQLite's busy timeout
    does: two commands on one file take turns. Says once on stderr whom it waits for; past REGISTRY_BUSY_TIMEOUT
    seconds, DatabaseLocked. A file held by a `registry serve` is not waited for (it holds the file until stopped):
    DatabaseLocked at once, with `served` set, and the command line goes through its HTTP API."""
    import sys
    import time

    from registry.core.errors import command_line, is_locked

    timeout = settings.current().busy_timeout
    deadline = time.monotonic() + (timeout if timeout == timeout else 0.0)      # (NaN: no wait)
    pause, told = 0.02, False
    while True:
        try:
            return connect()
        except Exception as exc:
            if not is_locked(exc):
                raise
            locked = database_locked(path, str(exc))
            left = deadline - time.monotonic()
            if locked.served or left <= 0:
                raise locked from None
            if not told:
                words = command_line(locked.pid) if locked.pid else []
                who = f"process {locked.pid}" if locked.pid else "another process"
                shown = f" ({' '.join(' '.join(words).split())[:120]})" if words else ""
                print(f"{path}: waiting for {who}{shown} to release the database (at most {timeout:g} s; "
                      f"REGISTRY_BUSY_TIMEOUT)", file=sys.stderr, flush=True)
                told = True
            time.sleep(min(pause, left))
            pause = min(2 * pause, 0.25)


def revision(con: Any) -> str | None:
    """The Alembic revision of an open DuckDB file (None: it holds no schema), asked straight: a look in DuckDB's
    catalog first took 15 ms of every command."""
    import duckdb

    try:
        rows = con.execute("select version_num from alembic_version").fetchall()
    except duckdb.CatalogException:
        return None
    return rows[0][0] if rows else None


def writable(path: str) -> bool:
    """May this process write the DuckDB file (a new one: create it) and its folder (the write-ahead log)?"""
    folder = os.path.dirname(os.path.abspath(path))
    return os.access(folder, os.W_OK) and (not os.path.exists(path) or os.access(path, os.W_OK))


def sidecar(db_path: str | None, name: str) -> Path | None:
    """Where a file derived from a DuckDB database is kept beside it, `<db>.index/NAME` (an index, a copy of a
    payload: never the truth, which is the database); None for PostgreSQL or no file, whose processes derive it."""
    from registry.core import dialect

    return None if not db_path or dialect.is_url(db_path) else Path(f"{db_path}.index") / name


def write_whole(path: Path | None, write: Callable[[Path], object]) -> bool:
    """`write(tmp)`, then tmp renamed to `path` (os.replace): the file whole or not at all, also when two threads or
    processes write it at once. Best effort, as a sidecar only saves work: False (nothing left behind) where it
    cannot be written."""
    import threading

    if path is None:
        return False
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        return False
