"""Reading input files into the stage: which file of a folder is which, which column is which (aliases), DuckDB's
own readers (`read_csv`, `read_json`, `read_parquet`, gzip included) into temporary tables with a line number per
row, and DuckDB's long reader errors cut to one line naming the file and the line. data/import_run.py checks and
writes what is staged here.

`tx.stage` is the in-process DuckDB that reads the files: on a DuckDB registry its own connection, on PostgreSQL a
private one into which the registry rows the checks join are mirrored (`mirror`).

Line numbers: for CSV, line = record number + 1 (the header is line 1) here and in DuckDB's errors, turned into
the line an editor shows where a quoted field spans lines (errors.editor_line, when the error is raised); for JSONL,
the record number; for Parquet, the row number.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from registry.core.errors import InputError
from registry.core.interrupts import is_interrupt
from registry.core.transaction import Tx
from registry.data import vector_files

# Accepted column names, first one canonical.
COLUMNS = {
    "models": {"name": ("model", "name"), "family": ("family",), "provider": ("provider",),
               "params_b": ("params_b", "params", "parameters_b"), "cost": ("cost", "price"),
               "open_weights": ("open_weights", "open"), "tags": ("tags",)},
    "queries": {"id": ("question_id", "query_id", "id"), "text": ("question", "text", "query"),
                "category": ("category",), "source": ("source", "benchmark"), "options": ("options", "choices"),
                "answer": ("answer", "gold")},
    "evaluations": {"model": ("model", "model_name"), "qid": ("question_id", "query_id", "query", "id"),
                    "correct": ("correct", "score", "label")},
    "splits": {"qid": ("question_id", "query_id", "query", "id"), "split": ("split",)},
}
REQUIRED = {"models": ("name",), "queries": ("id", "text"), "evaluations": ("model", "qid", "correct"),
            "splits": ("qid", "split")}
DIR_FILES = {"models": ("models",), "queries": ("questions", "queries"), "evaluations": ("evaluations",),
             "splits": ("splits",)}
SUFFIXES = (".csv", ".csv.gz", ".jsonl", ".jsonl.gz", ".ndjson", ".json", ".parquet")


@dataclass
class Staged:
    """A file read into a temporary table `table` with canonical column names and a `line` column."""
    kind: str
    path: str
    table: str
    rows: int
    ignored: list[str]
    line_sql: str = "line"  # SQL giving a row's line number in `table`


# --- locating and reading files ----------------------------------------------------------------------------------

ONE_FILE = ("a file, where the csv format is a folder (models.csv, questions.csv.gz, evaluations.csv.gz, splits.csv); "
            "one model's results (question_id,correct) are registered with `registry register NAME --evals FILE`")


def files_in_dir(directory: str | Path) -> dict[str, str]:
    """A folder laid out like ../shared/data/mmlu-pro: models.csv, questions.csv.gz, evaluations.csv.gz, splits.csv."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(ONE_FILE if directory.is_file() else "not a directory", file=str(directory))
    found: dict[str, str] = {}
    for kind, stems in DIR_FILES.items():
        for stem in stems:
            for suffix in SUFFIXES:
                candidate = directory / f"{stem}{suffix}"
                if candidate.is_file() and kind not in found:
                    found[kind] = str(candidate)
    if not found:
        raise InputError("no models, questions, evaluations or splits file found", file=str(directory))
    if (directory / vector_files.DIR_FILE).is_file():
        found["vectors"] = str(directory / vector_files.DIR_FILE)
    return found


def files_to_import(directory: str | None, **paths: str | None) -> dict[str, str]:
    """{kind: path} of an import: a folder's files (`files_in_dir`), and those named one by one over them."""
    files = files_in_dir(directory) if directory else {}
    files.update({kind: str(path) for kind, path in paths.items() if path})
    if not files:
        raise InputError("nothing to import: give a folder or at least one of --models, --queries, "
                         "--evaluations, --splits")
    return files


def file_format(path: str) -> str:
    name = path.lower().removesuffix(".gz")
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    return "csv"


def check_path(path: str) -> None:
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", file=path)
    if p.is_dir():
        raise InputError("is a directory, not a file", file=path)
    if p.stat().st_size == 0:
        raise InputError("file is empty", file=path)


def duck_error(path: str, exc: Exception) -> InputError:
    """DuckDB's reader errors are many lines long; keep the line number and the first sentence of the problem. DuckDB
    stops a query on Ctrl-C itself (InterruptException): that goes on as the interrupt it is, not as a bad file."""
    import re

    if is_interrupt(exc):
        raise KeyboardInterrupt from None
    text = str(exc)
    line = re.search(r"[Ll]ine:? (\d+)", text)
    first = text.splitlines()[0]
    for prefix in ("Invalid Input Error: ", "IO Error: ", "Conversion Error: ", "Binder Error: "):
        first = first.removeprefix(prefix)
    if "unicode" in text.lower() or "utf-8" in text.lower() or "utf8" in text.lower():
        first = "invalid UTF-8 (the file must be UTF-8 encoded)"
    elif "gzip" in text.lower():
        first = "truncated or corrupt gzip file"
    if line and "CSV Error on Line" in first:
        first = "malformed CSV row"
    if "state machine reached an invalid state" in text:      # DuckDB's reader names no line for it
        mixed = mixed_line_ending(path)
        if mixed:
            return InputError(f"line {mixed[0]}: {mixed[1]}", file=path)    # (a physical line: not recounted)
    at = int(line.group(1)) if line else None
    bad_json = re.search(r"Malformed JSON in file .*?: (.*)", first)
    if bad_json:        # DuckDB counts a JSONL record's line one past its own
        first, at = f"not valid JSON ({bad_json.group(1).strip().rstrip('.')})", (at - 1 if at else None)
    return InputError(first.strip().rstrip("."), file=path, line=at)


def mixed_line_ending(path: str) -> tuple[int, str] | None:
    """(line, problem) for the first line whose ending (LF or CRLF) differs from the first line's, which DuckDB's
    CSV reader cannot read; None when every line ends alike."""
    import gzip

    try:
        with (gzip.open if path.lower().endswith(".gz") else open)(path, "rb") as fh:
            first = None
            for at, raw in enumerate(fh, 1):
                if not raw.endswith(b"\n"):
                    return None                              # (the last line, without an ending)
                ending = "CRLF" if raw.endswith(b"\r\n") else "LF"
                first = first or ending
                if ending != first:
                    return at, (f"line ends with {ending} but line 1 with {first}: mixed line endings; convert the "
                                f"file to one kind (e.g. `dos2unix` or `unix2dos`) and import it again")
    except (OSError, EOFError):
        return None
    return None


def fetch(tx: Tx, statement: str, params=None):
    """Run SQL in the stage (the in-process DuckDB that reads the files) and fetch all rows."""
    return tx.stage.execute(statement, params or []).fetchall()


def mirror(tx: Tx, *tables: str) -> None:
    """PostgreSQL: copy the registry rows that the stage's checks join into the stage, as they are now in this
    transaction (DuckDB: the stage is the registry's own connection; nothing to do)."""
    for t in tables:
        tx.mirror(t, MIRRORS[t])


MIRRORS = {"queries": "SELECT id, external_id, content_hash FROM queries",
           "models": "SELECT id, name FROM models",
           "query_splits": "SELECT query_id, split FROM query_splits"}


def sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


HEADER_LIMIT = 16 << 20     # bytes: a header is a few hundred; a hostile file's first line may be a gigabyte


def csv_header(path: str) -> tuple[list[str], str]:
    """The header's column names and the delimiter, read by us: cheaper than DuckDB's sniffer on a big gzip file."""
    import csv
    import gzip

    opener = gzip.open if path.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.readline(HEADER_LIMIT + 1)
    except (OSError, EOFError):
        raise InputError("truncated or corrupt gzip file", file=path) from None
    if len(raw) > HEADER_LIMIT:
        raise InputError(f"the header line is longer than {HEADER_LIMIT >> 20} MB: not a header", file=path, line=1)
    if raw.startswith((b"PK\x03\x04", b"\xd0\xcf\x11\xe0")):     # zip (.xlsx, .ods) or OLE2 (.xls)
        raise InputError("a spreadsheet workbook (or another archive), not a CSV file: save the sheet as CSV (UTF-8) "
                         "and give that file", file=path)
    try:
        header = raw.decode("utf-8-sig").rstrip("\r\n")
    except UnicodeDecodeError:
        raise InputError("invalid UTF-8 (the file must be UTF-8 encoded)", file=path, line=1) from None
    delim = max((",", "\t", ";", "|"), key=header.count) if header else ","
    try:
        names = next(csv.reader([header], delimiter=delim), [])
    except csv.Error as exc:       # (the csv module's field limit: 131,072 characters)
        problem = ("a column name in the header is longer than 131,072 characters" if "field limit" in str(exc)
                   else f"the header is not valid CSV ({exc})")
        raise InputError(problem, file=path, line=1) from None
    return names, delim


def source_sql(path: str, fmt: str, names: list[str] | None = None, delim: str = ",") -> str:
    if fmt == "csv":
        cols = ", ".join(f"{sql_str(n)}: 'VARCHAR'" for n in names or [])
        return (f"read_csv({sql_str(path)}, header=true, auto_detect=false, delim={sql_str(delim)}, "
                f"quote='\"', escape='\"', columns={{{cols}}})")
    if fmt == "jsonl":
        return f"read_json({sql_str(path)}, format='newline_delimited')"
    return f"read_parquet({sql_str(path)})"


@dataclass
class Columns:
    """A file's source expression and how its columns map to the canonical ones (read from its header only)."""
    path: str
    fmt: str
    src: str                                # read_csv(...) / read_json(...) / read_parquet(...)
    types: dict[str, tuple[str, str]]       # lower-case name -> (name as given, DuckDB type)
    chosen: dict[str, str]                  # canonical -> lower-case name
    exprs: dict[str, str]                   # canonical -> SQL giving it as VARCHAR (or a constant)

    @property
    def ignored(self) -> list[str]:
        return [self.types[c][0] for c in self.types if c not in self.chosen.values()]


def column_names(tx: Tx, path: str) -> list[str]:
    """The file's column names as given (CSV: its header; JSONL and Parquet: what DuckDB reads), a reader error as
    one line naming the file."""
    fmt = file_format(path)
    if fmt == "csv":
        return csv_header(path)[0]
    try:
        return [row[0] for row in fetch(tx, f"DESCRIBE SELECT * FROM {source_sql(path, fmt)}")]
    except Exception as exc:
        raise duck_error(path, exc) from None


def file_columns(tx: Tx, kind: str, path: str, constants: dict[str, str] | None = None) -> Columns:
    """Which columns of the file are which (aliases in COLUMNS); a missing required column, an empty header or a
    Parquet column of the wrong type is an InputError naming the file."""
    check_path(path)
    fmt = file_format(path)
    if fmt == "csv":
        names, delim = csv_header(path)
        if not [n for n in names if n.strip()]:
            raise InputError("no header line", file=path, line=1)
        src = source_sql(path, fmt, names, delim)
        types = {n.strip().lower(): (n, "VARCHAR") for n in names}
    else:
        src = source_sql(path, fmt)
        try:
            described = fetch(tx, f"DESCRIBE SELECT * FROM {src}")
        except Exception as exc:
            raise duck_error(path, exc) from None
        types = {row[0].strip().lower(): (row[0], row[1]) for row in described}
    chosen: dict[str, str] = {}
    for canon, aliases in COLUMNS[kind].items():
        for alias in aliases:
            if alias in types:
                chosen[canon] = alias
                break
    missing = [c for c in REQUIRED[kind] if c not in chosen and c not in (constants or {})]
    if missing:
        wanted = " or ".join(repr(a) for a in COLUMNS[kind][missing[0]])
        raise InputError(f"missing column {wanted} (found: {', '.join(types) or 'none'})", file=path, line=1)
    if fmt == "parquet":
        _check_parquet_types(kind, path, chosen, types)
    exprs = {}
    for canon, alias in chosen.items():
        original, dtype = types[alias]
        exprs[canon] = f"to_json({ident(original)})::VARCHAR" if dtype.endswith("]") or \
            dtype.startswith(("STRUCT", "MAP")) else (ident(original) if dtype == "VARCHAR"
                                                      else f"CAST({ident(original)} AS VARCHAR)")
    for canon, value in (constants or {}).items():
        exprs.setdefault(canon, sql_str(value))
    return Columns(path, fmt, src, types, chosen, exprs)


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def stage(tx: Tx, kind: str, path: str, table: str, *, project: Callable[[dict[str, str]], str] | None = None,
          with_lines: bool = True, constants: dict[str, str] | None = None) -> Staged:
    """Read one file into a temporary table with canonical columns (VARCHAR).

    `project` may turn the canonical columns into the stage's select list (to normalise in the same pass);
    `with_lines` adds a `line` column (cheap for small files; big ones compute lines only when reporting an error).
    """
    cols = file_columns(tx, kind, path, constants)
    fmt, src, exprs = cols.fmt, cols.src, cols.exprs
    first_line = {"csv": 2, "jsonl": 1, "parquet": 1}[fmt]
    ignored = cols.ignored
    selects = project(exprs) if project else ", ".join(f"{e} AS {c}" for c, e in exprs.items())
    if kind == "models":  # kept, as tags
        selects += "".join(', CAST("{0}" AS VARCHAR) AS "x:{0}"'.format(c.replace('"', '""')) for c in ignored)
        ignored = []
    try:
        tx.stage.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT {selects} FROM {src}")
        # rowids follow the file's order (insertion order is preserved) from an arbitrary start
        rows, start = fetch(tx, f"SELECT count(*), min(rowid) FROM {table}")[0]
        if with_lines and rows:
            tx.stage.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS "
                            f"SELECT rowid - {start} + {first_line} AS line, * FROM {table}")
    except Exception as exc:
        raise duck_error(path, exc) from None
    if rows == 0:
        raise InputError("no rows (only a header)", file=path)
    return Staged(kind, path, table, rows, ignored, line_sql=f"(rowid - {start} + {first_line})")


def _check_parquet_types(kind: str, path: str, chosen: dict[str, str], types: dict[str, tuple[str, str]]) -> None:
    numeric = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "HUGEINT")
    expected = {("evaluations", "correct"): ("BOOLEAN",) + numeric,
                ("evaluations", "model"): ("VARCHAR",),
                ("evaluations", "qid"): ("VARCHAR",) + numeric,
                ("queries", "id"): ("VARCHAR",) + numeric,
                ("queries", "text"): ("VARCHAR",),
                ("splits", "split"): ("VARCHAR",)}
    for canon, alias in chosen.items():
        allowed = expected.get((kind, canon))
        dtype = types[alias][1]
        if allowed and dtype not in allowed:
            raise InputError(f"column {types[alias][0]!r} has type {dtype}, expected {' or '.join(allowed)}",
                             file=path)


def first_bad(tx: Tx, staged: Staged, condition: str, message: str, value_col: str | None = None, *,
              error: type[InputError] = InputError) -> None:
    value = f", {value_col}" if value_col else ""
    row = fetch(tx, f"SELECT {staged.line_sql} AS l{value} FROM {staged.table} WHERE {condition} ORDER BY l LIMIT 1")
    if row:
        shown = repr(row[0][1]) if value_col else ""
        raise error(message.format(value=shown), file=staged.path, line=int(row[0][0]))
