"""Import speed, side by side in one run (issue 2, bars 3 and 4).

- evaluations file into a registry that already holds the models and queries, against DuckDB's own
  `CREATE TABLE t AS SELECT * FROM read_csv(file)` of the same file (the floor);
- re-import of the same three files, against the first import;
- query-text embedding in questions per second, our path against a bare sentence-transformers `encode`.

Usage: .venv/bin/python bench/import_speed.py [--data ../shared/data/mmlu-pro] [--texts 512] [--repeat 3]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa

from registry import Registry
from registry.data import import_run, input_files
from registry.locus import text_encoder


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/mmlu-pro"))
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    data = Path(args.data)
    files = input_files.files_in_dir(data)
    tmp = Path(tempfile.mkdtemp())

    ours, floor = [], []
    for i in range(args.repeat):
        # the floor: DuckDB reading the same file into a plain table
        con = duckdb.connect(str(tmp / f"floor{i}.duckdb"))
        t_floor, _ = timed(lambda: con.execute(
            f"CREATE TABLE t AS SELECT * FROM read_csv('{files['evaluations']}')"))
        con.close()
        floor.append(t_floor)
        # ours: models + queries first (texts not embedded here: measured separately below), then the evaluations
        reg = Registry(tmp / f"reg{i}.duckdb")
        with reg.store.tx() as tx:
            import_run.run_import(tx, {k: files[k] for k in ("models", "queries", "splits")}, embed_texts=False)
        t_ev, res = timed(lambda: reg.import_files(evaluations=files["evaluations"], onboard=False))
        assert res.evaluations_added == 371_244, res
        ours.append(t_ev)
        reg.close()

    # first import of the whole folder, then the same again (texts excluded from both: never re-embedded, tested)
    reg = Registry(tmp / "whole.duckdb")
    with reg.store.tx() as tx:
        t_first, _ = timed(lambda: import_run.run_import(tx, files, embed_texts=False))
    t_re, again = timed(lambda: reg.import_files(directory=str(data), onboard=False))
    assert again.already_imported
    # the same rows under another file name: the row-level path must find nothing new
    renamed = tmp / "evaluations-copy.csv.gz"
    renamed.write_bytes(Path(files["evaluations"]).read_bytes())
    with reg.store.tx() as tx:
        t_rows, again2 = timed(lambda: import_run.run_import(tx, {"evaluations": str(renamed), "models": files["models"]},
                                                         embed_texts=False))
    assert again2.already_imported or (again2.evaluations_added == 0 and again2.models_added == 0), again2
    stats = reg.stats()
    reg.close()

    # text embedding: our path (hash check + batched encode + Arrow insert) against bare encode of the same texts
    con = duckdb.connect()
    rows = con.execute(f"SELECT question, options FROM read_csv('{files['queries']}') "
                       f"USING SAMPLE reservoir({args.texts} ROWS) REPEATABLE (1)").fetchall()
    texts = [text_encoder.query_text(q, text_encoder.parse_options(o)) for q, o in rows]
    model = text_encoder.load_model()
    model.encode(texts[:8])  # warm up
    bare, ours_text = [], []
    for i in range(2):  # alternate, keep the best of each: the machine is noisy
        bare.append(timed(lambda: model.encode(texts, batch_size=64, normalize_embeddings=True))[0])
        reg = Registry(tmp / f"texts{i}.duckdb")
        with reg.store.tx() as tx:
            tx.duck.register("qin", pa.table({"text": texts, "h": [text_encoder.content_hash(t) for t in texts]}))
            tx.duck.execute("INSERT INTO queries (external_id, text, content_hash) SELECT h, text, h FROM qin")
            # encode= given: MiniLM embeds every text (the shipped data/ vectors, which hold these MMLU-Pro texts,
            # are only looked up on the default path and would leave nothing to embed)
            t, n = timed(lambda: import_run.embed_missing_texts(tx, encode=text_encoder.encode))
            assert n == len(texts)
            ours_text.append(t)
        reg.close()
    t_bare, t_ours_text = min(bare), min(ours_text)

    med = statistics.median
    print(f"data: {data}  ({stats.models} models, {stats.queries} queries, {stats.evaluations} evaluations)")
    print(f"{'measure':58} {'ours':>9} {'floor':>9} {'ratio':>7}  bar")
    print(f"{'evaluations import (s), median of ' + str(args.repeat):58} {med(ours):9.3f} {med(floor):9.3f} "
          f"{med(ours) / med(floor):7.2f}  <= 1.5")
    print(f"{'re-import of the same folder (s) vs first import (no texts)':58} {t_re:9.3f} {t_first:9.3f} "
          f"{t_re / t_first:7.3f}  <= 0.10")
    print(f"{'re-import, same rows, renamed file (s) vs first import':58} {t_rows:9.3f} {t_first:9.3f} "
          f"{t_rows / t_first:7.3f}  (row-level check)")
    print(f"{'text embedding (questions/s), ' + str(len(texts)) + ' texts':58} {len(texts) / t_ours_text:9.1f} "
          f"{len(texts) / t_bare:9.1f} {t_bare / t_ours_text:7.2f}  >= 0.9")


if __name__ == "__main__":
    main()
