"""Can a better estimate of z from n evaluations close bar 2 of issue 3? Side by side on the active encoder.

    .venv/bin/python bench/sample_efficiency_estimators.py [--db registry.duckdb] [--n 32 128 512] [--draws 5]

Every model is embedded from n random non-test evaluations (the draws `registry evaluate --sample-efficiency` makes,
so `encoder` reproduces its column), then routed on the test questions with the active predictor. Estimators of z:
  - encoder: the set encoder's one forward pass (what the registry does);
  - shrink: the Gaussian posterior mean of z given the encoder's output. Prior N(mean, cov + ridge) of the models'
    embeddings from all their train evaluations; noise cov/n, cov measured per evaluation as n' times the scatter of
    256-evaluation train subsets around the full-set z;
  - MAP: z maximising the predictor's own likelihood of the n observed 0/1 results plus the same Gaussian log prior
    (L-BFGS, 50 iterations): the most a fixed predictor can read from the n results;
  - each "LOO" column fits the prior without the model being embedded, as it would be for a new model.
The prior is fitted on the train split only; the draws come from train + val, as in `registry evaluate`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from registry import Registry
from registry.embedding import encoders  # noqa: E402
from registry.embedding.dataset import dataset  # noqa: E402
from registry.evaluate.harness import embed_subsets  # noqa: E402
from registry.evaluate.harness import subset_rows as draw
from registry.locus import baselines as B  # noqa: E402


def embed(model, data, rows):
    return embed_subsets(model, data, rows).astype(np.float64)                   # [M,D]


def gaussian_prior(Z, ridge):
    """Mean and covariance of embeddings Z [K,D], plus ridge x the mean variance on the diagonal (K < D)."""
    C = np.cov(Z.T)
    return Z.mean(0), C + ridge * np.trace(C) / Z.shape[1] * np.eye(Z.shape[1])


def shrink(z, n, mu, S, N1):
    """Posterior mean of z given the noisy estimate z [D] from n evaluations: mu + S (S + N1/n)^-1 (z - mu)."""
    return mu + S @ np.linalg.solve(S + N1 / n, z - mu)


def map_fit(model, qvecs, rows, ys, mus, S_invs, iters=50):
    """argmax_z sum_i log p(y_i | z, q_i) - (z - mu)' S^-1 (z - mu) / 2, for every model at once. -> [M,D]"""
    n = len(rows[0])
    u = model.query_proj(torch.from_numpy(qvecs[np.concatenate(rows)]))           # [M*n,D]
    y = torch.from_numpy(np.concatenate(ys).astype(np.float32))                    # [M*n]
    mu = torch.tensor(np.stack(mus), dtype=torch.float32)                          # [M,D]
    Si = torch.tensor(np.stack(S_invs), dtype=torch.float32)                       # [M,D,D]
    z = mu.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([z], lr=1, max_iter=iters, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        nll = F.binary_cross_entropy_with_logits(model.pair_logits(z.repeat_interleave(n, 0), u), y, reduction="sum")
        d = z - mu
        loss = nll + 0.5 * torch.einsum("md,mde,me->", d, Si, d)
        loss.backward()
        return loss

    opt.step(closure)
    return z.detach().numpy().astype(np.float64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--n", type=int, nargs="+", default=[32, 128, 512])
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--ridge", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    with Registry(args.db) as reg, reg.store.tx() as tx:
        data = dataset(tx)
        model, meta = encoders.load(tx, encoders.ensure_default(tx))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    tr, va, te = data.splits["train"], data.splits["val"], data.splits["test"]
    nontest = np.concatenate([tr, va])
    M, ct = len(data.models), data.correct[:, te]
    q_te = torch.from_numpy(data.qvecs[te])

    def hit(Z):
        with torch.no_grad():
            return B.hit_at_k(model.predict_logits(torch.from_numpy(Z.astype(np.float32)), q_te).numpy(), ct, 1)

    Z_all = embed(model, data, draw(data.correct, nontest, 1 << 30, 0))           # what the registry stores
    Z_tr = embed(model, data, draw(data.correct, tr, 1 << 30, 0))                  # prior: train split only
    R = np.concatenate([embed(model, data, draw(data.correct, tr, 256, s)) - Z_tr for s in range(100, 108)])
    N1 = 256 * R.T @ R / len(R)                                                    # noise covariance x n
    priors = {"in": [gaussian_prior(Z_tr, args.ridge)] * M,
              "LOO": [gaussian_prior(np.delete(Z_tr, m, 0), args.ridge) for m in range(M)]}
    inv = {k: [np.linalg.inv(S) for _, S in v] for k, v in priors.items()}
    print(f"encoder {meta.get('name', '?')}; {M} models; test {len(te)} questions; all evaluations: "
          f"hit@1 {hit(Z_all):.4f}; noise per evaluation {np.trace(N1):.2f} vs prior spread "
          f"{np.trace(np.cov(Z_tr.T)):.3f} (traces)")
    cols = ["encoder", "shrink", "shrink LOO", "MAP", "MAP LOO"]
    print(f"{'n':>5s} " + " ".join(f"{c:>18s}" for c in cols))
    for n in args.n:
        res = {c: [] for c in cols}
        for seed in range(args.draws):
            rows = draw(data.correct, nontest, n, seed)
            ys = [data.correct[m, r] == 1 for m, r in enumerate(rows)]
            Z = embed(model, data, rows)
            res["encoder"].append(hit(Z))
            for k, tag in (("in", ""), ("LOO", " LOO")):
                res["shrink" + tag].append(hit(np.stack([shrink(Z[m], n, *priors[k][m], N1) for m in range(M)])))
                res["MAP" + tag].append(hit(map_fit(model, data.qvecs, rows, ys, [mu for mu, _ in priors[k]],
                                                    inv[k])))
        print(f"{n:>5d} " + " ".join(f"{np.mean(v):>9.4f} +- {np.std(v):.4f}" for v in res.values()), flush=True)
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
