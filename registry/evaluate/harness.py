"""`registry evaluate` and `registry train`: the registry's own data as arrays, LOCUS against the baselines.

LOCUS is scored with the models' stored current embeddings (computed from every evaluation outside the test split,
see embedding.py). Two LOCUS rows: `locus`, the predictor alone, and `locus_interaction`, what routing serves (the
predictor's logit plus the interaction terms of interaction.py, fitted on train and val exactly as routing fits
them), so the report describes exactly what routing will do. Every method sees the same queries.
`registry evaluate --held-out K` (models the encoder never saw, known from a few evaluations) is heldout.py.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from registry.locus import baselines as B
from registry.embedding import embed, encoders, evidence, index
from registry.data import evaluation_rows, query_cache
from registry.locus import interaction, label_columns
from registry.core.errors import RegistryError
from registry.core.store import Tx

SPLITS = ("train", "val", "test")


@dataclass
class Dataset:
    models: list[str]
    model_ids: np.ndarray        # [M]
    query_ids: np.ndarray        # [Nq] registry query ids
    qvecs: np.ndarray            # [Nq, Dq]
    correct: np.ndarray          # [M, Nq] int8, 1/0, -1 = missing
    splits: dict[str, np.ndarray]  # split -> indices into query_ids
    categories: np.ndarray       # [Nq] str
    sources: np.ndarray | None = None   # [Nq] str: the queries' source column ("(none)" where missing)

    def query_field(self, field: str) -> np.ndarray:
        """[Nq] the queries' values of a metadata column a predictor may read as categories (issue 16), or their
        labels under several columns ("category+source": querylabels)."""
        cols = label_columns.parse(field)
        if cols is None or ("source" in cols and self.sources is None):
            raise RegistryError(f"category features read the query column 'category', 'source' or both "
                                f"('category+source'), not {field!r}")
        return label_columns.join([self.categories if c == "category" else self.sources for c in cols])

    def digest(self) -> str:
        h = hashlib.sha256()
        for a in (self.query_ids, self.correct, *[self.splits[s] for s in SPLITS]):
            h.update(np.ascontiguousarray(a).tobytes())
        h.update("\n".join(self.models).encode())
        return h.hexdigest()


def dataset(tx: Tx) -> Dataset:
    """Current evaluations of every model on every query with a split, as a dense matrix."""
    q = tx.numpy("""SELECT q.id, s.split, coalesce(q.category, '(none)') AS category,
                           coalesce(q.source, '(none)') AS source FROM queries q
                    JOIN query_splits s ON s.query_id = q.id ORDER BY q.id""")
    if len(q["id"]) == 0:
        raise RegistryError("no queries with a train/val/test split: import a splits file or run "
                            "`registry draw-splits`")
    m = tx.sql("SELECT id, name FROM models ORDER BY name")
    model_ids = np.array([r[0] for r in m], dtype=np.int64)
    ev = tx.numpy(f"SELECT model_id, query_id, correct::INT AS c FROM {evaluation_rows.CURRENT} e")
    qpos = {int(x): i for i, x in enumerate(q["id"])}
    mpos = {int(x): i for i, x in enumerate(model_ids)}
    correct = np.full((len(model_ids), len(q["id"])), -1, dtype=np.int8)
    keep = np.array([int(x) in qpos for x in ev["query_id"]], dtype=bool)
    correct[[mpos[int(x)] for x in ev["model_id"][keep]], [qpos[int(x)] for x in ev["query_id"][keep]]] = ev["c"][keep]
    row_of, qmat = query_cache.query_vectors(tx, np.asarray(q["id"], dtype=np.int64))
    qvecs = qmat[[row_of[int(x)] for x in q["id"]]]
    split = np.asarray(q["split"])
    return Dataset([r[1] for r in m], model_ids, np.asarray(q["id"], dtype=np.int64), qvecs, correct,
                   {s: np.flatnonzero(split == s) for s in SPLITS}, np.asarray(q["category"]),
                   np.asarray(q["source"]))


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
    probation: dict[str, int] = field(default_factory=dict)   # on probation (evidence.py): not routed to by any
                                                              #   method; -> evaluations behind the embedding
    held_out: bool = True     # False off the test split: embeddings hold its answers, KNN and MF are tuned on val
    disagree: int = 0         # queries where the models' answers differ (hit@1_disagree is on these)
    interaction: dict = field(default_factory=dict)           # a, k, w chosen on val and what val measured
    planned_efficiency: dict | None = None   # --planned: planned against random probes at each n (probes.compare)


def current_embeddings(tx: Tx, data: Dataset, with_evidence: bool = False):
    """The active encoder's current embedding of every model that has an up-to-date one -> (z [M,D] in data's model
    order, NaN rows for the others; {model: why it has none}; encoder id). A version is up to date when its digest is
    that of the model's current non-test evaluations: one made before queries moved into the test split, for a model
    left with too few evaluations to re-embed, would carry test answers, so it is not used. `with_evidence` adds
    the evaluations behind each embedding and its stability ([M] each, in data's model order)."""
    encoder_id = encoders.require_active(tx)
    _, meta = encoders.load(tx, encoder_id)
    vids, mids, _, vecs = index.current_versions(tx, encoder_id)
    about = {r[0]: r[1:] for r in tx.sql(f"""
        SELECT v.model_id, v.digest, v.n_evaluations, coalesce(s.stability, v.stability) FROM embedding_versions v
        LEFT JOIN version_stability s ON s.version_id = v.id
        WHERE v.id IN ({', '.join(str(int(v)) for v in vids) or 'NULL'})""")}
    digest_of = {m: a[0] for m, a in about.items()}
    sets = embed.evaluation_sets(tx, [int(m) for m in mids], 2 ** 62, meta.get("embed_max_set"))
    pos = {int(m): i for i, m in enumerate(mids)}
    z = np.full((len(data.models), vecs.shape[1]), np.nan, dtype=np.float32)
    excluded = {}
    for i, (name, m) in enumerate(zip(data.models, data.model_ids)):
        m = int(m)
        if m not in pos:
            excluded[name] = "no embedding (fewer evaluations outside the test split than onboarding needs)"
        elif sets[m].digest != digest_of[m]:
            excluded[name] = (f"its embedding predates its current evaluations outside the test split ({sets[m].n}; "
                              f"too few to re-embed, or onboarding pending)")
        else:
            z[i] = vecs[pos[m]]
    if with_evidence:
        n = np.array([about.get(int(m), (None, 0, None))[1] for m in data.model_ids], dtype=np.int64)
        stab = [about.get(int(m), (None, 0, None))[2] for m in data.model_ids]
        return z, excluded, encoder_id, n, stab
    return z, excluded, encoder_id


def query_labels(data: Dataset, model) -> np.ndarray | None:
    """[Nq] what the encoder's predictor reads as the queries' categories (its category_field), or None for a
    text-only encoder."""
    return data.query_field(model.cfg.category_field) if model.cfg.categories else None


def _at(labels, idx):
    return None if labels is None else labels[idx]


def locus_probs(tx: Tx, encoder_id: int, z: np.ndarray, qvecs: np.ndarray, categories=None) -> np.ndarray:
    """P(correct) [M, N] of embeddings z [M,D] on query vectors [N,Dq] (categories [N]: their values of the
    encoder's category field, `query_labels`, read by an encoder with category features) under an encoder."""
    model, _ = encoders.load(tx, encoder_id)
    return model.p_correct(z, qvecs, categories)


def without(data: Dataset, drop: np.ndarray) -> Dataset:
    """The same dataset without the models where `drop` is True."""
    keep = ~drop
    return Dataset([n for n, k in zip(data.models, keep) if k], data.model_ids[keep], data.query_ids, data.qvecs,
                   data.correct[keep], data.splits, data.categories, data.sources)


def evaluate(tx: Tx, split: str = "test", baselines: bool = True, sample_efficiency: bool = False,
             seeds: int = 5, sizes=(32, 64, 128, 256, 512), mf_seed: int = 0,
             probation_min: int | None = None, planned: bool = False) -> EvaluationReport:
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
    data, z = without(data, left_out), z[keep]
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
    # what the predictor gives routing
    labels = query_labels(data, encoders.load(tx, encoder_id)[0])
    p = evidence.shrink(locus_probs(tx, encoder_id, z, data.qvecs[idx], _at(labels, idx)), ev)
    # the strongest model: the best single model on train, against which "differs_from_strongest" is counted
    strongest = int(np.argmax(B.model_accuracy(data.correct[:, tr]))) if len(tr) else None
    enc_name = tx.sql("SELECT name FROM encoders WHERE id = ?", [encoder_id])[0][0]
    methods = {"locus": B.routing_report(p, ct, p, strongest)}
    scores, routed, selection = {"locus": p}, p, {}
    if len(tr) and len(va):         # as routing: without a val split to choose the weights, the predictor alone
        rows = interaction.contenders(data.correct, tr, va)      # (every model here is eligible)
        raw = locus_probs(tx, encoder_id, z[rows], data.qvecs, labels)   # the predictor's own, as routing fits on
        fitted = interaction.fit(interaction.logit(raw), data.correct, data.qvecs, data.categories, tr, va, rows)
        routed = interaction.sigmoid(fitted.scores(interaction.logit(p), data.qvecs[idx],
                                                    fitted.category_index(data.categories[idx])))
        selection = fitted.selection
        methods["locus_interaction"] = dict(B.routing_report(routed, ct, routed, strongest),
                                            **{k: selection[k] for k in ("a", "k", "w")})
        scores["locus_interaction"] = routed
    chosen = B.topk_models(routed, 1)[0]
    choices = {data.models[m]: int(n) for m, n in zip(*np.unique(chosen, return_counts=True))}
    if baselines:
        methods["oracle"] = {f"hit@{k}": B.oracle_hit(ct) for k in (1, 3, 5)}
        s = B.best_single_scores(data.correct, tr, idx)
        methods["best_single"] = B.routing_report(s, ct, None, strongest)
        methods["best_single"]["model"] = data.models[int(np.argmax(s[:, 0]))]
        scores["best_single"] = s
        methods["random"] = {f"hit@{k}": B.random_hit_at_k(ct, k) for k in (1, 3, 5)}
        s, info = B.per_category_router(data.correct, data.categories, tr, va, idx)
        methods["per_category"] = dict(B.routing_report(s, ct, None, strongest), prior=info["prior"])
        scores["per_category"] = s
        k, _ = B.knn_router(data.qvecs, data.correct, tr, va)
        s = B.knn_scores(data.qvecs, data.correct, tr, idx, k)
        methods["knn"] = dict(B.routing_report(s, ct, s, strongest), k=k)
        scores["knn"] = s
        mf, info = B.mf_router(data.qvecs, data.correct, tr, va, seed=mf_seed)
        s = B.mf_probs(mf, data.qvecs, idx)
        methods["mf"] = dict(B.routing_report(s, ct, s, strongest), dim=info["dim"])
        scores["mf"] = s
        irt, info = B.irt_router(data.qvecs, data.correct, tr, va, seed=mf_seed)
        s = B.irt_probs(irt, data.qvecs, idx)
        methods["irt"] = dict(B.routing_report(s, ct, s, strongest), dim=info["dim"])
        scores["irt"] = s
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
                              disagree=int(B.disagreement(ct).sum()), interaction=selection)
    if sample_efficiency:
        report.sample_efficiency = sample_efficiency_curve(tx, data, idx, seeds, sizes)
    if planned:
        report.planned_efficiency = planned_curve(tx, data, z, idx, seeds, sizes)
    return report


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
    """hit@1 when every model is embedded from only n random non-test evaluations, against all of them."""
    encoder_id = encoders.ensure_default(tx)
    model, _ = encoders.load(tx, encoder_id)
    nontest = np.concatenate([data.splits["train"], data.splits["val"]])
    ct = data.correct[:, idx]
    out = {}
    for n in sizes:
        hits = []
        for seed in range(seeds):
            z = embed_subsets(model, data, subset_rows(data.correct, nontest, n, seed))
            p = model.p_correct(z, data.qvecs[idx], _at(query_labels(data, model), idx))
            hits.append(B.hit_at_k(p, ct, 1))
        out[str(n)] = {"mean": round(float(np.mean(hits)), 4), "std": round(float(np.std(hits)), 4), "draws": seeds}
    return out


def planned_curve(tx: Tx, data: Dataset, z: np.ndarray, idx: np.ndarray, seeds: int, sizes) -> dict:
    """Planned probes against random ones at each n (probes.compare): every model known from n non-test
    evaluations, random (the draws of `sample_efficiency_curve`) or planned from a random seed set of the same draw
    (each model in turn planned against the others' current embeddings z), each read by the set encoder and by
    likelihood, scored on the split's queries idx."""
    from registry.locus import probe_design

    model, _ = encoders.load(tx, encoders.ensure_default(tx))
    pred = probe_design.Predictor(model)
    nontest = np.concatenate([data.splits["train"], data.splits["val"]])
    return probe_design.compare(pred, pred.project(data.qvecs, query_labels(data, model)), data.correct, nontest, z.astype(np.float64),
                          idx, sizes, seeds, lambda rows: embed_subsets(model, data, rows),
                          lambda n, s: subset_rows(data.correct, nontest, n, s))
