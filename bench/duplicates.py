"""A duplicate must not blind the fingerprint, and `similar` must rank an exact copy first.

On a copy of the default registry (never the original): register `my-new-model` from 200, then 600, of
Meta-Llama-3_1-70B-Instruct's own non-test results; then fingerprint 300 of Mistral-7B-Instruct-v0.2's non-test
results, register 700 of Qwen1.5-72B-Chat's as `api-model` (its warning), and ask `similar my-new-model`. Each row:
the step and what the registry said (the calibration's closest distinct pair after each registration).

    .venv/bin/python bench/duplicates.py [--db /work/main/registry.duckdb] [--data /work/shared/data/mmlu-pro]
"""
from __future__ import annotations

import argparse
import csv
import gzip
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from registry import Registry  # noqa: E402
from registry.core.store import Store  # noqa: E402

COPY, SOURCE, OTHER, ALIASED = "my-new-model", "Meta-Llama-3_1-70B-Instruct", "Mistral-7B-Instruct-v0.2", \
    "Qwen1.5-72B-Chat"


def non_test(data: Path) -> dict[str, list[tuple[str, str]]]:
    """Each model's (question id, correct) rows outside the test split, in file order."""
    with open(data / "splits.csv", newline="") as f:
        test = {r["question_id"] for r in csv.DictReader(f) if r["split"] == "test"}
    out: dict[str, list[tuple[str, str]]] = {}
    with gzip.open(data / "evaluations.csv.gz", "rt", newline="") as f:
        for r in csv.DictReader(f):
            if r["question_id"] not in test:
                out.setdefault(r["model"], []).append((r["question_id"], r["correct"]))
    return out


def sample(evals: dict, model: str, n: int, seed: int = 0) -> list[tuple[str, str]]:
    rows = evals[model]
    return [rows[i] for i in np.random.default_rng(seed).permutation(len(rows))[:n]]


def write(rows: list[tuple[str, str]], out: Path) -> str:
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["question_id", "correct"])
        w.writerows(rows)
    return str(out)


def neighbours(near, label: str) -> list[tuple[str, str]]:
    return [(label if i == 0 else "", f"{i + 1}. {x.model}{' (alias)' if x.alias else ''}  combined {x.combined}  "
             f"distance {x.distance:.4f}  disagreement {x.disagreement}  shared {x.shared_queries}  "
             f"placed by {x.placed_by}") for i, x in enumerate(near)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="/work/main/registry.duckdb")
    ap.add_argument("--data", default="/work/shared/data/mmlu-pro")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    db = tmp / "registry.duckdb"
    shutil.copy(args.db, db)
    store = Store(str(db), migrate=False)      # the copy may predate this code's schema
    store.upgrade()
    store.close()
    evals = non_test(Path(args.data))
    rows = []
    with Registry(str(db)) as reg:
        def closest() -> str:
            a = reg.calibration().answers
            return f"closest distinct pair {' / '.join(a.closest_pair)} at {a.p_min:.1%}"
        rows.append(("clean registry", closest()))
        # the first 200 of a 600-row sample, then all 600: the second registration adds 400 results
        full = sample(evals, SOURCE, 600)
        for n in (200, 600):
            r = reg.register(COPY, write(full[:n], tmp / f"copy{n}.csv"))
            rows.append((f"register {COPY} ({n} of {SOURCE})", f"warning: {r.warning}"))
            rows.append(("", closest()))
            rows.append(("", f"show: alias of {reg.show(COPY).alias_of}"))
            rows += neighbours(reg.similar(COPY, k=5 if n == 600 else 4), f"similar {COPY}")
        f = reg.fingerprint(write(sample(evals, OTHER, 300), tmp / "mistral.csv"))
        rows.append((f"fingerprint 300 of {OTHER}", f.summary))
        r = reg.register("api-model", write(sample(evals, ALIASED, 700), tmp / "qwen.csv"))
        rows.append((f"register api-model (700 of {ALIASED})", f"warning: {r.warning}"))
    width = max(len(a) for a, _ in rows)
    for a, b in rows:
        print(f"{a.ljust(width)}  {b}")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
