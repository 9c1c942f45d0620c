"""`registry evaluate` and `registry train`: the registry's own data as arrays, LOCUS against the baselines.

LOCUS is scored with the models' stored current embeddings (computed from every evaluation outside the test split,
see embedding/embed.py). Two LOCUS rows: `locus`, the predictor alone, and `locus_interaction`, what routing serves (the
predictor's logit plus the interaction terms of locus/interaction.py, fitted on train and val exactly as routing fits
them), and `served`, the policy routing serves (routing/served.py: chosen on val among that and the simple
routers), so the report describes exactly what routing will do. Every method sees the same queries, and chooses for each
among the models with a result for it (baselines.among_answered): a model known from a few hundred results would
otherwise be chosen where it cannot be scored, and drag down the methods that like it.
`registry evaluate --held-out K` (models the encoder never saw, known from a few evaluations) is evaluate/heldout.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from registry.core.errors import InputError, RegistryError
from registry.core.transaction import Tx
from registry.embedding import embed, encoders
from registry.embedding.dataset import SPLITS, Dataset, current_embeddings, dataset, query_labels
from registry.evaluate import baseline_cache
from registry.evaluate import pair_baselines as P
from registry.locus import baselines as B
from registry.locus import evidence, interaction
from registry.routing import served


@dataclass
class EvaluationReport:
    split: str
    queries: int
    models: int
    encoder: str
    methods: dict[str, dict]                                  # method -> metrics
    per_category: dict[str, dict] = field(default_factory=dict)  # category -> {"queries", "locus", "best_single", ...,
                                                                 #   "locus_acc", "locus_auc", "locus_brier"}
    sample_efficiency: dict | None = None
    choices: dict[str, int] = field(default_factory=dict)     # how often routing (locus_interaction) chooses each model
    excluded: dict[str, str] = field(default_factory=dict)    # models left out of every method, and why
    # on probation (locus/evidence.py): not routed to by any method; -> evaluations behind the embedding
    probation: dict[str, int] = field(default_factory=dict)
    held_out: bool = True     # False off the test split: embeddings hold its answers, KNN and MF are tuned on val
    disagree: int = 0         # queries where the models' answers differ (hit@1_disagree is on these)
    interaction: dict = field(default_factory=dict)           # a, k, w chosen on val and what val measured
    served: dict = field(default_factory=dict)                # the policy routing serves (routing/served.py): its
                                                              #   name, settings and every policy's val hit@1
    notes: list[str] = field(default_factory=list)            # how the figures were made, where it matters
    planned_efficiency: dict | None = None   # --planned: planned against random probes at each n (probes.compare)


def _at(labels, idx):
    return None if labels is None else labels[idx]


def locus_probs(tx: Tx, encoder_id: int, z: np.ndarray, qvecs: np.ndarray, categories=None) -> np.ndarray:
    """P(correct) [M, N] of embeddings z [M,D] on query vectors [N,Dq] (categories [N]: their values of the
    encoder's category field, `query_labels`, read by an encoder with category features) under an encoder."""
    model, _ = encoders.load(tx, encoder_id)
    return model.p_correct(z, qvecs, categories)


def check_options(split: str, *, baselines: bool, sample_efficiency: bool, held_out: int | None,
                  planned: bool) -> None:
    """What `registry evaluate` refuses before it reads anything."""
    if held_out is not None and (split != "test" or sample_efficiency or not baselines):
        raise InputError("--held-out scores every method on the test split: it takes no --split, "
                         "--sample-efficiency or --no-baselines")
    if held_out is None and planned and not sample_efficiency:
        raise InputError("--planned compares planned and random probes on the sample-efficiency curve: add "
                         "--sample-efficiency")


def evaluate(tx: Tx, split: str = "test", *, baselines: bool = True, sample_efficiency: bool = False,
             seeds: int = 5, sizes=(32, 64, 128, 256, 512), mf_seed: int = 0,
             probation_min: int | None = None, planned: bool = False, progress=None) -> EvaluationReport:
    """`progress(method, done, total)`: told as each method starts (the CLI shows it on stderr)."""
    if split not in SPLITS:
        raise RegistryError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    data = dataset(tx)
    z, excluded, encoder_id, n_behind, stab = current_embeddings(tx, data, with_evidence=True)
    # every method sees the same models: those LOCUS can score honestly and routing may choose (not on probation)
    ev = evidence.assess(np.nan_to_num(z), n_behind, stab, probation_min)
    left_out = np.isnan(z[:, 0])
    probation = {n: int(k) for n, k, p, lo in zip(data.models, n_behind, ev.probation, left_out) if p and not lo}
    left_out |= ev.probation
    keep = ~left_out
    ev = evidence.Evidence(ev.n[keep], ev.stability[keep], ev.probation[keep], ev.weight[keep], ev.minimum)
    data, z = data.without(left_out), z[keep]
    if len(data.models) < 2:
        raise RegistryError(f"{len(data.models)} model(s) with an up-to-date embedding: nothing to route between"
                            + (f" ({len(excluded)} left out, e.g. {next(iter(excluded))}: "
                               f"{next(iter(excluded.values()))})" if excluded else ""))
    idx, tr, va = data.splits[split], data.splits["train"], data.splits["val"]
    needed = ((split, idx), ("train", tr), ("val", va)) if baselines else ((split, idx),)
    for name, rows in needed:
        if len(rows) == 0:   # best single is chosen on train, KNN's k and MF's dimension on val
            raise RegistryError(f"no queries in the {name} split")
    ct = data.correct[:, idx]
    step = _stepper(progress, METHODS if baselines else METHODS[:3])
    step("locus")
    # what the predictor gives routing
    labels = query_labels(data, encoders.load(tx, encoder_id)[0])
    p = evidence.shrink(locus_probs(tx, encoder_id, z, data.qvecs[idx], _at(labels, idx)), ev)
    # the strongest model: the best single model on train, against which "differs_from_strongest" is counted
    strongest = int(np.argmax(B.model_accuracy(data.correct[:, tr]))) if len(tr) else None
    enc_name = tx.sql("SELECT name FROM encoders WHERE id = ?", [encoder_id])[0][0]

    def answered(s):            # every method's choice: among the models with a result for the query
        return B.among_answered(s, ct)

    methods = {"locus": B.routing_report(answered(p), ct, p, strongest)}
    scores, routed = {"locus": answered(p)}, p
    selection: dict = {}
    served_info: dict = {}
    if len(tr) and len(va):         # as routing: without a val split to choose the weights, the predictor alone
        step("locus_interaction")
        rows = interaction.contenders(data.correct, tr, va)      # (every model here is eligible)
        raw = locus_probs(tx, encoder_id, z[rows], data.qvecs, labels)   # the predictor's own, as routing fits on
        fitted = interaction.fit(interaction.logit(raw), data.correct, data.qvecs, data.categories, tr, va, rows=rows)
        routed = interaction.sigmoid(fitted.scores(interaction.logit(p), data.qvecs[idx],
                                                    fitted.category_index(data.categories[idx])))
        selection = fitted.selection
        methods["locus_interaction"] = dict(B.routing_report(answered(routed), ct, routed, strongest),
                                            **{k: selection[k] for k in ("a", "k", "w")})
        scores["locus_interaction"] = answered(routed)
        step("served")
        kept = baseline_cache.BaselineCache(tx, baseline_cache.key_text(
            data, split, idx, mf_seed, caller=__file__, sources=_served_sources(),
            arrays=(z, np.asarray([encoder_id]), ev.n, ev.stability, ev.weight,
                    np.asarray([-1 if ev.minimum is None else ev.minimum]))))
        routed, served_info = kept.get("served", lambda routed=routed: _served(data, fitted, routed, idx, tr, va))
        kept.save(encoder_id)
        methods["served"] = dict(B.routing_report(answered(routed), ct, routed, strongest),
                                 policy=served_info["policy"])
        scores["served"] = answered(routed)
    chosen = B.topk_models(routed, 1)[0]       # what routing serves: it cannot know which models have a result
    choices = {data.models[m]: int(n) for m, n in zip(*np.unique(chosen, return_counts=True))}
    if baselines:
        cache = baseline_cache.BaselineCache(tx, baseline_cache.key_text(data, split, idx, mf_seed,
                                                                           caller=__file__))
        step("best_single")
        methods["oracle"] = {f"hit@{k}": B.oracle_hit(ct) for k in (1, 3, 5)}
        s, _ = cache.get("best_single", lambda: (B.best_single_scores(data.correct, tr, idx), {}))
        methods["best_single"] = B.routing_report(answered(s), ct, None, strongest)
        methods["best_single"]["model"] = data.models[int(np.argmax(s[:, 0]))]
        scores["best_single"] = answered(s)
        methods["random"] = {f"hit@{k}": B.random_hit_at_k(ct, k) for k in (1, 3, 5)}
        step("per_category")
        for name, labels in (("per_category", data.categories), ("per_source", data.sources)):
            if name == "per_source" and (labels is None or len(set(labels[tr].tolist())) <= 1):
                continue
            s, info = cache.get(name, lambda labels=labels: _prior_router(data, labels, tr, va, idx))
            methods[name] = dict(B.routing_report(answered(s), ct, None, strongest), prior=info["prior"])
            scores[name] = answered(s)
        step("knn")
        s, info = cache.get("knn", lambda: _knn(data, tr, va, idx))
        methods["knn"] = dict(B.routing_report(answered(s), ct, s, strongest), k=info["k"])
        scores["knn"] = answered(s)
        for name, router, probs in (("mf", P.mf_router, P.mf_probs), ("irt", P.irt_router, P.irt_probs)):
            step(name)
            told = (None if progress is None else
                    lambda d, i, n, name=name: progress(f"{name}, dimension {d} ({i}/{n})", *_place(name)))
            s, info = cache.get(name, lambda router=router, probs=probs, told=told: _pair_model(
                data, router, probs, tr, va, idx, seed=mf_seed, progress=told))
            methods[name] = dict(B.routing_report(answered(s), ct, s, strongest), dim=info["dim"])
            scores[name] = answered(s)
        cache.save(encoder_id)
    if "served" in scores:
        for m, sc in scores.items():
            if m != "served":
                methods[m]["vs_served"] = paired(scores["served"], sc, ct)
    per_category = {}
    for cat in sorted(set(data.categories[idx])):
        sel = data.categories[idx] == cat
        pm = B.predictor_metrics(p[:, sel], ct[:, sel])
        per_category[cat] = {"queries": int(sel.sum()),
                             **{m: round(B.hit_at_k(sc[:, sel], ct[:, sel], 1), 4) for m, sc in scores.items()},
                             **{f"locus_{k}": round(v, 4) for k, v in pm.items()}}
    report = EvaluationReport(split, len(idx), len(data.models), enc_name,
                              {m: {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                               for m, r in methods.items()}, per_category, None, choices, excluded,
                              probation=probation, held_out=split == "test",
                              disagree=int(B.disagreement(ct).sum()), interaction=selection,
                              served=served_info, notes=_answered_notes(data.models, ct))
    if sample_efficiency:
        report.sample_efficiency = sample_efficiency_curve(tx, data, idx, seeds, sizes)
    if planned:
        report.planned_efficiency = planned_curve(tx, data, z, idx, seeds, sizes)
    return report


def _served(data, fitted, routed, idx, tr, va) -> tuple[np.ndarray, dict]:
    """Routing as served on idx (the policy chosen on val, as routing chooses it) and what the report says of it."""
    pol = served.choose(fitted, data.correct, data.qvecs, data.categories, data.sources, train_idx=tr, val_idx=va)
    routed = served.as_served(pol, fitted, routed, data.qvecs[idx], categories=_at(data.categories, idx),
                              sources=_at(data.sources, idx))
    return routed, {"policy": pol.name, "setting": pol.setting, "val_hit": pol.val, "margin": pol.margin,
                    "margin_single": pol.margin_single}


def _served_sources() -> tuple[str, ...]:
    """The modules the served scores depend on beyond the baselines': the policy, its pair models, the interaction
    terms, the evidence's shrinkage and the network that scores."""
    from registry.locus import evidence as ev_module
    from registry.locus import numpy_network
    from registry.routing import pairs

    return tuple(str(m.__file__) for m in (served, pairs, interaction, ev_module, numpy_network))


def _prior_router(data, labels, tr, va, idx) -> tuple[np.ndarray, dict]:
    s, info = B.per_category_router(data.correct, labels, tr, va, idx)
    return s, {"prior": info["prior"].item() if isinstance(info["prior"], np.generic) else info["prior"]}


def _knn(data, tr, va, idx) -> tuple[np.ndarray, dict]:
    k, _ = B.knn_router(data.qvecs, data.correct, tr, va)
    return B.knn_scores(data.qvecs, data.correct, tr, idx, k), {"k": int(k)}


def _place(method: str) -> tuple[int, int]:
    return METHODS.index(method) + 1, len(METHODS)


def _pair_model(data, router, probs, tr, va, idx, *, seed: int, progress=None) -> tuple[np.ndarray, dict]:
    """MF or IRT, its dimension chosen on val: scores on idx."""
    model, info = router(data.qvecs, data.correct, tr, va, seed=seed, progress=progress)
    return probs(model, data.qvecs, idx), {"dim": int(info["dim"])}


def paired(served_scores: np.ndarray, other: np.ndarray, correct: np.ndarray) -> dict:
    """Routing as served against another method on the same queries: the queries where only served's choice was right
    (`served_better`) and where only the other's was (`served_worse`), served's hit@1 minus the other's (`diff`) and
    its paired standard error (`se`: most queries get the same outcome from both, so the difference is much surer
    than either hit@1)."""
    right_s = np.take_along_axis(correct, B.topk_models(served_scores, 1), axis=0)[0] == 1
    right_o = np.take_along_axis(correct, B.topk_models(other, 1), axis=0)[0] == 1
    d = right_s.astype(np.float64) - right_o
    n = max(len(d), 1)
    se = float(np.std(d, ddof=1) / np.sqrt(n)) if len(d) > 1 else 0.0
    return {"served_better": int((right_s & ~right_o).sum()), "served_worse": int((right_o & ~right_s).sum()),
            "diff": round(float(d.mean()) if len(d) else 0.0, 4), "se": round(se, 4)}


METHODS = ("locus", "locus_interaction", "served", "best_single", "per_category", "knn", "mf", "irt")


def _stepper(progress, names):
    """step(method): tells `progress` (if any) that method starts, with its place among `names`."""
    def step(method):
        if progress is not None:
            progress(method, names.index(method) + 1, len(names))
    return step


def _answered_notes(models: list[str], ct: np.ndarray) -> list[str]:
    """What the report says of the (model, query) pairs of the split without a result, if any."""
    missing = ct < 0
    if not missing.any():
        return []
    worst = int(np.argmax(missing.sum(axis=1)))
    return [f"every method chooses, for each query, among the models with a result for it: {int(missing.sum())} of "
            f"{missing.size} (model, query) pairs have none ({models[worst]}: {int(missing[worst].sum())} of "
            f"{ct.shape[1]} queries)"]


def subset_rows(correct: np.ndarray, pool: np.ndarray, n: int, seed: int) -> list[np.ndarray]:
    """Per model, n random query indices among its observed evaluations in pool (all of them if fewer): the draws of
    the sample-efficiency curve, shared with the bench scripts so that their figures line up with it."""
    rng = np.random.default_rng(seed)
    return [rng.choice(have, size=min(n, len(have)), replace=False)
            for have in (pool[correct[m, pool] >= 0] for m in range(correct.shape[0]))]


def embed_subsets(model, data: Dataset, rows: list[np.ndarray]) -> np.ndarray:
    """Each model embedded from its evaluations on rows[m] (indices into data's queries). -> z [M,D] float32"""
    return embed.embed_sets(model, [(data.qvecs[r], (data.correct[m, r] == 1).astype(np.float32))
                                         for m, r in enumerate(rows)])


def sample_efficiency_curve(tx: Tx, data: Dataset, idx: np.ndarray, seeds: int, sizes) -> dict:
    """hit@1 when every model is embedded from only n random non-test evaluations, against all of them (each
    query's choice among the models with a result for it, as every method's)."""
    model, _ = encoders.load(tx, encoders.require_active(tx))
    nontest = np.concatenate([data.splits["train"], data.splits["val"]])
    ct = data.correct[:, idx]
    out = {}
    for n in sizes:
        hits = []
        for seed in range(seeds):
            z = embed_subsets(model, data, subset_rows(data.correct, nontest, n, seed))
            p = model.p_correct(z, data.qvecs[idx], _at(query_labels(data, model), idx))
            hits.append(B.hit_at_k(B.among_answered(p, ct), ct, 1))
        out[str(n)] = {"mean": round(float(np.mean(hits)), 4), "std": round(float(np.std(hits)), 4), "draws": seeds}
    return out


def planned_curve(tx: Tx, data: Dataset, z: np.ndarray, idx: np.ndarray, seeds: int, sizes) -> dict:
    """Planned probes against random ones at each n (probes.compare): every model known from n non-test
    evaluations, random (the draws of `sample_efficiency_curve`) or planned from a random seed set of the same draw
    (each model in turn planned against the others' current embeddings z), each read by the set encoder and by
    likelihood, scored on the split's queries idx."""
    from registry.locus import probe_design

    model, _ = encoders.load(tx, encoders.require_active(tx))
    pred = probe_design.Predictor(model)
    nontest = np.concatenate([data.splits["train"], data.splits["val"]])
    return probe_design.compare(pred, pred.project(data.qvecs, query_labels(data, model)), data.correct,
                                pool_rows=nontest, z_all=z.astype(np.float64), eval_rows=idx, sizes=sizes,
                                seeds=seeds, encode=lambda rows: embed_subsets(model, data, rows),
                                draw=lambda n, s: subset_rows(data.correct, nontest, n, s))
