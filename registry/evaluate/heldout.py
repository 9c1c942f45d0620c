"""`registry evaluate --held-out K`: new models, honestly.

The standard report scores every model with an encoder that was trained on that very model's answers. Here, per
seed, K models are held out: the encoder is trained on the others only, and each held-out model is then known to
every method by n random evaluations, as a newly registered model would be. Each method gets the same rows, and
only those: `visible` masks every test answer and every held-out answer outside the n drawn, and the methods read
nothing else (a test flips the hidden answers and gets the same report).

Choices, each said in the report's notes:
- The n are drawn from the train split (non-test, and the rows every method fits on; val only chooses settings),
  so no method fits on rows another one only uses for selection.
- No probation and no evidence shrinkage: the held-out models (n < the probation minimum of 500) are candidates
  for every method, and each method's own P(correct) is scored, since this measures prediction quality.
- Nothing is stored: the encoder is trained in memory and dropped.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field, replace
from typing import TypedDict

import numpy as np
from sklearn.metrics import roc_auc_score

from registry.core.errors import InputError
from registry.embedding.dataset import Dataset, query_labels
from registry.evaluate import pair_baselines as P
from registry.evaluate.harness import embed_subsets
from registry.locus import baselines as B
from registry.locus import interaction, probe_design, training
from registry.routing import served


class TrainShort(TypedDict):
    """What TRAIN_SHORT changes in training.TrainConfig."""
    teacher_epochs: int
    max_steps: int
    eval_every: int
    refit_epochs: int


# Shorter than `registry train`'s default (30 teacher epochs, 240 encoder steps, 10 refit epochs, about 10 min on
# 2 cores) so that a seed trains in a few minutes; the report names it.
TRAIN_SHORT: TrainShort = {"teacher_epochs": 8, "max_steps": 60, "eval_every": 20, "refit_epochs": 4}
METHODS = ("locus", "locus_interaction", "served", "locus_likelihood", "mf", "irt", "knn", "per_category",
           "best_single")
COLUMNS = [("hit@1", "hit@1"), ("auc", "AUC"), ("n_chosen", "models chosen"),           # (metric, table heading)
           ("differs_from_strongest", "not the strongest"), ("hit@1_disagree", "hit@1 where models disagree"),
           ("held_out_auc", "held-out AUC"),
           ("held_out_auc_within", "within-model AUC"), ("held_out_brier", "held-out Brier"),
           ("held_out_acc_error", "acc error"), ("routed_to_held_out", "routed to held-out")]
NOTES = [
    "held-out models: K per seed (seeded) among the models with at least n train results; every method knows each "
    "one only from the same n random evaluations of the train split (test answers and the rest are hidden)",
    "no probation, no evidence shrinkage: the held-out models are routing candidates for every method, and each "
    "method's own P(correct) is scored",
    "locus: encoder trained in memory on the other models only (train_config); known models embedded from all their "
    "non-test evaluations, held-out ones from their n",
    "locus_likelihood: the same encoder and known models; each held-out model read from its n by likelihood "
    "(probes.read, prior from the known models' embeddings)",
    "planned (with --planned): each held-out model asked probes.SEED_SIZE of its n random rows, then batches "
    "planned by probes.choose with the same encoder and the known models, up to n; every method given those rows",
    "mf: retrained on every visible train result (the held-out rows: their n); dimension chosen on val",
    "irt: fitted on the other models (dimension chosen on val); a held-out model's theta by MAP from its n, the "
    "query side a(q), b(q) frozen",
    "knn: each model's k nearest among the train queries it has a result for (k chosen on val)",
    "locus_interaction: LOCUS's logit plus each model's category offset and nearest-query residual "
    "(locus/interaction.py) from the visible train and val answers (a held-out model's: its n), weights chosen on val",
    "served: routing as served (routing/served.py): the policy chosen on val among locus_interaction and the simple "
    "routers from the visible answers, as routing chooses it",
    "per_category: each category's best model by its visible answers in the category (prior chosen on val)",
    "best_single: each model's accuracy on its visible train results, as its P(correct) on every query",
    "held_out_*: the K held-out models' test answers only; acc_error = mean |predicted - actual test accuracy|; "
    "auc_within = mean over held-out models of the AUC across questions (0.5 for a constant prediction)",
]


def cell(key: str, value: float) -> str:
    """A table cell: counts as counts, the rest to 4 decimals."""
    return f"{value:.4g}" if key == "n_chosen" else f"{value:.4f}"


@dataclass
class HeldOutSeed:
    seed: int
    held_out: list[str]
    methods: dict[str, dict]        # method -> hit@1, auc, held_out_{auc,auc_within,brier,acc_error}, ... settings
    visible_digest: str             # of the rows every method was given
    locus_train: dict               # best step, val hit@1 of the encoder trained without the held-out models
    wall_s: float
    planned: dict[str, dict] | None = None   # --planned: the same, every held-out model known from planned rows


@dataclass
class HeldOutReport:
    held_out: int
    n: int
    seeds: list[int]
    queries: int                    # test queries scored
    models: int
    train_config: dict              # the encoder's training config (TRAIN_SHORT unless overridden)
    per_seed: list[HeldOutSeed]
    mean: dict[str, dict]           # method -> metric -> mean over seeds
    std: dict[str, dict]
    notes: list[str] = field(default_factory=lambda: list(NOTES))
    planned_mean: dict[str, dict] | None = None   # --planned
    planned_std: dict[str, dict] | None = None


def draw(data: Dataset, k: int, n: int, seed: int) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """-> (held [M] bool, {held model index: its n drawn train query indices, sorted}), seeded."""
    tr = data.splits["train"]
    have = [tr[data.correct[m, tr] >= 0] for m in range(len(data.models))]
    eligible = [m for m in range(len(data.models)) if len(have[m]) >= n]
    if len(eligible) < k:
        raise InputError(f"--held-out {k}: only {len(eligible)} models have {n} train results to draw from")
    rng = np.random.default_rng(seed)
    chosen = sorted(int(m) for m in rng.choice(eligible, size=k, replace=False))
    held = np.zeros(len(data.models), dtype=bool)
    held[chosen] = True
    return held, {m: np.sort(rng.choice(have[m], size=n, replace=False)) for m in chosen}


def visible(data: Dataset, held: np.ndarray, rows: dict[int, np.ndarray]) -> Dataset:
    """What every method is given: no test answers at all, and of each held-out model only its drawn rows."""
    c = data.correct.copy()
    c[:, data.splits["test"]] = -1
    for m in np.flatnonzero(held):
        keep = c[m, rows[int(m)]]
        c[m] = -1
        c[m, rows[int(m)]] = keep
    return replace(data, correct=c)


def _train(vis: Dataset, held, cfg: training.TrainConfig, progress, train=None):
    model, _, metrics = (train or training.train)(vis.qvecs, vis.correct[~held], vis.splits["train"],
                                                  vis.splits["val"], cfg, progress=progress)
    return model, {"best_step": metrics["best_step"], "val_hit@1": round(metrics["val_hit@1"], 4)}


def _locus(vis: Dataset, held, te, model):
    """-> (P(correct) as the registry embeds: every visible (non-test) evaluation, for a held-out model its n;
    the router's P with the interaction terms; the terms' settings; P with each held-out model read by likelihood;
    routing's as served, and the served policy)"""
    z = embed_subsets(model, vis, [np.flatnonzero(vis.correct[m] >= 0) for m in range(len(vis.models))])
    labels = query_labels(vis, model)
    lg = interaction.logit(model.p_correct(z, vis.qvecs, labels))
    tr, va = vis.splits["train"], vis.splits["val"]
    rows = interaction.contenders(vis.correct, tr, va)
    fitted = interaction.fit(lg[rows], vis.correct, vis.qvecs, vis.categories, tr, va, rows=rows)
    routed = interaction.sigmoid(fitted.scores(lg[:, te], vis.qvecs[te], fitted.category_index(vis.categories[te])))
    pol = served.choose(fitted, vis.correct, vis.qvecs, vis.categories, vis.sources, train_idx=tr, val_idx=va)
    as_served = served.as_served(pol, fitted, routed, vis.qvecs[te], categories=vis.categories[te],
                                 sources=None if vis.sources is None else vis.sources[te])
    pred = probe_design.Predictor(model)
    q = pred.project(vis.qvecs, labels)
    prior = probe_design.gaussian_prior(z[~held])
    zl = z.astype(np.float64)
    for m in np.flatnonzero(held):
        rows_m = np.flatnonzero(vis.correct[m] >= 0)
        zl[m] = probe_design.read(pred, q.take(rows_m), (vis.correct[m, rows_m] == 1).astype(np.float64), prior)[0]
    return (interaction.sigmoid(lg[:, te]), routed, {k: fitted.selection[k] for k in ("a", "k", "w")},
            model.p_correct(zl.astype(np.float32), vis.qvecs[te], None if labels is None else labels[te]),
            as_served, {"policy": pol.name})


def planned_rows(data: Dataset, held: np.ndarray, rows: dict[int, np.ndarray], model, seed: int) -> dict:
    """Each held-out model's n rows planned instead of drawn: probes.SEED_SIZE of its drawn rows first, then batches
    chosen with `model` (trained without the held-out models) against the known models, from its train rows."""
    tr = data.splits["train"]
    pred = probe_design.Predictor(model)
    q = pred.project(data.qvecs, query_labels(data, model))
    known = np.flatnonzero(~held)
    nontest = np.concatenate([tr, data.splits["val"]])
    z = embed_subsets(model, data, [nontest[data.correct[m, nontest] >= 0] for m in known]).astype(np.float64)
    ref = np.sort(np.random.default_rng(0).choice(tr, min(probe_design.REFERENCES, len(tr)), replace=False))
    best_other = np.max([pred.logits(zk, q.take(ref)) for zk in z], axis=0)
    new = np.flatnonzero(held)
    n = len(rows[int(new[0])])
    rng = np.random.default_rng([seed, 2])
    answers = (data.correct[new] == 1).astype(np.float64)
    planned = probe_design.plan_rows(
        pred, q, answers, pool=[tr[data.correct[m, tr] >= 0] for m in new],
        seed_rows=[rng.choice(rows[int(m)], min(probe_design.SEED_SIZE, n), replace=False) for m in new], sizes=[n],
        priors=[probe_design.gaussian_prior(z)] * len(new), others=[best_other] * len(new), ref=ref, seed=seed)[n]
    return {int(m): np.sort(r) for m, r in zip(new, planned)}


def _irt(vis: Dataset, held, te, seed: int):
    known = ~held
    c, q, tr, va = vis.correct, vis.qvecs, vis.splits["train"], vis.splits["val"]
    irt, info = P.irt_router(q, c[known], tr, va, seed=seed)
    p = np.empty((len(vis.models), len(te)), dtype=np.float32)
    p[known] = P.irt_probs(irt, q, te)    # type: ignore[arg-type]  # (irt_probs is mf_probs, typed for MF alone)
    new = np.flatnonzero(held)
    sets = [(np.flatnonzero(c[m] >= 0), (c[m][c[m] >= 0] == 1).astype(np.float64)) for m in new]
    p[new] = P.irt_theta_probs(irt, P.fit_theta(irt, q, sets), q, te)
    return p, {"dim": info["dim"]}


def predictions(vis: Dataset, held: np.ndarray, cfg: training.TrainConfig, *, seed: int,
                progress=None, train=None, trained=None) -> tuple[dict[str, np.ndarray], dict[str, dict]]:
    """Every method's P(correct) [M, test queries] from the visible rows alone -> (probs, settings). `train`:
    training.train's stand-in (a bench keeps trained encoders on disk with it); `trained`: (encoder, its info)
    already trained on the known models (the encoder never sees the held-out rows)."""
    te, tr, va, c, q = vis.splits["test"], vis.splits["train"], vis.splits["val"], vis.correct, vis.qvecs
    probs, info = {}, {}
    model, info["locus"] = trained or _train(vis, held, cfg, progress, train)
    (probs["locus"], probs["locus_interaction"], info["locus_interaction"], probs["locus_likelihood"],
     probs["served"], info["served"]) = _locus(vis, held, te, model)
    info["locus_likelihood"], info["model"] = {}, model
    probs["per_category"], pc = B.per_category_router(c, vis.categories, tr, va, te)
    info["per_category"] = {"prior": pc["prior"]}
    mf, mf_info = P.mf_router(q, c, tr, va, seed=seed)
    probs["mf"], info["mf"] = P.mf_probs(mf, q, te), {"dim": mf_info["dim"]}
    probs["irt"], info["irt"] = _irt(vis, held, te, seed)
    k, _ = B.knn_router(q, c, tr, va, own_neighbours=True)
    probs["knn"], info["knn"] = B.knn_scores(q, c, tr, te, k, own_neighbours=True), {"k": k}
    probs["best_single"] = B.best_single_scores(c, tr, te)
    info["best_single"] = {"model": vis.models[int(np.argmax(probs["best_single"][:, 0]))]}
    return probs, info


def metrics(p: np.ndarray, truth: np.ndarray, held: np.ndarray, strongest: int) -> dict:
    """Routing over every model (how many it chooses, how often not the `strongest`, the best single model, and
    hit@1 where models disagree too), and prediction quality on the held-out models' answers alone. truth [M,N].
    Each query's choice is among the models with a result for it (baselines.among_answered), as `evaluate`'s."""
    s = B.among_answered(p, truth)
    top = B.topk_models(s, 1)[0]
    ph, th = p[held], truth[held]
    within, err = [], []
    for pm, tm in zip(ph, th):
        obs = tm >= 0
        y = tm[obs] == 1
        within.append(roc_auc_score(y, pm[obs]) if 0 < y.mean() < 1 else np.nan)
        err.append(abs(float(np.mean(pm[obs], dtype=np.float64)) - float(y.mean())))
    hp = B.predictor_metrics(ph, th)
    dis = B.disagreement(truth)
    return {"hit@1": B.hit_at_k(s, truth, 1), "auc": B.predictor_metrics(p, truth)["auc"],
            "n_chosen": float(len(np.unique(top))), "differs_from_strongest": float((top != strongest).mean()),
            "hit@1_disagree": B.hit_at_k(s[:, dis], truth[:, dis], 1),
            "held_out_auc": hp["auc"], "held_out_auc_within": float(np.nanmean(within)),
            "held_out_brier": hp["brier"], "held_out_acc_error": float(np.mean(err)),
            "routed_to_held_out": float(held[top].mean())}


def run_seed(data: Dataset, k: int, n: int, *, seed: int, cfg: training.TrainConfig, progress=None, train=None,
             planned: bool = False):
    """One seed -> (HeldOutSeed, {method: P(correct)}, held, drawn rows). `planned`: every method again with each
    held-out model known from n planned rows instead (HeldOutSeed.planned)."""
    t0 = time.time()
    held, rows = draw(data, k, n, seed)
    vis = visible(data, held, rows)
    probs, info = predictions(vis, held, replace(cfg, seed=seed), seed=seed, progress=progress, train=train)
    truth = data.correct[:, data.splits["test"]]

    def table(probs, info):
        strongest = int(np.argmax(probs["best_single"][:, 0]))
        return {m: {**{key: round(v, 4) for key, v in metrics(probs[m], truth, held, strongest).items()},
                    **{key: v for key, v in info[m].items() if m != "locus"}} for m in METHODS}

    digest = hashlib.sha256(np.ascontiguousarray(vis.correct).tobytes()).hexdigest()[:16]
    out = HeldOutSeed(seed, [data.models[m] for m in np.flatnonzero(held)], table(probs, info), digest,
                      info["locus"], round(time.time() - t0, 1))
    if planned:
        model = info["model"]
        vis_p = visible(data, held, planned_rows(data, held, rows, model, seed))
        probs_p, info_p = predictions(vis_p, held, replace(cfg, seed=seed), seed=seed, trained=(model, info["locus"]))
        out.planned = table(probs_p, info_p)
        out.wall_s = round(time.time() - t0, 1)
    return out, probs, held, rows


def train_config(max_steps: int | None = None, epochs: int | None = None) -> training.TrainConfig:
    cfg = replace(training.TrainConfig(), **TRAIN_SHORT)
    for flag, value in (("--steps", max_steps), ("--epochs", epochs)):
        if value is not None and value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    if max_steps is not None:
        cfg = replace(cfg, max_steps=max_steps, eval_every=min(cfg.eval_every, max_steps))
    if epochs is not None:
        cfg = replace(cfg, teacher_epochs=epochs)
    return cfg


def run(data: Dataset, k: int, *, n: int = 128, seeds: int = 3, max_steps: int | None = None,
        epochs: int | None = None, progress=None, planned: bool = False) -> HeldOutReport:
    """Seeds 0..seeds-1, each holding out k models known from n evaluations; the mean and std over seeds."""
    for flag, value, least in (("--held-out", k, 1), ("--n", n, 1), ("--seeds", seeds, 1)):
        if value < least:
            raise InputError(f"{flag} must be at least {least}, got {value}")
    if len(data.models) - k < 2:
        raise InputError(f"--held-out {k} leaves {len(data.models) - k} model(s) to train on: at least 2 are needed")
    for split in ("train", "val", "test"):
        if len(data.splits[split]) == 0:
            raise InputError(f"no queries in the {split} split: the held-out run fits on train, chooses settings on "
                             f"val and scores on test")
    cfg = train_config(max_steps, epochs)
    per_seed = []
    for s in range(seeds):
        if progress:
            progress({"stage": "seed", "seed": s, "seeds": seeds})
        per_seed.append(run_seed(data, k, n, seed=s, cfg=cfg, progress=progress, planned=planned)[0])
    return report(data, k, n, cfg, per_seed)


def report(data: Dataset, k: int, n: int, cfg: training.TrainConfig, per_seed: list[HeldOutSeed]) -> HeldOutReport:
    """The seeds' results with their mean and std per method and metric."""
    def summary(tables):
        mean, std = {}, {}
        for m in METHODS:
            keys = [key for key, _ in COLUMNS]                      # the metrics, not the settings (a, w, ...)
            mean[m] = {key: round(float(np.mean([t[m][key] for t in tables])), 4) for key in keys}
            std[m] = {key: round(float(np.std([t[m][key] for t in tables])), 4) for key in keys}
        return mean, std

    mean, std = summary([r.methods for r in per_seed])
    config = {key: v for key, v in asdict(cfg).items() if key not in ("encoder", "seed")}   # seed: per run
    out = HeldOutReport(k, n, [r.seed for r in per_seed], len(data.splits["test"]), len(data.models), config,
                        per_seed, mean, std)
    if all(r.planned is not None for r in per_seed):
        out.planned_mean, out.planned_std = summary([r.planned for r in per_seed])
    return out
