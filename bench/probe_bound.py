"""How well can any 128 questions know a model? An information bound for planned probes (issue 16, bar 1).

    .venv/bin/python bench/probe_bound.py [--db registry.duckdb] [--models gpt-4o-2024-05-13 gemini-1.5-pro-002]
        [--sizes 32 64 128 256 512] [--draws 20] [--planned 128] [--iters 300]

Test hit@1 at small n turns on one number per top model: its mean P(correct) over the test questions, since the
router's split between the two best models (gpt-4o and gemini-1.5-pro, about 0.02 apart) follows whichever looks
stronger. Under the predictor, a model's answers inform its embedding z through the Fisher information
J = sum over asked questions of p(1-p) g g' (g = d logit / dz); with the Gaussian prior of probes.gaussian_prior
(precision L), the Laplace posterior variance of the model's mean test P(correct) is c' (L + J)^-1 c, with c its
gradient in z. This script computes that variance at each model's embedding from all its evaluations (the truth a
planner does not know: an advantage to planning) for
  - random designs: the draws of `registry evaluate --sample-efficiency` (evaluation.subset_rows), mean over draws;
  - the best design of n questions for exactly this quantity (c-optimal), over the whole pool: greedy (an actual
    design, an upper bound on the best variance) and the convex relaxation solved by Frank-Wolfe, whose duality gap
    certifies a lower bound: no set of n questions, chosen with any knowledge, gives a smaller variance.
If that lower bound at 128 is above the random designs' variance at 512, then under the predictor no plan of 128
questions can know a model's level as well as 512 random ones do.
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
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from registry import Registry
from registry.embedding import encoders
from registry.embedding.dataset import dataset  # noqa: E402
from registry.evaluate.harness import embed_subsets, subset_rows  # noqa: E402
from registry.locus import probe_design  # noqa: E402


def criterion(B, prior_prec, G, w):
    """tr(B (L + G' diag(w) G)^-1): the posterior variance the criterion B measures, for the design G (weights w)."""
    return float(np.trace(B @ np.linalg.inv(prior_prec + (G * w[:, None]).T @ G)))


def greedy(B, prior_prec, G, w, n):
    """n rows chosen one at a time, each the largest drop of tr(B Sigma) (probes._greedy: rank-one updates).
    -> (rows, criterion)."""
    picked = probe_design._greedy(G, w, np.linalg.inv(prior_prec), B, n)
    return picked, criterion(B, prior_prec, G[picked], w[picked])


def relaxed_bound(B, prior_prec, G, w, n, iters, start):
    """Frank-Wolfe on f(lam) = tr(B (L + sum lam_i w_i g_i g_i')^-1) over {0 <= lam <= 1, sum lam = n}, from the
    greedy design. f is convex in lam, so f(lam) - (its Frank-Wolfe gap) <= min f <= the min over 0/1 designs of n
    rows. -> (best f seen, certified lower bound)."""
    def at(lam):
        S = np.linalg.inv(prior_prec + (G * (lam * w)[:, None]).T @ G)
        return float(np.trace(B @ S)), S

    lam = np.zeros(len(G))
    lam[start] = 1.0
    best, bound = np.inf, -np.inf
    for _ in range(iters):
        f, S = at(lam)
        grad = -w * np.einsum("nd,nd->n", G @ (S @ B @ S), G)     # d f / d lam_i
        vertex = np.zeros(len(G))
        vertex[np.argsort(grad, kind="stable")[:n]] = 1.0           # the design minimising <grad, .>
        gap = float(grad @ (lam - vertex))
        best, bound = min(best, f), max(bound, f - gap)
        lo, hi = 0.0, 1.0                                           # f is convex on the segment: golden section
        for _ in range(8):
            m1, m2 = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
            lo, hi = (lo, m2) if at(lam + m1 * (vertex - lam))[0] < at(lam + m2 * (vertex - lam))[0] else (m1, hi)
        lam = lam + 0.5 * (lo + hi) * (vertex - lam)
    return best, bound


def equivalent_n(sizes, values, target):
    """The random-design size whose criterion equals target (log-log interpolation of the measured curve)."""
    x, y = np.log(sizes), np.log(values)
    if target >= values[0]:
        return float(sizes[0])
    if target <= values[-1]:      # beyond the curve: extrapolate its last segment
        slope = (y[-1] - y[-2]) / (x[-1] - x[-2])
        return float(np.exp(x[-1] + (np.log(target) - y[-1]) / slope))
    return float(np.exp(np.interp(-np.log(target), -y, x)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--models", nargs="+", default=["gpt-4o-2024-05-13", "gemini-1.5-pro-002"],
                    help="model names, or 'all'")
    ap.add_argument("--quantity", choices=["level", "map"], default="level",
                    help="level: the model's mean P(correct) over the test questions; map: the mean over the test "
                         "questions of the variance of its P(correct) on each")
    ap.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 256, 512])
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--planned", type=int, default=128)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--prior-scale", type=float, default=probe_design.PRIOR_SCALE, help="probes.PRIOR_SCALE")
    ap.add_argument("--contested", action="store_true",
                    help="only the test questions where the named models are the top predicted (with every "
                         "model's embedding from all its evaluations)")
    args = ap.parse_args()
    probe_design.PRIOR_SCALE = args.prior_scale
    torch.set_num_threads(1)
    t0 = time.time()
    with Registry(args.db) as reg, reg.store.tx() as tx:
        data = dataset(tx)
        model, meta = encoders.load(tx, encoders.ensure_default(tx))
    tr, va, te = data.splits["train"], data.splits["val"], data.splits["test"]
    nontest = np.concatenate([tr, va])
    cor = data.correct
    pred = probe_design.Predictor(model)
    q = pred.project(data.qvecs)
    z_all = embed_subsets(model, data, [nontest[cor[m, nontest] >= 0] for m in range(len(cor))]).astype(np.float64)
    names = data.models if args.models == ["all"] else args.models
    ids = [data.models.index(name) for name in names]
    if args.contested:              # questions where the named models hold the top places of the routing
        L = np.stack([pred.logits(z, q.take(te)) for z in z_all])
        top = np.argsort(-L, 0)[:len(ids)]
        te = te[np.all(np.sort(top, 0) == np.sort(ids)[:, None], 0)]
    qt = q.take(te)
    what = ("its mean P(correct) over" if args.quantity == "level"
            else "the mean variance of its P(correct) on each of")
    print(f"encoder {meta.get('name', '?')}; {len(cor)} models; pool: {len(nontest)} non-test questions; prior scale "
          f"{probe_design.PRIOR_SCALE}; posterior sd of {what} {len(te)} test questions"
          + (" (where the named models are the top predicted)" if args.contested else "") + "\n")
    print("| model | " + " | ".join(f"random {n}" for n in args.sizes)
          + f" | best {args.planned}, greedy | best {args.planned}, certified lower bound | random n it equals |")
    print("|---" * (len(args.sizes) + 4) + "|")
    rows = {}
    for name, m in zip(names, ids):
        z = z_all[m]
        prior = probe_design.gaussian_prior(np.delete(z_all, m, 0))
        lt, gt = pred.logits_grad(z, qt)
        pt = probe_design._sigmoid(lt)
        dp = (pt * (1 - pt))[:, None] * gt               # d P(correct) / dz on each test question
        if args.quantity == "level":
            c = dp.mean(0)
            B = np.outer(c, c)
        else:
            B = dp.T @ dp / len(dp)
        pool = nontest[cor[m, nontest] >= 0]
        lp, G = pred.logits_grad(z, q.take(pool))
        pp = probe_design._sigmoid(lp)
        w = pp * (1 - pp)
        pos = {int(r): i for i, r in enumerate(pool)}
        rand = {}
        for n in args.sizes:
            v = []
            for s in range(args.draws):
                at = [pos[int(r)] for r in subset_rows(cor, pool, n, s)[m]]
                v.append(criterion(B, prior.precision, G[at], w[at]))
            rand[n] = float(np.mean(v))
        picked, g_val = greedy(B, prior.precision, G, w, args.planned)
        _, bound = relaxed_bound(B, prior.precision, G, w, args.planned, args.iters, picked)
        bound = max(bound, 0.0)
        eq = equivalent_n(args.sizes, [rand[n] for n in args.sizes], bound)
        rows[name] = (rand, g_val, bound, eq)
        print(f"| {name} | " + " | ".join(f"{np.sqrt(rand[n]):.4f}" for n in args.sizes)
              + f" | {np.sqrt(g_val):.4f} | {np.sqrt(bound):.4f} | {eq:.0f} |", flush=True)
    top = max(args.sizes)
    above = sum(r[2] > r[0][top] for r in rows.values())
    print(f"\nthe certified lower bound at {args.planned} is above random {top}'s sd for {above} of {len(rows)} "
          f"models; the random n it equals: median {np.median([r[3] for r in rows.values()]):.0f}, "
          f"max {max(r[3] for r in rows.values()):.0f}")
    if len(rows) == 2 and args.quantity == "level":
        (ra, ga, ba, _), (rb, gb, bb, _) = rows.values()
        print("the two models' gap, sd: " + ", ".join(f"random {n} {np.sqrt(ra[n] + rb[n]):.4f}" for n in args.sizes)
              + f"; best {args.planned}: greedy {np.sqrt(ga + gb):.4f}, lower bound {np.sqrt(ba + bb):.4f}")
    print(f"\n(Laplace at each model's embedding from all its evaluations, prior from the other models' embeddings; "
          f"{args.draws} random draws; {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
