"""Planned probes against random ones (issue 16, item 1), side by side on the active encoder.

    .venv/bin/python bench/planned_probes.py [--db registry.duckdb] [--sizes 32 64 128 256 512] [--draws 5]
        [--pool nontest|train] [--split test|val] [--cache out/planned_probes]

The library call of `registry evaluate --sample-efficiency --planned` (probes.compare), with its planned rows cached
per draw (--cache) and a choice of pool and split, for choosing settings on val (`--pool train --split val`: the
val answers then never reach any embedding). Every model is known from n of its pool evaluations and routed on the
split's questions with the active predictor beside the others, each known the same way:
  - random: n random evaluations, the draws of `registry evaluate --sample-efficiency` (evaluation.subset_rows), so
    with the default pool its encoder column reproduces that report;
  - planned: the first SEED_SIZE of the same draw, then batches of BATCH chosen by probes.choose, each model's
    answers revealed as it is asked; its prior and routing relevance come from the *other* models' embeddings from
    all their evaluations (every model in turn is the new one).
Each set is read by the set encoder (what `register` stores) and by likelihood (probes.read).
"""
from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")    # before numpy: an idle BLAS thread spins on a shared core

import argparse  # noqa: E402
import pickle  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from registry import Registry
from registry.embedding import encoders
from registry.embedding.dataset import dataset  # noqa: E402
from registry.evaluate.harness import embed_subsets, subset_rows  # noqa: E402
from registry.locus import probe_design  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--pool", choices=["nontest", "train"], default="nontest")
    ap.add_argument("--split", choices=["test", "val"], default="test")
    ap.add_argument("--cache", default="out/planned_probes")
    ap.add_argument("--floor", type=float, default=probe_design.FLOOR, help="probes.FLOOR (settings search)")
    ap.add_argument("--batch", type=int, default=probe_design.BATCH, help="probes.BATCH (settings search)")
    ap.add_argument("--seed-size", type=int, default=probe_design.SEED_SIZE, help="probes.SEED_SIZE (settings search)")
    ap.add_argument("--prior-scale", type=float, default=probe_design.PRIOR_SCALE, help="probes.PRIOR_SCALE (search)")
    ap.add_argument("--oracle", action="store_true",
                    help="plan as if each model's embedding from all its evaluations were known (probes.plan_rows' "
                         "truth): what the planner could do if its reading of the answers so far were exact")
    args = ap.parse_args()
    probe_design.FLOOR, probe_design.BATCH, probe_design.SEED_SIZE = args.floor, args.batch, args.seed_size
    probe_design.PRIOR_SCALE = args.prior_scale
    torch.set_num_threads(1)
    t0 = time.time()
    with Registry(args.db) as reg, reg.store.tx() as tx:
        data = dataset(tx)
        model, meta = encoders.load(tx, encoders.ensure_default(tx))
    tr, va = data.splits["train"], data.splits["val"]
    pool_rows = np.concatenate([tr, va]) if args.pool == "nontest" else tr
    c = data.correct
    pred = probe_design.Predictor(model)
    nontest = np.concatenate([tr, va])
    z_all = embed_subsets(model, data, [nontest[c[m, nontest] >= 0] for m in range(len(c))])
    settings = (f"{args.pool}-seed{probe_design.SEED_SIZE}-batch{probe_design.BATCH}-floor{probe_design.FLOOR}"
                + (f"-prior{probe_design.PRIOR_SCALE}" if probe_design.PRIOR_SCALE != 1.0 else "") + f"-to{max(args.sizes)}"
                + ("-oracle" if args.oracle else ""))
    os.makedirs(args.cache, exist_ok=True)
    plans = {}
    for s in range(args.draws):
        path = Path(args.cache) / f"planned-{settings}-draw{s}.pkl"
        if path.exists():
            plans[s] = pickle.loads(path.read_bytes())
    cached = set(plans)
    out = probe_design.compare(pred, pred.project(data.qvecs), c, pool_rows=pool_rows, z_all=z_all.astype(np.float64),
                               eval_rows=data.splits[args.split], sizes=args.sizes, seeds=args.draws,
                               encode=lambda rows: embed_subsets(model, data, rows),
                               draw=lambda n, s: subset_rows(c, pool_rows, n, s), plans=plans, oracle=args.oracle)
    for s in set(plans) - cached:
        (Path(args.cache) / f"planned-{settings}-draw{s}.pkl").write_bytes(pickle.dumps(plans[s]))
    print(f"encoder {meta.get('name', '?')}; {len(c)} models; {args.split} {len(data.splits[args.split])} questions; "
          f"pool {args.pool}; {settings}; {args.draws} draws ({len(cached)} planned draws from the cache)")
    cols = [(d, r) for d in ("random", "planned") for r in ("encoder", "likelihood")]
    print(f"\n{args.split} hit@1 / AUC, mean +- std over the draws\n")
    print("| n | " + " | ".join(f"{d}, {r} reading" for d, r in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for n in args.sizes:
        cells = [out[str(n)][d][r] for d, r in cols]
        print(f"| {n} | " + " | ".join(f"{v['hit@1']:.4f} +- {v['hit@1_std']:.4f} / {v['auc']:.4f} +- "
                                       f"{v['auc_std']:.4f}" for v in cells) + " |")
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
