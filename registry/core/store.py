"""The database behind the registry: connections, migrations, and one managed transaction per public operation.

The default is one DuckDB file; `--db postgresql://user@host:port/dbname` puts the same schema on PostgreSQL
(psycopg 3). Modules write their SQL once, in the subset both databases read (see core/dialect.py for what differs), and
run it through `Tx`: `sql`, `arrow`, `numpy`, `table` (a Python table visible to SQL), `append` (bulk rows). Files
are always read by DuckDB in-process (`Tx.stage`): on DuckDB that is the registry's own connection, on PostgreSQL a
private in-memory one whose results are copied in with COPY. Bulk rows and ORM rows share one transaction either
way: an import commits whole or not at all.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from registry.core import database_file, dialect, resources, settings
from registry.core.database_file import folder_lock, head_revision, remove_files, wait_for_lock, writable
from registry.core.errors import (
    NotFound,
    RegistryError,
    RowsWouldBeLost,
    SchemaMissing,
    SchemaOutdated,
    database_damaged,
    database_locked,
    disk_full,
    is_locked,
)
from registry.core.transaction import Tx, cache_section


def default_db_path() -> str:
    return settings.current().db


def alembic_config(connection: Any = None) -> Any:
    from alembic.config import Config

    cfg = Config(str(resources.alembic_ini()))
    cfg.set_main_option("script_location", str(resources.alembic_dir()))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def _duckdb_default_limit() -> int:
    """DuckDB's own default memory limit: 80% of the machine's memory."""
    return int(0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


class Store:
    # driver objects, typed loosely: DuckDB's connection (None on PostgreSQL, or once closed), the SQLAlchemy
    # engine made on first use, idle cursors, PostgreSQL's in-memory DuckDB for files and its lock
    con: Any
    _engine: Any
    _idle: list[Any]
    _idle_lock: Any
    _stage_con: Any
    _stage_lock: Any

    def __init__(self, path: str | os.PathLike[str] | None = None, migrate: bool = True, create: bool = True):
        self.path = str(path or default_db_path())
        self.duckdb_threads: int | None = None      # (limit_duckdb_threads)
        self.dialect = "postgresql" if dialect.is_url(self.path) else "duckdb"
        self.create, self.read_only = create, False
        self.created = False        # this Store's connection created the DuckDB file (`discard_if_created`)
        self.commit_failed = False  # a COMMIT failed on this connection (a full disk)
        # a routing state built here is saved for the next process (routing/saved_state.py); a server, whose
        # threads build states side by side and keep them in memory, turns it off
        self.save_routing_state = True
        if self.dialect == "postgresql":
            self._open_postgres()
        else:
            self._open_duckdb(create)
        if migrate:
            try:
                self.ensure_schema()
            except BaseException as exc:
                # release the file: nothing of ours may keep it open after a refusal; one it created goes
                self.discard_if_created()
                known = self.failure(exc)
                if known is not None:
                    raise known from None
                raise

    def failure(self, exc: BaseException) -> RegistryError | None:
        """Our one-line error for a driver error that says the file is damaged or the disk is full; else None."""
        if self.dialect != "duckdb" or isinstance(exc, RegistryError):     # (ours already says what failed)
            return None
        return database_damaged(self.path, exc) or disk_full(self.path, exc)

    def _open_duckdb(self, create: bool) -> None:
        database_file.not_database_file(self.path)
        if not create and not Path(self.path).exists():   # a typo must not leave an empty registry behind
            raise self._no_such_registry()
        import threading

        import duckdb

        config = self._duckdb_config()        # (a bad setting is its own error, not "cannot open")
        # DuckDB is driven directly: SQLAlchemy (and an engine) only when Alembic migrates the file (`engine`)
        self._engine, self._idle, self._idle_lock = None, [], threading.Lock()
        # rows that never change once written (encoder checkpoints, query text vectors), kept per open database:
        # while the connection is open this process holds DuckDB's file lock, so no other process writes behind
        # it; and the sections of values derived from them whose owners check them before use (`section`)
        self.cache: dict[Any, Any] = {}
        # a file this process may not write (its mode, its folder, a read-only mount) is still read
        self.read_only = not create and not writable(self.path)
        def connect() -> Any:
            # under the folder's lock: whether the file existed before this connection is this process's to know
            with folder_lock(self.path):
                existed = os.path.exists(self.path)
                if not existed and not create:      # (removed by its creator while we waited)
                    raise self._no_such_registry()
                try:
                    con = duckdb.connect(self.path, read_only=self.read_only, config=config)
                except BaseException:
                    if not existed:     # what a failed create left (a full disk): ours, and nobody else's yet
                        remove_files(self.path)
                    raise
                self.created = not existed
                return con

        try:       # (another registry process's turn: waited for, `wait_for_lock`)
            self.con = wait_for_lock(self.path, connect)
        except RegistryError:
            raise
        except Exception as exc:  # duckdb raises IOException for a held lock
            if is_locked(exc):
                raise database_locked(self.path, str(exc)) from None
            known = self.failure(exc)
            if known is not None:
                raise known from None
            raise RegistryError(f"{self.path}: cannot open database: {str(exc).splitlines()[0]}") from None

    def _no_such_registry(self) -> NotFound:
        return NotFound(f"{self.path}: no such registry (create one with `registry import DIR`, or give --db / "
                        f"REGISTRY_DB)")

    def _stage_db(self) -> Any:
        """The in-memory DuckDB that reads files for a PostgreSQL registry (`Tx.stage`), opened on first use."""
        with self._stage_lock:
            if self._stage_con is None:
                import duckdb

                self._stage_con = duckdb.connect(config=self._duckdb_config())
            return self._stage_con

    def _duckdb_config(self) -> dict[str, Any]:
        """What every DuckDB database of this store is opened with: the threads given to `limit_duckdb_threads`,
        else REGISTRY_DUCKDB_THREADS when set, else DuckDB's default; and never an extension fetched from the
        network or loaded unasked (a file DuckDB takes for another engine's, SQLite's, would do both)."""
        threads = self.duckdb_threads or settings.current().duckdb_threads
        config: dict[str, Any] = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
        return config if threads is None else {**config, "threads": threads}

    def limit_duckdb_threads(self, threads: int) -> None:
        """Run DuckDB's queries on `threads` threads from now on (the file's database, and the in-memory one that
        reads files for a PostgreSQL registry, when it opens): `registry serve` asks for one."""
        self.duckdb_threads = threads
        if self.dialect == "duckdb":        # (a database-wide setting: any connection sets it)
            self.con.execute(f"SET threads = {int(threads)}")

    @contextmanager
    def memory_limited(self, limit_bytes: int) -> Iterator[None]:
        """DuckDB's memory limit lowered to `limit_bytes` (never raised) while inside: its bulk statements then
        spill rather than keep what they read (an import of 10^8 evaluations held 7.6 GB under the default limit,
        80% of RAM, and 3.05 GB under 3 GB, as fast). PostgreSQL: nothing changes."""
        if self.dialect != "duckdb":
            yield
            return
        self.con.execute(f"SET memory_limit = '{min(limit_bytes, _duckdb_default_limit()) >> 20}MiB'")
        try:
            yield
        finally:
            self.con.execute("RESET memory_limit")          # (nothing of ours sets it otherwise)

    def _open_postgres(self) -> None:
        """The database must exist (PostgreSQL creates databases, we create the schema in it). Other processes
        may write to it at any time: `tx` drops the cached values of rows that can change (dialect.MUTABLE_CACHE)
        at the start of every transaction, and keeps only rows that never change once written."""
        import threading

        from sqlalchemy import create_engine, text

        self._stage_con, self._stage_lock = None, threading.Lock()
        url = dialect.engine_url(self.path)
        self.path = dialect.display_url(self.path)      # what is printed: never a password
        try:
            # sessions in UTC: TIMESTAMP columns hold UTC, as DuckDB's now() gives them
            self._engine = create_engine(url, pool_reset_on_return=None, pool_pre_ping=True,
                                         connect_args={"options": "-c timezone=UTC"})
            self.cache = {}
            with self.engine.connect() as conn:
                conn.execute(text("select 1"))
        except Exception as exc:
            first = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            raise RegistryError(f"{self.path}: cannot open database: {first}") from None

    @property
    def engine(self) -> Any:
        """A SQLAlchemy engine on this database (what Alembic migrates through); on DuckDB made on first use, its
        connections cursors of the Store's own connection (one process may open a file only one way)."""
        if self._engine is None:
            from duckdb_engine import ConnectionWrapper
            from sqlalchemy import create_engine

            self._engine = create_engine("duckdb:///:memory:", creator=lambda: ConnectionWrapper(self.con.cursor()),
                                         pool_reset_on_return=None)
        return self._engine

    def section(self, name: str, make: Callable[[], Any] = dict) -> Any:
        """This Store's cache section `name` (`cache_section`)."""
        return cache_section(self.cache, name, make)

    # --- schema -------------------------------------------------------------------------------------------
    def current_revision(self) -> str | None:
        if self.dialect == "duckdb":
            return database_file.revision(self.con)
        with self.tx() as tx:
            if not tx.sql(dialect.TABLE_EXISTS[self.dialect].replace(":name", "?"), ["alembic_version"])[0][0]:
                return None
            rows = tx.sql("select version_num from alembic_version")
            return rows[0][0] if rows else None

    def ensure_schema(self) -> None:
        """A new file is migrated to head; a file with an older schema is refused."""
        current = self.current_revision()
        if current is None and (self.read_only or not self.create):   # only commands that bring data in create it
            raise SchemaMissing(f"{self.path}: holds no registry schema (an empty file, or downgraded to base); "
                                f"run `registry db upgrade` or `registry import` to create it")
        if current is None:
            self.upgrade("head")
            return
        head = head_revision()
        if current != head:
            raise SchemaOutdated(database_file.revision_problem(self.path, current, head))

    def upgrade(self, revision: str = "head") -> None:
        from alembic import command

        with self.engine.begin() as conn:
            self._migrate(command.upgrade, conn, revision)

    def downgrade(self, revision: str, *, keep_rows: bool = False) -> dict[str, int]:
        """Migrate down to `revision`. -> what it deleted that held rows: {table: rows}, {"table.column": values}.
        With `keep_rows`, a downgrade that would delete rows changes nothing: RowsWouldBeLost says what."""
        from alembic import command

        with self.engine.connect() as conn:         # a trial run, rolled back, finds what the downgrade drops
            with conn.begin() as trial:
                before = table_columns(conn)
                self._migrate(command.downgrade, conn, revision)
                after = table_columns(conn)
                trial.rollback()
            lost = {}
            for table, columns in before.items():
                counted = [(table, "*")] if table not in after else [(f"{table}.{c}", c) for c in columns
                                                                      if c not in after[table]]
                for name, column in counted:
                    what = "*" if column == "*" else f'"{column}"'
                    rows = conn.exec_driver_sql(f'SELECT count({what}) FROM "{table}"').scalar()
                    if rows:
                        lost[name] = rows
        if lost and keep_rows:
            raise RowsWouldBeLost(self.path, revision, lost)
        with self.engine.begin() as conn:
            self._migrate(command.downgrade, conn, revision)
        return lost

    def _migrate(self, step: Callable[[Any, str], None], conn: Any, revision: str) -> None:
        """An Alembic command; a revision it does not know is one line."""
        from alembic.util import CommandError

        try:
            step(alembic_config(conn), revision)
        except CommandError as exc:
            raise RegistryError(f"{self.path}: {str(exc).splitlines()[0]} (give a revision such as head, base, -1 "
                                f"or {head_revision()}; `registry db current` shows the file's)") from None

    # --- transactions -------------------------------------------------------------------------------------
    @contextmanager
    def tx(self) -> Iterator[Tx]:
        """Commit on success, roll back on any error: a failed operation changes nothing."""
        if self.dialect == "postgresql":   # another process may have changed these rows since
            for key in dialect.MUTABLE_CACHE:
                self.cache.pop(key, None)
            self.cache[("generation", "versions")] = self.cache.get(("generation", "versions"), 0) + 1
        if self.dialect == "duckdb":
            with self._duckdb_tx() as tx:
                yield tx
            tx.committed()
            return
        from sqlalchemy.orm import Session

        with Session(self.engine, expire_on_commit=False) as session:
            tx = Tx(session, self.cache, self.path, dialect=self.dialect, _stage_db=self._stage_db,
                    save_routing_state=self.save_routing_state)
            try:
                yield tx
                session.commit()
            except BaseException:
                session.rollback()
                raise
            finally:
                tx.release()          # (the connection went back to the pool with the transaction)
        tx.committed()

    @contextmanager
    def _duckdb_tx(self) -> Iterator[Tx]:
        with self._idle_lock:
            cur = self._idle.pop() if self._idle else None
        cur = cur or self.con.cursor()      # a cursor is a connection of its own: transactions per thread
        cur.execute("BEGIN TRANSACTION")
        tx = Tx(None, self.cache, self.path, dialect="duckdb", _raw=cur, read_only=self.read_only,
                save_routing_state=self.save_routing_state)
        try:
            yield tx
            try:
                cur.execute("COMMIT")
            except Exception:      # (not an interrupt that came as it ran: the COMMIT itself did not fail)
                self.commit_failed = True      # (DuckDB may show the failed commit's rows: `discard_if_created`)
                raise
        except BaseException as exc:
            try:
                cur.execute("ROLLBACK")
            except Exception:      # (a failed COMMIT has rolled back already)
                pass
            known = self.failure(exc)
            if known is not None:
                raise known from None
            if self.read_only and "read-only mode" in str(exc):
                raise RegistryError(f"{self.path}: opened read-only (this process may not write the file or its "
                                    f"folder), and this command writes") from None
            raise
        finally:
            tx.release()
            with self._idle_lock:
                self._idle.append(cur)

    def check(self) -> database_file.SchemaCheck:
        """What is wrong with the database's schema (`database_file.SchemaCheck`): its revision, the migration's own
        table, a table or column missing. Needs only an open store (migrate=False opens any revision)."""
        with self.tx() as tx:
            return database_file.check(self.path, tx)

    def holds_rows(self) -> bool:
        """Does any table of the registry hold a row (the migration's bookkeeping left out)?"""
        with self.tx() as tx:
            tables = [r[0] for r in tx.sql("SELECT table_name FROM information_schema.tables WHERE table_schema = "
                                           "current_schema() AND table_name <> 'alembic_version'")]
            return any(tx.sql(f'SELECT EXISTS (SELECT 1 FROM "{t}")')[0][0] for t in tables)

    def discard_if_created(self) -> bool:
        """Close; and if this Store's connection created the DuckDB file and no table holds a row, remove the file
        and its write-ahead log (under `folder_lock`, before any other process can open it). -> removed.
        A file that holds rows stays: something was committed to it (unless a commit failed here, a full disk: what
        the file shows then is not what was reported)."""
        if not self.created or getattr(self, "con", None) is None:
            self.close()
            return False
        self.cache.clear()      # (nothing of it is saved beside the file when it closes: no index)
        with folder_lock(self.path):
            try:
                keep = not self.commit_failed and self.current_revision() is not None and self.holds_rows()
            except Exception:     # (a connection the failure broke, a full disk: nothing readable was committed)
                keep = False
            try:
                self.close()
            except Exception:
                pass
            if not keep:
                remove_files(self.path)
        self.created = False
        return not keep

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
        if getattr(self, "con", None) is not None:
            for cur in self._idle:
                cur.close()
            self._idle = []
            self.con.close()
            self.con = None
        if getattr(self, "_stage_con", None) is not None:
            self._stage_con.close()
            self._stage_con = None


def table_columns(conn: Any) -> dict[str, set[str]]:
    """{table: its columns} of the database's own schema, the migration's bookkeeping table left out."""
    rows = conn.exec_driver_sql("SELECT table_name, column_name FROM information_schema.columns "
                                "WHERE table_schema = current_schema() AND table_name <> 'alembic_version'").all()
    tables: dict[str, set[str]] = {}
    for table, column in rows:
        tables.setdefault(table, set()).add(column)
    return tables
