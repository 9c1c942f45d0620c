"""Alembic environment for the registry's DuckDB file.

The registry passes its open SQLAlchemy connection in `config.attributes["connection"]` (DuckDB allows one
read-write connection configuration per file and process). From the shell: `alembic -x db=registry.duckdb upgrade head`.
"""
from alembic.ddl.impl import DefaultImpl
from sqlalchemy import create_engine

from alembic import context


class DuckDBImpl(DefaultImpl):
    """Alembic knows no 'duckdb' dialect; DuckDB runs DDL inside transactions, so a failed upgrade rolls back."""
    __dialect__ = "duckdb"
    transactional_ddl = True


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=None, transaction_per_migration=False)
        with context.begin_transaction():
            context.run_migrations()
        return
    path = context.get_x_argument(as_dictionary=True).get("db", "registry.duckdb")
    engine = create_engine(f"duckdb:///{path}")
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=None)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run_migrations_online()
