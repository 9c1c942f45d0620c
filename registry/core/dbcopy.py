"""`registry db copy DEST`: the whole registry, every table, into another database (a DuckDB file or a PostgreSQL
URL, either way round), losslessly: the same rows with the same ids, and every id sequence moved past the copied
ids so that later inserts do not collide.

The destination must be empty (a new file, or a database without rows); it is migrated to head first, so both
sides have the same schema (the source is at head, or the registry would not have opened it). The rows then go in
one transaction on the destination: a failure rolls it back and leaves the destination empty. The source is read in
one transaction too (on PostgreSQL at REPEATABLE READ), so a registry that is being written to is copied as it stood
at one moment. Rows travel as Arrow batches: read with DuckDB's Arrow reader or a PostgreSQL server-side cursor,
written with `Tx.append` (DuckDB inserts from the registered Arrow batch, PostgreSQL takes it with COPY).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Sequence

from registry.core import dialect
from registry.core.database_file import head_revision
from registry.core.errors import InputError, RegistryError
from registry.core.schema import Base
from registry.core.store import Store
from registry.core.transaction import Tx

BATCH_ROWS = 1 << 16           # rows per Arrow batch: bounded memory for a table of any size
MIGRATIONS_TABLE = "alembic_version"   # written by the destination's own migration to the same head


@dataclass
class CopyResult:
    source: str
    dest: str
    tables: dict[str, int] = field(default_factory=dict)      # rows copied, per table, in copy order
    sequences: dict[str, int] = field(default_factory=dict)   # each id sequence's last value in the destination
    revision: str | None = None                               # the schema revision of both
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return sum(self.tables.values())


def copy(source: Store, dest: str, progress: Callable[[str, int], None] | None = None) -> CopyResult:
    """Copy the registry in `source` to `dest` (a DuckDB file path or a PostgreSQL URL). `progress(table, rows)` is
    called as each table is done."""
    started = time.perf_counter()
    dest = str(dest)
    if _same_place(source.path, dest):
        raise InputError(f"{source.path}: db copy needs another database than the one it copies")
    target = Store(dest, migrate=False, create=True)
    try:
        _refuse_unless_empty(target)
        head = head_revision()
        if target.current_revision() != head:
            try:
                target.upgrade(head)
            except Exception as exc:   # e.g. a revision this registry does not know
                raise RegistryError(f"{target.path}: cannot migrate the destination: {_first_line(exc)}") from None
        result = CopyResult(source=source.path, dest=target.path, revision=head)
        with source.tx() as src, target.tx() as dst:
            if src.postgres:   # one snapshot for every table, whatever other writers commit meanwhile
                src.session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            tables = _tables(src)
            _check_same_tables(tables, _tables(dst), target.path)
            for table in tables:
                if table == MIGRATIONS_TABLE:
                    continue
                try:
                    result.tables[table] = _copy_table(src, dst, table)
                except RegistryError:
                    raise
                except Exception as exc:   # a value the destination refuses: the whole copy rolls back
                    raise RegistryError(f"{target.path}: copy of table {table} failed, nothing was copied: "
                                        f"{_first_line(exc)}") from None
                if progress:
                    progress(table, result.tables[table])
            # last, just before the commit: sequences ignore rollback on both databases
            result.sequences = _advance_sequences(src, dst)
    finally:
        target.close()
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def _same_place(source: str, dest: str) -> bool:
    if dialect.is_url(source) or dialect.is_url(dest):   # (source: as displayed, its password hidden)
        return dialect.is_url(dest) and dialect.display_url(dest) == source
    return Path(source).resolve() == Path(dest).resolve()


def _first_line(exc: Exception) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _refuse_unless_empty(store: Store) -> None:
    """A destination may hold the registry's empty tables (a migrated, unused database), nothing else."""
    ours = set(Base.metadata.tables) | {MIGRATIONS_TABLE}
    with store.tx() as tx:
        for table in _tables(tx):
            if table not in ours:
                raise InputError(f"{store.path}: not empty (holds table {table}, which is not the registry's); "
                                 f"db copy needs a new file or an empty database")
            if table != MIGRATIONS_TABLE and tx.sql(f'SELECT 1 FROM "{table}" LIMIT 1'):
                raise InputError(f"{store.path}: not empty (table {table} has rows); db copy needs a new file or "
                                 f"an empty database")


def _tables(tx: Tx) -> list[str]:
    return [r[0] for r in tx.sql(dialect.TABLES[tx.dialect])]


def _check_same_tables(source: list[str], dest: list[str], where: str) -> None:
    if source != dest:
        differ = sorted(set(source) ^ set(dest))
        raise RegistryError(f"{where}: after migration its tables differ from the source's ({', '.join(differ)})")


def _columns(tx: Tx, table: str) -> list[str]:
    """The table's columns in their stored order."""
    return list(tx.arrow(f'SELECT * FROM "{table}" LIMIT 0').column_names)


def _copy_table(src: Tx, dst: Tx, table: str) -> int:
    columns = _columns(src, table)
    missing = set(columns) - set(_columns(dst, table))
    if missing:
        raise RegistryError(f"{dst.path}: table {table} lacks columns {', '.join(sorted(missing))}")
    meta = Base.metadata.tables.get(table)
    keys = [c.name for c in meta.primary_key.columns] if meta is not None else []
    # by primary key: the copy's rows are stored in id order (evaluations, without one, as they are stored)
    order = f" ORDER BY {', '.join(keys)}" if keys else ""
    statement = f"SELECT {', '.join(columns)} FROM \"{table}\"{order}"
    copied = 0
    for batch in _read(src, statement):
        dst.append(table, batch, columns)
        copied += batch.num_rows
    return copied


def _read(tx: Tx, statement: str) -> Iterator[Any]:
    """The statement's rows as Arrow tables of at most BATCH_ROWS rows."""
    import pyarrow as pa

    if not tx.postgres:
        for batch in tx.raw.sql(statement).to_arrow_reader(BATCH_ROWS):
            if batch.num_rows:
                yield pa.Table.from_batches([batch])
        return
    from psycopg.types.string import TextBinaryLoader

    # server-side: one batch in memory at a time; binary: vectors come as floats, not text to parse (2.7x faster)
    with tx.raw.cursor(name="registry_db_copy", binary=True) as cur:
        dialect.configure(cur)
        cur.adapters.register_loader("json", TextBinaryLoader)   # JSON as its text, as `configure` reads it
        cur.execute(statement)
        yield from dialect.arrow_batches(cur, BATCH_ROWS)


def _advance_sequences(src: Tx, dst: Tx) -> dict[str, int]:
    """Each of the destination's sequences moved on to the source's last value, or to the largest copied id if that
    is larger: the next id either side would draw is the same, and never one already taken."""
    source_last = dict(src.sql(dialect.SEQUENCES[src.dialect]))
    dest_last = dict(dst.sql(dialect.SEQUENCES[dst.dialect]))
    users = {col.default.name: (table.name, col.name) for table in Base.metadata.tables.values()
             for col in table.columns if isinstance(col.default, Sequence)}
    out = {}
    for name in sorted(source_last):
        if name not in dest_last:
            raise RegistryError(f"{dst.path}: has no sequence {name} after migration")
        value = source_last[name] or 0
        if name in users:
            table, column = users[name]
            value = max(value, dst.sql(f'SELECT coalesce(max({column}), 0) FROM "{table}"')[0][0])
        statement = dialect.advance_sequence(dst.dialect, name, dest_last[name], value)
        if statement:
            dst.sql(statement)
        out[name] = max(value, dest_last[name] or 0)
    return out
