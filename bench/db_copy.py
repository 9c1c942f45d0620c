"""`registry db copy` of the full registry (issue 14, item 4), each direction beside the database's own copy of the
same database, in one run, with the round trip checked.

A throwaway PostgreSQL (tests/pg.py; default durability: fsync on). Per repeat, fresh destinations:

- DuckDB -> DuckDB: `Registry(src).db_copy(file)` against DuckDB's own `COPY FROM DATABASE` (ATTACH both) (the
  floor: the same engine copies its own tables, no Arrow, no driver);
- DuckDB -> PostgreSQL, PostgreSQL -> DuckDB (the round trip), PostgreSQL -> PostgreSQL against
  `CREATE DATABASE ... TEMPLATE` (PostgreSQL's file-level copy: the floor no row-by-row copy can reach).

Every time includes opening the destination, migrating it and the commit. Lossless: the round trip's file holds the
same rows as the source (every table's count and sum of row hashes, tests/conftest.py `snapshot`), and the
PostgreSQL copies of a copy hold the same rows as the first (`pg_snapshot`).

Usage: .venv/bin/python bench/db_copy.py [--db registry.duckdb] [--repeat 3]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import duckdb  # noqa: E402

from registry import Registry  # noqa: E402
from tests.conftest import pg_snapshot, snapshot  # noqa: E402
from tests.pg import Server  # noqa: E402


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def db_copy(src: str, dest: str):
    with Registry(src, create=False) as reg:
        return reg.db_copy(dest)


def duckdb_own_copy(src: str, dest: str) -> None:
    con = duckdb.connect()
    con.execute(f"ATTACH '{src}' AS s (READ_ONLY)")
    con.execute(f"ATTACH '{dest}' AS d")
    con.execute("COPY FROM DATABASE s TO d")
    con.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=str(ROOT / "registry.duckdb"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    source = str(Path(args.db).resolve())
    original = snapshot(Path(source))
    rows = sum(n for n, _ in original.values())
    times: dict[str, list[float]] = {}
    server = Server(durable=True)
    tmp = Path(tempfile.mkdtemp(prefix="db-copy-bench-"))
    try:
        for i in range(args.repeat):
            def note(name, seconds):
                times.setdefault(name, []).append(seconds)

            t, _ = timed(lambda: db_copy(source, str(tmp / f"dd{i}.duckdb")))
            note("DuckDB -> DuckDB: db copy", t)
            assert snapshot(tmp / f"dd{i}.duckdb") == original, "DuckDB -> DuckDB copy differs"
            t, _ = timed(lambda: duckdb_own_copy(source, str(tmp / f"own{i}.duckdb")))
            note("DuckDB -> DuckDB: COPY FROM DATABASE (floor)", t)

            url = server.create_db(f"pg{i}")
            t, _ = timed(lambda: db_copy(source, url))
            note("DuckDB -> PostgreSQL: db copy", t)
            t, _ = timed(lambda: db_copy(url, str(tmp / f"back{i}.duckdb")))
            note("PostgreSQL -> DuckDB: db copy", t)
            assert snapshot(tmp / f"back{i}.duckdb") == original, "the round trip lost or changed rows"

            url2 = server.create_db(f"pgpg{i}")
            t, _ = timed(lambda: db_copy(url, url2))
            note("PostgreSQL -> PostgreSQL: db copy", t)
            t, _ = timed(lambda: server.create_db(f"tpl{i}", template=f"pg{i}"))
            note("PostgreSQL -> PostgreSQL: CREATE DATABASE TEMPLATE (floor)", t)
            assert pg_snapshot(url2) == pg_snapshot(url), "PostgreSQL -> PostgreSQL copy differs"
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{source}: {len(original)} tables, {rows:,} rows; median of {args.repeat}; every copy checked equal")
    print(f"{'copy':<58} {'median s':>9} {'rows/s':>11}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<58} {med:>9.2f} {rows / med:>11,.0f}")


if __name__ == "__main__":
    main()
