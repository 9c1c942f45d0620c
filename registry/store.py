"""The DuckDB file behind the registry: engine, migrations, and one managed transaction per public operation.

Bulk rows go through the DuckDB connection that the SQLAlchemy session holds (`Tx.duck`), so native bulk paths
(`read_csv`, Arrow) and ORM rows share one transaction: an import commits whole or not at all.
"""
from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from .errors import DatabaseLocked, NotFound, RegistryError, SchemaOutdated

DEFAULT_DB = "registry.duckdb"
ROOT = Path(__file__).resolve().parent.parent
ALEMBIC_DIR = ROOT / "alembic"


def default_db_path() -> str:
    return os.environ.get("REGISTRY_DB", DEFAULT_DB)


def _locked_message(path: str, exc: Exception) -> str:
    pid = re.search(r"PID (\d+)", str(exc))
    who = f"process {pid.group(1)}" if pid else "another process"
    return (f"{path}: the database is locked by {who} (a running `registry serve`?); "
            f"stop it or use its HTTP API")


def _alembic_config(connection=None):
    from alembic.config import Config

    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ALEMBIC_DIR))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


@dataclass
class Tx:
    """One open transaction: the ORM session and the raw DuckDB connection inside it."""
    session: Session
    cache: dict = field(default_factory=dict)   # the Store's cache of immutable rows (see Store.cache)
    path: str = ""                              # the database file
    local: dict = field(default_factory=dict)   # this transaction's own cache (may hold rows it has not committed)
    _after_commit: list = field(default_factory=list)

    def cached(self, key, build):
        """The cached value under `key`, or build() read in this transaction; a value read here joins the cache
        when this transaction commits, unless a transaction that changed it (`invalidate`) committed since."""
        if key in self.cache:
            return self.cache[key]
        generation = self.cache.get(("generation", key), 0)
        value = build()

        def keep():
            if self.cache.get(("generation", key), 0) == generation:
                self.cache[key] = value
        self.after_commit(keep)
        return value

    def invalidate(self, key) -> None:
        """This transaction changes what `key` caches: drop it once the change commits."""
        def drop():
            self.cache.pop(key, None)
            self.cache[("generation", key)] = self.cache.get(("generation", key), 0) + 1
        self.after_commit(drop)

    def after_commit(self, fn) -> None:
        """Run fn() once this transaction has committed (never after a rollback): how in-process caches learn
        of rows this transaction wrote or read, without ever holding rows that were rolled back."""
        self._after_commit.append(fn)

    @property
    def duck(self):
        return self.session.connection().connection.driver_connection

    def sql(self, statement: str, params=None):
        """Run SQL on the raw DuckDB connection and fetch all rows."""
        return self.duck.execute(statement, params or []).fetchall()

    def arrow(self, statement: str, params=None):
        """Run SQL and fetch the result as a pyarrow Table (the bulk path: no Python objects per row)."""
        return self.duck.sql(statement, params=params or None).to_arrow_table()


class Store:
    def __init__(self, path: str | os.PathLike | None = None, migrate: bool = True, create: bool = True):
        self.path = str(path or default_db_path())
        if Path(self.path).is_dir():
            raise RegistryError(f"{self.path}: is a directory, not a database file")
        if not create and not Path(self.path).exists():   # a typo must not leave an empty registry behind
            raise NotFound(f"{self.path}: no such registry (create one with `registry import DIR`, "
                           f"or give --db / REGISTRY_DB)")
        try:
            # every transaction ends in an explicit commit or rollback (Store.tx), so the pool's extra rollback on
            # returning a connection only costs time
            self.engine = create_engine(f"duckdb:///{self.path}", pool_reset_on_return=None)
            # rows that never change once written (encoder checkpoints, query text vectors), kept per open database:
            # while the engine is open this process holds DuckDB's file lock, so no other process writes behind it
            self.cache: dict = {}
            with self.engine.connect() as conn:
                conn.execute(text("select 1"))
        except Exception as exc:  # duckdb raises IOException for a held lock
            if "lock" in str(exc).lower():
                raise DatabaseLocked(_locked_message(self.path, exc)) from None
            raise RegistryError(f"{self.path}: cannot open database: {str(exc).splitlines()[0]}") from None
        if migrate:
            try:
                self.ensure_schema()
            except BaseException:
                self.engine.dispose()  # release the file: nothing of ours may keep it open after a refusal
                raise

    # --- schema -------------------------------------------------------------------------------------------
    def current_revision(self) -> str | None:
        with self.engine.connect() as conn:
            exists = conn.execute(text(
                "select count(*) from duckdb_tables() where table_name = 'alembic_version'")).scalar()
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
        with Session(self.engine, expire_on_commit=False) as session:
            try:
                tx = Tx(session, self.cache, self.path)
                yield tx
                session.commit()
            except BaseException:
                session.rollback()
                raise
            for fn in tx._after_commit:
                fn()

    def close(self) -> None:
        self.engine.dispose()
