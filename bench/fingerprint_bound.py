"""Feasibility bound for the fingerprint bar: how well can 128 evaluations identify a model at all?

(1) Likelihood bound: with P(correct | model, q) known for the 31 models (from MF fitted on train, or the shipped
    checkpoint's predictor with each model's capped non-test embedding), identify the model behind a set of 128 of its
    evaluations by maximum likelihood over the 31 candidates. Also the two-sample version: match set B to set A by the
    overlap of their posteriors over the 31 models.
(2) Empirical two-sample check without any model: per-category accuracy profiles of two disjoint 128-sets, nearest.
Sets as in the fingerprint bar: per model a fixed seeded 1,024 of its train+val evaluations (embed_max_set), then two
disjoint random 128-subsets (5 seeds). Also sets from val+test (never seen by MF) to measure the optimism.

    OMP_NUM_THREADS=1 .venv/bin/python bench/fingerprint_bound.py [--ckpt path]   (about 35 s)

Reads the shared data and the cached MiniLM query vectors that bench/train_locus.py reads (load_data).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import duckdb
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_locus import DATA, load_data  # noqa: E402

from registry.evaluate import pair_baselines as P  # noqa: E402
from registry.locus import baselines as B  # noqa: E402
from registry.locus.scoring import embed_models, model_rows, predict_proba  # noqa: E402


def pairs(rows, n, seed):
    rng = np.random.default_rng(1000 + seed)
    A, Bs = [], []
    for r in rows:
        p = rng.permutation(r)[:2 * n]
        A.append(np.sort(p[:n])); Bs.append(np.sort(p[n:]))
    return A, Bs


def loglik(P, correct, sets):
    """[S,M]: log-likelihood of set s under candidate model m, P [M,Nq] probabilities."""
    lp, lq = np.log(np.clip(P, 1e-6, 1 - 1e-6)), np.log(np.clip(1 - P, 1e-6, 1 - 1e-6))
    out = np.zeros((len(sets), P.shape[0]))
    for s, (m, r) in enumerate(sets):
        y = correct[m, r] == 1
        out[s] = np.where(y[None], lp[:, r], lq[:, r]).sum(1)
    return out


def bound(P, correct, rows, n=128, seeds=range(5)):
    M = correct.shape[0]
    mle, match, same, diff = [], [], [], []
    for s in seeds:
        A, Bs = pairs(rows, n, s)
        la = loglik(P, correct, list(enumerate(A)))
        lb = loglik(P, correct, list(enumerate(Bs)))
        mle.append(float((lb.argmax(1) == np.arange(M)).mean()))
        pa = np.exp(la - la.max(1, keepdims=True)); pa /= pa.sum(1, keepdims=True)
        pb = np.exp(lb - lb.max(1, keepdims=True)); pb /= pb.sum(1, keepdims=True)
        # B_i matched to the A_j with the largest posterior overlap
        ov = np.log(pb @ pa.T + 1e-300)
        match.append(float((ov.argmax(1) == np.arange(M)).mean()))
        same.extend(np.diag(ov)); diff.extend(ov[~np.eye(M, dtype=bool)])
    return np.mean(mle), np.mean(match), threshold_acc(-np.array(same), -np.array(diff))


def threshold_acc(same, diff):
    """Best single threshold on a distance-like score (small = same): (same-pair accuracy, different-pair accuracy)
    at the threshold maximising the smaller of the two."""
    best = (0.0, 0.0)
    for t in np.unique(np.concatenate([same, diff])):
        a, b = float((same <= t).mean()), float((diff > t).mean())
        if min(a, b) > min(best):
            best = (a, b)
    return best


def category_profiles(correct, rows, cat, n=128, seeds=range(5)):
    M = correct.shape[0]
    cats = np.unique(cat)
    res = {"acc": [], "cat": [], "cat_shrunk": []}
    for s in seeds:
        A, Bs = pairs(rows, n, s)
        def prof(sets, shrink):
            out = []
            for m, r in enumerate(sets):
                y = (correct[m, r] == 1).astype(float)
                mu = y.mean()
                v = [(y[cat[r] == c].sum() + shrink * mu) / ((cat[r] == c).sum() + shrink) for c in cats]
                out.append(v)
            return np.array(out)
        acc_a = np.array([(correct[m, r] == 1).mean() for m, r in enumerate(A)])
        acc_b = np.array([(correct[m, r] == 1).mean() for m, r in enumerate(Bs)])
        res["acc"].append(float((np.abs(acc_b[:, None] - acc_a[None]).argmin(1) == np.arange(M)).mean()))
        for key, sh in (("cat", 1e-9), ("cat_shrunk", 5.0)):
            pa, pb = prof(A, sh), prof(Bs, sh)
            d = np.linalg.norm(pb[:, None] - pa[None], axis=-1)
            res[key].append(float((d.argmin(1) == np.arange(M)).mean()))
    return {k: float(np.mean(v)) for k, v in res.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default=str(Path(__file__).resolve().parents[1] / "data" / "locus-mmlu-pro.safetensors"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    qvecs, correct, models, sp = load_data()
    tr, va, te = sp["train"], sp["val"], sp["test"]
    nontest = np.sort(np.concatenate([tr, va]))
    heldout = np.sort(np.concatenate([va, te]))
    ids = duckdb.sql("select question_id from read_csv('/work/cache/qvec_ids.csv')").fetchnumpy()["question_id"]
    qc = duckdb.sql(f"select question_id, category from read_csv('{DATA}/questions.csv.gz')").fetchnumpy()
    cmap = dict(zip(qc["question_id"].tolist(), qc["category"].tolist()))
    cat = np.array([cmap[int(q)] for q in ids])
    rows_nt = model_rows(correct, nontest, 1024, None)          # the registry's fixed seeded cap
    rows_ho = model_rows(correct, heldout, 1024, None)

    print("model accuracy spread (non-test):", np.round(np.sort(B.model_accuracy(correct[:, nontest])), 3).tolist())
    for dim in (64,):
        mf, info = P.train_mf(qvecs, correct, tr, va, dim, seed=0)
        with torch.no_grad():
            P = torch.sigmoid(mf.logits(torch.from_numpy(qvecs))).numpy()
        print(f"MF d={dim} (fitted on train, val hit@1 {info['val_hit@1']:.4f}):")
        for name, rows in (("train+val cap 1024", rows_nt), ("val+test (unseen by MF)", rows_ho)):
            mle, match, th = bound(P, correct, rows)
            print(f"  sets from {name:26s}: MLE identify 128-set among 31 {mle:.3f}; two-sample posterior match {match:.3f}; "
                  f"best threshold same/diff {th[0]:.3f}/{th[1]:.3f}")
        for n in (256, 512):
            mle, match, th = bound(P, correct, rows_nt, n=n)
            print(f"  n={n}: MLE {mle:.3f} match {match:.3f} threshold {th[0]:.3f}/{th[1]:.3f}")
    from registry.locus.checkpoint import load_checkpoint
    model, _, _ = load_checkpoint(Path(args.ckpt).read_bytes())
    z = embed_models(model, qvecs, correct, nontest, max_set=1024)
    P = predict_proba(model, z, qvecs)
    print(f"checkpoint predictor, z from capped non-test ({args.ckpt}):")
    for name, rows in (("train+val cap 1024", rows_nt), ("val+test", rows_ho)):
        mle, match, th = bound(P, correct, rows)
        print(f"  sets from {name:26s}: MLE identify {mle:.3f}; two-sample posterior match {match:.3f}; "
              f"best threshold same/diff {th[0]:.3f}/{th[1]:.3f}")
    # oracle: empirical per-question truth is useless across disjoint sets; category profiles instead
    print("empirical two-sample nearest (no model), sets from train+val cap 1024:",
          category_profiles(correct, rows_nt, cat))


if __name__ == "__main__":
    main()
