"""The last stage of category features: rows of the predictor, one per query category of the train queries, fitted
on top of the trained text-only model (a logit offset per model and category, read from the model's embedding)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from registry.locus.baselines import hit_at_k, predictor_metrics
from registry.locus.network import EncoderConfig, LocusModel
from registry.locus.numpy_network import NO_LABEL, label_columns, split_label
from registry.locus.scoring import embed_models


def category_vocabulary(categories, train_idx, field: str = "category") -> tuple[str, ...]:
    """The category names of the train queries, sorted ("(none)", the registry's name for a missing one, left out).
    With several columns (field "category+source", categories their joined labels): "column:value" names, column
    by column, each column's values sorted."""
    from registry.core.errors import InputError

    if categories is None:
        raise InputError("category features need the queries' categories")
    cols = label_columns(field) or (field,)
    labels = np.asarray(categories, dtype=object)[np.asarray(train_idx)].tolist()
    if len(cols) == 1:
        names = sorted({c for c in labels if isinstance(c, str) and c != NO_LABEL})
    else:
        values = [split_label(c, len(cols)) for c in labels]
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
def fit_category_rows(model: LocusModel, qvecs, correct, train_idx, val_idx, categories, *,
                      field: str = "category", l2: float = 10.0, fit: str = "train",
                      deep_l2: tuple = (10.0, 30.0, 100.0, 300.0),
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
    model embedded from them (see training.TrainConfig.category_fit).

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
    assert ids is not None, "category_vocabulary raised unless categories were given and the vocabulary non-empty"
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

