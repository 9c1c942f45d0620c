"""Import into PostgreSQL against PostgreSQL's own COPY of the same rows, side by side in one run (issue 14, bar 2).

A throwaway PostgreSQL (tests/pg.py; default durability: fsync on) holds, per repeat, three fresh databases:

- ours: `registry import --evaluations` of the 371,244 MMLU-Pro evaluations into a registry that already holds the
  models and queries (imported just before, not timed): DuckDB in-process reads and checks the gzip CSV, the rows to
  append go to PostgreSQL with COPY, in one transaction (commit included in the time);
- COPY (file rows): the floor. The same file's rows (model, question_id, correct) streamed from the gzip file into
  a plain table with `COPY ... FROM STDIN (FORMAT csv)`, decompressed by the client as it goes;
- COPY (stored rows): context. The rows as the registry stores them (model_id, query_id, correct, batch_id), already
  in memory, COPYed into a table shaped like `evaluations`.

Usage: .venv/bin/python bench/pg_import.py [--data ../shared/data/mmlu-pro] [--repeat 3]
"""
from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry import Registry
from registry.data import import_run, input_files  # noqa: E402
from tests.pg import Server  # noqa: E402


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def copy_file_rows(url: str, path: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE file_rows (model text, question_id bigint, correct int)")
        with conn.cursor() as cur, cur.copy("COPY file_rows FROM STDIN (FORMAT csv, HEADER true)") as cp, \
                gzip.open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                cp.write(chunk)
        n = conn.execute("SELECT count(*) FROM file_rows").fetchone()[0]
        conn.commit()
    return n


def copy_stored_rows(url: str, rows) -> None:
    import psycopg

    from registry.core.dialect import pg_copy

    with psycopg.connect(url) as conn:
        conn.execute("""CREATE TABLE stored_rows (model_id integer NOT NULL, query_id integer NOT NULL,
                        correct boolean NOT NULL, batch_id integer NOT NULL,
                        created timestamp NOT NULL DEFAULT now())""")
        pg_copy(conn, "stored_rows", ["model_id", "query_id", "correct", "batch_id"], rows)
        conn.commit()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT.parent / "shared/data/mmlu-pro"))
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    files = input_files.files_in_dir(Path(args.data))
    server = Server(durable=True)
    results = []
    try:
        for i in range(args.repeat):
            # ours
            url = server.create_db(f"ours{i}")
            reg = Registry(url)
            with reg.store.tx() as tx:
                import_run.run_import(tx, {k: files[k] for k in ("models", "queries", "splits")}, embed_texts=False)
            t_ours, res = timed(lambda: reg.import_files(evaluations=files["evaluations"], onboard=False))
            assert res.evaluations_added == 371_244, res
            with reg.store.tx() as tx:
                stored = tx.arrow("SELECT model_id, query_id, correct, batch_id FROM evaluations")
            reg.close()
            # the floor: COPY of the file's rows
            floor_url = server.create_db(f"floor{i}")
            t_floor, n = timed(lambda: copy_file_rows(floor_url, files["evaluations"]))
            assert n == 371_244, n
            # context: COPY of the stored rows from memory
            ctx_url = server.create_db(f"stored{i}")
            t_stored, _ = timed(lambda: copy_stored_rows(ctx_url, stored))
            results.append((t_ours, t_floor, t_stored))
            print(f"run {i + 1}: ours {t_ours:.2f} s, COPY file rows {t_floor:.2f} s, "
                  f"COPY stored rows {t_stored:.2f} s", flush=True)
    finally:
        server.stop()
    ours, floor, stored = (statistics.median(c) for c in zip(*results))
    print()
    print("| 371,244 MMLU-Pro evaluations into PostgreSQL | median s | x COPY of the file's rows |")
    print("|---|---|---|")
    print(f"| `registry import --evaluations` (DuckDB reads and checks, COPY appends) | {ours:.2f} | "
          f"{ours / floor:.2f} |")
    print(f"| PostgreSQL COPY of the file's rows (client gunzips, FORMAT csv) | {floor:.2f} | 1.00 |")
    print(f"| PostgreSQL COPY of the stored rows from memory (context) | {stored:.2f} | {stored / floor:.2f} |")
    print()
    print(f"bar 2 (ours <= 2x COPY): {'met' if ours <= 2 * floor else 'NOT met'} ({ours / floor:.2f}x); "
          f"runs: {args.repeat}")


if __name__ == "__main__":
    main()
