"""Category features (issue 16, item 3, bar 3): the LOCUS predictor with and without the queries' categories.

Per training seed (0, 1, 2): the text-only encoder (`registry train --seed S`, one thread), and the same encoder with
category features (`registry train --seed S --category-features [--category-field source]`): training's last stage
(category_rows.fit_category_rows) gives the predictor one row per category of the train queries, a logit offset per
model and category read from the model's embedding; nothing before that stage reads the categories, so the bench
applies that stage to the text-only checkpoint of the same seed instead of training it again (the same function
`registry train` calls). Two fields: `category` (14 values on MMLU-Pro) and `source` (91: the question's origin,
e.g. ori_mmlu-professional_law, stemez-Physics), the "other metadata the user names" of the issue, and both
(`--category-field category+source`: each source's offsets fitted on top of its category's, the source level's
pseudo-weight and a scale of the text logit chosen on val by the training stage; `--fields category+source`).

Each checkpoint is installed and activated in one copy of the registry (every model re-embedded from its non-test
evaluations, as the registry embeds them), then `Registry.evaluate()` reports LOCUS's test hit@1 and AUC (the
predictor alone, `locus`, and routing as served, `locus_interaction`); the per-category router (each category's
best model, chosen on train and val) is scored on the same test questions, beside them, with a paired bootstrap over
the questions of the predictor's hit@1 against it. Val figures (models embedded from train, scored on val, as
training selects) are printed too: the choice between fields is made on them, never on test.

Bar 3: with category features, LOCUS test hit@1 >= the per-category router's, and test AUC >= the text-only
checkpoint's + 0.005, in every seed.

Checkpoints are kept under --cache (KIND-seedS.safetensors), so a rerun only evaluates. A text-only checkpoint
trained by `registry train --seed S` on the same data can be put there as text-seedS.safetensors
(bench/routing_interaction.py's all-seedS.safetensors are such); the bench checks its data digest and config.

    .venv/bin/python bench/category_features.py --db registry.duckdb --cache /work/cache-cat [--json-out F]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from registry import Registry
from registry.embedding.dataset import current_embeddings, dataset, locus_probs, query_labels  # noqa: E402
from registry.locus import baselines as B  # noqa: E402
from registry.locus import category_rows, scoring, training  # noqa: E402
from registry.locus.checkpoint import load_checkpoint, read_header, save_checkpoint  # noqa: E402

BAR_AUC = 0.005


def log(t0: float, msg: str) -> None:
    print(f"[{time.time() - t0:6.0f} s] {msg}", flush=True)


def wait_quiet(t0: float) -> None:
    """The lead measures latency while /work/QUIET exists: no training starts then."""
    quiet = Path("/work/QUIET")
    if quiet.exists():
        log(t0, "waiting for /work/QUIET to go")
        while quiet.exists():
            time.sleep(10)


def checkpoint(data, cache: Path, kind: str, seed: int, overrides: dict, t0: float) -> Path:
    """cache/KIND-seedS.safetensors, made if missing: `text` as `registry train --seed S` trains it, a category
    kind as `registry train --seed S --category-features --category-field F` does (its last stage applied to the
    text-only checkpoint)."""
    path = cache / f"{kind}-seed{seed}.safetensors"
    if path.exists():
        meta = read_header(path.read_bytes())["meta"]
        if meta.get("train_data_digest") != data.digest():
            raise SystemExit(f"{path}: trained on other data ({meta.get('train_data_digest')})")
        want = json.loads(json.dumps(asdict(replace(training.TrainConfig(seed=seed), **overrides)), default=str))
        have = dict(meta.get("train_config", {}))
        # a checkpoint from before the category fields has them at their defaults
        have = {**{k: want[k] for k in ("category_features", "category_field", "category_l2", "category_fit",
                                        "category_l2_deep", "category_text_scales")}, **have}
        have["encoder"] = {"categories": [], "category_field": "category", **have.get("encoder", {})}
        differ = {k for k in want if have.get(k) != want[k]}
        if differ:
            raise SystemExit(f"{path}: trained with another config ({sorted(differ)})")
        return path
    wait_quiet(t0)
    if kind == "text":
        log(t0, f"{kind} seed {seed}: training")
        blob, _ = training.checkpoint_from(data, seed=seed, name=f"bench-{kind}-seed{seed}")
    else:
        log(t0, f"{kind} seed {seed}: the category stage on text-seed{seed}")
        text = checkpoint(data, cache, "text", seed, {}, t0)
        model, _, meta = load_checkpoint(text.read_bytes())
        cfg = replace(training.TrainConfig(seed=seed), **overrides)
        model, ecfg, info = category_rows.fit_category_rows(
            model, data.qvecs, data.correct, data.splits["train"], data.splits["val"],
            data.query_field(cfg.category_field), field=cfg.category_field, l2=cfg.category_l2,
            fit=cfg.category_fit, deep_l2=tuple(cfg.category_l2_deep), text_scales=tuple(cfg.category_text_scales))
        meta = dict(meta, name=f"bench-{kind}-seed{seed}", metrics=dict(meta["metrics"], category=info),
                    train_config=json.loads(json.dumps(asdict(cfg), default=str)))
        blob = save_checkpoint(model, ecfg, meta)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(blob)
    tmp.rename(path)
    log(t0, f"{kind} seed {seed}: trained")
    return path


def scored(reg: Registry, path: Path, per_cat_hits: np.ndarray, draws: int = 1000) -> dict:
    """Install and activate the checkpoint, `Registry.evaluate()` on test without baselines; the predictor's
    question-by-question outcome against the per-category router's (paired bootstrap of the hit@1 difference)."""
    enc = reg.install_encoder(str(path), name=path.stem)
    reg.activate_encoder(enc)
    r = asdict(reg.evaluate(baselines=False))
    with reg.store.tx() as tx:
        data = dataset(tx)
        z, excluded, encoder_id = current_embeddings(tx, data)
        te = data.splits["test"]
        model, _ = load_checkpoint(path.read_bytes())[:2]
        labels = query_labels(data, model)
        p = locus_probs(tx, encoder_id, z, data.qvecs[te], None if labels is None else labels[te])
    ct = data.correct[:, te]
    hits = ct[B.topk_models(p, 1)[0], np.arange(len(te))] == 1
    rng = np.random.default_rng(0)
    diffs = np.array([(hits[i].astype(float) - per_cat_hits[i]).mean()
                      for i in (rng.integers(0, len(te), len(te)) for _ in range(draws))])
    # val as training selects: every model embedded from its train evaluations, scored on the val questions
    va = data.splits["val"]
    z_tr = scoring.embed_models(model, data.qvecs, data.correct, data.splits["train"])
    pv = model.p_correct(z_tr, data.qvecs[va], None if labels is None else labels[va])
    val = {"hit@1": B.hit_at_k(pv, data.correct[:, va], 1), "auc": B.predictor_metrics(pv, data.correct[:, va])["auc"]}
    drift = None
    if model.cfg.categories:
        # the offsets of the models as the registry embeds them (train and val answers) against those the rows
        # were fitted on (train answers): how far a re-embedded model's offsets move
        with torch.no_grad():
            o = model.category_offsets(torch.from_numpy(z.astype(np.float64)))[:, 1:]
            o_tr = model.category_offsets(torch.from_numpy(z_tr.astype(np.float64)))[:, 1:]
        drift = {"offset_abs_mean": float(o_tr.abs().mean()), "drift_abs_mean": float((o - o_tr).abs().mean()),
                 "drift_abs_max": float((o - o_tr).abs().max())}
    return {"locus": r["methods"]["locus"], "locus_interaction": r["methods"].get("locus_interaction"),
            "interaction": {k: r["interaction"].get(k) for k in ("a", "k", "w")},
            "val_hit@1": val["hit@1"], "val_auc": val["auc"], "offsets": drift,
            "paired_hit@1": float(hits.mean()), "only_locus": int((hits & ~per_cat_hits).sum()),
            "only_per_category": int((per_cat_hits & ~hits).sum()),
            "ci95_vs_per_category": [float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--cache", default="/work/cache-cat")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--fields", nargs="*", default=["category", "source", "category+source"])
    ap.add_argument("--fits", nargs="*", default=["train", "nontest"],
                    help="the answers the category rows are fitted to (TrainConfig.category_fit)")
    ap.add_argument("--train-only", action="store_true", help="train what is missing, evaluate nothing")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    kinds = {"text": {}, **{f + ("" if fit == "train" else f"-{fit}"): {"category_features": True,
                                                                         "category_field": f, "category_fit": fit}
                            for fit in args.fits for f in args.fields}}

    with Registry(args.db) as reg, reg.store.tx() as tx:
        data = dataset(tx)
    paths = {(k, s): checkpoint(data, cache, k, s, over, t0) for s in args.seeds for k, over in kinds.items()}
    if args.train_only:
        return

    db = cache / "eval.duckdb"
    shutil.copy(args.db, db)
    te, tr, va = data.splits["test"], data.splits["train"], data.splits["val"]
    ct = data.correct[:, te]
    pc, _ = B.per_category_router(data.correct, data.categories, tr, va, te)
    per_cat = B.routing_report(pc, ct, None)
    per_cat_hits = ct[B.topk_models(pc, 1)[0], np.arange(len(te))] == 1
    out = {"per_category": per_cat, "runs": {}}
    with Registry(db) as reg:
        for (k, s), path in paths.items():
            log(t0, f"{k} seed {s}: install, re-embed, evaluate")
            out["runs"][f"{k}-seed{s}"] = scored(reg, path, per_cat_hits)
    db.unlink()

    print(f"\nTEST ({len(te)} questions; std err of hit@1 ~0.013). per-category router hit@1 {per_cat['hit@1']:.4f}")
    print("| seed | encoder | val hit@1 | val AUC | test hit@1 (predictor) | test AUC | AUC - text only | "
          "95% CI of hit@1 - per-category | routing as served (+interaction) |")
    print("|---|---|---|---|---|---|---|---|---|")
    verdicts = []
    for s in args.seeds:
        base = out["runs"][f"text-seed{s}"]["locus"]["auc"]
        for k in kinds:
            r = out["runs"][f"{k}-seed{s}"]
            li = r["locus_interaction"] or {}
            d = r["locus"]["auc"] - base
            r["auc_delta"] = round(d, 4)
            ci = r["ci95_vs_per_category"]
            print(f"| {s} | {k} | {r['val_hit@1']:.4f} | {r['val_auc']:.4f} | {r['locus']['hit@1']:.4f} | "
                  f"{r['locus']['auc']:.4f} | {d:+.4f} | [{ci[0]:+.4f}, {ci[1]:+.4f}] | {li.get('hit@1', float('nan')):.4f} |")
            if k != "text":
                # question counts, not the report's hit@1 (rounded to 4 places: 880 of 1,203 read 0.7315 < 0.73150)
                ok = int(round(r["paired_hit@1"] * len(te))) >= int(per_cat_hits.sum()) and d >= BAR_AUC
                verdicts.append((k, s, ok))
    for (k, s), path in paths.items():
        info = read_header(path.read_bytes())["meta"]["metrics"].get("category") or {}
        if "deep_l2" in info:           # several columns: the source pseudo-weight and the text scale, chosen on val
            out["runs"][f"{k}-seed{s}"].update(deep_l2=info["deep_l2"], text_scale=info["text_scale"],
                                               choices_val=info["choices_val"])
            print(f"{k} seed {s}: text scale {info['text_scale']:g}, source pseudo-weight {info['deep_l2']:g}, "
                  "chosen on val from (hit@1 / AUC / log loss) " + ", ".join(
                      f"{c}: {v['hit@1']:.4f} / {v['auc']:.4f} / {v['log_loss']:.4f}"
                      for c, v in info["choices_val"].items()))
    for k in [k for k in kinds if k != "text"]:
        oks = [ok for kk, s, ok in verdicts if kk == k]
        print(f"bar 3 ({k}): hit@1 >= per-category ({per_cat['hit@1']:.4f}) and AUC +{BAR_AUC} over text only, "
              f"in {sum(oks)} of {len(oks)} seeds: {'holds' if all(oks) else 'FAILS'}")
    for k in kinds:
        rows = [out["runs"][f"{k}-seed{s}"] for s in args.seeds]
        print(f"mean over seeds, {k}: test hit@1 {np.mean([r['locus']['hit@1'] for r in rows]):.4f}, "
              f"AUC {np.mean([r['locus']['auc'] for r in rows]):.4f}, "
              f"val hit@1 {np.mean([r['val_hit@1'] for r in rows]):.4f}, val AUC {np.mean([r['val_auc'] for r in rows]):.4f}")
    log(t0, "done")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
