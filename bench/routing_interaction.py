"""Routing that never loses to the simple routers (issue 20): LOCUS alone, LOCUS + interaction (what `registry route`
serves, locus/interaction.py), KNN, MF, IRT, the per-category router and the best single model, side by side, in three
situations:

1. All models, training seeds 0, 1, 2: per seed an encoder trained as `registry train --seed S` does (one thread),
   installed and activated in a copy of the registry (every model re-embedded), then `Registry.evaluate()`.
2. Held out: 6 models known from 128 evaluations, seeds 0, 1, 2 (`registry evaluate --held-out 6 --n 128`, the same
   library calls as bench/heldout.py).
3. Whole categories held out: a copy of the registry with `registry draw-splits --by category --test-categories
   A,B`, an encoder trained on that split (seed 0), then `Registry.evaluate()`: routing on questions of a kind the
   training never saw.

Bars: (1) LOCUS+interaction hit@1 >= KNN's, MF's and the per-category router's in every seed, and > best single's;
(2) >= KNN's and MF's in every held-out seed; (3) >= KNN's and best single's with the categories held out; (4) AUC
no lower than today's: the report's LOCUS AUC is the predictor's, unchanged; the router's own AUC is printed beside it. Also: the served router against the report (the test
questions routed through `Registry.route_batch`, their choices compared with the report's) and route latency.

Trained encoders and the registry copies are kept under --cache, so a rerun only evaluates (training takes about
6 minutes per seed on one quiet thread; far longer on a shared machine).

    .venv/bin/python bench/routing_interaction.py --db registry.duckdb --cache /work/cache-routing [--json-out F]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from registry import Registry, RouteOptions
from registry.embedding.dataset import dataset  # noqa: E402
from registry.evaluate import heldout
from registry.locus import training  # noqa: E402
from registry.locus.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from registry.routing import choice
from registry.routing import fit as routing_fit

ROWS = [("locus", "LOCUS"), ("locus_interaction", "LOCUS+interaction"), ("knn", "KNN"), ("mf", "MF"),
        ("irt", "IRT"), ("per_category", "per-category"), ("best_single", "best single")]


def log(t0: float, msg: str) -> None:
    print(f"[{time.time() - t0:6.0f} s] {msg}", flush=True)


def trained_copy(src: Path, cache: Path, tag: str, seed: int, prepare=None, t0=0.0) -> Path:
    """A copy of the registry (prepared by `prepare(reg)`, e.g. new splits) whose active encoder is the one
    `registry train --seed seed` trains on it, kept as cache/tag.duckdb (its checkpoint as cache/tag.safetensors)."""
    db, ckpt = cache / f"{tag}.duckdb", cache / f"{tag}.safetensors"
    if db.exists():
        return db
    tmp = cache / f"{tag}.tmp.duckdb"
    shutil.copy(src, tmp)
    with Registry(tmp) as reg:
        if prepare:
            prepare(reg)
        if not ckpt.exists():
            log(t0, f"{tag}: training seed {seed}")
            with reg.store.tx() as tx:
                data = dataset(tx)
            blob, _ = training.checkpoint_from(data, seed=seed, name=f"bench-{tag}")
            ckpt.write_bytes(blob)
        log(t0, f"{tag}: installing and re-embedding")
        reg.install_encoder(str(ckpt), name=f"bench-{tag}", activate=True)
    tmp.rename(db)
    return db


def evaluate(db: Path) -> dict:
    with Registry(db) as reg:
        return asdict(reg.evaluate())


def served_vs_report(db: Path, report: dict) -> dict:
    """The test questions routed as `registry route` routes them (stored vectors: no MiniLM), against the report's
    choices; and the latency of one known text with and without the interaction terms, in one process."""
    with Registry(db) as reg, reg.store.tx() as tx:
        texts = [r[0] for r in tx.sql("""SELECT q.text FROM queries q JOIN query_splits s ON s.query_id = q.id
                                         WHERE s.split = 'test' ORDER BY q.id""")]
        t = time.perf_counter()
        st = routing_fit.keep(tx)                # (a Registry just opened: read or built, not cached)
        build_s = time.perf_counter() - t
        decs = choice.route(tx, texts, RouteOptions(log=False))
        counts = {}
        for d in decs:
            counts[d.model] = counts.get(d.model, 0) + 1
        lat, kept = {}, st.interaction
        for label, inter in (("with", kept), ("without", None)):
            st.interaction = inter
            times = []
            for text in texts[:200]:
                t = time.perf_counter()
                choice.route(tx, [text], RouteOptions(log=False))
                times.append(time.perf_counter() - t)
            lat[label] = round(1000 * float(np.median(times)), 2)
        st.interaction = kept
    return {"same_counts": counts == report["choices"], "served_choices": counts, "state_build_s": round(build_s, 2),
            "route_known_text_ms": lat}


def paired_vs_per_category(db: Path, draws: int = 1000) -> dict:
    """The served router's choices on the test questions (`Registry.route_batch`) against the per-category
    router's, question by question: on how many questions they choose differently with a different outcome, and a
    paired bootstrap over the questions of the hit@1 difference."""
    from registry.locus import baselines as B

    with Registry(db) as reg:
        with reg.store.tx() as tx:
            data = dataset(tx)
            text_of = dict(tx.sql("SELECT id, text FROM queries"))
        te, tr, va = data.splits["test"], data.splits["train"], data.splits["val"]
        decisions = reg.route_batch([text_of[int(q)] for q in data.query_ids[te]], RouteOptions(log=False))
    row = {n: i for i, n in enumerate(data.models)}
    ct = data.correct[:, te]
    served = np.array([ct[row[d.model], j] == 1 for j, d in enumerate(decisions)])
    pc, _ = B.per_category_router(data.correct, data.categories, tr, va, te)
    other = ct[B.topk_models(pc, 1)[0], np.arange(len(te))] == 1
    rng = np.random.default_rng(0)
    diffs = np.array([(served[i] - other[i].astype(float)).mean()
                      for i in (rng.integers(0, len(te), len(te)) for _ in range(draws))], dtype=np.float64)
    return {"served_hit@1": float(served.mean()), "per_category_hit@1": float(other.mean()),
            "served_only": int((served & ~other).sum()), "per_category_only": int((other & ~served).sum()),
            "ci95": [float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))],
            "share_at_least": float((diffs >= 0).mean())}


class CachedTrain:
    """training.train for the held-out run, kept on disk per seed and visible data (bench/heldout.py retrains)."""

    def __init__(self, cache: Path, t0: float):
        self.cache, self.t0 = cache, t0

    def __call__(self, qvecs, correct, train_idx, val_idx, cfg, progress=None):
        h = hashlib.sha256(np.ascontiguousarray(correct).tobytes())
        h.update(json.dumps(asdict(cfg), sort_keys=True, default=str).encode())
        path = self.cache / f"heldout-seed{cfg.seed}-{h.hexdigest()[:12]}.safetensors"
        lock = path.with_suffix(".training")
        while lock.exists() and not path.exists():      # another run of this bench is training it
            time.sleep(10)
        if path.exists():
            model, ecfg, meta = load_checkpoint(path.read_bytes())
            return model, ecfg, meta["metrics"]
        log(self.t0, f"held-out seed {cfg.seed}: training")
        lock.touch()
        try:
            model, ecfg, metrics = training.train(qvecs, correct, train_idx, val_idx, cfg)
            keep = {"best_step": metrics["best_step"], "val_hit@1": metrics["val_hit@1"]}
            path.write_bytes(save_checkpoint(model, ecfg, {"metrics": keep}))
        finally:
            lock.unlink()
        return model, ecfg, keep


def table(methods: dict, extra: str = "") -> None:
    print(f"| method | hit@1 | AUC | models chosen | not the strongest | hit@1 where models disagree |{extra}")
    print("|---|---|---|---|---|---|")
    f = lambda v: "" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))  # noqa: E731
    for key, label in ROWS:
        v = methods.get(key)
        if v is not None:
            print(f"| {label} | {f(v.get('hit@1'))} | {f(v.get('auc'))} | {v.get('n_chosen', 0):.4g} | "
                  f"{f(v.get('differs_from_strongest'))} | {f(v.get('hit@1_disagree'))} |")


def verdict(ok: bool) -> str:
    return "holds" if ok else "FAILS"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--cache", default="/work/cache-routing")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--held-out-seeds", type=int, nargs="*", default=[0, 1, 2])
    ap.add_argument("--test-categories", default="law,physics")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json-out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    src = Path(args.db)
    t0 = time.time()
    out = {"all": {}, "held_out": {}, "categories": None}

    # 1. all models, per training seed
    for s in args.seeds:
        db = trained_copy(src, cache, f"all-seed{s}", s, t0=t0)
        log(t0, f"all models, seed {s}: evaluate")
        out["all"][s] = evaluate(db)
        out["all"][s]["paired"] = paired_vs_per_category(db)
    if args.seeds:
        out["served"] = served_vs_report(cache / f"all-seed{args.seeds[0]}.duckdb", out["all"][args.seeds[0]])

    # 2. held out: 6 models from 128 evaluations
    with Registry(src) as reg, reg.store.tx() as tx:
        data = dataset(tx)
    cfg = heldout.train_config()
    for s in args.held_out_seeds:
        log(t0, f"held out, seed {s}")
        res, _, _, _ = heldout.run_seed(data, 6, 128, seed=s, cfg=cfg, train=CachedTrain(cache, t0))
        out["held_out"][s] = asdict(res)

    # 3. whole categories held out
    cats = [c for c in args.test_categories.split(",") if c]
    if cats:
        tag = "cat-" + "-".join(c.replace(" ", "_") for c in cats) + "-seed0"
        db = trained_copy(src, cache, tag, 0, prepare=lambda reg: reg.draw_splits(by="category",
                                                                                  test_categories=cats), t0=t0)
        log(t0, f"categories {cats} held out: evaluate")
        out["categories"] = {"test_categories": cats, **evaluate(db)}
    wall = time.time() - t0

    # ---- tables and bars
    bars = {}
    print(f"\n## 1. All {next(iter(out['all'].values()))['models'] if out['all'] else ''} models, "
          f"{next(iter(out['all'].values()))['queries'] if out['all'] else ''} test questions")
    b1 = []
    for s, r in out["all"].items():
        m, sel = r["methods"], r["interaction"]
        print(f"\nseed {s}: interaction a={sel['a']}, k={sel['k']}, w={sel['w']} (val hit@1 "
              f"{sel.get('val_hit', {}).get('chosen')} vs the predictor's {sel.get('val_hit', {}).get('predictor')}); "
              f"{r['disagree']} questions where models disagree")
        table(m)
        h = m["locus_interaction"]["hit@1"]
        ok = all(h >= m[b]["hit@1"] for b in ("knn", "mf", "per_category")) and h > m["best_single"]["hit@1"]
        auc_ok = m["locus_interaction"]["auc"] >= m["locus"]["auc"]
        b1.append(ok)
        bars.setdefault("router AUC >= predictor AUC", []).append(auc_ok)
        pv = r["paired"]
        print(f"served router vs per-category, question by question: right only with the served router on "
              f"{pv['served_only']}, only with per-category on {pv['per_category_only']}; paired bootstrap of the "
              f"hit@1 difference, 95% [{pv['ci95'][0]:+.4f}, {pv['ci95'][1]:+.4f}], >= 0 in "
              f"{pv['share_at_least']:.0%} of resamples")
        print(f"bar 1, seed {s}: {h:.4f} vs KNN {m['knn']['hit@1']:.4f}, MF {m['mf']['hit@1']:.4f}, per-category "
              f"{m['per_category']['hit@1']:.4f}, best single {m['best_single']['hit@1']:.4f}: {verdict(ok)}; "
              f"router AUC {m['locus_interaction']['auc']:.4f} vs LOCUS {m['locus']['auc']:.4f}: {verdict(auc_ok)}")
    bars["1"] = b1
    if "served" in out:
        sv = out["served"]
        print(f"\nserved = measured (seed {args.seeds[0]}): `Registry.route_batch` over the test questions chooses "
              f"each model as often as the report: {sv['same_counts']}; routing state built in "
              f"{sv['state_build_s']} s; one known text routed in {sv['route_known_text_ms']['with']} ms with the "
              f"interaction, {sv['route_known_text_ms']['without']} ms without (median of 200)")

    print("\n## 2. Held out: 6 models known from 128 evaluations")
    b2 = []
    for s, r in out["held_out"].items():
        m = r["methods"]
        print(f"\nseed {s}: held out {', '.join(r['held_out'])}; interaction a={m['locus_interaction']['a']}, "
              f"k={m['locus_interaction']['k']}, w={m['locus_interaction']['w']}")
        table(m)
        h = m["locus_interaction"]["hit@1"]
        ok = h >= m["knn"]["hit@1"] and h >= m["mf"]["hit@1"]
        auc_ok = m["locus_interaction"]["auc"] >= m["locus"]["auc"]
        b2.append(ok)
        bars["router AUC >= predictor AUC"].append(auc_ok)
        print(f"bar 2, seed {s}: {h:.4f} vs KNN {m['knn']['hit@1']:.4f}, MF {m['mf']['hit@1']:.4f}: {verdict(ok)}; "
              f"router AUC {m['locus_interaction']['auc']:.4f} vs LOCUS {m['locus']['auc']:.4f}: {verdict(auc_ok)}")
    bars["2"] = b2

    if out["categories"]:
        r = out["categories"]
        m, sel = r["methods"], r["interaction"]
        print(f"\n## 3. Categories held out of training: {', '.join(r['test_categories'])} ({r['queries']} test "
              f"questions; encoder trained on the other categories, seed 0)\n\ninteraction a={sel['a']}, "
              f"k={sel['k']}, w={sel['w']}")
        table(m)
        h = m["locus_interaction"]["hit@1"]
        ok = h >= m["knn"]["hit@1"] and h >= m["best_single"]["hit@1"]
        auc_ok = m["locus_interaction"]["auc"] >= m["locus"]["auc"]
        bars["3"] = [ok]
        bars["router AUC >= predictor AUC"].append(auc_ok)
        print(f"bar 3: {h:.4f} vs KNN {m['knn']['hit@1']:.4f}, best single {m['best_single']['hit@1']:.4f}: "
              f"{verdict(ok)}; router AUC {m['locus_interaction']['auc']:.4f} vs LOCUS {m['locus']['auc']:.4f}: "
              f"{verdict(auc_ok)}")
    print("\nbars: " + "; ".join(f"{k}: {verdict(all(v))} ({sum(v)} of {len(v)})" for k, v in sorted(bars.items()))
          + "\nbar 4 (AUC no lower than today's): the AUC the report gives LOCUS comes from the predictor's "
            "probabilities, which this issue leaves as they were, so it is today's in every run; the router's own AUC "
            "is the line above"
          + f"\n{wall:.0f} s in all; {args.threads} thread(s)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(dict(out, bars=bars, wall_s=wall), indent=1, default=str))


if __name__ == "__main__":
    main()
