"""A version's stability from a sample of its evaluations, against the halves of all of them.

    .venv/bin/python bench/stability_sample.py --db registry.duckdb [--samples 512 1024 2048 4096] [--draws 3]

For every model of the registry: the distance between the embeddings of two random halves of all its current
non-test evaluations (what stability was before embed.STABILITY_SAMPLE), and the same from two halves of a random
sample of m of them, scaled by sqrt(m / n) (the 1/n law of an embedding's variance). Each figure is one random draw,
so the table also gives a second full-halves draw against the first: the spread any single estimate has. Prints the
median and the 10th/90th percentiles of each ratio to the first full draw, and the encoder rows each reads.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--samples", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--draws", type=int, default=3, help="random draws per model and sample size")
    args = ap.parse_args()
    from registry import Registry
    from registry.embedding import embed, encoders

    with Registry(args.db) as reg, reg.store.tx() as tx:
        model, meta = encoders.load(tx, encoders.require_active(tx))
        mids = [r[0] for r in tx.sql("SELECT id FROM models ORDER BY id")]
        sets = [s for s in embed.evaluation_sets(tx, mids, 2 ** 62, meta.get("embed_max_set")).values()
                if s.n >= 2 * max(args.samples)]

        def distance(s, rng, m):
            perm = rng.permutation(s.n)[:m]
            z = embed.compute(tx, model, [embed.EvalSet(s.model_id, s.query_ids[h], s.y[h], s.digest)
                                          for h in (perm[: m // 2], perm[m // 2:])])
            return float(np.linalg.norm(z[0] - z[1])) * (m / s.n) ** 0.5

        ratios: dict[str, list[float]] = {}
        rows_read: dict[str, int] = {}
        for i, s in enumerate(sets):
            first = distance(s, np.random.default_rng(i), s.n)
            for d in range(args.draws):
                rng = np.random.default_rng(10_000 * (d + 1) + i)
                ratios.setdefault("all (another draw)", []).append(distance(s, rng, s.n) / first)
                rows_read["all (another draw)"] = int(np.mean([x.n for x in sets]))
                for m in args.samples:
                    ratios.setdefault(f"{m:,}", []).append(distance(s, rng, m) / first)
                    rows_read[f"{m:,}"] = m
    print(f"{len(sets)} models, {int(np.mean([s.n for s in sets])):,} evaluations each on average, "
          f"{args.draws} draws each\n")
    print("| halves from | rows read | ratio to the first full draw: median | p10 | p90 |")
    print("|---|---|---|---|---|")
    for key, r in ratios.items():
        p10, p50, p90 = np.percentile(r, [10, 50, 90])
        print(f"| {key} | {rows_read[key]:,} | {p50:.3f} | {p10:.3f} | {p90:.3f} |")


if __name__ == "__main__":
    main()
