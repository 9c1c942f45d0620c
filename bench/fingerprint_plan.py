"""`registry fingerprint --plan` against random queries (issue 16, item 1): does asking the planned queries name an
unknown endpoint more often, at the same 1% false "same" bar?

For each n and each of the 31 models m, as bench/fingerprint_answers.py does it (its numpy mirror of
`fingerprint.by_answers`), with the registry's own answers:
- naming: a rerun of m (a random 5-15% of its answers flipped) answers n queries; named when the model it disagrees
  with least is m. Planned: the n queries of `probe_plans.separating` over every model's answers (what
  `fingerprint --plan -n N` lists; the seed varies the tie-breaks per draw); random: n random queries m answered.
- false "same": m's own answers on n queries against a registry without m; planned from the other 30 models.
The flips are uniform, as in the random-query bench: a real rerun may flip contested questions more often.

    .venv/bin/python bench/fingerprint_plan.py [--db registry.duckdb] [--draws 20] [--ns 32 48 64 128]

(Below 32 shared queries the answers test does not decide: `fingerprint` falls back to the embedding.)
"""
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fingerprint_answers import matrix, verdicts  # noqa: E402

from registry.answers import (
    disagreement,
    fingerprint,  # noqa: E402
)
from registry.answers.probe_plans import separating  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--draws", type=int, default=20, help="draws per model and n")
    ap.add_argument("--ns", type=int, nargs="+", default=[32, 48, 64, 128])
    args = ap.parse_args()
    t0 = time.time()
    names, _, qids, correct, _, _ = matrix(args.db)
    M = len(names)
    rate, _ = disagreement.disagreement_matrix(correct, fingerprint.MIN_PAIR_SHARED)
    np.fill_diagonal(rate, np.nan)
    seen = correct >= 0
    rng = np.random.default_rng(0)
    plans: dict = {}

    def plan(n, draw, without):
        key = (n, draw, without)
        if key not in plans:
            rows = [k for k in range(M) if k != without]
            cols = np.flatnonzero(seen[rows].sum(0) >= 2)
            picks, _ = separating(correct[rows][:, cols], seen[rows][:, cols], n, seed=draw)
            plans[key] = cols[picks]
        return plans[key]

    print(f"{M} models, {len(qids)} queries; {args.draws} draws per model and n")
    print("\n| n | design | reruns named | reruns judged 'same' | distinct models judged 'same' |")
    print("|---|---|---|---|---|")
    for n in args.ns:
        for design in ("random", "planned"):
            named = same_rerun = false_same = total = 0
            for m in range(M):
                have = np.flatnonzero(seen[m])
                for d in range(args.draws):
                    if design == "random":
                        cols = cols2 = rng.choice(have, n, replace=False)
                    else:
                        cols, cols2 = plan(n, d % 2, None), plan(n, d % 2, m)   # two tie-break seeds
                    y = correct[m, cols].astype(np.int64)
                    flip = rng.random(n) < rng.uniform(0.05, 0.15)
                    ok = y >= 0                             # planned queries m did not answer: not asked
                    best, same = verdicts(correct, rate, cols[ok], np.where(flip, 1 - y, y)[ok], None)
                    named += best == m
                    same_rerun += same and best == m
                    y2 = correct[m, cols2].astype(np.int64)
                    _, same2 = verdicts(correct, rate, cols2[y2 >= 0], y2[y2 >= 0], m)
                    false_same += same2
                    total += 1
            print(f"| {n} | {design} | {named / total:.4f} | {same_rerun / total:.4f} | {false_same / total:.4f} "
                  f"({false_same}/{total}) |", flush=True)
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
