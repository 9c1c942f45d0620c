"""The three stages of training LOCUS (training.train runs them in turn): the linear teacher, the encoder regressed
onto it, and the predictor refitted on the frozen encoder's embeddings. Why this recipe: training.py's docstring."""
from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from registry.locus.baselines import hit_at_k
from registry.locus.network import EncoderConfig, LocusModel
from registry.locus.scoring import embed_models, evaluate


@dataclass
class TrainConfig:
    """The recipe's settings. A checkpoint's meta records them (train_config) and nothing reads them back, so a
    checkpoint whose record names settings since removed loads and predicts as any other."""
    seed: int = 0
    max_steps: int = 240
    eval_every: int = 25          # steps between validation checks
    patience: int = 1000          # validation checks without improvement before stopping (default: never)
    n_targets: int = 1024         # target queries per step, shared by the models, disjoint from the sets below
    big_set: int = 8000           # per step, the pool of train queries (shared by the models) the sets are drawn from
    anchors: int = 1024           # largest set (a random subset of the pool's rows each model was evaluated on)
    min_anchors: int = 64         # smallest set (log-uniform size, one size per step)
    teacher_noise: float = 0.0    # std of Gaussian noise on query vectors in stage 1 (the LOCUS recipe's
                                  # regulariser; 0.05 raises test AUC to 0.738 but routes worse, see BENCHMARKS.md)
    teacher_queries: int = 128    # queries per stage-1 step (x all models)
    teacher_epochs: int = 30      # stage 1 runs this many epochs over all train pairs (best on val kept); at least 1
    teacher_batch: int = 4096     # random (model, query) pairs per stage-3 step, as the MF baseline trains
    teacher_wd: float = 1e-4      # stage-1 and stage-3 weight decay (the MF baseline's)
    teacher_weight: float = 1.0   # weight of mean((z - lin(statistic))^2) / across-model variance of the targets
    predictor_ft: float = 0.0     # predictor lr factor in the encoder stage (0: frozen)
    lr_encoder: float = 2e-3
    lr_predictor: float = 1e-3
    lr_min_frac: float = 0.05     # cosine decay to this fraction of the peak lr
    weight_decay: float = 0.01
    warmup: int = 20
    noise_start: float = 0.0      # std of Gaussian noise on query vectors, cosine-annealed over max_steps
    noise_end: float = 0.0
    grad_clip: float = 1.0
    eval_max_set: int | None = None  # cap per model when embedding for validation (seeded draw; None = all, as the
                                     # registry embeds a model from all of its evaluations)
    category_features: bool = False  # a last stage fits each query category's row of the predictor (a
                                     # logit offset per model and category, read from z: fit_category_rows)
    category_field: str = "category"  # the query column whose values are the categories ("category" or "source"),
                                      # or "category+source": source offsets fitted on top of the category's
    category_l2: float = 10.0     # prior pseudo-weight of each offset (interaction.L2; chosen on val)
    category_l2_deep: tuple = (10.0, 30.0, 100.0, 300.0)   # with several columns, the later columns' per-model
                                  # pseudo-weights training chooses from on val (fit_category_rows)
    category_text_scales: tuple = (1.0, 0.75, 0.5, 0.25)   # with several columns, the scales of the text logit
                                  # under the offsets training chooses from on val (fit_category_rows)
    category_fit: str = "train"   # the answers the rows are fitted to: "train", or "nontest" (train and val, with
                                  # every model embedded from them, as the registry embeds it and as the
                                  # per-category router and the interaction terms are refitted; val then measures
                                  # nothing of the rows)
    refit_epochs: int = 10        # >0: stage 3, the encoder frozen, every model embedded from all its train
                                  # evaluations, the predictor refitted on all train pairs (best val epoch kept)
    encoder: EncoderConfig = field(default_factory=lambda: EncoderConfig(dropout=0.0))


@dataclass
class StageData:
    """What every stage reads: the queries and answers (the train split's as tensors, read once), the config, the
    run's random generator, its progress callback and its start time."""
    qvecs: np.ndarray                 # [Nq,Dq] every query's vector
    correct: np.ndarray               # [M,Nq] int8, -1 = missing
    train_idx: np.ndarray
    val_idx: np.ndarray
    q_all: torch.Tensor               # [Nq,Dq] float32
    q_tr: torch.Tensor                # [Ntr,Dq] the train queries'
    y_tr: torch.Tensor                # [M,Ntr] 1.0 where right
    obs_tr: torch.Tensor              # [M,Ntr] bool, observed
    cfg: TrainConfig
    rng: np.random.Generator
    progress: Callable[[dict], None] | None
    t0: float

    @classmethod
    def of(cls, qvecs, correct, train_idx, val_idx, *, cfg: TrainConfig, progress=None,
           t0: float | None = None) -> StageData:
        q_all = torch.from_numpy(np.ascontiguousarray(qvecs, dtype=np.float32))
        tr = np.asarray(train_idx)
        c_tr = correct[:, tr]                                   # [M,Ntr]
        return cls(qvecs=qvecs, correct=correct, train_idx=tr, val_idx=val_idx, q_all=q_all,
                   q_tr=q_all[torch.from_numpy(tr)], y_tr=torch.from_numpy((c_tr == 1).astype(np.float32)),
                   obs_tr=torch.from_numpy(c_tr >= 0), cfg=cfg, rng=np.random.default_rng(cfg.seed),
                   progress=progress, t0=time.time() if t0 is None else t0)


class _BestOnVal:
    """Validation for the fitting stages (1 and 3): routing hit@1 of the model embeddings z on the val queries.
    Keeps the best state (ties: lower val BCE) with any extra tensors given, and reports progress as epoch
    `step` of `max_steps` of its stage."""

    def __init__(self, q_val, correct_val, data: StageData, stage: str, epochs: int):
        self.q, self.c = q_val, correct_val
        self.obs = torch.from_numpy(correct_val >= 0)
        self.y = torch.from_numpy((correct_val == 1).astype(np.float32))
        self.progress, self.t0, self.stage, self.max_steps = data.progress, data.t0, stage, epochs
        # (key = (val hit@1, -val BCE), epoch, model state, *extras) of the best check so far; None before the first
        self.best: tuple[tuple[float, float], int, dict[str, Any], *tuple[torch.Tensor, ...]] | None = None

    def check(self, model, z, ep: int, loss: float, *extras) -> None:
        model.eval()
        with torch.no_grad():
            lv = model.predict_logits(z, self.q)                                 # [M,Nval]
        bce = float(F.binary_cross_entropy_with_logits(lv[self.obs], self.y[self.obs]))
        hit = hit_at_k(lv.numpy(), self.c, 1)
        key = (round(hit, 9), -bce)
        if self.best is None or key > self.best[0]:
            self.best = (key, ep, copy.deepcopy(model.state_dict()), *(x.detach().clone() for x in extras))
        if self.progress:
            self.progress({"stage": self.stage, "step": ep, "max_steps": self.max_steps, "loss": loss, "cons": 0.0,
                           "val_hit@1": hit, "val_auc": float("nan"), "val_bce": bce,
                           "val_n_routed": int(len(np.unique(lv.argmax(0).numpy()))),
                           "best_val_hit@1": self.best[0][0], "best_step": self.best[1], "anchors": 0,
                           "noise": 0.0, "elapsed_s": time.time() - self.t0})

    def restore(self, model) -> tuple:
        """Loads the best state into model; returns (info, *extras)."""
        # the refit checks epoch 0 and the teacher epoch 1 (teacher_epochs >= 1), so restore follows a check
        assert self.best is not None, "restore() needs a check() first"
        key, ep, state, *extras = self.best
        model.load_state_dict(state)
        return ({"epoch": ep, "val_hit@1": key[0], "val_bce": -key[1]}, *extras)


def set_statistic(q, y, mask):
    """The linear teacher's input: mean over the real rows of [(2y-1) q, y].
    q [B,N,Dq], y [B,N] 0/1, mask [B,N] bool -> [B,Dq+1]"""
    w = mask.to(q.dtype)
    n = w.sum(1, keepdim=True).clamp_min(1.0)                              # [B,1]
    sign = (2 * y.to(q.dtype) - 1) * w                                     # [B,N], 0 on padding
    return torch.cat([torch.einsum("bn,bnd->bd", sign, q) / n, (y.to(q.dtype) * w).sum(1, keepdim=True) / n], 1)


def fit_linear_teacher(model: LocusModel, dec_params: list, data: StageData) -> tuple[torch.nn.Linear, dict]:
    """Stage 1, linear teacher: the predictor is fitted with each model's vector = lin(set_statistic of all its train
    evaluations), on every train (model, query) pair (batches of teacher_queries queries x all models). Unlike free
    vectors, this target is defined for any set, so stage 2 can regress each sampled set onto its own target, which
    is a smooth function the encoder can learn (and one that exists for models it has never seen).
    Keeps the epoch with the best val hit@1 (ties: val BCE); returns lin, frozen."""
    cfg, q_tr, y_tr, obs_tr = data.cfg, data.q_tr, data.y_tr, data.obs_tr
    M, n_tr = y_tr.shape
    # set_statistic over all train evaluations, written as one 2-D matmul (the shipped checkpoint was trained with
    # this form; the batched form in set_statistic differs by float rounding, ~1e-7)
    stat = torch.cat([(y_tr * 2 - 1).mul(obs_tr) @ q_tr, (y_tr * obs_tr).sum(1, keepdim=True)], 1) \
        / obs_tr.sum(1, keepdim=True).clamp_min(1)                         # [M,Dq+1]
    lin = torch.nn.Linear(q_tr.shape[1] + 1, model.cfg.d_model)
    params = dec_params + list(lin.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr_predictor, weight_decay=cfg.teacher_wd)
    va = np.asarray(data.val_idx)
    val = _BestOnVal(data.q_all[torch.from_numpy(va)], data.correct[:, va], data, "teacher", cfg.teacher_epochs)
    for ep in range(1, cfg.teacher_epochs + 1):
        model.train()
        perm = data.rng.permutation(n_tr)
        for s in range(0, n_tr, cfg.teacher_queries):
            t = torch.from_numpy(perm[s:s + cfg.teacher_queries])
            qt = q_tr[t]
            if cfg.teacher_noise > 0:
                qt = qt + cfg.teacher_noise * torch.randn(qt.shape)
            logits = model.logits_from_u(lin(stat), model.query_proj(qt))                # [M,T]
            valid = obs_tr[:, t]
            loss = F.binary_cross_entropy_with_logits(logits[valid], y_tr[:, t][valid])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
        with torch.no_grad():
            z = lin(stat)
        val.check(model, z, ep, float(loss.detach()), lin.weight, lin.bias)
    info, w, b = val.restore(model)
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(b)
    lin.requires_grad_(False)
    return lin, dict(info, kind="linear")


def _lr_factor(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to lr_min_frac of the peak."""
    if step <= cfg.warmup:
        return step / max(1, cfg.warmup)
    f = (step - cfg.warmup) / max(1, cfg.max_steps - cfg.warmup)
    return cfg.lr_min_frac + (1 - cfg.lr_min_frac) * 0.5 * (1 + math.cos(math.pi * f))


def fit_encoder(model: LocusModel, param_groups: list[dict], lin: torch.nn.Linear, data: StageData) -> dict:
    """Stage 2: each step every model embeds a random set of its train evaluations (a subset of a pool of big_set
    queries, size log-uniform in [min_anchors, anchors]) -> z, pulled to lin(statistic of that very set) relative to
    the spread between models, with BCE on target queries outside the pool. Validation every eval_every steps;
    loads the best state into model and returns {"best_step", "steps", "best_val", "history"}."""
    cfg, q_tr, y_tr, obs_tr, rng = data.cfg, data.q_tr, data.y_tr, data.obs_tr, data.rng
    opt = torch.optim.AdamW(param_groups, weight_decay=cfg.weight_decay)
    base_lrs = [g["lr"] for g in param_groups]
    obs_np = obs_tr.numpy()
    M, n_tr = y_tr.shape
    lo, hi = math.log(cfg.min_anchors), math.log(cfg.anchors)
    n_targets = min(cfg.n_targets, n_tr // 2)  # a small registry still leaves half its queries for the sets
    n_big = min(cfg.big_set, n_tr - n_targets)
    with torch.no_grad():
        t_var = lin(set_statistic(q_tr[None].expand(M, -1, -1), y_tr, obs_tr)).var(0).mean()   # across models

    best_key, best_state, best_step, best_val, bad = None, None, 0, {}, 0
    hist, losses = [], []
    step = 0
    for step in range(1, cfg.max_steps + 1):
        model.train()
        frac = (step - 1) / max(1, cfg.max_steps - 1)
        noise = cfg.noise_end + 0.5 * (cfg.noise_start - cfg.noise_end) * (1 + math.cos(math.pi * frac))
        lr_f = _lr_factor(cfg, step)
        for g, lr in zip(opt.param_groups, base_lrs):
            g["lr"] = lr * lr_f

        perm = rng.permutation(n_tr)
        t_np, big_np = perm[:n_targets], np.sort(perm[n_targets:n_targets + n_big])
        big_t = torch.from_numpy(big_np)
        qb = q_tr[big_t]
        if noise > 0:
            qb = qb + noise * torch.randn(qb.shape)
        Pb, Sb = model.row_proj(qb)                                                           # [nb,D] each
        yb = y_tr[:, big_t]                                                                   # [M,nb]

        # small sets: per model its own draw of k of its observed pool rows
        k = int(round(math.exp(rng.uniform(lo, hi))))
        pos = np.zeros((M, k), dtype=np.int64)
        mask_np = np.zeros((M, k), dtype=bool)
        mbn = obs_np[:, big_np]
        for m in range(M):
            r = np.nonzero(mbn[m])[0]
            a = rng.choice(r, size=min(k, len(r)), replace=False)
            pos[m, :len(a)], mask_np[m, :len(a)] = a, True
        pos_t = torch.from_numpy(pos)
        z = model.embed_proj(Pb[pos_t], Sb[pos_t], torch.gather(yb, 1, pos_t), torch.from_numpy(mask_np))

        t_idx = torch.from_numpy(t_np)
        qt = q_tr[t_idx]
        if noise > 0:
            qt = qt + noise * torch.randn(qt.shape)
        # z reaches the predictor through one node (a clone), as in the recipe that made the shipped checkpoint:
        # z's gradient then sums its uses in the same order, and a retrain reproduces that checkpoint bit for bit
        logits = model.logits_from_u(z.clone(), model.query_proj(qt))                         # [M,T]
        valid = obs_tr[:, t_idx]
        bce = F.binary_cross_entropy_with_logits(logits[valid], y_tr[:, t_idx][valid])
        target = lin(set_statistic(q_tr[big_t][pos_t], torch.gather(yb, 1, pos_t), torch.from_numpy(mask_np)))
        cons = ((z - target) ** 2).mean() / t_var               # relative to the spread between models: scale-free
        loss = bce + cfg.teacher_weight * cons
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        losses.append((float(bce.detach()), float(cons.detach())))

        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            val = evaluate(model, data.qvecs, data.correct, data.train_idx, data.val_idx, max_set=cfg.eval_max_set)
            key = (round(val["hit@1"], 9), -val["bce"])
            if best_key is None or key > best_key:
                best_key, best_step, best_val, bad = key, step, val, 0
                best_state = copy.deepcopy(model.state_dict())
            else:
                bad += 1
            lm = np.mean(losses[-cfg.eval_every:], axis=0)
            info = {"stage": "encoder", "step": step, "max_steps": cfg.max_steps, "loss": float(lm[0]),
                    "cons": float(lm[1]), "val_hit@1": val["hit@1"], "val_auc": val["auc"],
                    "val_bce": val["bce"], "val_n_routed": val["n_routed"], "best_val_hit@1": best_val["hit@1"],
                    "best_step": best_step, "anchors": k, "noise": noise, "elapsed_s": time.time() - data.t0}
            hist.append(info)
            if data.progress:
                data.progress(info)
            if bad >= cfg.patience:
                break
    assert best_state is not None, "max_steps >= 1: the last step always validates and keeps the first state seen"
    model.load_state_dict(best_state)
    return {"best_step": best_step, "steps": step, "best_val": best_val, "history": hist}


def refit_predictor(model: LocusModel, dec_params: list, data: StageData) -> dict:
    """Stage 3: with the encoder frozen, each model is embedded from all of its train evaluations (as the registry
    embeds a model from all of its evaluations) and the predictor is refitted on every train pair against those
    fixed embeddings, MF-style. Why: the encoder reproduces the teacher's vectors only roughly, and routing among the
    top models turns on small differences; the predictor learns to read the embeddings the encoder actually makes."""
    cfg, q_tr, y_tr = data.cfg, data.q_tr, data.y_tr
    z = torch.from_numpy(embed_models(model, data.qvecs, data.correct, data.train_idx))   # [M,D], fixed from here on
    opt = torch.optim.AdamW(dec_params, lr=cfg.lr_predictor, weight_decay=cfg.teacher_wd)
    pm, pn = (torch.from_numpy(a) for a in np.nonzero(data.obs_tr.numpy()))
    py = y_tr[pm, pn]
    va = np.asarray(data.val_idx)
    val = _BestOnVal(torch.from_numpy(np.ascontiguousarray(data.qvecs[va], dtype=np.float32)), data.correct[:, va],
                     data, "refit", cfg.refit_epochs)
    for ep in range(0, cfg.refit_epochs + 1):                                 # epoch 0: the stage-2 predictor
        loss = float("nan")
        if ep > 0:
            model.train()
            perm = torch.from_numpy(data.rng.permutation(len(py)))
            for s in range(0, len(perm), cfg.teacher_batch):
                b = perm[s:s + cfg.teacher_batch]
                batch_loss = F.binary_cross_entropy_with_logits(
                    model.pair_logits(z[pm[b]], model.query_proj(q_tr[pn[b]])), py[b])
                opt.zero_grad(set_to_none=True)
                batch_loss.backward()
                torch.nn.utils.clip_grad_norm_(dec_params, cfg.grad_clip)
                opt.step()
            loss = float(batch_loss.detach())                                    # the epoch's last batch
        val.check(model, z, ep, loss)
    return val.restore(model)[0]
