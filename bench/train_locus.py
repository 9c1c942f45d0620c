"""Train LOCUS on MMLU-Pro, save the checkpoint, and compare it with the baselines on the test split.

    .venv/bin/python bench/train_locus.py --seed 0 --out /work/cache/locus.safetensors

Models are embedded for routing from all of their train-split evaluations. Every method sees the same queries.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from registry import baselines as B  # noqa: E402
from registry.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from registry.training import TrainConfig, embed_models, predict_proba, train  # noqa: E402

DATA = Path("/work/shared/data/mmlu-pro")


def load_data(data=DATA, qvec="/work/cache/qvec.npy", qids="/work/cache/qvec_ids.csv"):
    """-> qvecs [Nq,Dq], correct [M,Nq] int8 (-1 missing), models [M], splits {name: index array}."""
    qvecs = np.load(qvec).astype(np.float32)
    ids = duckdb.sql(f"select question_id from read_csv('{qids}') ").fetchnumpy()["question_id"]
    pos = {int(q): i for i, q in enumerate(ids)}
    models = list(duckdb.sql(f"select model from read_csv('{data}/models.csv') order by model").fetchnumpy()["model"])
    mpos = {m: i for i, m in enumerate(models)}
    ev = duckdb.sql(f"select model, question_id, correct from read_csv('{data}/evaluations.csv.gz')").fetchnumpy()
    correct = np.full((len(models), len(ids)), -1, dtype=np.int8)
    correct[[mpos[m] for m in ev["model"]], [pos[int(q)] for q in ev["question_id"]]] = ev["correct"].astype(np.int8)
    sp = duckdb.sql(f"select question_id, split from read_csv('{data}/splits.csv')").fetchnumpy()
    splits = {s: np.sort(np.array([pos[int(q)] for q, t in zip(sp["question_id"], sp["split"]) if t == s]))
              for s in ("train", "val", "test")}
    return qvecs, correct, models, splits


def digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="/work/cache/locus.safetensors")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--mf-seeds", type=int, default=1)
    ap.add_argument("--skip-baselines", action="store_true")
    ap.add_argument("--set", nargs="*", default=[], help="TrainConfig overrides, e.g. noise_start=0.05")
    ap.add_argument("--embed-max-set", type=int, default=None, help="cap per model for routing embeddings")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    qvecs, correct, models, sp = load_data()
    tr, va, te = sp["train"], sp["val"], sp["test"]
    ct = correct[:, te]
    print(f"{len(models)} models, {qvecs.shape[0]} queries: train {len(tr)} / val {len(va)} / test {len(te)}")

    cfg = TrainConfig(seed=args.seed)
    if args.max_steps:
        cfg.max_steps = args.max_steps
    for kv in args.set:
        k, v = kv.split("=", 1)
        old = getattr(cfg, k)
        setattr(cfg, k, None if v == "None" else type(old)(v) if old is not None else int(v))

    def show(i):
        print(f"  step {i['step']:5d}  loss {i['loss']:.4f}  val hit@1 {i['val_hit@1']:.4f}  auc {i['val_auc']:.4f}"
              f"  bce {i['val_bce']:.4f}  best {i['best_val_hit@1']:.4f}@{i['best_step']}  {i['elapsed_s']:.0f}s",
              flush=True)

    t0 = time.time()
    model, ecfg, metrics = train(qvecs, correct, tr, va, cfg, progress=show)
    wall = time.time() - t0
    print(f"trained in {wall:.0f}s, best step {metrics['best_step']} of {metrics['steps']}, {metrics['n_params']} params")

    # test figures come from the checkpoint as saved, so they describe what is shipped
    meta = {"text_encoder": "all-MiniLM-L6-v2@256", "data": "mmlu-pro", "data_digest": digest(qvecs, correct),
            "seed": args.seed, "train_wall_s": round(wall, 1), "best_step": metrics["best_step"],
            "val_hit@1": metrics["val_hit@1"], "train_config": metrics["train_config"]}
    blob = save_checkpoint(model, ecfg, meta)
    model, ecfg, meta = load_checkpoint(blob)
    assert save_checkpoint(model, ecfg, meta) == blob

    z = embed_models(model, qvecs, correct, tr, max_set=args.embed_max_set)
    p = predict_proba(model, z, qvecs[te])
    rows = {"LOCUS": B.routing_report(p, ct, p)}
    meta["test"] = {k: rows["LOCUS"][k] for k in ("hit@1", "hit@3", "hit@5", "auc", "brier")}
    blob = save_checkpoint(model, ecfg, meta)
    Path(args.out).write_bytes(blob)
    print(f"checkpoint {args.out}: {len(blob)} bytes")

    if not args.skip_baselines:
        rows["oracle"] = {f"hit@{k}": B.oracle_hit(ct) for k in (1, 3, 5)}
        s = B.best_single_scores(correct, tr, te)
        rows["best single"] = B.routing_report(s, ct, s)
        rows["random"] = {f"hit@{k}": B.random_hit_at_k(ct, k) for k in (1, 3, 5)}
        k, _ = B.knn_router(qvecs, correct, tr, va)
        s = B.knn_scores(qvecs, correct, tr, te, k)
        rows[f"knn (k={k})"] = B.routing_report(s, ct, s)
        for ms in range(args.mf_seeds):
            mf, info = B.mf_router(qvecs, correct, tr, va, seed=ms)
            s = B.mf_probs(mf, qvecs, te)
            rows[f"mf (d={info['dim']}, seed {ms})"] = B.routing_report(s, ct, s)

    print(f"\nTEST ({len(te)} questions; std err of hit@1 ~0.013)")
    print(f"{'method':24s} {'hit@1':>7s} {'hit@3':>7s} {'hit@5':>7s} {'AUC':>7s} {'Brier':>7s} {'acc':>7s} {'#routed':>7s}")
    fmt = lambda r, k, f="{:7.4f}": f.format(r[k]) if k in r else " " * 7
    for name, r in rows.items():
        print(f"{name:24s} {fmt(r, 'hit@1')} {fmt(r, 'hit@3')} {fmt(r, 'hit@5')} {fmt(r, 'auc')} {fmt(r, 'brier')}"
              f" {fmt(r, 'acc')} {fmt(r, 'n_chosen', '{:7d}')}")

    print("\nSample efficiency: LOCUS test hit@1, every model embedded from n random train evaluations (5 draws)")
    eff = {}
    for n in (32, 64, 128, 256, 512):
        hits = [B.hit_at_k(predict_proba(model, embed_models(model, qvecs, correct, tr, max_set=n, seed=s),
                                         qvecs[te]), ct) for s in range(5)]
        eff[n] = (float(np.mean(hits)), float(np.std(hits)))
        print(f"  n={n:4d}: {eff[n][0]:.4f} +- {eff[n][1]:.4f}  (min {min(hits):.4f}, max {max(hits):.4f})")
    print(f"  all  : {rows['LOCUS']['hit@1']:.4f}  (~{int(np.mean([(correct[m, tr] >= 0).sum() for m in range(len(models))]))}"
          f" per model)")
    print(f"\ntraining wall time {wall:.0f}s; threads {args.threads}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "efficiency": eff, "wall_s": wall,
                                               "metrics": {k: v for k, v in metrics.items() if k != "history"}},
                                              indent=1, default=str))


if __name__ == "__main__":
    main()
