"""The registry's own error types. The library raises these; only the CLI (cli.common.handles_errors) turns them
into click errors, and the HTTP server into status codes."""
from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any


class RegistryError(Exception):
    """Base class: every message is one line a user can act on."""


class InputError(RegistryError):
    """Bad user input: names the file, the line (or row) and the problem."""

    def __init__(self, problem: str, file: str | None = None, line: int | None = None):
        if file is not None and line is not None:
            line = editor_line(file, line)
        self.file, self.line, self.problem = file, line, problem
        where = ""
        if file is not None:
            where = f"{file}: " if line is None else f"{file}: line {line}: "
        super().__init__(f"{where}{problem}")


def editor_line(path: str, line: int) -> int:
    """A file's line as an editor counts it, for the line counted in records, as DuckDB's readers and our checks
    count: in CSV the header is line 1 and the two differ after a quoted field that holds line breaks (a probe
    file's question texts); in JSONL, after blank lines (no record). Other files, and a file that cannot be read
    here, keep the line given."""
    import csv
    import gzip

    name = str(path).lower()
    bare = name.removesuffix(".gz")
    if bare.endswith((".jsonl", ".ndjson")):
        try:        # (in pieces of a MiB: a hostile file's one line may be a gigabyte long)
            with (gzip.open if name.endswith(".gz") else open)(path, "rb") as fh:
                records, at, blank = 0, 1, True
                for piece in iter(lambda: fh.readline(1 << 20), b""):
                    blank = blank and not piece.strip()
                    if piece.endswith(b"\n"):
                        records += not blank
                        if not blank and records == line:
                            return at
                        at, blank = at + 1, True
                if not blank and records + 1 == line:
                    return at
        except (OSError, EOFError):
            pass
        return line
    if line <= 2 or not bare.endswith((".csv", ".tsv")):
        return line
    try:
        with (gzip.open if name.endswith(".gz") else open)(path, "rt", encoding="utf-8-sig", newline="") as fh:
            header = fh.readline()
            delim = max((",", "\t", ";", "|"), key=header.count)
            reader = csv.reader(fh, delimiter=delim)
            before = 1                                   # physical lines before the record sought
            for _ in range(line - 2):                    # the records between the header and it
                next(reader)
                before = 1 + reader.line_num
            return before + 1
    except (OSError, UnicodeDecodeError, StopIteration, csv.Error):
        return line


class UnknownReference(InputError):
    """Input that names something the registry does not have (a query id in a results file): over HTTP a 404, as
    an unknown name in a path is."""


class Conflict(InputError):
    """Well-formed input that the registry as it stands cannot take or answer (a change that needs `update`, more
    models than it holds, prices it lacks, rows that contradict each other): over HTTP a 409."""


class NotFound(RegistryError):
    pass


class EndpointFailed(RegistryError):
    """An endpoint the registry asked gave no answer at all (nothing listens, every request refused or past its
    deadline): nothing was stored. Over HTTP a 502, as an upstream failing is."""


class SchemaOutdated(RegistryError):
    pass


class DatabaseLocked(RegistryError):
    """Another process holds the database file. `pid`: the holder's process id, where DuckDB named it; `served`:
    the holder is a `registry serve` (whose HTTP API can take the request instead)."""

    def __init__(self, message: str, pid: int | None = None, served: bool = False):
        super().__init__(message)
        self.pid, self.served = pid, served


class DatabaseDamaged(RegistryError):
    pass


class DiskFull(RegistryError):
    """The database (or its write-ahead log) could not be written for want of space: the transaction that wrote was
    rolled back. `reason`: the driver's (or the OS's) own line, 'No space left on device' in it."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class SchemaMissing(RegistryError):
    pass


class RowsWouldBeLost(RegistryError):
    """A schema downgrade that would delete rows, not confirmed: nothing was changed. `lost`: {table: rows},
    {"table.column": values}."""

    def __init__(self, path: str, revision: str, lost: dict[str, int]):
        self.path, self.revision, self.lost = path, revision, lost
        super().__init__(f"{path}: downgrading to {revision} deletes {rows_lost(lost)}; nothing was changed")


def rows_lost(lost: dict[str, int]) -> str:
    """'3 tables with 1,204 rows (models 120, queries 1,000, ...)': what a downgrade deletes, in one line."""
    shown = ", ".join(f"{name} {rows:,}" for name, rows in sorted(lost.items(), key=lambda kv: -kv[1]))
    return f"{len(lost)} tables or columns with {sum(lost.values()):,} rows ({shown})"


DAMAGE_SIGNS = {"Corrupt database file": "a block's checksum does not match",
                "Could not read enough bytes from file": "truncated: shorter than its own contents say",
                "Corrupt WAL file": "its write-ahead log is corrupt"}


def text_problem(value: Any, what: str) -> str | None:
    """Why `value` cannot be stored as text, or None: the one rule every name, metadata field and command-line
    argument meets before it reaches the database. A lone surrogate (JSON's "\\ud800") and a command-line byte that
    is not UTF-8 (which Python keeps as the surrogate U+DC80 + byte) have no UTF-8 form, so no file or database can
    hold them."""
    if not isinstance(value, str) or value.isascii():
        return None
    try:
        value.encode("utf-8")
        return None
    except UnicodeEncodeError as exc:
        code = ord(value[exc.start])
        how = f"U+{code:04X} is a lone surrogate"
        if 0xDC80 <= code <= 0xDCFF:
            how = f"byte 0x{code - 0xDC00:02x} is not UTF-8 ({how} in Python)"
        return f"{what} {value!r} is not valid UTF-8 text ({how}, at position {exc.start})"


def check_text(value: Any, what: str) -> Any:
    """`value`, once `text_problem` finds nothing wrong with it (else InputError); in a dict or list, every key and
    value."""
    if isinstance(value, dict):
        for k, v in value.items():
            check_text(k, what)
            check_text(v, what)
    elif isinstance(value, (list, tuple)):
        for v in value:
            check_text(v, what)
    else:
        problem = text_problem(value, what)
        if problem:
            raise InputError(problem)
    return value


def damage_of(exc: BaseException) -> str | None:
    """What the database driver's error says is wrong with a damaged file (truncated, a checksum that does not
    match), or None for any other error."""
    text = str(getattr(exc, "orig", None) or exc)
    return next((what for sign, what in DAMAGE_SIGNS.items() if sign in text), None)


def database_damaged(path: str, exc: BaseException) -> DatabaseDamaged | None:
    """DatabaseDamaged naming the file, for a driver error that says the file is damaged; else None."""
    what = damage_of(exc)
    if what is None:
        return None
    said = first_line(exc).removeprefix("Error: ").removeprefix("IO Error: ")
    return DatabaseDamaged(f"{path}: the database file is damaged ({what}; DuckDB: {said}); restore it from a "
                           f"backup or import its data into a new file")


def first_line(exc: BaseException) -> str:
    """The first line of a driver error's text (SQLAlchemy's wrapper unwrapped)."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# what DuckDB says when another process holds the file's lock (and nothing else says: "in block at location 0"
# of a damaged file's checksum error holds "lock" too)
LOCK_SIGN = "Could not set lock on file"


def is_locked(exc: BaseException) -> bool:
    """Does the driver's error say that another process holds the database file's lock?"""
    return LOCK_SIGN in str(exc)


NO_SPACE = ("No space left on device", "Disk quota exceeded", "not enough space on the disk")


def disk_full(path: str, exc: BaseException) -> DiskFull | None:
    """DiskFull naming the database and the space left where it lives, for a driver error (or OSError) that says
    the disk is full; else None."""
    import errno
    import shutil

    cause = getattr(exc, "orig", None) or exc
    if not (isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT)) \
            and not any(sign in str(cause) for sign in NO_SPACE):
        return None
    folder = os.path.dirname(os.path.abspath(path))
    try:
        free = f"{size_text(shutil.disk_usage(folder).free)} free"
    except OSError:
        free = "free space unknown"
    wal = path + ".wal"
    held = os.path.getsize(path) if os.path.isfile(path) else 0
    held += os.path.getsize(wal) if os.path.isfile(wal) else 0
    reason = (cause.strerror if isinstance(cause, OSError) and cause.strerror else first_line(cause))
    return DiskFull(f"{path}: the disk is full ({reason}): {free} in {folder}, and the write needed more than that "
                    f"(the database and its log hold {size_text(held)}); the write was rolled back: free some space "
                    f"and run the command again", reason)


def size_text(n: float) -> str:
    """Bytes in a unit a person reads: '0 B', '12.0 KiB', '3.4 MiB', '1.2 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def storage_problem(exc: BaseException) -> str | None:
    """One line for a failure to write or read a file or the database (a full disk, a file that went read-only or
    away): an OSError, or the database driver's I/O error (DuckDB's IOException, PostgreSQL's disk full), bare or
    wrapped by SQLAlchemy. None for any other exception."""
    cause = getattr(exc, "orig", None) or exc          # (SQLAlchemy's DBAPIError wraps the driver's)
    if damage_of(cause) is not None:                   # (raised outside a Store's transaction: no path known)
        return f"the database file is damaged ({damage_of(cause)}): {str(cause).strip().splitlines()[0]}"
    if isinstance(cause, OSError):
        if cause.strerror:
            return cause.strerror + (f": {cause.filename}" if cause.filename else "")
    elif type(cause).__name__ not in ("IOException", "DiskFull"):
        return None
    text = str(cause).strip()
    inner = re.search(r'"exception_message":\s*"((?:[^"\\]|\\.)*)"', text)    # (DuckDB's I/O errors carry JSON)
    return inner.group(1).replace('\\"', '"') if inner else text.splitlines()[0] if text else type(cause).__name__


def unknown_model(name: str, known: Iterable[str], where: str = "") -> NotFound:
    """NotFound for a model name the registry lacks, with the names it most likely meant: those containing it
    (`gpt-4o` -> `gpt-4o-2024-05-13`), then the closest spellings."""
    import difflib

    known = sorted(set(known))
    bare = re.sub(r"[^0-9a-z]", "", name.lower())        # (`gpt4o` is `gpt-4o-2024-05-13` without its dashes)
    guesses = [k for k in known if bare and bare in re.sub(r"[^0-9a-z]", "", k.lower())]
    guesses += [k for k in difflib.get_close_matches(name, known, n=3, cutoff=0.5) if k not in guesses]
    hint = f"; did you mean {' or '.join(repr(g) for g in guesses[:3])}?" if guesses else ""
    return NotFound(f"unknown model {name!r}{where}{hint}")


def database_locked(path: str, detail: str) -> DatabaseLocked:
    """DatabaseLocked for a file another process holds (`detail`: the database's own message), saying what is
    known of the holder: its PID and, where /proc lets us read it, its command line; the HTTP API is suggested only
    when the holder is a `registry serve`."""
    pid = re.search(r"PID (\d+)", detail)
    if not pid:
        return DatabaseLocked(f"{path}: the database is locked by another process; wait for it to finish or stop "
                              f"it")
    words = command_line(int(pid.group(1)))
    shown = f" ({' '.join(' '.join(words).split())[:COMMAND_SHOWN]})" if words else ""    # one line
    if words and words[0] == "registry" and "serve" in words[1:]:
        return DatabaseLocked(f"{path}: the database is locked by process {pid.group(1)}{shown}; stop it or use its "
                              f"HTTP API", pid=int(pid.group(1)), served=True)
    return DatabaseLocked(f"{path}: the database is locked by process {pid.group(1)}{shown}; wait for it to "
                          f"finish or stop it", pid=int(pid.group(1)))


COMMAND_SHOWN = 120     # characters of the lock holder's command line a message shows


def command_line(pid: int) -> list[str]:
    """A process's command line from /proc (empty where unreadable), a registry process's as `registry ARGS`
    (`python -m registry ...` and the console script alike), a token given on it hidden."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
    except OSError:
        return []
    words = [("--token=***" if w.startswith("--token=") else "***" if i and words[i - 1] == "--token" else w)
             for i, w in enumerate(words)]
    for i, w in enumerate(words):
        if w == "-m" and i + 1 < len(words) and words[i + 1] == "registry":
            return ["registry", *words[i + 2:]]
        if os.path.basename(w) == "registry" and i < 2:
            return ["registry", *words[i + 1:]]
    return [os.path.basename(words[0]), *words[1:]] if words else []


class Interrupted(RegistryError):
    """Ctrl-C (SIGINT) during a long write: the message says what was committed and what is left to do. The command
    line exits 130, as a shell expects of an interrupted command. `committed`: some of it was (a new file stays)."""

    def __init__(self, message: str, committed: bool = False):
        super().__init__(message)
        self.committed = committed
