"""The database behind the registry: engine, migrations, and one managed transaction per public operation.

The default is one DuckDB file; `--db postgresql://user@host:port/dbname` puts the same schema on PostgreSQL
(psycopg 3). Modules write their SQL once, in the subset both databases read (see core/dialect.py for what differs), and
run it through `Tx`: `sql`, `arrow`, `numpy`, `table` (a Python table visible to SQL), `append` (bulk rows). Files
are always read by DuckDB in-process (`Tx.stage`): on DuckDB that is the registry's own connection, on PostgreSQL a
private in-memory one whose results are copied in with COPY. Bulk rows and ORM rows share one transaction either
way: an import commits whole or not at all.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from registry.core import dialect, resources, settings
from registry.core.errors import NotFound, RegistryError, SchemaOutdated, database_locked


def default_db_path() -> str:
    return settings.current().db


def _alembic_config(connection=None):
    from alembic.config import Config

    cfg = Config(str(resources.alembic_ini()))
    cfg.set_main_option("script_location", str(resources.alembic_dir()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def cache_section(cache: dict, name: str, make=dict):
    """A named section of a Store's cache, made on first use: values derived from the registry (routing states and
    fits, routed texts' vectors, pages) whose owner checks they are still current before using them. Per Store: a
    fresh Store starts empty."""
    section = cache.get(("section", name))
    if section is None:
        section = cache.setdefault(("section", name), make())     # (atomic: threads share one section)
    return section


@dataclass
class TxNotes:
    """What a transaction wrote that a later step of it reads from memory rather than from the database."""
    # embedding versions (onboarding): (id, model id, name, version, vector, evaluations, stability, encoder id)
    versions_written: list = field(default_factory=list)
    new_model_meta: dict = field(default_factory=dict)     # models created (ingest): model id -> (cost, params_b)


@dataclass
class Tx:
    """One open transaction: the ORM session and the raw connection inside it (DuckDB or PostgreSQL)."""
    session: Session
    cache: dict = field(default_factory=dict)   # the Store's cache of immutable rows (see Store.cache)
    path: str = ""                              # the database file (or PostgreSQL URL, password hidden)
    local: dict = field(default_factory=dict)   # this transaction's own cache (may hold rows it has not committed)
    notes: TxNotes = field(default_factory=TxNotes)
    _after_commit: list = field(default_factory=list)
    dialect: str = "duckdb"                     # "duckdb" | "postgresql"
    _stage: object = None                       # PostgreSQL only: the in-process DuckDB for files (see `stage`)
    _stage_db: object = None                    # PostgreSQL only: -> the Store's in-memory DuckDB
    _raw: object = None                         # the driver connection, once asked for (see `raw`)

    def cached(self, key, build):
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

        def keep():
            if self.cache.get(("generation", key), 0) == generation:
                self.cache[key] = value
        self.after_commit(keep)
        return value

    def section(self, name: str, make=dict):
        """The Store's cache section `name` (`cache_section`)."""
        return cache_section(self.cache, name, make)

    def invalidate(self, key) -> None:
        """This transaction changes what `key` caches: drop it once the change commits (and read it afresh in this
        transaction meanwhile: `cached`)."""
        self.local.setdefault("invalidated", set()).add(key)
        self.local.get("own_reads", {}).pop(key, None)

        def drop():
            self.cache.pop(key, None)
            self.cache[("generation", key)] = self.cache.get(("generation", key), 0) + 1
        self.after_commit(drop)

    def after_commit(self, fn) -> None:
        """Run fn() once this transaction has committed (never after a rollback): how in-process caches learn
        of rows this transaction wrote or read, without ever holding rows that were rolled back."""
        self._after_commit.append(fn)

    @property
    def postgres(self) -> bool:
        return self.dialect == "postgresql"

    @property
    def raw(self):
        """The driver's connection inside this transaction (duckdb, or psycopg on PostgreSQL). Looked up once: the
        session keeps one connection for the whole transaction, and asking it again per statement cost more than a
        small statement."""
        if self._raw is None:
            self._raw = self.session.connection().connection.driver_connection
        return self._raw

    @property
    def duck(self):
        """The registry's own DuckDB connection (DuckDB-only code paths: benches, the DuckDB side of a test)."""
        if self.postgres:
            raise RegistryError("a DuckDB-only operation was asked of a PostgreSQL registry")
        return self.raw

    @property
    def stage(self):
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

    def sql(self, statement: str, params=None):
        """Run SQL (`?` placeholders) on the registry's connection and fetch all rows (none for a statement that
        returns none)."""
        if not self.postgres:
            return self.raw.execute(statement, params or []).fetchall()
        with self.raw.cursor() as cur:
            dialect.configure(cur)
            cur.execute(*dialect.pg_statement(statement, params))
            return cur.fetchall() if cur.description is not None else []

    def executemany(self, statement: str, rows) -> None:
        if not self.postgres:
            self.raw.executemany(statement, rows)
            return
        with self.raw.cursor() as cur:
            cur.executemany(dialect.pg_statement(statement, [0])[0], [dialect.plain_value(list(r)) for r in rows])

    def arrow(self, statement: str, params=None):
        """Run SQL and fetch the result as a pyarrow Table (the bulk path: no Python objects per row on DuckDB)."""
        if not self.postgres:
            return self.raw.sql(statement, params=params or None).to_arrow_table()
        with self.raw.cursor() as cur:
            dialect.configure(cur)
            cur.execute(*dialect.pg_statement(statement, params))
            return dialect.rows_to_arrow(cur)

    def numpy(self, statement: str, params=None) -> dict:
        """Run SQL and fetch the result as {column: numpy array}."""
        if not self.postgres:
            return self.raw.execute(statement, params or []).fetchnumpy()
        import numpy as np

        tbl = self.arrow(statement, params)
        return {c: np.asarray(tbl.column(c).to_numpy(zero_copy_only=False)) for c in tbl.column_names}

    @contextmanager
    def table(self, name: str, data):
        """A pyarrow Table visible to the registry's SQL as `name` for the block (DuckDB: registered as is;
        PostgreSQL: a temporary table filled by COPY)."""
        if not self.postgres:
            self.raw.register(name, data)
            try:
                yield name
            finally:
                self.raw.unregister(name)
            return
        dialect.pg_temp_table(self.raw, name, data)
        try:
            yield name
        finally:
            if not dialect.pg_failed(self.raw):   # (a failed transaction drops it when it rolls back)
                self.sql(f"DROP TABLE IF EXISTS {name}")

    def append(self, table: str, data, columns: list[str] | None = None) -> None:
        """Bulk-append the rows of a pyarrow Table (or a DuckDB relation) to a registry table: DuckDB inserts
        from Arrow, PostgreSQL takes them with COPY."""
        columns = columns or list(data.column_names if hasattr(data, "column_names") else data.columns)
        if not self.postgres:
            self.raw.register("_append_in", data)
            try:
                self.raw.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(columns)} "
                                 f"FROM _append_in")
            finally:
                self.raw.unregister("_append_in")
            return
        dialect.pg_copy(self.raw, table, columns, data)

    def mirror(self, name: str, statement: str, params=None) -> None:
        """Make the registry rows that `statement` selects visible to `stage` as table `name` (PostgreSQL: read
        into it; DuckDB: nothing to do, `stage` sees the registry's tables, so `name` must be the table's own)."""
        if self.postgres:
            self.stage.register(name, self.arrow(statement, params))

    def close_stage(self) -> None:
        if self._stage is not None:
            self._stage.close()
            self._stage = None


class Store:
    def __init__(self, path: str | os.PathLike | None = None, migrate: bool = True, create: bool = True):
        self.path = str(path or default_db_path())
        self.duckdb_threads: int | None = None      # (limit_duckdb_threads)
        self.dialect = "postgresql" if dialect.is_url(self.path) else "duckdb"
        if self.dialect == "postgresql":
            self._open_postgres()
        else:
            self._open_duckdb(create)
        if migrate:
            try:
                self.ensure_schema()
            except BaseException:
                self.engine.dispose()  # release the file: nothing of ours may keep it open after a refusal
                raise

    def _open_duckdb(self, create: bool) -> None:
        if Path(self.path).is_dir():
            raise RegistryError(f"{self.path}: is a directory, not a database file")
        if not create and not Path(self.path).exists():   # a typo must not leave an empty registry behind
            raise NotFound(f"{self.path}: no such registry (create one with `registry import DIR`, "
                           f"or give --db / REGISTRY_DB)")
        try:
            # every transaction ends in an explicit commit or rollback (Store.tx), so the pool's extra rollback on
            # returning a connection only costs time
            self.engine = create_engine(f"duckdb:///{self.path}", pool_reset_on_return=None,
                                        connect_args={"config": self._duckdb_config()})
            # rows that never change once written (encoder checkpoints, query text vectors), kept per open database:
            # while the engine is open this process holds DuckDB's file lock, so no other process writes behind it;
            # and the sections of values derived from them whose owners check them before use (`section`)
            self.cache: dict = {}
            with self.engine.connect() as conn:
                conn.execute(text("select 1"))
        except Exception as exc:  # duckdb raises IOException for a held lock
            if "lock" in str(exc).lower():
                raise database_locked(self.path, str(exc)) from None
            raise RegistryError(f"{self.path}: cannot open database: {str(exc).splitlines()[0]}") from None

    def _stage_db(self):
        """The in-memory DuckDB that reads files for a PostgreSQL registry (`Tx.stage`), opened on first use."""
        with self._stage_lock:
            if self._stage_con is None:
                import duckdb

                self._stage_con = duckdb.connect(config=self._duckdb_config())
            return self._stage_con

    def _duckdb_config(self) -> dict:
        """What every DuckDB database of this store is opened with: the threads given to `limit_duckdb_threads`,
        else REGISTRY_DUCKDB_THREADS when set, else DuckDB's default."""
        threads = self.duckdb_threads or settings.current().duckdb_threads
        return {} if threads is None else {"threads": threads}

    def limit_duckdb_threads(self, threads: int) -> None:
        """Run DuckDB's queries on `threads` threads from now on (the file's database, and the in-memory one that
        reads files for a PostgreSQL registry, when it opens): `registry serve` asks for one."""
        self.duckdb_threads = threads
        if self.dialect == "duckdb":        # (a database-wide setting: any of the engine's connections sets it)
            with self.engine.connect() as conn:
                conn.exec_driver_sql(f"SET threads = {int(threads)}")

    def _open_postgres(self) -> None:
        """The database must exist (PostgreSQL creates databases, we create the schema in it). Other processes
        may write to it at any time: `tx` drops the cached values of rows that can change (dialect.MUTABLE_CACHE)
        at the start of every transaction, and keeps only rows that never change once written."""
        import threading

        self._stage_con, self._stage_lock = None, threading.Lock()
        url = dialect.engine_url(self.path)
        self.path = dialect.display_url(self.path)      # what is printed: never a password
        try:
            # sessions in UTC: TIMESTAMP columns hold UTC, as DuckDB's now() gives them
            self.engine = create_engine(url, pool_reset_on_return=None, pool_pre_ping=True,
                                        connect_args={"options": "-c timezone=UTC"})
            self.cache = {}
            with self.engine.connect() as conn:
                conn.execute(text("select 1"))
        except Exception as exc:
            first = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            raise RegistryError(f"{self.path}: cannot open database: {first}") from None

    def section(self, name: str, make=dict):
        """This Store's cache section `name` (`cache_section`)."""
        return cache_section(self.cache, name, make)

    # --- schema -------------------------------------------------------------------------------------------
    def current_revision(self) -> str | None:
        with self.engine.connect() as conn:
            exists = conn.execute(text(dialect.TABLE_EXISTS[self.dialect]), {"name": "alembic_version"}).scalar()
            if not exists:
                return None
            return conn.execute(text("select version_num from alembic_version")).scalar()

    def ensure_schema(self) -> None:
        """A new file is migrated to head; a file with an older schema is refused."""
        current = self.current_revision()
        if current is None:
            self.upgrade("head")
            return
        head = head_revision()
        if current != head:
            raise SchemaOutdated(f"{self.path}: schema is at revision {current}, this registry needs {head}; "
                                 f"run `registry db upgrade`")

    def upgrade(self, revision: str = "head") -> None:
        from alembic import command

        with self.engine.begin() as conn:
            command.upgrade(_alembic_config(conn), revision)

    def downgrade(self, revision: str) -> None:
        from alembic import command

        with self.engine.begin() as conn:
            command.downgrade(_alembic_config(conn), revision)

    # --- transactions -------------------------------------------------------------------------------------
    @contextmanager
    def tx(self) -> Iterator[Tx]:
        """Commit on success, roll back on any error: a failed operation changes nothing."""
        if self.dialect == "postgresql":   # another process may have changed these rows since
            for key in dialect.MUTABLE_CACHE:
                self.cache.pop(key, None)
            self.cache[("generation", "versions")] = self.cache.get(("generation", "versions"), 0) + 1
        with Session(self.engine, expire_on_commit=False) as session:
            tx = Tx(session, self.cache, self.path, dialect=self.dialect, _stage_db=self._stage_db)
            try:
                yield tx
                session.commit()
            except BaseException:
                session.rollback()
                raise
            finally:
                tx.close_stage()
                tx._raw = None        # (the connection went back to the pool with the transaction)
            # (committed: every hook runs, so one that fails, a bug of ours, leaves no other cache behind; then it
            # is raised)
            failed = None
            for fn in tx._after_commit:
                try:
                    fn()
                except Exception as exc:
                    failed = failed or exc
            if failed is not None:
                raise failed

    def close(self) -> None:
        self.engine.dispose()
        if getattr(self, "_stage_con", None) is not None:
            self._stage_con.close()
            self._stage_con = None
