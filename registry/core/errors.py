"""The registry's own error types. The library raises these; only the CLI (cli.common.handles_errors) turns them
into click errors, and the HTTP server into status codes."""
from __future__ import annotations


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
        try:
            with (gzip.open if name.endswith(".gz") else open)(path, "rt", encoding="utf-8", errors="replace") as fh:
                records = 0
                for at, text in enumerate(fh, 1):
                    records += bool(text.strip())
                    if records == line:
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
    pass


class DatabaseDamaged(RegistryError):
    pass


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
    return DatabaseDamaged(f"{path}: the database file is damaged ({what}); restore it from a backup or import "
                           f"its data into a new file")


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
    return text.splitlines()[0] if text else type(cause).__name__


def unknown_model(name: str, known, where: str = "") -> NotFound:
    """NotFound for a model name the registry lacks, with the names it most likely meant: those containing it
    (`gpt-4o` -> `gpt-4o-2024-05-13`), then the closest spellings."""
    import difflib

    known = sorted(set(known))
    low = name.lower()
    guesses = [k for k in known if low and low in k.lower()]
    guesses += [k for k in difflib.get_close_matches(name, known, n=3, cutoff=0.5) if k not in guesses]
    hint = f"; did you mean {' or '.join(repr(g) for g in guesses[:3])}?" if guesses else ""
    return NotFound(f"unknown model {name!r}{where}{hint}")


def database_locked(path: str, detail: str) -> DatabaseLocked:
    """DatabaseLocked for a file another process holds (`detail`: the database's own message), saying what is
    known of the holder: its PID and, where /proc lets us read it, its command line; the HTTP API is suggested only
    when the holder is a `registry serve`."""
    import re

    pid = re.search(r"PID (\d+)", detail)
    if not pid:
        return DatabaseLocked(f"{path}: the database is locked by another process; wait for it to finish or stop "
                              f"it")
    words = command_line(int(pid.group(1)))
    shown = f" ({' '.join(' '.join(words).split())[:COMMAND_SHOWN]})" if words else ""    # one line
    if words and words[0] == "registry" and "serve" in words[1:]:
        return DatabaseLocked(f"{path}: the database is locked by process {pid.group(1)}{shown}; stop it or use its "
                              f"HTTP API")
    return DatabaseLocked(f"{path}: the database is locked by process {pid.group(1)}{shown}; wait for it to "
                          f"finish or stop it")


COMMAND_SHOWN = 120     # characters of the lock holder's command line a message shows


def command_line(pid: int) -> list[str]:
    """A process's command line from /proc (empty where unreadable), a registry process's as `registry ARGS`
    (`python -m registry ...` and the console script alike), a token given on it hidden."""
    import os

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
