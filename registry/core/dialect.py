"""What differs between the two databases the registry runs on, in one place: DuckDB (the default, one file) and
PostgreSQL (`--db postgresql://user@host:port/dbname`, psycopg 3).

Modules write SQL once, with `?` placeholders, in the subset both read (`::INT` casts, `unnest(?)` of a list,
`ON CONFLICT`, `count(*) FILTER`, window functions in subqueries rather than QUALIFY, `min` rather than
`any_value`). What PostgreSQL lacks of DuckDB's SQL is either here (placeholders, Arrow reads, COPY, temporary
tables from Arrow) or created in the database by migration 0007 (the `arg_max` aggregates). Computation that only
DuckDB does (reading files, bit-string aggregates) runs in an in-process DuckDB over Arrow tables (`Tx.stage`).
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

# rows cached per open database that another process can change: on PostgreSQL they are dropped at the start of
# every transaction (DuckDB's file lock means no other process writes while a registry holds the file)
MUTABLE_CACHE = ("active_encoder", "evaluated_models", "model_states", "query_meta")

TABLE_EXISTS = {
    "duckdb": "select count(*) from duckdb_tables() where table_name = :name",
    "postgresql": "select count(*) from information_schema.tables where table_name = :name "
                  "and table_schema = current_schema()",
}


def is_url(path: str) -> bool:
    return str(path).startswith(("postgresql://", "postgres://", "postgresql+psycopg://"))


def engine_url(url: str) -> str:
    """SQLAlchemy's URL for psycopg 3."""
    return re.sub(r"^(postgresql|postgres)(\+psycopg)?://", "postgresql+psycopg://", url)


def display_url(url: str) -> str:
    """The URL as printed (`stats`, `/health`, errors): the password, if any, hidden."""
    return re.sub(r"^(\w[\w+]*://[^:/@]+):[^@]*@", r"\1:***@", re.sub(r"^postgresql\+psycopg://", "postgresql://",
                                                                      re.sub(r"^postgres://", "postgresql://", url)))


_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?|%")


def pg_statement(statement: str, params: Sequence[Any] | None = None) -> tuple[str, list[Any] | None]:
    """(statement, params) as psycopg takes them: `?` -> `%s` (outside quotes), every literal `%` doubled, numpy
    scalars and arrays as Python values."""
    if not params:
        return statement, None

    # psycopg reads % everywhere, quotes included; ? is a placeholder only outside quotes
    def sub(m: re.Match[str]) -> str:
        tok = m.group(0)
        return "%s" if tok == "?" else tok.replace("%", "%%")
    return _TOKEN.sub(sub, statement), [plain_value(p) for p in params]


def plain_value(value: Any) -> Any:
    """A parameter as psycopg takes it: numpy scalars and arrays as Python values, tuples as lists."""
    if hasattr(value, "tolist") and not isinstance(value, (bytes, bytearray, memoryview)):
        return value.tolist()          # numpy scalar or array
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    return value


def configure(cursor: Any) -> None:
    """Read values as DuckDB gives them: JSON as its text, numeric (avg of integers) as float."""
    from psycopg.types.numeric import FloatLoader
    from psycopg.types.string import TextLoader

    cursor.adapters.register_loader("json", TextLoader)
    cursor.adapters.register_loader("jsonb", TextLoader)
    cursor.adapters.register_loader("numeric", FloatLoader)


# PostgreSQL type oid -> Arrow type, so that an empty result keeps its column types
def _arrow_types() -> dict[int, Any]:
    import pyarrow as pa

    return {16: pa.bool_(), 20: pa.int64(), 21: pa.int16(), 23: pa.int32(), 700: pa.float32(), 701: pa.float64(),
            1700: pa.float64(), 25: pa.string(), 1043: pa.string(), 114: pa.string(), 3802: pa.string(),
            17: pa.binary(), 1114: pa.timestamp("us"), 1184: pa.timestamp("us", tz="UTC"),
            1021: pa.list_(pa.float32()), 1022: pa.list_(pa.float64()), 1007: pa.list_(pa.int32()),
            1016: pa.list_(pa.int64()), 1009: pa.list_(pa.string())}


def rows_to_arrow(cursor: Any) -> Any:
    """The rows of an executed psycopg cursor as a pyarrow Table, column by column."""
    import pyarrow as pa

    if cursor.description is None:
        return pa.table({})
    return _rows_table(cursor.description, cursor.fetchall())


def arrow_batches(cursor: Any, rows: int) -> Iterator[Any]:
    """The rows of an executed psycopg cursor as pyarrow Tables of at most `rows` rows each (a server-side cursor
    keeps only one batch in memory: `db copy` of a large table)."""
    while batch := cursor.fetchmany(rows):
        yield _rows_table(cursor.description, batch)


def _rows_table(description: Any, rows: list[Any]) -> Any:
    import pyarrow as pa

    types = _arrow_types()
    cols = list(zip(*rows)) if rows else [()] * len(description)
    arrays, names = [], []
    for d, values in zip(description, cols):
        names.append(d.name)
        arrays.append(pa.array(list(values), type=types.get(d.type_code)))
    return pa.Table.from_arrays(arrays, names=names)


def _pg_type(t: Any) -> str:
    import pyarrow as pa

    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_integer(t):
        return "bigint" if t.bit_width > 32 or (pa.types.is_unsigned_integer(t) and t.bit_width == 32) else "integer"
    if pa.types.is_float32(t) or pa.types.is_float16(t):
        return "real"
    if pa.types.is_floating(t):
        return "double precision"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _pg_type(t.value_type) + "[]"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytea"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return "text"


def _as_arrow(data: Any) -> Any:
    return data if hasattr(data, "column_names") else data.to_arrow_table()


def pg_temp_table(conn: Any, name: str, data: Any) -> None:
    """A temporary table `name` holding an Arrow table's rows (dropped at the end of the transaction at the
    latest)."""
    data = _as_arrow(data)
    cols = ", ".join(f'"{f.name}" {_pg_type(f.type)}' for f in data.schema)
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {name}")
        cur.execute(f"CREATE TEMP TABLE {name} ({cols}) ON COMMIT DROP")
    pg_copy(conn, name, data.column_names, data)


def pg_copy(conn: Any, table: str, columns: list[str], data: Any) -> None:
    """Append an Arrow table's rows with COPY. Flat columns go as CSV written by Arrow's C++ writer (no Python
    object per value); a table with list columns (vectors) goes row by row through psycopg's binary COPY."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    data = _as_arrow(data).select(columns)
    if data.num_rows == 0:
        return
    collist = ", ".join(f'"{c}"' for c in columns)
    nested = any(pa.types.is_list(f.type) or pa.types.is_large_list(f.type) or pa.types.is_fixed_size_list(f.type)
                 or pa.types.is_binary(f.type) for f in data.schema)
    if not nested and _copy_binary_fixed(conn, table, columns, data):
        return
    with conn.cursor() as cur:
        if nested:
            with cur.copy(f"COPY {table} ({collist}) FROM STDIN (FORMAT binary)") as cp:
                cp.set_types([_pg_type(f.type) for f in data.schema])
                for batch in data.to_batches():
                    for row in zip(*(c.to_pylist() for c in batch.columns)):
                        cp.write_row(row)
            return
        # pyarrow writes nulls as empty unquoted fields and quotes every string: COPY's CSV reads both right
        opts = pacsv.WriteOptions(include_header=False, quoting_style="all_valid", batch_size=1 << 16)
        with cur.copy(f"COPY {table} ({collist}) FROM STDIN (FORMAT csv)") as cp:
            sink = pa.BufferOutputStream()
            for batch in data.to_batches(max_chunksize=1 << 18):
                sink = pa.BufferOutputStream()
                pacsv.write_csv(pa.Table.from_batches([batch]), sink, opts)
                cp.write(sink.getvalue().to_pybytes())


def xor_hash(dialect: str, columns: str) -> str:
    """SQL for an order-free digest of a table's rows over `columns` (a cache key: changes when any row does)."""
    if dialect == "postgresql":
        return f"coalesce(bit_xor(hashtextextended(row({columns})::text, 0)), 0)"
    # one hash of the row as text: DuckDB's hash(a, b) combines the columns' hashes linearly, so the XOR over rows
    # cancels out (moving two queries from train to val, or swapping two models' sizes, left it unchanged)
    return f"coalesce(bit_xor(hash(row({columns})::VARCHAR)), 0)"


_FIXED = {"integer": ">i4", "bigint": ">i8", "smallint": ">i2", "boolean": "?", "real": ">f4",
          "double precision": ">f8"}
_PGCOPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8
_ROWS_PER_WRITE = 1 << 18


def _copy_binary_fixed(conn: Any, table: str, columns: list[str], data: Any) -> bool:
    """COPY in PostgreSQL's binary format, built with numpy (no Python object per value), when every column is a
    fixed-width number or boolean in the target table and holds no NULL: the bulk path for evaluations. -> False
    (nothing sent) otherwise."""
    import numpy as np

    if any(c.null_count for c in data.columns):
        return False
    with conn.cursor() as cur:
        types = dict(cur.execute(
            """SELECT attname, format_type(atttypid, NULL) FROM pg_attribute
               WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped""", [table]).fetchall())
    if not all(types.get(c) in _FIXED for c in columns):
        return False
    fields: list[tuple[str, Any]] = [("n", ">i2")]
    for i, c in enumerate(columns):
        dt = np.dtype(_FIXED[types[c]])
        fields += [(f"l{i}", ">i4"), (f"v{i}", dt)]
    row = np.dtype(fields)
    with conn.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN (FORMAT binary)") as cp:
        cp.write(_PGCOPY_HEADER)
        for start in range(0, data.num_rows, _ROWS_PER_WRITE):
            part = data.slice(start, _ROWS_PER_WRITE)
            out = np.empty(part.num_rows, dtype=row)
            out["n"] = len(columns)
            for i, c in enumerate(columns):
                out[f"l{i}"] = row[f"v{i}"].itemsize
                out[f"v{i}"] = part.column(c).to_numpy(zero_copy_only=False)
            cp.write(out.tobytes())
        cp.write(b"\xff\xff")
    return True


_FIXED_OIDS = {16: "?", 20: ">i8", 21: ">i2", 23: ">i4", 700: ">f4", 701: ">f8"}


def copy_out_fixed(conn: Any, statement: str, params: list[Any] | None) -> Any:
    """A query's rows as a pyarrow Table read with COPY ... TO STDOUT in PostgreSQL's binary format and cut into
    columns by numpy (no Python object per value), when every column is a fixed-width number or boolean and no value
    is NULL: the bulk path for evaluations. -> None otherwise (the caller reads it row by row).

    The rows come as one row of arrays, a column each (array_agg): libpq hands a COPY over one row at a time, and a
    COPY row per result row cost 2 us a row in Python (a million evaluations: 2.0 s, 1.2 s so). A statement that
    orders its rows numbers them too, and they are put back in that order here."""
    import numpy as np
    import pyarrow as pa

    with conn.cursor() as cur:
        cur.execute(f"SELECT * FROM ({statement}) q LIMIT 0", params)
        description = cur.description
    if not description or not all(d.type_code in _FIXED_OIDS for d in description):
        return None
    ordered = "order by" in statement.lower()
    names = [f"c{i}" for i in range(len(description))] + (["rn"] if ordered else [])
    source = (f"SELECT *, row_number() OVER () FROM ({statement}) s" if ordered else statement)
    arrays = ", ".join(f"array_agg({n})" for n in names)
    body = bytearray()
    with conn.cursor() as cur, cur.copy(f"COPY (SELECT {arrays} FROM ({source}) AS q({', '.join(names)})) "
                                        "TO STDOUT (FORMAT binary)", params) as cp:
        for block in cp:
            body += block
    types = [np.dtype(_FIXED_OIDS[d.type_code]) for d in description] + ([np.dtype(">i8")] if ordered else [])
    columns = _arrays_row(body, types)
    if columns is None:
        return None
    if ordered:
        order = np.empty(len(columns[-1]), dtype=np.int64)
        order[columns.pop() - 1] = np.arange(len(order))
        columns = [c[order] for c in columns]
    return pa.table({d.name: c for d, c in zip(description, columns)})


def _arrays_row(body: bytes | bytearray, types: list[Any]) -> list[Any] | None:
    """The columns of a binary COPY of one row of one-dimensional arrays without NULLs (a NULL field: no rows),
    as numpy arrays of `types` (big-endian, as sent) in native order. None where it is anything else."""
    import numpy as np

    at = len(_PGCOPY_HEADER)
    if body[:at] != _PGCOPY_HEADER or body[-2:] != b"\xff\xff" or int.from_bytes(body[at:at + 2], "big") != len(types):
        return None
    at += 2
    out = []
    for dtype in types:
        size = int.from_bytes(body[at:at + 4], "big", signed=True)
        at += 4
        if size < 0:                                            # (array_agg over no rows: NULL)
            out.append(np.zeros(0, dtype=dtype.newbyteorder("=")))
            continue
        ndim, has_null = int.from_bytes(body[at:at + 4], "big"), int.from_bytes(body[at + 4:at + 8], "big")
        if ndim != 1 or has_null:
            return None
        n = int.from_bytes(body[at + 12:at + 16], "big")
        cells = np.frombuffer(body, dtype=np.dtype([("l", ">i4"), ("v", dtype)]), count=n, offset=at + 20)
        if n and not (cells["l"] == dtype.itemsize).all():
            return None
        out.append(cells["v"].astype(dtype.newbyteorder("=")))
        at += size
    return out


def pg_failed(conn: Any) -> bool:
    """Whether the connection's transaction has failed (every statement but ROLLBACK is refused)."""
    from psycopg.pq import TransactionStatus

    return bool(conn.info.transaction_status == TransactionStatus.INERROR)


# `db copy`: the tables and id sequences of a registry's schema, and how to set a sequence so that the next id is
# `value + 1` (DuckDB has no setval: it draws the missing values; its sequences, like PostgreSQL's, ignore rollback)
TABLES = {
    "duckdb": "SELECT table_name FROM duckdb_tables() WHERE schema_name = current_schema() ORDER BY 1",
    "postgresql": "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() "
                  "ORDER BY 1",
}
SEQUENCES = {   # -> (name, last value drawn or NULL)
    "duckdb": "SELECT sequence_name, last_value FROM duckdb_sequences() WHERE schema_name = current_schema()",
    "postgresql": "SELECT sequencename, last_value FROM pg_sequences WHERE schemaname = current_schema()",
}


def advance_sequence(dialect: str, name: str, last: int | None, value: int) -> str | None:
    """SQL that moves sequence `name` (last drawn: `last`, None if never) on to `value`; None if nothing to do."""
    if value <= (last or 0):
        return None
    if dialect == "postgresql":
        return f"SELECT setval('{name}', {int(value)})"
    return f"SELECT max(nextval('{name}')) FROM range({int(value) - (last or 0)})"
