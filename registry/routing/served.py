"""The policy routing serves, chosen on the registry's val split: the best single model, the predictor with its
interaction terms (locus/interaction.py), or one of the simple routers that sometimes beat it where questions come in
templated families (the mean answer of the k nearest reference queries, each category's or each source's best model,
MF or IRT over the text vectors: routing/pairs.py), or the blend of them (the mean of their P(correct)-like scores).

`choose` judges each on val (hit@1 among the interaction's models, each query's choice among those with a val
answer), settings fitted on train (the interaction's val scores too). The best single model (the model most often
right on train) serves unless another candidate beats it on val by more than val's noise (MARGIN_SE paired standard
errors of their difference); among the rest, the predictor with interaction unless a simple router beats it so.
The kept one is then fitted on train and val (the reference queries, as the interaction terms are). Its routing
scores (routing/served_scores.py, which a route reads) are the same in `registry evaluate` (its `served` row, through
`as_served`) and in routing, so the report describes what is served. Pure numpy: a routing refit computes it beside
the interaction fit, without torch.
"""
from __future__ import annotations

import numpy as np

from registry.locus import interaction
from registry.routing import pairs
from registry.routing.served_scores import ServedPolicy, field_of, group_indices, knn, scores

CHOICES = ("locus_interaction", "knn", "per_category", "per_source", "mf", "irt", "blend", "best_single")
# one dimension each: every fit also runs in a routing refit (on ZeroEval, dims 4 to 32 were within one val query)
PAIR_DIMS = {"mf": (8,), "irt": (16,)}
KNN_KS = (5, 10, 20, 50, 100)
PRIORS = (0, 5, 20, 50, 200)
# a simple router replaces the predictor only when it beats it on val by more than this many standard errors of
# their query-by-query difference: a gain within val's noise is not one, and the leader's own figure is the best of
# several settings and candidates. At 0.5 per-source was served on MMLU-Pro (+0.0033 on val, -0.011 on test); at 1
# the blend or KNN on two of AlpacaEval's five folds (+3 and +4 of 161 val questions; -0.0087 pooled on test)
MARGIN_SE = 1.5


def val_right(scores: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """[N] bool: whether each query's choice among the models with a result for it was right (the one scoring rule,
    interaction.answered_right); ties: lower row."""
    rows = (correct >= 0).any(axis=1)
    if not rows.any():
        return np.zeros(correct.shape[1], dtype=bool)
    return interaction.answered_right(np.asarray(scores, dtype=np.float64)[rows], correct[rows])


def val_hit(scores: np.ndarray, correct: np.ndarray) -> float:
    """hit@1 among the models with a result for each query (interaction.answered_hit, the one figure); ties: lower
    row."""
    return interaction.answered_hit(scores, correct)


def required_gain(judged: dict, name: str, correct: np.ndarray, against: str = "locus_interaction") -> float:
    """The val gain over `against` (the predictor with interaction, or the best single model) that `name` must
    exceed to be served: MARGIN_SE standard errors of the query-by-query difference of their val hits (of a val
    hit@1 where either has no val scores)."""
    n = correct.shape[1]
    p = judged[against][0]
    if judged[name][2] is None or judged[against][2] is None:
        return MARGIN_SE * float(np.sqrt(max(p * (1 - p), 1e-9) / n))
    diff = val_right(judged[name][2], correct).astype(np.float64) - val_right(judged[against][2], correct)
    return MARGIN_SE * float(diff.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0


def group_table(answers: np.ndarray, group: np.ndarray, n_groups: int, prior: float) -> np.ndarray:
    """[R,G]: each row's accuracy per group, shrunk toward its overall accuracy by `prior` pseudo-answers."""
    y, seen = (answers == 1).astype(np.float64), (answers >= 0).astype(np.float64)
    overall = y.sum(1) / np.maximum(seen.sum(1), 1)
    onehot = np.zeros((len(group), n_groups))
    onehot[np.flatnonzero(group >= 0), group[group >= 0]] = 1.0
    yc, nc = y @ onehot, seen @ onehot
    return (yc + prior * overall[:, None]) / (nc + prior + 1e-9) + 1e-9 * overall[:, None]


def choose(fitted: interaction.Interaction, correct: np.ndarray, qvecs: np.ndarray, categories, sources, *,
           train_idx, val_idx) -> ServedPolicy:
    """The served policy for the interaction's rows: correct [M,Nq] of every model (fitted.rows index it), the
    queries' text vectors, categories and sources ([Nq] str, sources None when the registry has none)."""
    judged = candidates(fitted, correct, qvecs, categories, sources, train_idx=train_idx, val_idx=val_idx)
    if not judged:
        return ServedPolicy("locus_interaction")
    rows, va = np.asarray(fitted.rows, dtype=np.int64), np.asarray(val_idx, dtype=np.int64)
    c = np.asarray(correct)[rows]
    rest = [n for n in judged if n != "best_single"]
    best = max(rest, key=lambda n: (round(judged[n][0], 9), -CHOICES.index(n)))
    margin = required_gain(judged, best, c[:, va])
    if judged[best][0] - judged["locus_interaction"][0] <= margin:
        best = "locus_interaction"
    margin_single = 0.0
    if "best_single" in judged:
        # the best single model serves unless another candidate beats it by more than that candidate's margin
        gains = {n: (judged[n][0] - judged["best_single"][0], required_gain(judged, n, c[:, va], "best_single"))
                 for n in rest}
        margin_single = gains[best][1]
        if not any(lead > need for lead, need in gains.values()):
            best = "best_single"
    val = {n: round(v[0], 4) for n, v in judged.items()}
    out = _build(best, judged, c, qvecs, np.sort(np.concatenate([np.asarray(train_idx, dtype=np.int64), va])))
    out.val, out.margin, out.margin_single = val, round(margin, 4), round(margin_single, 4)
    return out


def candidates(fitted: interaction.Interaction, correct: np.ndarray, qvecs: np.ndarray, categories, sources, *,
               train_idx, val_idx) -> dict:
    """Every policy judged on val: name -> (val hit@1, its settings, its val scores [R, Nval] as P(correct)-like
    values, from train alone); {} when there is nothing to judge on."""
    rows = np.asarray(fitted.rows, dtype=np.int64)
    tr, va = np.asarray(train_idx, dtype=np.int64), np.asarray(val_idx, dtype=np.int64)
    c = np.asarray(correct)[rows]
    val_info = fitted.selection.get("val_hit")
    if not len(rows) or not len(tr) or not len(va) or val_info is None:
        return {}
    cv = c[:, va]
    # the interaction's val figure, as `fit` measured it by the one rule (interaction.answered_hit: among the models
    # with an answer, as every candidate here), one figure in `evaluate`'s two lines; its weights were chosen by
    # another criterion (`selection["criterion"]`, a choice without an answer wrong: on ZeroEval, where models
    # skipped whole tasks, that read 0.8169 for a predictor that scored 0.9261 on test)
    val_p = None if fitted.val_logits is None else interaction.sigmoid(fitted.val_logits)
    judged: dict[str, tuple] = {"locus_interaction": (val_info["chosen"], {}, val_p)}
    nn_va = interaction.neighbours(np.asarray(qvecs[tr], dtype=np.float32), qvecs[va], max(KNN_KS))
    by_k = {k: knn(c[:, tr], nn_va, k) for k in KNN_KS if k <= len(tr)}
    if by_k:
        k = max(by_k, key=lambda k: (val_hit(by_k[k], cv), -k))
        judged["knn"] = (val_hit(by_k[k], cv), {"k": k}, by_k[k])
    for name, labels in (("per_category", categories), ("per_source", sources)):
        if labels is None:
            continue
        labels = np.asarray([None if v is None else str(v) for v in labels], dtype=object)
        names = sorted({v for v in labels[tr].tolist() if v is not None})
        if len(names) < 2:
            continue                                  # one group: the best single model, not a router
        g_tr, g_va = group_indices(labels[tr], names), group_indices(labels[va], names)
        mix = interaction.category_mix(g_va, nn_va, g_tr, len(names))
        by_prior = {prior: group_table(c[:, tr], g_tr, len(names), prior) @ mix.T for prior in PRIORS}
        prior = max(by_prior, key=lambda p: (val_hit(by_prior[p], cv), -p))
        judged[name] = (val_hit(by_prior[prior], cv), {"prior": prior, "labels": labels}, by_prior[prior])
    judged.update(_pair_candidates(c, qvecs, tr, va))
    members = _blend_members(judged)
    if len(members) > 1:
        s = np.mean([judged[n][2] for n in members], axis=0)
        judged["blend"] = (val_hit(s, cv), {"members": members}, s)
    # the best single model: each row's train accuracy as its score on every query (evaluate's best single model;
    # where the most accurate has no val answer, the next one)
    s = np.repeat(accuracy(c[:, tr])[:, None], len(va), axis=1)
    judged["best_single"] = (val_hit(s, cv), {}, s)
    return judged


def accuracy(answers: np.ndarray) -> np.ndarray:
    """[R] each row's share of right answers among its answers (0 without any)."""
    return (answers == 1).sum(1) / np.maximum((answers >= 0).sum(1), 1)


def _blend_members(judged: dict) -> list[str]:
    """The blend's members: every candidate with val scores, of the two group routers the better on val (a blend
    reads one query field)."""
    names = [n for n in CHOICES if n in judged and judged[n][2] is not None and n not in ("blend", "best_single")]
    groups = [n for n in ("per_category", "per_source") if n in names]
    if len(groups) == 2:
        names.remove(min(groups, key=lambda n: (judged[n][0], n == "per_category")))
    return names


def _build(name: str, judged: dict, c: np.ndarray, qvecs: np.ndarray, ref: np.ndarray) -> ServedPolicy:
    """The policy `name` with its settings, fitted on the reference (train + val) answers."""
    setting = dict(judged[name][1])
    out = ServedPolicy(name, setting={k: v for k, v in setting.items() if k != "labels"})
    if name == "blend":
        out.members = [_build(n, judged, c, qvecs, ref) for n in setting["members"]]
    elif name == "knn":
        out.answers = c[:, ref].astype(np.int8)
    elif name == "best_single":
        # the model judged on val, by its train accuracy: evaluate's best single model, not a second one that the
        # val answers would pick (on GSM8K's 264 test questions the two differ by 3 answers)
        out.rank = judged[name][2][:, 0]
    elif name in PAIR_DIMS:
        q_ref = np.asarray(qvecs, dtype=np.float64)[ref]
        mean, basis = pairs.components(q_ref)
        out.pair = pairs.fit(name, (q_ref - mean) @ basis, c[:, ref], mean=mean, basis=basis, dim=setting["dim"],
                             steps=max(setting["steps"], pairs.CHECK))
    elif name in ("per_category", "per_source"):
        labels = setting["labels"]
        out.groups = sorted({v for v in labels[ref].tolist() if v is not None})
        out.ref_group = group_indices(labels[ref], out.groups)
        out.table = group_table(c[:, ref], out.ref_group, len(out.groups), setting["prior"])
    return out


def _pair_candidates(c: np.ndarray, qvecs: np.ndarray, tr: np.ndarray, va: np.ndarray) -> dict:
    """{"mf": (val hit@1, {"dim", "steps"}, val P), "irt": ...}: each fitted on train, its dimension and steps
    chosen on val (ties: the smaller dimension)."""
    q = np.asarray(qvecs, dtype=np.float64)
    mean, basis = pairs.components(q[tr])
    q_tr, q_va = (q[tr] - mean) @ basis, (q[va] - mean) @ basis
    cv = c[:, va]
    out = {}
    for kind, dims in PAIR_DIMS.items():
        runs = []
        for dim in dims:
            m = pairs.fit(kind, q_tr, c[:, tr], mean=mean, basis=basis, dim=dim,
                          judge=lambda m: val_hit(m.logits(q_va, reduced=True), cv))
            runs.append((val_hit(m.logits(q_va, reduced=True), cv), -dim, m))
        hit, _, m = max(runs, key=lambda r: (round(r[0], 9), r[1]))
        out[kind] = (hit, {"dim": m.dim, "steps": m.steps}, interaction.sigmoid(m.logits(q_va, reduced=True)))
    return out


def as_served(policy: ServedPolicy, fitted: interaction.Interaction, routed: np.ndarray, qvecs: np.ndarray, *,
              categories, sources) -> np.ndarray:
    """[M,N] routing's scores as served: `routed` (every model's P(correct) with the interaction terms) with the
    interaction's rows given the policy's scores; `categories`, `sources` [N]: these queries' (None: unknown)."""
    out = np.array(routed, dtype=np.float64)
    labels = {"category": categories, "source": sources}.get(field_of(policy) or "")
    out[fitted.rows] = scores(policy, fitted, out[fitted.rows], qvecs, labels)
    return out
