"""New models, honestly (issue 15, bar 1): the run of `registry evaluate --held-out 6 --n 128 --seeds 3` on a copy
of a registry (the same library calls, seed by seed, keeping each method's P(correct)), with a table per seed, the
mean, the bar checked per seed, and a paired bootstrap over the test questions of LOCUS's held-out AUC margin.

Bar 1: with 6 models held out, 3 seeds, n = 128, LOCUS's held-out AUC is at least every baseline's in each seed.

Usage: .venv/bin/python bench/heldout.py --db registry.duckdb [--held-out 6 --n 128 --seeds 3 --steps S --epochs E
--threads 2 --json-out FILE] (the registry is copied, not changed; the encoder is trained per seed in memory with
heldout.TRAIN_SHORT unless --steps/--epochs say otherwise)
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from registry import Registry
from registry.embedding.dataset import dataset  # noqa: E402
from registry.evaluate import heldout  # noqa: E402
from registry.evaluate.heldout import COLUMNS, cell  # noqa: E402

BASELINES = ("mf", "irt", "knn", "best_single")


def bootstrap_margin(p_locus, p_base, truth, held, draws: int = 1000, seed: int = 0):
    """Paired bootstrap over the test questions: (2.5%, 97.5%) of LOCUS's held-out AUC minus the baseline's, and
    the share of resamples where LOCUS's is at least the baseline's."""
    rng = np.random.default_rng(seed)
    t, a, b = truth[held], p_locus[held], p_base[held]
    diffs = []
    for _ in range(draws):
        cols = rng.integers(0, t.shape[1], t.shape[1])
        tt = t[:, cols]
        obs = tt >= 0
        y = tt[obs] == 1
        diffs.append(roc_auc_score(y, a[:, cols][obs]) - roc_auc_score(y, b[:, cols][obs]))
    diffs = np.array(diffs)
    return float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5)), float((diffs >= 0).mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--held-out", type=int, default=6)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp())
    shutil.copy(args.db, tmp / "r.duckdb")
    t0 = time.time()
    with Registry(tmp / "r.duckdb") as reg, reg.store.tx() as tx:
        data = dataset(tx)
    shutil.rmtree(tmp)
    cfg = heldout.train_config(args.steps, args.epochs)
    truth = data.correct[:, data.splits["test"]]
    per_seed, extra = [], []
    for s in range(args.seeds):
        print(f"[{time.time() - t0:6.0f} s] seed {s}", flush=True)
        res, probs, held, _ = heldout.run_seed(data, args.held_out, args.n, seed=s, cfg=cfg)
        per_seed.append(res)
        auc = {m: res.methods[m]["held_out_auc"] for m in res.methods}
        best_b = max(BASELINES, key=lambda b: auc[b])
        lo, hi, share = bootstrap_margin(probs["locus"], probs[best_b], truth, held)
        extra.append({"holds": all(auc["locus"] >= auc[b] for b in BASELINES), "best_baseline": best_b,
                      "margin": auc["locus"] - auc[best_b], "ci95": [lo, hi], "share_at_least": share})
    r = heldout.report(data, args.held_out, args.n, cfg, per_seed)
    wall = time.time() - t0
    cfg = r.train_config
    print(f"\n{r.held_out} of {r.models} models held out per seed, each known from {r.n} train evaluations; "
          f"{r.queries} test queries; encoder per seed: teacher_epochs={cfg['teacher_epochs']}, "
          f"max_steps={cfg['max_steps']}, eval_every={cfg['eval_every']}, refit_epochs={cfg['refit_epochs']}; "
          f"{args.threads} threads; {wall:.0f} s in all")
    head = "| method | " + " | ".join(h for _, h in COLUMNS)
    rule = "|---" * (len(COLUMNS) + 1)
    for s, e in zip(r.per_seed, extra):
        print(f"\nseed {s.seed}: held out {', '.join(s.held_out)} (LOCUS best step {s.locus_train['best_step']}, "
              f"val hit@1 {s.locus_train['val_hit@1']}; {s.wall_s:.0f} s)\n{head} | setting |\n{rule}|---|")
        for m, v in s.methods.items():
            setting = ", ".join(f"{k}={v[k]}" for k in ("dim", "k", "model") if k in v)
            print(f"| {m} | " + " | ".join(cell(k, v[k]) for k, _ in COLUMNS) + f" | {setting} |")
        print(f"bar 1, seed {s.seed}: LOCUS held-out AUC {s.methods['locus']['held_out_auc']:.4f} vs best baseline "
              f"{e['best_baseline']} {s.methods[e['best_baseline']]['held_out_auc']:.4f}: "
              f"{'holds' if e['holds'] else 'FAILS'}; margin {e['margin']:+.4f}, paired bootstrap over questions "
              f"95% [{e['ci95'][0]:+.4f}, {e['ci95'][1]:+.4f}], LOCUS >= it in {e['share_at_least']:.0%} of resamples")
    print(f"\nmean over {len(r.seeds)} seeds (± std)\n{head} |\n{rule}|")
    for m, v in r.mean.items():
        print(f"| {m} | " + " | ".join(f"{cell(k, v[k])} ± {r.std[m][k]:.4f}" for k, _ in COLUMNS) + " |")
    holds = [e["holds"] for e in extra]
    print(f"\nbar 1 (LOCUS held-out AUC >= every baseline's, each seed): "
          f"{'holds' if all(holds) else 'FAILS'} ({sum(holds)} of {len(holds)} seeds)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(dict(asdict(r), wall_s=wall, bar1=extra), indent=2, default=str))


if __name__ == "__main__":
    main()
