"""How well can any router do when each model is known from only n of its evaluations? (issue 3, bar 2)

    .venv/bin/python bench/sample_efficiency_bound.py [--db registry.duckdb] [--draws 5]

For n random non-test evaluations per model (the same draws `registry evaluate --sample-efficiency` makes), two
routers that need no training and use the category labels LOCUS never sees, on the 1,203 test questions:
  - best single by the n-sample accuracy (route everything to the model that looks strongest);
  - per-category best, each model's accuracy per category estimated from its n samples, shrunk towards its n-sample
    overall accuracy with a prior of `--prior` pseudo-evaluations (chosen on val over 0..200).
With all evaluations the per-category router is the strongest simple router on this data; how much it loses at n
is what the evaluations themselves carry about which model to pick.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from registry.evaluate.harness import subset_rows  # noqa: E402
from registry.locus import baselines as B  # noqa: E402


def load(db: str):
    from registry import Registry
    from registry.embedding.dataset import dataset

    with Registry(db) as reg, reg.store.tx() as tx:
        d = dataset(tx)
    return d.correct, d.categories, d.models, d.splits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--draws", type=int, default=5)
    args = ap.parse_args()
    correct, cats, models, sp = load(args.db)
    tr, va, te = sp["train"], sp["val"], sp["test"]
    nontest = np.sort(np.concatenate([tr, va]))
    ct = correct[:, te]
    obs = correct >= 0
    all_known = np.zeros_like(obs)
    all_known[:, nontest] = obs[:, nontest]
    priors = (0, 5, 20, 50, 200)
    print(f"{len(models)} models; test {len(te)} questions; best single (train) "
          f"{B.hit_at_k(B.best_single_scores(correct, tr, te), ct):.4f}")
    print(f"{'evaluations per model':>22s} {'best single by n-sample acc':>28s} {'per-category best':>20s} {'prior':>6s}")
    for n in (32, 64, 128, 256, 512, None):
        single, percat, chosen = [], [], []
        for seed in range(args.draws if n else 1):
            known = all_known
            if n:
                known = np.zeros_like(obs)
                for m, rows in enumerate(subset_rows(correct, nontest, n, seed)):
                    known[m, rows] = True
            acc = ((correct == 1) & known).sum(1) / np.maximum(known.sum(1), 1)
            single.append(B.hit_at_k(np.repeat(acc[:, None], len(te), 1), ct))
            # the prior is chosen on val with the val questions left out of the known sets
            kv = known.copy()
            kv[:, va] = False
            prior = max(priors, key=lambda p: B.hit_at_k(B.per_category_scores(correct, cats, kv, va, p), correct[:, va]))
            percat.append(B.hit_at_k(B.per_category_scores(correct, cats, known, te, prior), ct))
            chosen.append(prior)
        label = str(n) if n else "all"
        print(f"{label:>22s} {np.mean(single):>20.4f} +- {np.std(single):.4f} {np.mean(percat):>12.4f} +- "
              f"{np.std(percat):.4f} {int(np.median(chosen)):>6d}")


if __name__ == "__main__":
    main()
