"""Every Eval Ever out and in, side by side with the plain folder import, in one run (each step a `registry`
command in its own process, as a user runs it):

  1. `registry import ../shared/data/mmlu-pro` into an empty registry (the yardstick);
  2. `registry export --to eee DIR` of a copy of the default registry (registry.duckdb: 31 models, 371,244
     evaluations; the copy brought to the current schema first, untimed);
  3. `registry import DIR` (no --from: the reader recognises EEE) into an empty registry;

then the copy and the round-tripped registry compared row for row (models with their metadata, queries with their
text, source, category, gold answer and split, and every current evaluation), and, with --full-validate, every sample
line of the export checked against EEE's schema with jsonschema one by one (slow: minutes).

    .venv/bin/python bench/eee_roundtrip.py [--db registry.duckdb] [--repeat 1] [--full-validate]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = str(ROOT / ".venv" / "bin" / "registry")
MMLU = ROOT.parent / "shared" / "data" / "mmlu-pro"

TABLES = {
    "models": "SELECT name, family, provider, params_b, cost, open_weights, tags::VARCHAR FROM models",
    "queries": "SELECT external_id, source, category, text, content_hash FROM queries",
    "gold answers": """SELECT q.external_id, a.answer, a.grading FROM query_answers a
                       JOIN queries q ON q.id = a.query_id""",
    "splits": "SELECT q.external_id, s.split FROM query_splits s JOIN queries q ON q.id = s.query_id",
    "evaluations": """SELECT m.name, q.external_id, arg_max(e.correct, e.batch_id) FROM evaluations e
                      JOIN models m ON m.id = e.model_id JOIN queries q ON q.id = e.query_id GROUP BY ALL""",
}


def timed(*args: str) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([REGISTRY, *args], capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"registry {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return seconds, done.stdout


def rows(path: Path) -> dict[str, set]:
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        return {name: set(con.execute(sql).fetchall()) for name, sql in TABLES.items()}
    finally:
        con.close()


def full_validate(directory: Path) -> tuple[int, int, float]:
    """Every sample line and aggregate checked with jsonschema, one by one: (lines, errors, seconds)."""
    from registry.data.formats import eee_schema

    started, lines, errors = time.perf_counter(), 0, 0
    for agg in sorted(directory.rglob("*.json")):
        errors += eee_schema.first_error("aggregate", json.loads(agg.read_text())) is not None
    for samples in sorted(directory.rglob("*_samples.jsonl")):
        with open(samples, "rb") as f:
            for line in f:
                lines += 1
                errors += eee_schema.first_error("sample", json.loads(line)) is not None
    return lines, errors, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=str(ROOT / "registry.duckdb"), help="the registry to export (only read: copied)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of the three steps, interleaved (medians shown)")
    ap.add_argument("--full-validate", action="store_true", help="also check every line with jsonschema")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="eee-bench-"))
    try:
        source = work / "source.duckdb"
        shutil.copy(args.db, source)
        if Path(args.db + ".index").is_dir():
            shutil.copytree(args.db + ".index", str(source) + ".index")
        timed("--db", str(source), "db", "upgrade")
        times: dict[str, list[float]] = {"import mmlu-pro (folder)": [], "export --to eee": [], "import eee": []}
        for i in range(args.repeat):
            for p in work.glob(f"run{i}-*"):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
            times["import mmlu-pro (folder)"].append(timed("--db", str(work / f"run{i}-mmlu.duckdb"), "import",
                                                           str(MMLU), "--json")[0])
            out = work / f"run{i}-eee"
            seconds, printed = timed("--db", str(source), "export", "--to", "eee", str(out), "--json")
            times["export --to eee"].append(seconds)
            exported = json.loads(printed)
            back = work / f"run{i}-back.duckdb"
            times["import eee"].append(timed("--db", str(back), "import", str(out), "--json")[0])
        base = statistics.median(times["import mmlu-pro (folder)"])
        print(f"\n{'step':<28}{'seconds (median of ' + str(args.repeat) + ')':>26}{'x folder import':>18}")
        for step, ts in times.items():
            print(f"{step:<28}{statistics.median(ts):>26.1f}{statistics.median(ts) / base:>18.2f}")
        v = exported["validated"]
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        print(f"\nexport: {len(exported['models'])} models, {exported['evaluations']:,} evaluations, "
              f"{exported['queries']:,} queries, {size / 1e6:.0f} MB; schema check in the export: {v['aggregates']} "
              f"aggregates, {v['sample_lines']:,} lines in {v['shapes_checked']} shapes, {v['errors']} errors "
              f"(write {exported['seconds']['write']:.1f} s, check {exported['seconds']['validate']:.1f} s)")
        a, b = rows(source), rows(back)
        print(f"\n{'round trip':<16}{'source':>12}{'imported':>12}{'differences':>14}")
        for name in TABLES:
            print(f"{name:<16}{len(a[name]):>12,}{len(b[name]):>12,}{len(a[name] ^ b[name]):>14,}")
        if args.full_validate:
            lines, errors, seconds = full_validate(out)
            print(f"\nfull jsonschema check, line by line: {lines:,} sample lines and {len(exported['models'])} "
                  f"aggregates, {errors} errors ({seconds:.0f} s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
