"""Training LOCUS, embedding models, and scoring queries.

Why the training differs from the reference code (see notes/reference-runs.md): the reference collapses to routing
everything to the strongest model; so did a one-stage version of this file (the encoder learns slowly on 2 cores, and
the predictor only sees noisy embeddings, so it learns base rates), and so did a recipe that distilled one free
vector per model into the encoder (the encoder kept about 6 directions of them, and routing lives in the small
differences between the top models). The default recipe has three stages:

1. Teacher: the predictor (the LOCUS decoder, unchanged) is fitted on every train (model, query) pair with each
   model's vector = lin(set statistic), the statistic being the mean over the model's train evaluations of
   [(2y-1) q, y] (where in query space the model is right rather than wrong, and how often). A linear map of it
   already routes above MF on this data; the point is that it is defined for *any* set. The epoch with the best
   val hit@1 is kept.
2. Encoder: each step every model embeds a random set of its train evaluations (size log-uniform in
   [min_anchors, anchors]) and z is pulled to lin(statistic of that very set), relative to the spread between
   models: a smooth target the set transformer learns to about 1% (it is an attention average of the rows), for
   seen and unseen models alike. BCE on target queries outside the set rides along; the predictor stays frozen.
3. Refit: with the encoder frozen, every model is embedded from all its train evaluations (the registry embeds a
   model from all of its evaluations) and the predictor is refitted on the train pairs against those embeddings;
   the epoch (0 = unchanged) with the best val hit@1 is kept.

teacher="free" is the earlier free-vector teacher (distilled by pulling z to each model's vector).
With teacher_epochs=0 and big_set_embed=True it is the one-stage recipe: z_big from a big set, z_small from a subset
of it, BCE through both and a consistency term.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from registry.locus import label_columns
from registry.locus.baselines import hit_at_k, predictor_metrics
from registry.locus.network import EncoderConfig, LocusModel
from registry.locus.disagreement import disagreement_matrix


@dataclass
class TrainConfig:
    seed: int = 0
    max_steps: int = 240
    eval_every: int = 25          # steps between validation checks
    patience: int = 1000          # validation checks without improvement before stopping (default: never)
    n_targets: int = 1024         # target queries per step, shared by the models, disjoint from the sets below
    big_set: int = 8000           # per step, each model embeds this many train evaluations (shared queries) -> z_big
    big_set_embed: bool = False   # False: the big set is only the pool the small sets are drawn from (no z_big)
    anchors: int = 1024           # largest small set (a random subset of the big set) -> z_small
    min_anchors: int = 64         # smallest small set (log-uniform size, one size per step)
    consistency: float = 1.0      # weight of mean((z_small - sg(z_big))^2) / mean across-model variance of sg(z_big)
    teacher: str = "linear"       # stage-1 model vectors: "linear" = a learned linear map of the set statistic
                                  # [mean((2y-1) q), mean(y)] (defined for any set, so stage 2 regresses each
                                  # set onto its own target), or "free" = one free vector per model
    teacher_noise: float = 0.0    # std of Gaussian noise on query vectors in stage 1 (the LOCUS recipe's
                                  # regulariser; 0.05 raises test AUC to 0.738 but routes worse, see BENCHMARKS.md)
    teacher_queries: int = 128    # queries per stage-1 step for the linear teacher (x all models)
    teacher_epochs: int = 30      # >0: stage 1 runs this many epochs over all train pairs (best on val kept), and
                                  # the encoder stage then pulls each set's z onto its teacher vector
    teacher_batch: int = 4096     # random (model, query) pairs per stage-1 step, as the MF baseline trains
    teacher_init: float = 1.0     # std of the free vectors at init, times d_model^-0.5
    teacher_wd: float = 1e-4      # stage-1 weight decay (the MF baseline's)
    teacher_weight: float = 1.0   # weight of mean((z - e_model)^2) / across-model variance of e, for z_big and z_small
    predictor_ft: float = 0.0     # predictor lr factor in the encoder stage when a teacher was fitted
    geo_weight: float = 0.1       # weight of the geometry loss (s*||z_a - z_b|| - disagreement_ab)^2 on z_big
    lr_encoder: float = 2e-3
    lr_predictor: float = 1e-3
    lr_min_frac: float = 0.05     # cosine decay to this fraction of the peak lr
    weight_decay: float = 0.01
    warmup: int = 20
    noise_start: float = 0.0      # std of Gaussian noise on query vectors, cosine-annealed over max_steps
    noise_end: float = 0.0
    grad_clip: float = 1.0
    route_weight: float = 0.0     # stage 2: weight of the listwise routing loss (softmax over models per target query)
    ema: float = 0.0              # validation and the result use an exponential moving average of the weights (0: off)
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
    P_all, S_all = model.row_proj(q)                                       # [Nq,D] each, once for every model
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
        it = torch.from_numpy(idx)
        zs.append(model.embed_proj(P_all[it], S_all[it], torch.from_numpy(y), torch.from_numpy(mask)))
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
def predict_proba(model: LocusModel, z: np.ndarray, qvecs: np.ndarray, categories=None) -> np.ndarray:
    """P(correct) [M,N] for model embeddings z [M,D] and query vectors [N,Dq] (with their category names [N], for
    a model that reads them)."""
    model.eval()
    return model.p_correct(z, qvecs, categories)


def route(model: LocusModel, z: np.ndarray, qvecs: np.ndarray, k: int = 1, categories=None) -> np.ndarray:
    """[k,N] indices of the k models most likely to answer each query, best first."""
    p = predict_proba(model, z, qvecs, categories)
    return np.argsort(-p.astype(np.float64), axis=0, kind="stable")[:k]


def evaluate(model: LocusModel, qvecs, correct, embed_idx, eval_idx, max_set=None, seed=None,
             categories=None) -> dict:
    """Routing and predictor metrics on eval_idx, with models embedded from their evaluations on embed_idx
    (categories [Nq]: every query's category name, or None)."""
    z = embed_models(model, qvecs, correct, embed_idx, max_set=max_set, seed=seed)
    eval_idx = np.asarray(eval_idx)
    p = predict_proba(model, z, qvecs[eval_idx], None if categories is None else np.asarray(categories)[eval_idx])
    c = correct[:, eval_idx]
    obs = c >= 0
    pt = torch.from_numpy(p[obs].astype(np.float64)).clamp(1e-7, 1 - 1e-7)
    bce = float(F.binary_cross_entropy(pt, torch.from_numpy((c[obs] == 1).astype(np.float64))))
    n_routed = int(len(np.unique(np.argmax(p.astype(np.float64), axis=0))))
    return {"hit@1": hit_at_k(p, c, 1), "bce": bce, "n_routed": n_routed, **predictor_metrics(p, c)}


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


class _BestOnVal:
    """Validation for the fitting stages (1 and 3): routing hit@1 of the model embeddings z on the val queries.
    Keeps the best state (ties: lower val BCE) with any extra tensors given, and reports progress as epoch
    `step` of `max_steps` of its stage."""

    def __init__(self, q_val, correct_val, progress, t0, stage: str, epochs: int):
        self.q, self.c = q_val, correct_val
        self.obs = torch.from_numpy(correct_val >= 0)
        self.y = torch.from_numpy((correct_val == 1).astype(np.float32))
        self.progress, self.t0, self.stage, self.max_steps = progress, t0, stage, epochs
        self.best = None                                   # (key, epoch, model state, *extras)

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
                           "geo": 0.0, "val_hit@1": hit, "val_auc": float("nan"), "val_bce": bce,
                           "val_n_routed": int(len(np.unique(lv.argmax(0).numpy()))),
                           "best_val_hit@1": self.best[0][0], "best_step": self.best[1], "anchors": 0,
                           "noise": 0.0, "elapsed_s": time.time() - self.t0})

    def restore(self, model) -> tuple:
        """Loads the best state into model; returns (info, *extras)."""
        key, ep, state, *extras = self.best
        model.load_state_dict(state)
        return ({"epoch": ep, "val_hit@1": key[0], "val_bce": -key[1]}, *extras)


def _fit_teacher(model, dec_params, log_s, q_tr, y_tr, obs_tr, dis, q_all, correct, val_idx, cfg, rng, progress, t0):
    """Stage 1: predictor + one free vector per model, BCE on all train pairs (minibatches of n_targets queries),
    plus the geometry loss on the vectors. Keeps the epoch with the best val hit@1 (ties: val BCE); loads that
    predictor into `model` and returns the vectors [M,D] (fixed from then on)."""
    M, n_tr = y_tr.shape
    # small init: directions the predictor never uses stay near the mean, so the encoder need not learn them
    e = torch.nn.Parameter(torch.randn(M, model.cfg.d_model) * cfg.teacher_init * model.cfg.d_model ** -0.5)
    params = [{"params": dec_params + [e], "lr": cfg.lr_predictor, "weight_decay": cfg.teacher_wd}]
    if cfg.geo_weight > 0:
        params.append({"params": [log_s], "lr": cfg.lr_predictor, "weight_decay": 0.0})
    opt = torch.optim.AdamW(params, weight_decay=cfg.weight_decay)
    val = _BestOnVal(q_all[torch.from_numpy(np.asarray(val_idx))], correct[:, np.asarray(val_idx)], progress, t0,
                     "teacher", cfg.teacher_epochs)
    pm, pn = (torch.from_numpy(a) for a in np.nonzero(obs_tr.numpy()))     # observed (model, query) train pairs
    py = y_tr[pm, pn]
    for ep in range(1, cfg.teacher_epochs + 1):
        model.train()
        perm = torch.from_numpy(rng.permutation(len(py)))
        for s in range(0, len(perm), cfg.teacher_batch):
            b = perm[s:s + cfg.teacher_batch]                              # [P] random pairs, as MF trains
            logits = model.pair_logits(e[pm[b]], model.query_proj(q_tr[pn[b]]))
            loss = F.binary_cross_entropy_with_logits(logits, py[b])
            if cfg.geo_weight > 0:
                loss = loss + cfg.geo_weight * ((log_s.exp() * torch.pdist(e) - dis) ** 2).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for g in params for p in g["params"]], cfg.grad_clip)
            opt.step()
        val.check(model, e, ep, float(loss.detach()), e)
    info, e = val.restore(model)
    with torch.no_grad():
        # exact reparametrisation: vectors centred and scaled to unit spread (one scalar, so distances keep their
        # geometry), the predictor's z-facing weights absorb the change; the encoder's targets then sit at the scale
        # its LayerNorm'd output has from the start
        mu, sd = e.mean(0), e.std(0).mean() + 1e-6
        model.w_z.bias += model.w_z.weight @ mu
        model.w_z.weight *= sd
        model.w_u.weight += model.w_zu.weight * mu[None]
        model.w_zu.weight *= sd
        e = (e - mu) / sd
    return e, dict(info, scale=float(sd))


def category_vocabulary(categories, train_idx, field: str = "category") -> tuple[str, ...]:
    """The category names of the train queries, sorted ("(none)", the registry's name for a missing one, left out).
    With several columns (field "category+source", categories their joined labels): "column:value" names, column
    by column, each column's values sorted."""
    from registry.core.errors import InputError

    if categories is None:
        raise InputError("category features need the queries' categories")
    cols = label_columns.parse(field) or (field,)
    labels = np.asarray(categories, dtype=object)[np.asarray(train_idx)].tolist()
    if len(cols) == 1:
        names = sorted({c for c in labels if isinstance(c, str) and c != label_columns.NONE})
    else:
        values = [label_columns.split(c, len(cols)) for c in labels]
        names = [f"{col}:{v}" for k, col in enumerate(cols) for v in sorted({vs[k] for vs in values} - {None})]
    if not names:
        raise InputError("category features need categories, and no train query has one")
    return tuple(names)


def _category_targets(lg, c, ids, n_names: int, l2: float, deep_l2: float):
    """Every model's offset on every category row, fitted to its answers c [M,N] on top of the predictor's logits
    lg [M,N] (ids [N, columns], 0: none): (offsets [M,C] of each model, shift [C] common to all models). The first
    column's offsets are the maximum-a-posteriori shift of the logits per model and value (prior pseudo-weight l2:
    interaction.category_offsets). Each later column is fitted on top of the columns before it, its value's offset
    shrunk towards theirs: a shift common to all models first (pseudo-weight l2, pooled over the models: a value's
    difficulty, which moves AUC and never routing), then each model's own deviation (pseudo-weight deep_l2, chosen
    on val: 91 sources have a tenth of a category's answers each)."""
    from registry.locus.interaction import category_offsets

    lg = np.array(lg, dtype=np.float64)
    M = len(lg)
    offsets, shift = np.zeros((M, n_names)), np.zeros(n_names)
    for k in range(ids.shape[1]):
        has = ids[:, k] > 0
        cat = ids[has, k] - 1
        if k > 0:
            pooled = category_offsets(lg[:, has].reshape(1, -1), c[:, has].reshape(1, -1), np.tile(cat, M),
                                      n_names, l2)[0]
            shift += pooled
            lg[:, has] += pooled[cat][None]
        b = category_offsets(lg[:, has], c[:, has], cat, n_names, l2 if k == 0 else deep_l2)   # [M,C]
        offsets += b
        lg[:, has] += b[:, cat]
    return offsets, shift


def _scale_text_logit(model: LocusModel, scale: float) -> None:
    """Multiplies the predictor's text logit by scale, in place (its last layer: head, and q_bias if any)."""
    model.head.weight.mul_(scale)
    model.head.bias.mul_(scale)
    if model.cfg.query_bias:
        model.q_bias.weight.mul_(scale)
        model.q_bias.bias.mul_(scale)


@torch.no_grad()
def fit_category_rows(model: LocusModel, qvecs, correct, train_idx, val_idx, categories, field: str = "category",
                      l2: float = 10.0, fit: str = "train", deep_l2: tuple = (10.0, 30.0, 100.0, 300.0),
                      text_scales: tuple = (1.0, 0.75, 0.5, 0.25)) -> tuple[LocusModel, EncoderConfig, dict]:
    """The last stage of category features: a copy of the trained (text-only) model with one row per
    category of the train queries, so that logit += [z, 1] . row(category) (summed over the columns, for a field
    of several: "category+source").

    Why this form and this fit (measured on MMLU-Pro's val split, BENCHMARKS.md): rows added to the query projection
    and trained by SGD with the rest did not move routing (the predictor learns base rates and difficulty, not which
    model is better on what), and neither did rows read against z trained by SGD on the frozen predictor. What the
    per-category router knows is a per-(model, category) offset. So each model's offset on each category is fitted
    directly (_category_targets), with every model embedded from its train evaluations as in the refit stage; the
    rows are then the least-norm solution of [z_m, 1] . row_c = offset(m, c), exact for the training models (fewer
    models than dimensions), and defined for any model embedded later; a shift common to all models goes into the
    rows' constant term alone, so every model gets it. fit="nontest" fits to the train and val answers, every
    model embedded from them (see TrainConfig.category_fit).

    With several columns two more choices are made on val, each candidate fitted to train (the val answers never
    fitted): the later columns' per-model pseudo-weight (deep_l2: the best val hit@1, ties val AUC), and a scale
    of the text logit under the offsets (text_scales: the lowest val log loss; the text-only predictor is
    overconfident once the offsets carry what the category says, measured on val), written into the predictor's
    last layer. A nontest fit uses the choices of the train fit. One column keeps the scale 1 and no choice, as
    every checkpoint before the option was made."""
    from registry.core.errors import InputError
    from registry.locus.interaction import logit

    if fit not in ("train", "nontest"):
        raise InputError(f"category rows are fitted on 'train' or 'nontest', not {fit!r}")
    va, trn = np.asarray(val_idx), np.asarray(train_idx)
    tr = trn if fit == "train" else np.sort(np.concatenate([train_idx, val_idx]))
    names = category_vocabulary(categories, tr, field)
    ecfg = replace(model.cfg, categories=names, category_field=field)
    out = LocusModel(ecfg)
    out.load_state_dict({**model.state_dict(), "q_cat.weight": torch.zeros(len(names) + 1, ecfg.d_model + 1)})
    out.eval()
    ids = out.category_ids(categories)
    ids = ids.reshape(len(ids), -1)                                       # [Nq, columns], 0 = none
    cv, cats_va = correct[:, va], np.asarray(categories, dtype=object)[va]
    several = ids.shape[1] > 1

    def embedded(idx):             # every model embedded from its answers on idx, and the predictor's logits there
        z = embed_models(model, qvecs, correct, idx).astype(np.float64)  # [M,D], as the refit stage embeds
        return z, logit(model.p_correct(z.astype(np.float32), qvecs[idx]))

    def rows_of(z, offsets, shift):
        Z = np.concatenate([z, np.ones((len(z), 1))], 1)                  # [M,D+1]
        rows = np.linalg.pinv(Z) @ offsets                                # [D+1,C]
        rows[-1] += shift
        return Z, rows

    def on_val(m, z, cats=None):
        p = m.p_correct(z.astype(np.float32), qvecs[va], cats)
        obs = cv >= 0
        pp = np.clip(p[obs].astype(np.float64), 1e-7, 1 - 1e-7)
        y = cv[obs] == 1
        return {"hit@1": hit_at_k(p, cv, 1), "auc": predictor_metrics(p, cv)["auc"],
                "log_loss": float(-np.mean(np.where(y, np.log(pp), np.log(1 - pp))))}

    def fitted(z, lg, idx, scale, w):
        """out with the text logit scaled and the rows fitted on top of it (in place); Z, rows, offsets, shift."""
        out.load_state_dict({**model.state_dict(), "q_cat.weight": torch.zeros_like(out.q_cat.weight)})
        _scale_text_logit(out, scale)
        o, sh = _category_targets(scale * lg, correct[:, idx], ids[idx], len(names), l2, w)
        Z, rows = rows_of(z, o, sh)
        out.q_cat.weight[1:] = torch.from_numpy(rows.T.astype(np.float32))
        return Z, rows, o, sh

    choices, scale, chosen = {}, 1.0, None
    if several:
        z, lg = embedded(trn)
        best = {}
        for sc in text_scales:
            for w in deep_l2:
                fitted(z, lg, trn, sc, w)
                choices[(sc, w)] = on_val(out, z, cats_va)
            best[sc] = max(deep_l2, key=lambda w: (round(choices[(sc, w)]["hit@1"], 9), choices[(sc, w)]["auc"]))
        scale = min(text_scales, key=lambda sc: choices[(sc, best[sc])]["log_loss"])
        chosen = best[scale]
    if not several or fit != "train":
        z, lg = embedded(tr)
    Z, rows, o, sh = fitted(z, lg, tr, scale, chosen)
    info = {"field": field, "categories": len(names), "l2": l2, "fit": fit,
            "fit_max_error": float(np.abs(Z @ rows - o - sh[None]).max()),
            "val_before": on_val(model, z), "val_after": on_val(out, z, cats_va)}
    if several:
        info.update(deep_l2=chosen, text_scale=scale,
                    choices_val={f"scale {sc:g}, l2 {w:g}": v for (sc, w), v in choices.items()})
    return out, ecfg, info


def set_statistic(q, y, mask):
    """The linear teacher's input: mean over the real rows of [(2y-1) q, y].
    q [B,N,Dq], y [B,N] 0/1, mask [B,N] bool -> [B,Dq+1]"""
    w = mask.to(q.dtype)
    n = w.sum(1, keepdim=True).clamp_min(1.0)                              # [B,1]
    sign = (2 * y.to(q.dtype) - 1) * w                                     # [B,N], 0 on padding
    return torch.cat([torch.einsum("bn,bnd->bd", sign, q) / n, (y.to(q.dtype) * w).sum(1, keepdim=True) / n], 1)


def _fit_linear_teacher(model, dec_params, q_tr, y_tr, obs_tr, q_all, correct, val_idx, cfg, rng, progress, t0):
    """Stage 1, linear teacher: the predictor is fitted with each model's vector = lin(set_statistic of all its train
    evaluations), on every train (model, query) pair (batches of teacher_queries queries x all models). Unlike free
    vectors, this target is defined for any set, so stage 2 can regress each sampled set onto its own target, which
    is a smooth function the encoder can learn (and one that exists for models it has never seen).
    Keeps the epoch with the best val hit@1 (ties: val BCE); returns lin, frozen."""
    M, n_tr = y_tr.shape
    # set_statistic over all train evaluations, written as one 2-D matmul (the shipped checkpoint was trained with
    # this form; the batched form in set_statistic differs by float rounding, ~1e-7)
    stat = torch.cat([(y_tr * 2 - 1).mul(obs_tr) @ q_tr, (y_tr * obs_tr).sum(1, keepdim=True)], 1) \
        / obs_tr.sum(1, keepdim=True).clamp_min(1)                         # [M,Dq+1]
    lin = torch.nn.Linear(q_tr.shape[1] + 1, model.cfg.d_model)
    params = dec_params + list(lin.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr_predictor, weight_decay=cfg.teacher_wd)
    val = _BestOnVal(q_all[torch.from_numpy(np.asarray(val_idx))], correct[:, np.asarray(val_idx)], progress, t0,
                     "teacher", cfg.teacher_epochs)
    for ep in range(1, cfg.teacher_epochs + 1):
        model.train()
        perm = rng.permutation(n_tr)
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


def _refit_predictor(model, dec_params, qvecs, correct, tr, val_idx, q_tr, y_tr, obs_tr, cfg, rng, progress, t0):
    """Stage 3: with the encoder frozen, each model is embedded from all of its train evaluations (as the registry
    embeds a model from all of its evaluations) and the predictor is refitted on every train pair against those
    fixed embeddings, MF-style. Why: the encoder reproduces the teacher's vectors only roughly, and routing among the
    top models turns on small differences; the predictor learns to read the embeddings the encoder actually makes."""
    z = torch.from_numpy(embed_models(model, qvecs, correct, tr))             # [M,D], fixed from here on
    opt = torch.optim.AdamW(dec_params, lr=cfg.lr_predictor, weight_decay=cfg.teacher_wd)
    pm, pn = (torch.from_numpy(a) for a in np.nonzero(obs_tr.numpy()))
    py = y_tr[pm, pn]
    val = _BestOnVal(torch.from_numpy(np.ascontiguousarray(qvecs[np.asarray(val_idx)], dtype=np.float32)),
                     correct[:, np.asarray(val_idx)], progress, t0, "refit", cfg.refit_epochs)
    for ep in range(0, cfg.refit_epochs + 1):                                 # epoch 0: the stage-2 predictor
        loss = float("nan")
        if ep > 0:
            model.train()
            perm = torch.from_numpy(rng.permutation(len(py)))
            for s in range(0, len(perm), cfg.teacher_batch):
                b = perm[s:s + cfg.teacher_batch]
                loss = F.binary_cross_entropy_with_logits(model.pair_logits(z[pm[b]], model.query_proj(q_tr[pn[b]])),
                                                          py[b])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(dec_params, cfg.grad_clip)
                opt.step()
            loss = float(loss.detach())
        val.check(model, z, ep, loss)
    return val.restore(model)[0]


def train(qvecs: np.ndarray, correct: np.ndarray, train_idx, val_idx, cfg: TrainConfig | None = None,
          progress: Callable[[dict], None] | None = None, categories=None) -> tuple[LocusModel, EncoderConfig, dict]:
    """Train on the train queries; keep the state with the best validation hit@1 (ties: lower validation BCE).

    Each step: the train queries are split at random into targets (n_targets) and the rest; every model embeds its
    evaluations on big_set of the rest (the same queries for all models) -> z_big, nearly deterministic, and a random
    subset of that (size log-uniform in [min_anchors, anchors], its own draw per model) -> z_small. The predictor is
    trained with BCE on the targets from both embeddings (targets are never in a set, as at routing time); a
    consistency term pulls z_small to stopgrad(z_big), so a few evaluations embed close to many.

    With cfg.category_features, categories [Nq] (each query's value of cfg.category_field; None or "(none)": none)
    are read by a last stage (fit_category_rows); nothing before it reads them, so every other weight is the
    text-only model's.
    """
    cfg = cfg or TrainConfig()
    t0 = time.time()
    det_before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(cfg.seed)
        rng = np.random.default_rng(cfg.seed)
        ecfg = copy.deepcopy(cfg.encoder)
        model = LocusModel(ecfg)
        is_dec = lambda n: n.startswith(("q_proj", "q_bias", "w_", "head"))
        enc_params = [p for n, p in model.named_parameters() if not is_dec(n)]
        dec_params = [p for n, p in model.named_parameters() if is_dec(n)]
        log_s = torch.zeros((), requires_grad=True)              # geometry scale, training only (not saved)
        groups = [{"params": enc_params, "lr": cfg.lr_encoder}, {"params": dec_params, "lr": cfg.lr_predictor}]
        if cfg.geo_weight > 0:
            groups.append({"params": [log_s], "lr": cfg.lr_predictor, "weight_decay": 0.0})
        opt = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
        base_lrs = [g["lr"] for g in groups]
        ema_model = copy.deepcopy(model) if cfg.ema > 0 else model

        q_all = torch.from_numpy(np.ascontiguousarray(qvecs, dtype=np.float32))
        tr = np.asarray(train_idx)
        c_tr = correct[:, tr]                                   # [M,Ntr]
        M, n_tr = c_tr.shape
        y_tr = torch.from_numpy((c_tr == 1).astype(np.float32))
        obs_np = c_tr >= 0
        obs_tr = torch.from_numpy(obs_np)
        q_tr = q_all[torch.from_numpy(tr)]                      # [Ntr,Dq]
        lo, hi = math.log(cfg.min_anchors), math.log(cfg.anchors)
        n_targets = min(cfg.n_targets, n_tr // 2)  # a small registry still leaves half its queries for the sets
        n_big = min(cfg.big_set, n_tr - n_targets)
        iu = np.triu_indices(M, 1)
        dis = torch.from_numpy(np.nan_to_num(disagreement_matrix(correct[:, tr])[0])[iu].astype(np.float32))

        teacher, teacher_info, lin = None, {}, None
        if cfg.teacher_epochs > 0 and cfg.teacher == "linear":
            lin, teacher_info = _fit_linear_teacher(model, dec_params, q_tr, y_tr, obs_tr, q_all, correct, val_idx,
                                                    cfg, rng, progress, t0)
            base_lrs[1] *= cfg.predictor_ft
            with torch.no_grad():
                full = lin(set_statistic(q_tr[None].expand(M, -1, -1), y_tr, obs_tr))         # [M,D]
            t_var = full.var(0).mean()
        elif cfg.teacher_epochs > 0:
            teacher, teacher_info = _fit_teacher(model, dec_params, log_s, q_tr, y_tr, obs_tr, dis, q_all, correct,
                                                 val_idx, cfg, rng, progress, t0)
            base_lrs[1] *= cfg.predictor_ft
            t_var = teacher.var(0).mean()

        best_key, best_state, best_step, best_val, bad = None, None, 0, {}, 0
        hist, losses = [], []
        step = 0
        for step in range(1, cfg.max_steps + 1):
            model.train()
            frac = (step - 1) / max(1, cfg.max_steps - 1)
            noise = cfg.noise_end + 0.5 * (cfg.noise_start - cfg.noise_end) * (1 + math.cos(math.pi * frac))
            if step <= cfg.warmup:
                lr_f = step / max(1, cfg.warmup)
            else:
                f = (step - cfg.warmup) / max(1, cfg.max_steps - cfg.warmup)
                lr_f = cfg.lr_min_frac + (1 - cfg.lr_min_frac) * 0.5 * (1 + math.cos(math.pi * f))
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
            mb = obs_tr[:, big_t]
            z_big = None
            if cfg.big_set_embed:
                z_big = model.embed_proj(Pb[None].expand(M, -1, -1), Sb[None].expand(M, -1, -1), yb, mb)   # [M,D]

            # small sets: per model its own draw of k of its observed big-set rows
            k = int(round(math.exp(rng.uniform(lo, hi))))
            pos = np.zeros((M, k), dtype=np.int64)
            mask_np = np.zeros((M, k), dtype=bool)
            mbn = obs_np[:, big_np]
            for m in range(M):
                r = np.nonzero(mbn[m])[0]
                a = rng.choice(r, size=min(k, len(r)), replace=False)
                pos[m, :len(a)], mask_np[m, :len(a)] = a, True
            pos_t = torch.from_numpy(pos)
            z_small = model.embed_proj(Pb[pos_t], Sb[pos_t], torch.gather(yb, 1, pos_t), torch.from_numpy(mask_np))
            zs = [z for z in (z_big, z_small) if z is not None]

            t_idx = torch.from_numpy(t_np)
            qt = q_tr[t_idx]
            if noise > 0:
                qt = qt + noise * torch.randn(qt.shape)
            u = model.query_proj(qt)                                                              # [T,D]
            logits = model.logits_from_u(torch.cat(zs), u)                                        # [2M or M,T]
            yt, valid = y_tr[:, t_idx].repeat(len(zs), 1), obs_tr[:, t_idx].repeat(len(zs), 1)
            bce = F.binary_cross_entropy_with_logits(logits[valid], yt[valid])
            loss = len(zs) * bce
            cons = torch.zeros(())
            if z_big is not None and cfg.consistency > 0:
                zb = z_big.detach()                             # relative to the spread between models: scale-free
                cons = ((z_small - zb) ** 2).mean() / (zb.var(0).mean() + 1e-6)
                loss = loss + cfg.consistency * cons
            if cfg.route_weight > 0:
                loss = loss + cfg.route_weight * routing_loss(logits[:M], yt[:M], valid[:M])
            if lin is not None:                       # each set's own target: lin(statistic of that set)
                targets = []
                if z_big is not None:
                    targets.append(lin(set_statistic(q_tr[big_t][None].expand(M, -1, -1), yb, mb)))
                targets.append(lin(set_statistic(q_tr[big_t][pos_t], torch.gather(yb, 1, pos_t),
                                                 torch.from_numpy(mask_np))))
                cons = sum(((z - t) ** 2).mean() for z, t in zip(zs, targets)) / (len(zs) * t_var)
                loss = loss + cfg.teacher_weight * len(zs) * cons
            elif teacher is not None:
                cons = sum(((z - teacher) ** 2).mean() for z in zs) / (len(zs) * t_var)   # logged in place of cons
                loss = loss + cfg.teacher_weight * len(zs) * cons
            geo = torch.zeros(())
            if cfg.geo_weight > 0 and teacher is None and lin is None:  # with a teacher, geometry is shaped there
                dist = torch.pdist(zs[0])                                                         # [pairs], triu order
                geo = ((log_s.exp() * dist - dis) ** 2).mean()
                loss = loss + cfg.geo_weight * geo
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            if cfg.ema > 0:
                with torch.no_grad():
                    d = min(cfg.ema, (step - 1) / (step + 9))             # short warm-up of the average
                    for pe, p in zip(ema_model.parameters(), model.parameters()):
                        pe.lerp_(p, 1 - d)
            losses.append((float(bce.detach()), float(cons.detach()), float(geo.detach())))

            if step % cfg.eval_every == 0 or step == cfg.max_steps:
                val = evaluate(ema_model, qvecs, correct, tr, val_idx, max_set=cfg.eval_max_set)
                key = (round(val["hit@1"], 9), -val["bce"])
                improved = best_key is None or key > best_key
                if improved:
                    best_key, best_step, best_val, bad = key, step, val, 0
                    best_state = copy.deepcopy(ema_model.state_dict())
                else:
                    bad += 1
                lm = np.mean(losses[-cfg.eval_every:], axis=0)
                info = {"stage": "encoder", "step": step, "max_steps": cfg.max_steps, "loss": float(lm[0]),
                        "cons": float(lm[1]), "geo": float(lm[2]), "val_hit@1": val["hit@1"], "val_auc": val["auc"],
                        "val_bce": val["bce"], "val_n_routed": val["n_routed"], "best_val_hit@1": best_val["hit@1"],
                        "best_step": best_step, "anchors": k, "noise": noise, "elapsed_s": time.time() - t0}
                hist.append(info)
                if progress:
                    progress(info)
                if bad >= cfg.patience:
                    break
        model.load_state_dict(best_state)
        refit_info = {}
        if cfg.refit_epochs > 0:
            refit_info = _refit_predictor(model, dec_params, qvecs, correct, tr, val_idx, q_tr, y_tr, obs_tr, cfg, rng,
                                          progress, t0)
        model.eval()
        category_info = {}
        if cfg.category_features:
            model, ecfg, category_info = fit_category_rows(model, qvecs, correct, tr, val_idx, categories,
                                                           cfg.category_field, cfg.category_l2, cfg.category_fit,
                                                           tuple(cfg.category_l2_deep),
                                                           tuple(cfg.category_text_scales))
        metrics = {"best_step": best_step, "steps": step, "teacher": teacher_info, "refit": refit_info,
                   "category": category_info,
                   "wall_s": time.time() - t0, "n_params": model.n_params(),
                   **{f"val_{k}": v for k, v in best_val.items()}, "train_config": asdict(cfg),
                   "history": [{k: h[k] for k in ("step", "loss", "cons", "val_hit@1", "val_auc", "val_bce",
                                                  "val_n_routed")} for h in hist]}
        return model, ecfg, metrics
    finally:
        torch.use_deterministic_algorithms(det_before)


def checkpoint_from(data, seed: int = 0, anchors: int | None = None, max_steps: int | None = None,
                    epochs: int | None = None, name: str | None = None, progress=None,
                    category_features: bool = False, category_field: str = "category",
                    category_fit: str = "train") -> tuple[bytes, dict]:
    """Train on a registry's dataset (evaluation.Dataset: train split to fit, val to select) and return the
    checkpoint (safetensors bytes) and its meta. Models without train evaluations are left out. With
    category_features the predictor also reads each query's value of category_field."""
    import json

    from registry.locus import text_encoder
    from registry.locus.checkpoint import save_checkpoint
    from registry.core.errors import InputError, RegistryError

    for flag, value in (("--anchors", anchors), ("--steps", max_steps), ("--epochs", epochs)):
        if value is not None and value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    cfg = TrainConfig(seed=seed, category_features=category_features, category_field=category_field,
                      category_fit=category_fit)
    if anchors is not None:
        cfg = replace(cfg, anchors=anchors, min_anchors=min(cfg.min_anchors, anchors))
    if max_steps is not None:
        cfg = replace(cfg, max_steps=max_steps)
    if epochs is not None:
        cfg = replace(cfg, teacher_epochs=epochs)
    for split in ("train", "val"):
        if len(data.splits[split]) == 0:
            raise RegistryError(f"no queries in the {split} split: training fits on train and selects on val")
    # a model with no train evaluations has nothing to learn from (say, listed in models.csv only)
    data = data.without(~(data.correct[:, data.splits["train"]] >= 0).any(axis=1))
    if len(data.models) < 2:
        raise RegistryError(f"{len(data.models)} model(s) with train evaluations: training needs at least 2")
    model, config, metrics = train(data.qvecs, data.correct, data.splits["train"], data.splits["val"], cfg,
                                   progress=progress,
                                   categories=data.query_field(category_field) if category_features else None)
    digest = data.digest()
    meta = {"name": name or f"locus-seed{seed}-{digest[:8]}", "text_encoder": text_encoder.TEXT_ENCODER,
            "metrics": metrics, "train_data_digest": digest, "embed_max_set": None,
            "train_config": json.loads(json.dumps(asdict(cfg), default=str))}
    return save_checkpoint(model, config, meta), meta
