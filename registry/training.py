"""Training LOCUS, embedding models, and scoring queries.

Why the training differs from the reference code (see notes/reference-runs.md): the reference collapses to routing
everything to the strongest model. Here every step (a) embeds each model from an anchor set of random size
(log-uniform in [min_anchors, anchors]) drawn afresh from its train evaluations, and (b) trains the predictor on a
fresh batch of target queries that are NOT in that model's anchor set, so the predictor cannot learn answers that the
encoder just saw; many such steps, early stopping on validation routing hit@1.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .baselines import hit_at_k, predictor_metrics
from .encoder import EncoderConfig, LocusModel


@dataclass
class TrainConfig:
    seed: int = 0
    max_steps: int = 400
    eval_every: int = 25          # steps between validation checks
    patience: int = 8             # validation checks without improvement before stopping
    anchors: int = 512            # largest anchor set per model and step
    min_anchors: int = 32         # smallest
    n_targets: int = 2048         # target queries per step (shared by the models, minus each one's anchors)
    lr_encoder: float = 5e-4
    lr_predictor: float = 1e-3
    weight_decay: float = 0.05
    warmup: int = 30
    noise_start: float = 0.02     # std of Gaussian noise on query vectors, cosine-annealed over max_steps
    noise_end: float = 0.005
    grad_clip: float = 1.0
    route_weight: float = 1.0     # weight of the listwise routing loss (softmax over models per target query)
    ema: float = 0.98             # validation and the result use an exponential moving average of the weights (0: off)
    eval_max_set: int | None = 512   # cap per model when embedding for validation (seeded draw; None = all)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)


# ---------------------------------------------------------------- embedding and scoring

def _model_rows(correct: np.ndarray, idx_subset, max_set: int | None, seed: int | None) -> list[np.ndarray]:
    """Per model, the query indices (within idx_subset) it was evaluated on; capped to max_set by a seeded draw."""
    idx = np.asarray(idx_subset)
    rng = np.random.default_rng(0 if seed is None else seed)
    rows = []
    for m in range(correct.shape[0]):
        r = idx[correct[m, idx] >= 0]
        if len(r) == 0:
            raise ValueError(f"model {m} has no evaluations in the subset")
        if max_set is not None and len(r) > max_set:
            r = np.sort(rng.choice(r, size=max_set, replace=False))
        rows.append(r)
    return rows


def _embed_rows(model: LocusModel, q: torch.Tensor, correct: np.ndarray, rows: list[np.ndarray],
                budget: int = 1 << 16) -> torch.Tensor:
    """Padded, masked batches of sets; about `budget` padded rows per forward pass. -> z [M,D]"""
    zs, start = [], 0
    while start < len(rows):
        end, width = start, 0
        while end < len(rows) and max(width, len(rows[end])) * (end - start + 1) <= max(budget, len(rows[end])):
            width = max(width, len(rows[end]))
            end += 1
        B = end - start
        idx = np.zeros((B, width), dtype=np.int64)
        y = np.zeros((B, width), dtype=np.float32)
        mask = np.zeros((B, width), dtype=bool)
        for i, m in enumerate(range(start, end)):
            r = rows[m]
            idx[i, :len(r)], y[i, :len(r)], mask[i, :len(r)] = r, correct[m, r], True
        zs.append(model.embed(q[torch.from_numpy(idx)], torch.from_numpy(y), torch.from_numpy(mask)))
        start = end
    return torch.cat(zs)


@torch.no_grad()
def embed_models(model: LocusModel, qvecs: np.ndarray, correct: np.ndarray, idx_subset,
                 max_set: int | None = None, seed: int | None = None) -> np.ndarray:
    """Each model's embedding from its evaluations on idx_subset (observed entries only). -> z [M,D] float32.

    correct [M,Nq] int8 (-1 = missing). max_set caps the set per model by a seeded random draw (seed None = 0).
    """
    model.eval()
    rows = _model_rows(correct, idx_subset, max_set, seed)
    return _embed_rows(model, torch.from_numpy(np.ascontiguousarray(qvecs, dtype=np.float32)), correct, rows).numpy()


@torch.no_grad()
def predict_proba(model: LocusModel, z: np.ndarray, qvecs: np.ndarray) -> np.ndarray:
    """P(correct) [M,N] for model embeddings z [M,D] and query vectors [N,Dq]."""
    model.eval()
    logits = model.predict_logits(torch.from_numpy(np.asarray(z, dtype=np.float32)),
                                  torch.from_numpy(np.ascontiguousarray(qvecs, dtype=np.float32)))
    return torch.sigmoid(logits).numpy()


def route(model: LocusModel, z: np.ndarray, qvecs: np.ndarray, k: int = 1) -> np.ndarray:
    """[k,N] indices of the k models most likely to answer each query, best first."""
    p = predict_proba(model, z, qvecs)
    return np.argsort(-p.astype(np.float64), axis=0, kind="stable")[:k]


def evaluate(model: LocusModel, qvecs, correct, embed_idx, eval_idx, max_set=None, seed=None) -> dict:
    """Routing and predictor metrics on eval_idx, with models embedded from their evaluations on embed_idx."""
    z = embed_models(model, qvecs, correct, embed_idx, max_set=max_set, seed=seed)
    p = predict_proba(model, z, qvecs[np.asarray(eval_idx)])
    c = correct[:, eval_idx]
    obs = c >= 0
    pt = torch.from_numpy(p[obs].astype(np.float64)).clamp(1e-7, 1 - 1e-7)
    bce = float(F.binary_cross_entropy(pt, torch.from_numpy((c[obs] == 1).astype(np.float64))))
    return {"hit@1": hit_at_k(p, c, 1), "bce": bce, **predictor_metrics(p, c)}


# ---------------------------------------------------------------- training

def routing_loss(logits, y, valid):
    """-log P(route to a model that answered), softmax over the models per query: BCE alone learns base rates
    well but barely ranks models within a query, so routing collapses onto the strongest model.
    logits, y, valid [M,T]; queries no valid model answered are skipped. Finite fill (not -inf) keeps grads finite."""
    pos = valid & (y > 0.5)
    has = pos.any(0)                                                       # [T]
    lse_all = torch.logsumexp(logits.masked_fill(~valid, -1e4), 0)        # [T]
    lse_pos = torch.logsumexp(logits.masked_fill(~pos, -1e4), 0)          # [T]
    return (lse_all - lse_pos)[has].mean()


def train(qvecs: np.ndarray, correct: np.ndarray, train_idx, val_idx, cfg: TrainConfig | None = None,
          progress: Callable[[dict], None] | None = None) -> tuple[LocusModel, EncoderConfig, dict]:
    """Train on the train queries; keep the state with the best validation hit@1 (ties: lower validation BCE)."""
    cfg = cfg or TrainConfig()
    t0 = time.time()
    det_before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(cfg.seed)
        rng = np.random.default_rng(cfg.seed)
        ecfg = copy.deepcopy(cfg.encoder)
        model = LocusModel(ecfg)
        enc_params = [p for n, p in model.named_parameters() if not n.startswith(("q_proj", "w_", "head"))]
        dec_params = [p for n, p in model.named_parameters() if n.startswith(("q_proj", "w_", "head"))]
        opt = torch.optim.AdamW([{"params": enc_params, "lr": cfg.lr_encoder},
                                 {"params": dec_params, "lr": cfg.lr_predictor}], weight_decay=cfg.weight_decay)
        base_lrs = [cfg.lr_encoder, cfg.lr_predictor]
        ema_model = copy.deepcopy(model) if cfg.ema > 0 else model    # smooths step-to-step noise in the routing

        q_all = torch.from_numpy(np.ascontiguousarray(qvecs, dtype=np.float32))
        tr = np.asarray(train_idx)
        c_tr = correct[:, tr]                                   # [M,Ntr]
        M, n_tr = c_tr.shape
        obs_rows = [np.nonzero(c_tr[m] >= 0)[0] for m in range(M)]   # positions within tr
        y_tr = torch.from_numpy((c_tr == 1).astype(np.float32))
        obs_tr = torch.from_numpy(c_tr >= 0)
        q_tr = q_all[torch.from_numpy(tr)]                      # [Ntr,Dq]
        lo, hi = math.log(cfg.min_anchors), math.log(cfg.anchors)

        best_key, best_state, best_step, best_val, bad = None, None, 0, {}, 0
        hist, losses = [], []
        step = 0
        for step in range(1, cfg.max_steps + 1):
            model.train()
            frac = (step - 1) / max(1, cfg.max_steps - 1)
            noise = cfg.noise_end + 0.5 * (cfg.noise_start - cfg.noise_end) * (1 + math.cos(math.pi * frac))
            for g, lr in zip(opt.param_groups, base_lrs):
                g["lr"] = lr * min(1.0, step / max(1, cfg.warmup))

            # anchor sets: one random size for the step, each model its own draw from its train evaluations
            k = int(round(math.exp(rng.uniform(lo, hi))))
            anchor = np.zeros((M, k), dtype=np.int64)
            mask_np = np.zeros((M, k), dtype=bool)
            in_anchor_np = np.zeros((M, n_tr), dtype=bool)
            for m, r in enumerate(obs_rows):                    # a model with fewer than k evaluations: pad + mask
                a = rng.choice(r, size=min(k, len(r)), replace=False)
                anchor[m, :len(a)], mask_np[m, :len(a)], in_anchor_np[m, a] = a, True, True
            a_idx, mask, in_anchor = (torch.from_numpy(x) for x in (anchor, mask_np, in_anchor_np))
            qa = q_tr[a_idx] + noise * torch.randn(M, k, q_tr.shape[1])                          # [M,k,Dq]
            ya = torch.gather(y_tr, 1, a_idx)                                                     # [M,k]
            z = model.embed(qa, ya, mask)                                                         # [M,D]

            # targets: shared fresh queries; a model's own anchors and missing entries are left out of the loss
            t_idx = torch.from_numpy(rng.choice(n_tr, size=min(cfg.n_targets, n_tr), replace=False))
            valid = obs_tr[:, t_idx] & ~in_anchor[:, t_idx]                                      # [M,T]
            qt = q_tr[t_idx] + noise * torch.randn(len(t_idx), q_tr.shape[1])
            logits = model.predict_logits(z, qt)                                                  # [M,T]
            yt = y_tr[:, t_idx]
            loss = F.binary_cross_entropy_with_logits(logits[valid], yt[valid])
            if cfg.route_weight > 0:
                loss = loss + cfg.route_weight * routing_loss(logits, yt, valid)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            if cfg.ema > 0:
                with torch.no_grad():
                    d = min(cfg.ema, (step - 1) / (step + 9))             # short warm-up of the average
                    for pe, p in zip(ema_model.parameters(), model.parameters()):
                        pe.lerp_(p, 1 - d)
            losses.append(float(loss.detach()))

            if step % cfg.eval_every == 0 or step == cfg.max_steps:
                val = evaluate(ema_model, qvecs, correct, tr, val_idx, max_set=cfg.eval_max_set)
                key = (round(val["hit@1"], 9), -val["bce"])
                improved = best_key is None or key > best_key
                if improved:
                    best_key, best_step, best_val, bad = key, step, val, 0
                    best_state = copy.deepcopy(ema_model.state_dict())
                else:
                    bad += 1
                info = {"step": step, "max_steps": cfg.max_steps, "loss": float(np.mean(losses[-cfg.eval_every:])),
                        "val_hit@1": val["hit@1"], "val_auc": val["auc"], "val_bce": val["bce"],
                        "best_val_hit@1": best_val["hit@1"], "best_step": best_step, "anchors": k,
                        "noise": noise, "elapsed_s": time.time() - t0}
                hist.append(info)
                if progress:
                    progress(info)
                if bad >= cfg.patience:
                    break
        model.load_state_dict(best_state)
        model.eval()
        metrics = {"best_step": best_step, "steps": step, "wall_s": time.time() - t0, "n_params": model.n_params(),
                   **{f"val_{k}": v for k, v in best_val.items()}, "train_config": asdict(cfg),
                   "history": [{k: h[k] for k in ("step", "loss", "val_hit@1", "val_auc", "val_bce")} for h in hist]}
        return model, ecfg, metrics
    finally:
        torch.use_deterministic_algorithms(det_before)
