"""Train LOCUS on MMLU-Pro, save the checkpoint, and compare it with the baselines on the test split.

    .venv/bin/python bench/train_locus.py --seed 0 --threads 1 --out /work/cache/locus.safetensors

LOCUS routes with models embedded from all of their non-test evaluations (train and val), as the registry embeds
them. Baselines are fitted on train (val for their hyperparameters). Every method is scored on the same test queries.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import duckdb
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from registry.evaluate import pair_baselines as P  # noqa: E402
from registry.locus import baselines as B  # noqa: E402
from registry.locus.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from registry.locus.network import EncoderConfig  # noqa: E402
from registry.locus.scoring import embed_models, embed_rows, predict_proba  # noqa: E402
from registry.locus.training import TrainConfig, train  # noqa: E402

DATA = Path("/work/shared/data/mmlu-pro")


def load_registry_data(db: str):
    """The same arrays from a registry built from the data (`bin/build-default`): its stored MiniLM vectors."""
    from registry import Registry
    from registry.embedding.dataset import dataset

    with Registry(db) as reg, reg.store.tx() as tx:
        d = dataset(tx)
    return d.qvecs, d.correct, d.models, d.splits


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


def fingerprint(model, qvecs, correct, n=128, seeds=range(5)):
    """Each model embedded twice from two disjoint random sets of n of its evaluations (any split): how often the
    second embedding's nearest first embedding (L2) is the same model; and same- vs different-model distances."""
    M = correct.shape[0]
    top1, same, diff = [], [], []
    for s in seeds:
        rng = np.random.default_rng(1000 + s)
        first, second = [], []
        for m in range(M):
            r = rng.permutation(np.nonzero(correct[m] >= 0)[0])[:2 * n]
            first.append(np.sort(r[:n]))
            second.append(np.sort(r[n:]))
        za = _embed_sets(model, qvecs, correct, first)
        zb = _embed_sets(model, qvecs, correct, second)
        d = np.linalg.norm(zb[:, None, :] - za[None, :, :], axis=-1)          # [M,M] second x first
        top1.append(float((d.argmin(1) == np.arange(M)).mean()))
        same.extend(np.diag(d).tolist())
        diff.extend(d[~np.eye(M, dtype=bool)].tolist())
    same, diff = np.array(same), np.array(diff)
    return {"top1": float(np.mean(top1)), "top1_per_seed": top1,
            "same_q": np.quantile(same, [0.5, 0.95, 1.0]).tolist(), "diff_q": np.quantile(diff, [0.0, 0.05, 0.5]).tolist(),
            "separable_95": bool(np.quantile(same, 0.95) < np.quantile(diff, 0.05))}


def _embed_sets(model, qvecs, correct, rows):
    with torch.no_grad():
        model.eval()
        return embed_rows(model, torch.from_numpy(qvecs), correct, rows).numpy()


def geometry(z, correct, idx):
    from scipy.stats import pearsonr, spearmanr

    from registry.answers.disagreement import disagreement_matrix
    M = z.shape[0]
    iu = np.triu_indices(M, 1)
    dist = np.linalg.norm(z[:, None] - z[None], axis=-1)[iu]
    dis = np.nan_to_num(disagreement_matrix(correct[:, idx])[0])[iu]
    acc = B.model_accuracy(correct[:, idx])
    dacc = np.abs(acc[:, None] - acc[None])[iu]
    # partial correlation of distance and disagreement, controlling for the accuracy difference
    res = lambda a: a - np.polyval(np.polyfit(dacc, a, 1), dacc)
    return {"pairs": int(len(dist)), "pearson": float(pearsonr(dist, dis)[0]), "spearman": float(spearmanr(dist, dis)[0]),
            "pearson_dist_vs_acc_gap": float(pearsonr(dist, dacc)[0]),
            "partial_given_acc_gap": float(pearsonr(res(dist), res(dis))[0])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb",
                    help="registry to read the data from (query vectors included); `--db cache` reads "
                         "/work/cache/qvec.npy instead (a development shortcut)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="/work/cache/locus.safetensors")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--mf-seeds", type=int, default=3)
    ap.add_argument("--skip-baselines", action="store_true")
    ap.add_argument("--set", nargs="*", default=[],
                    help="TrainConfig overrides, e.g. teacher_noise=0.05; encoder fields as enc.d_hidden=128")
    ap.add_argument("--embed-max-set", type=int, default=None, help="cap per model for routing embeddings")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    qvecs, correct, models, sp = load_data() if args.db == "cache" else load_registry_data(args.db)
    tr, va, te = sp["train"], sp["val"], sp["test"]
    nontest = np.sort(np.concatenate([tr, va]))
    ct = correct[:, te]
    print(f"{len(models)} models, {qvecs.shape[0]} queries: train {len(tr)} / val {len(va)} / test {len(te)}")

    cfg = TrainConfig(seed=args.seed)
    if args.max_steps:
        cfg.max_steps = args.max_steps
    enc = {}
    for kv in args.set:
        k, v = kv.split("=", 1)
        obj, k = (cfg.encoder, k[4:]) if k.startswith("enc.") else (cfg, k)
        old = getattr(obj, k)
        val = None if v == "None" else (v.lower() in ("1", "true")) if isinstance(old, bool) else \
            type(old)(v) if old is not None else int(v)
        if obj is cfg:
            setattr(cfg, k, val)
        else:
            enc[k] = val
    if enc:
        cfg.encoder = EncoderConfig(**{**asdict(cfg.encoder), **enc})

    def show(i):
        print(f"  {i['stage']:7s} {i['step']:4d}  bce {i['loss']:.4f}  cons {i['cons']:.3f}  val hit@1 {i['val_hit@1']:.4f}"
              f"  auc {i['val_auc']:.4f}  bce {i['val_bce']:.4f}  routed {i['val_n_routed']:2d}"
              f"  best {i['best_val_hit@1']:.4f}@{i['best_step']}  {i['elapsed_s']:.0f}s", flush=True)

    t0 = time.time()
    model, ecfg, metrics = train(qvecs, correct, tr, va, cfg, progress=show)
    wall = time.time() - t0
    print(f"trained in {wall:.0f}s, best step {metrics['best_step']} of {metrics['steps']}, {metrics['n_params']} params")

    # test figures come from the checkpoint as saved, so they describe what is shipped
    meta = {"name": "locus-mmlu-pro-v2", "text_encoder": "all-MiniLM-L6-v2@256", "embed_max_set": args.embed_max_set,
            "data": "mmlu-pro", "train_data_digest": digest(qvecs, correct, tr, va), "seed": args.seed,
            "train_wall_s": round(wall, 1), "threads": args.threads, "best_step": metrics["best_step"],
            "val_hit@1": metrics["val_hit@1"], "train_config": metrics["train_config"]}
    blob = save_checkpoint(model, ecfg, meta)
    model, ecfg, meta = load_checkpoint(blob)
    assert save_checkpoint(model, ecfg, meta) == blob

    # routing: every model embedded from all its non-test evaluations (train and val), as the registry does
    z = embed_models(model, qvecs, correct, nontest, max_set=args.embed_max_set)
    p = predict_proba(model, z, qvecs[te])
    rows = {"LOCUS": B.routing_report(p, ct, p)}

    print("\nSample efficiency: LOCUS test hit@1, every model embedded from n random non-test evaluations (5 draws)")
    eff = {}
    for n in (32, 64, 128, 256, 512):
        hits = [B.hit_at_k(predict_proba(model, embed_models(model, qvecs, correct, nontest, max_set=n, seed=s),
                                         qvecs[te]), ct) for s in range(5)]
        eff[n] = {"mean": float(np.mean(hits)), "std": float(np.std(hits)), "min": min(hits), "max": max(hits)}
        print(f"  n={n:4d}: {eff[n]['mean']:.4f} +- {eff[n]['std']:.4f}  (min {min(hits):.4f}, max {max(hits):.4f})")
    n_all = int(np.mean([(correct[m, nontest] >= 0).sum() for m in range(len(models))]))
    print(f"  all  : {rows['LOCUS']['hit@1']:.4f}  (~{n_all} per model)")

    fp = fingerprint(model, qvecs, correct)
    print(f"\nFingerprint (two disjoint sets of 128 per model, 5 seeds): nearest neighbour is the same model "
          f"{fp['top1']:.3f} {[round(x, 3) for x in fp['top1_per_seed']]}\n  same-model distance median/95%/max "
          f"{np.round(fp['same_q'], 3).tolist()}; different-model min/5%/median {np.round(fp['diff_q'], 3).tolist()};"
          f" a threshold separates 95%/95%: {fp['separable_95']}")
    geo = geometry(z, correct, te)
    print(f"Geometry ({geo['pairs']} pairs, embeddings from non-test evaluations, disagreement on test): "
          f"Pearson {geo['pearson']:.3f}, Spearman {geo['spearman']:.3f}; distance vs accuracy gap "
          f"{geo['pearson_dist_vs_acc_gap']:.3f}; partial r given the accuracy gap {geo['partial_given_acc_gap']:.3f}")

    meta["metrics"] = {"test_" + k: rows["LOCUS"][k] for k in ("hit@1", "hit@3", "hit@5", "auc", "brier", "n_chosen")}
    meta["metrics"].update({f"test_hit@1_n{n}": round(e["mean"], 4) for n, e in eff.items()},
                           fingerprint_top1=fp["top1"], geometry_pearson=geo["pearson"],
                           geometry_spearman=geo["spearman"])
    meta["metrics"]["val_hit@1"] = metrics["val_hit@1"]
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
            mf, info = P.mf_router(qvecs, correct, tr, va, seed=ms)
            s = P.mf_probs(mf, qvecs, te)
            rows[f"mf (d={info['dim']}, seed {ms})"] = B.routing_report(s, ct, s)

    print(f"\nTEST ({len(te)} questions; std err of hit@1 ~0.013)")
    print(f"{'method':24s} {'hit@1':>7s} {'hit@3':>7s} {'hit@5':>7s} {'AUC':>7s} {'Brier':>7s} {'acc':>7s} {'#routed':>7s}")
    fmt = lambda r, k, f="{:7.4f}": f.format(r[k]) if k in r else " " * 7
    for name, r in rows.items():
        print(f"{name:24s} {fmt(r, 'hit@1')} {fmt(r, 'hit@3')} {fmt(r, 'hit@5')} {fmt(r, 'auc')} {fmt(r, 'brier')}"
              f" {fmt(r, 'acc')} {fmt(r, 'n_chosen', '{:7d}')}")
    mfh = [r["hit@1"] for n, r in rows.items() if n.startswith("mf")]
    if mfh:
        print(f"MF over {len(mfh)} seeds: hit@1 {np.mean(mfh):.4f} +- {np.std(mfh):.4f}; "
              f"AUC {np.mean([r['auc'] for n, r in rows.items() if n.startswith('mf')]):.4f}")
    print(f"\ntraining wall time {wall:.0f}s; threads {args.threads}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "efficiency": eff, "fingerprint": fp, "geometry": geo,
                                               "wall_s": wall,
                                               "metrics": {k: v for k, v in metrics.items() if k != "history"}},
                                              indent=1, default=str))


if __name__ == "__main__":
    main()
