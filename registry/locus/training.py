"""Training LOCUS: the run (train; the recipe's settings, TrainConfig, live in stages.py) and a registry's
checkpoint from it.

Why the training differs from the reference code (see notes/reference-runs.md): the reference collapses to routing
everything to the strongest model; so did a one-stage version of this file (the encoder learns slowly on 2 cores, and
the predictor only sees noisy embeddings, so it learns base rates), and so did a recipe that distilled one free
vector per model into the encoder (the encoder kept about 6 directions of them, and routing lives in the small
differences between the top models); both are in git's history. The recipe has three stages (locus/stages.py):
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
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, replace

import numpy as np
import torch

from registry.locus.category_rows import fit_category_rows
from registry.locus.network import EncoderConfig, LocusModel
from registry.locus.stages import StageData, TrainConfig, fit_encoder, fit_linear_teacher, refit_predictor


def train(qvecs: np.ndarray, correct: np.ndarray, train_idx, val_idx, cfg: TrainConfig | None = None, *,
          progress: Callable[[dict], None] | None = None, categories=None) -> tuple[LocusModel, EncoderConfig, dict]:
    """Train on the train queries; keep the state with the best validation hit@1 (ties: lower validation BCE).

    The three stages of the module's docstring, in turn: fit_linear_teacher, fit_encoder (each step the train
    queries are split at random into targets (n_targets) and a pool of big_set of the rest, the same for all models;
    each model embeds a random subset of its pool rows, size log-uniform in [min_anchors, anchors], its own draw per
    model; targets are never in a set, as at routing time), refit_predictor.

    With cfg.category_features, categories [Nq] (each query's value of cfg.category_field; None or "(none)": none)
    are read by a last stage (fit_category_rows); nothing before it reads them, so every other weight is the
    text-only model's.
    """
    from registry.core.errors import InputError

    cfg = cfg or TrainConfig()
    if cfg.teacher_epochs < 1:
        raise InputError(f"teacher_epochs must be at least 1, got {cfg.teacher_epochs}: the encoder stage "
                         f"regresses onto the teacher")
    t0 = time.time()
    det_before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(cfg.seed)
        data = StageData.of(qvecs, correct, train_idx, val_idx, cfg=cfg, progress=progress, t0=t0)
        ecfg = copy.deepcopy(cfg.encoder)
        model = LocusModel(ecfg)
        is_dec = lambda n: n.startswith(("q_proj", "q_bias", "w_", "head"))  # noqa: E731
        enc_params = [p for n, p in model.named_parameters() if not is_dec(n)]
        dec_params = [p for n, p in model.named_parameters() if is_dec(n)]

        lin, teacher_info = fit_linear_teacher(model, dec_params, data)
        groups = [{"params": enc_params, "lr": cfg.lr_encoder},
                  {"params": dec_params, "lr": cfg.lr_predictor * cfg.predictor_ft}]
        enc = fit_encoder(model, groups, lin, data)
        refit_info = refit_predictor(model, dec_params, data) if cfg.refit_epochs > 0 else {}
        model.eval()
        category_info: dict = {}
        if cfg.category_features:
            model, ecfg, category_info = fit_category_rows(
                model, qvecs, correct, data.train_idx, val_idx, categories, field=cfg.category_field,
                l2=cfg.category_l2, fit=cfg.category_fit, deep_l2=tuple(cfg.category_l2_deep),
                text_scales=tuple(cfg.category_text_scales))
        metrics = {"best_step": enc["best_step"], "steps": enc["steps"], "teacher": teacher_info,
                   "refit": refit_info, "category": category_info,
                   "wall_s": time.time() - t0, "n_params": model.n_params(),
                   **{f"val_{k}": v for k, v in enc["best_val"].items()}, "train_config": asdict(cfg),
                   "history": [{k: h[k] for k in ("step", "loss", "cons", "val_hit@1", "val_auc", "val_bce",
                                                  "val_n_routed")} for h in enc["history"]]}
        return model, ecfg, metrics
    finally:
        torch.use_deterministic_algorithms(det_before)


def checkpoint_from(data, *, seed: int = 0, anchors: int | None = None, max_steps: int | None = None,
                    epochs: int | None = None, name: str | None = None, progress=None,
                    category_features: bool = False, category_field: str = "category",
                    category_fit: str = "train") -> tuple[bytes, dict]:
    """Train on a registry's dataset (evaluation.Dataset: train split to fit, val to select) and return the
    checkpoint (safetensors bytes) and its meta. Models without train evaluations are left out. With
    category_features the predictor also reads each query's value of category_field."""
    import json

    from registry.core.errors import InputError, RegistryError
    from registry.locus import text_encoder
    from registry.locus.checkpoint import save_checkpoint

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
