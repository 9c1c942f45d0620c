"""Planned probes against random ones (issue 16, item 1), side by side on the active encoder.

    .venv/bin/python bench/planned_probes.py [--db registry.duckdb] [--sizes 32 64 128 256 512] [--draws 5]
        [--pool nontest|train] [--split test|val] [--cache out/planned_probes]

Every model is known from n of its non-test evaluations (the pool; `--pool train` for choosing settings on val) and
routed on the split's questions with the active predictor, beside the others, each known the same way:
  - random: n random evaluations, the draws `registry evaluate --sample-efficiency` makes (evaluation.subset_rows),
    so its encoder column reproduces that report;
  - planned: the first SEED_SIZE of the same draw, then batches of BATCH chosen by probes.choose, each model's
    answers revealed as it is asked; its prior and the routing relevance come from the *other* models' embeddings
    from all their evaluations (every model in turn is the new one).
Each set is read two ways: by the set encoder (what `register` stores today) and by likelihood (probes.read, the
prior fitted to the other models' embeddings). The planned rows are cached per draw (--cache).
"""
from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from registry import Registry, encoders, probes  # noqa: E402
from registry import baselines as B  # noqa: E402
from registry.evaluation import dataset, embed_subsets, subset_rows  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--pool", choices=["nontest", "train"], default="nontest")
    ap.add_argument("--split", choices=["test", "val"], default="test")
    ap.add_argument("--batch", type=int, default=probes.BATCH)
    ap.add_argument("--seed-size", type=int, default=probes.SEED_SIZE)
    ap.add_argument("--floor", type=float, default=probes.FLOOR)
    ap.add_argument("--cache", default="out/planned_probes")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    with Registry(args.db) as reg, reg.store.tx() as tx:
        data = dataset(tx)
        model, meta = encoders.load(tx, encoders.ensure_default(tx))
    model.eval()
    tr, va, ev = data.splits["train"], data.splits["val"], data.splits[args.split]
    pool_rows = np.concatenate([tr, va]) if args.pool == "nontest" else tr
    M, c = len(data.models), data.correct
    answers = (c == 1).astype(np.float64)
    pred = probes.Predictor(model)
    q = pred.project(data.qvecs)
    nontest = np.concatenate([tr, va])
    z_all = embed_subsets(model, data, [nontest[c[m, nontest] >= 0] for m in range(M)]).astype(np.float64)
    priors = [probes.gaussian_prior(np.delete(z_all, m, 0)) for m in range(M)]
    ref = np.sort(np.random.default_rng(0).choice(pool_rows, min(probes.REFERENCES, len(pool_rows)), replace=False))
    L_ref = np.stack([pred.logits(z, q.take(ref)) for z in z_all])              # [M, refs]
    others = [np.delete(L_ref, m, 0).max(0) for m in range(M)]
    pool = [pool_rows[c[m, pool_rows] >= 0] for m in range(M)]
    truth = c[:, ev]
    qe = q.take(ev)

    def scores(Z):
        p = np.stack([1 / (1 + np.exp(-pred.logits(z, qe))) for z in Z])
        return B.hit_at_k(p, truth, 1), B.predictor_metrics(p, truth)["auc"]

    def read_all(rows):
        return np.stack([probes.read(pred, q.take(r), answers[m, r], priors[m])[0] for m, r in enumerate(rows)])

    full_enc, full_lik = scores(z_all), scores(read_all([nontest[c[m, nontest] >= 0] for m in range(M)]))
    print(f"encoder {meta.get('name', '?')}; {M} models; {args.split} {len(ev)} questions; pool {args.pool}; "
          f"seed {args.seed_size}, batch {args.batch}, floor {args.floor}")
    print(f"all evaluations: encoder hit@1 {full_enc[0]:.4f} AUC {full_enc[1]:.4f}; likelihood hit@1 "
          f"{full_lik[0]:.4f} AUC {full_lik[1]:.4f}", flush=True)
    os.makedirs(args.cache, exist_ok=True)
    res = {}                                                   # (design, reading, n) -> [(hit, auc)] over draws
    for draw in range(args.draws):
        tag = f"{args.pool}-s{args.seed_size}-b{args.batch}-f{args.floor}-{max(args.sizes)}-{draw}"
        path = Path(args.cache) / f"planned-{tag}.pkl"
        if path.exists():
            planned = pickle.loads(path.read_bytes())
        else:
            t1 = time.time()
            seed_rows = subset_rows(c, pool_rows, args.seed_size, draw)
            planned = probes.plan_rows(pred, q, answers, pool, seed_rows, args.sizes, priors, others, ref,
                                       seed=draw, batch=args.batch)
            path.write_bytes(pickle.dumps(planned))
            print(f"(draw {draw} planned in {time.time() - t1:.0f} s)", flush=True)
        for n in args.sizes:
            for design, rows in (("random", subset_rows(c, pool_rows, n, draw)), ("planned", planned[n])):
                res.setdefault((design, "encoder", n), []).append(
                    scores(embed_subsets(model, data, rows).astype(np.float64)))
                res.setdefault((design, "likelihood", n), []).append(scores(read_all(rows)))
    cols = [(d, r) for d in ("random", "planned") for r in ("encoder", "likelihood")]
    print(f"\n{args.split} hit@1 / AUC, mean +- std over {args.draws} draws")
    print("| n | " + " | ".join(f"{d}, {r} reading" for d, r in cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for n in args.sizes:
        cells = []
        for key in cols:
            a = np.array(res[key + (n,)])
            cells.append(f"{a[:, 0].mean():.4f} +- {a[:, 0].std():.4f} / {a[:, 1].mean():.4f} +- {a[:, 1].std():.4f}")
        print(f"| {n} | " + " | ".join(cells) + " |")
    print(f"| all | {full_enc[0]:.4f} / {full_enc[1]:.4f} | {full_lik[0]:.4f} / {full_lik[1]:.4f} | | |")
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
