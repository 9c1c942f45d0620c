"""One open transaction (`Tx`): the raw connection it runs on, the SQL helpers every module writes through (`sql`,
`arrow`, `numpy`, `table`, `append`, `stage`), its typed notes, and the Store's cache it reads and invalidates."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from registry.core import dialect, interrupts
from registry.core.errors import RegistryError, check_text


def cache_section(cache: dict[Any, Any], name: str, make: Callable[[], Any] = dict) -> Any:
    """A named section of a Store's cache, made on first use: values derived from the registry (routing states and
    fits, routed texts' vectors, pages) whose owner checks they are still current before using them. Per Store: a
    fresh Store starts empty."""
    section = cache.get(("section", name))
    if section is None:
        section = cache.setdefault(("section", name), make())     # (atomic: threads share one section)
    return section


def texts(params: Iterable[Any] | None) -> None:
    """Every text among a statement's parameters must be one the database can hold (errors.text_problem), else
    InputError: a name that was not checked where it entered is still one line, never the driver's error."""
    for value in params or ():
        if type(value) is str and not value.isascii():
            check_text(value, "value")
        elif type(value) in (list, tuple) and value and type(value[0]) is str:      # (a list of names)
            for item in value:
                if type(item) is str and not item.isascii():
                    check_text(item, "value")


@dataclass
class TxNotes:
    """What a transaction wrote that a later step of it reads from memory rather than from the database."""
    # embedding versions (onboarding): (id, model id, name, version, vector, evaluations, stability, encoder id)
    versions_written: list[Any] = field(default_factory=list)
    # models created (ingest): model id -> (cost, params_b)
    new_model_meta: dict[int, Any] = field(default_factory=dict)


@dataclass
class Tx:
    """One open transaction: the raw connection it runs on (DuckDB or PostgreSQL; on PostgreSQL inside an ORM
    session, which DuckDB does without)."""
    session: Any                                # the ORM session (PostgreSQL), None on DuckDB
    cache: dict[Any, Any] = field(default_factory=dict)   # the Store's cache of immutable rows (see Store.cache)
    path: str = ""                              # the database file (or PostgreSQL URL, password hidden)
    # this transaction's own cache (may hold rows it has not committed)
    local: dict[Any, Any] = field(default_factory=dict)
    notes: TxNotes = field(default_factory=TxNotes)
    _after_commit: list[Callable[[], None]] = field(default_factory=list)
    dialect: str = "duckdb"                     # "duckdb" | "postgresql"
    _stage: Any = None                          # PostgreSQL only: the in-process DuckDB for files (see `stage`)
    _stage_db: Any = None                       # PostgreSQL only: -> the Store's in-memory DuckDB
    _raw: Any = None                            # the driver connection, once asked for (see `raw`)
    read_only: bool = False                     # the file is open read-only: nothing may be written, caches included
    save_routing_state: bool = True             # (Store.save_routing_state: a server keeps its own in memory)

    def cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """The cached value under `key`, or build() read in this transaction; a value read here joins the cache
        when this transaction commits, unless a transaction that changed it (`invalidate`) committed since."""
        if key in self.local.get("invalidated", ()):
            # this transaction changed what it caches: its own read, kept for this transaction only (until it
            # changes it again)
            own = self.local.setdefault("own_reads", {})
            if key not in own:
                own[key] = build()
            return own[key]
        if key in self.cache:
            return self.cache[key]
        generation = self.cache.get(("generation", key), 0)
        value = build()

        def keep() -> None:
            if self.cache.get(("generation", key), 0) == generation:
                self.cache[key] = value
        self.after_commit(keep)
        return value

    def section(self, name: str, make: Callable[[], Any] = dict) -> Any:
        """The Store's cache section `name` (`cache_section`)."""
        return cache_section(self.cache, name, make)

    def invalidate(self, key: Any) -> None:
        """This transaction changes what `key` caches: drop it once the change commits (and read it afresh in this
        transaction meanwhile: `cached`)."""
        self.local.setdefault("invalidated", set()).add(key)
        self.local.get("own_reads", {}).pop(key, None)

        def drop() -> None:
            self.cache.pop(key, None)
            self.cache[("generation", key)] = self.cache.get(("generation", key), 0) + 1
        self.after_commit(drop)

    def after_commit(self, fn: Callable[[], None]) -> None:
        """Run fn() once this transaction has committed (never after a rollback): how in-process caches learn
        of rows this transaction wrote or read, without ever holding rows that were rolled back."""
        self._after_commit.append(fn)

    @property
    def postgres(self) -> bool:
        return self.dialect == "postgresql"

    @property
    def raw(self) -> Any:
        """The driver's connection inside this transaction (duckdb, or psycopg on PostgreSQL). Looked up once: the
        session keeps one connection for the whole transaction, and asking it again per statement cost more than a
        small statement."""
        if self._raw is None:         # (DuckDB's transactions are given theirs)
            self._raw = self.session.connection().connection.driver_connection
        return self._raw

    @property
    def duck(self) -> Any:
        """The registry's own DuckDB connection (DuckDB-only code paths: benches, the DuckDB side of a test)."""
        if self.postgres:
            raise RegistryError("a DuckDB-only operation was asked of a PostgreSQL registry")
        return self.raw

    @property
    def stage(self) -> Any:
        """DuckDB in this process, for reading and checking files and for computing over Arrow tables: on DuckDB
        the registry's own connection (registry tables are visible in it), on PostgreSQL a private in-memory one
        (registry rows it needs are mirrored into it, `mirror`; results go to PostgreSQL with `append`)."""
        if not self.postgres:
            return self.raw
        if self._stage is None:
            # a connection of its own to the Store's in-memory DuckDB (opened once: about 60 ms): temporary tables
            # and registered Arrow tables are per connection, so concurrent transactions do not see each other's
            self._stage = self._stage_db().cursor()
        return self._stage

    def sql(self, statement: str, params: Sequence[Any] | None = None) -> list[Any]:
        """Run SQL (`?` placeholders) on the registry's connection and fetch all rows (none for a statement that
        returns none)."""
        texts(params)
        if not self.postgres:
            with interrupts.statement(self.raw):
                rows: list[Any] = self.raw.execute(statement, params or []).fetchall()
            return rows
        with self.raw.cursor() as cur:
            dialect.configure(cur)
            cur.execute(*dialect.pg_statement(statement, params))
            return cur.fetchall() if cur.description is not None else []

    def executemany(self, statement: str, rows: Iterable[Sequence[Any]]) -> None:
        rows = list(rows)
        for row in rows:
            texts(row)
        if not self.postgres:
            with interrupts.statement(self.raw):
                self.raw.executemany(statement, rows)
            return
        with self.raw.cursor() as cur:
            cur.executemany(dialect.pg_statement(statement, [0])[0], [dialect.plain_value(list(r)) for r in rows])

    def arrow(self, statement: str, params: Sequence[Any] | None = None) -> Any:
        """Run SQL and fetch the result as a pyarrow Table (the bulk path: no Python objects per row on DuckDB)."""
        texts(params)
        if not self.postgres:
            with interrupts.statement(self.raw):
                return self.raw.sql(statement, params=params or None).to_arrow_table()
        fast = dialect.copy_out_fixed(self.raw, *dialect.pg_statement(statement, params))
        if fast is not None:
            return fast
        with self.raw.cursor() as cur:
            dialect.configure(cur)
            cur.execute(*dialect.pg_statement(statement, params))
            return dialect.rows_to_arrow(cur)

    def numpy(self, statement: str, params: Sequence[Any] | None = None) -> dict[str, Any]:
        """Run SQL and fetch the result as {column: numpy array}."""
        texts(params)
        if not self.postgres:
            with interrupts.statement(self.raw):
                columns: dict[str, Any] = self.raw.execute(statement, params or []).fetchnumpy()
            return columns
        import numpy as np

        tbl = self.arrow(statement, params)
        return {c: np.asarray(tbl.column(c).to_numpy(zero_copy_only=False)) for c in tbl.column_names}

    @contextmanager
    def table(self, name: str, data: Any) -> Iterator[str]:
        """A pyarrow Table visible to the registry's SQL as `name` for the block (DuckDB: registered as is;
        PostgreSQL: a temporary table filled by COPY)."""
        if not self.postgres:
            self.raw.register(name, data)
            try:
                yield name
            except BaseException:
                try:                      # an interrupted or failed statement aborted the transaction: unregistering
                    self.raw.unregister(name)      # then fails too, and must not hide what happened
                except Exception:
                    pass
                raise
            self.raw.unregister(name)
            return
        dialect.pg_temp_table(self.raw, name, data)
        try:
            yield name
        finally:
            if not dialect.pg_failed(self.raw):   # (a failed transaction drops it when it rolls back)
                self.sql(f"DROP TABLE IF EXISTS {name}")

    def append(self, table: str, data: Any, columns: list[str] | None = None) -> None:
        """Bulk-append the rows of a pyarrow Table (or a DuckDB relation) to a registry table: DuckDB inserts
        from Arrow, PostgreSQL takes them with COPY."""
        columns = columns or list(data.column_names if hasattr(data, "column_names") else data.columns)
        if not self.postgres:
            with self.table("_append_in", data), interrupts.statement(self.raw):
                self.raw.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(columns)} "
                                 f"FROM _append_in")
            return
        dialect.pg_copy(self.raw, table, columns, data)

    def mirror(self, name: str, statement: str, params: Sequence[Any] | None = None) -> None:
        """Make the registry rows that `statement` selects visible to `stage` as table `name` (PostgreSQL: read
        into it; DuckDB: nothing to do, `stage` sees the registry's tables, so `name` must be the table's own)."""
        if self.postgres:
            self.stage.register(name, self.arrow(statement, params))

    def committed(self) -> None:
        """The transaction has committed: run every `after_commit` hook, so one that fails (a bug of ours) leaves
        no other cache behind; then raise the first failure."""
        failed = None
        for fn in self._after_commit:
            try:
                fn()
            except Exception as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    def release(self) -> None:
        """The transaction is over: its stage closed, its connection no longer its own."""
        self.close_stage()
        self._raw = None

    def close_stage(self) -> None:
        if self._stage is not None:
            self._stage.close()
            self._stage = None
