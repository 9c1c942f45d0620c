"""Every routing method on each dataset, side by side in one run (issue bar: routing as served at least the simple
routers - 0.005 and above the best single model; the predictor's AUC at least KNN's and MF's).

    .venv/bin/python bench/benchmarks.py DIR... [--seeds 0 1 2] [--work W] [--json]

For each dataset folder (the registry's input layout: shared/data/mmlu-pro, or one built by bench/devdata.py):
`registry --db W/<name>.duckdb import DIR` (kept in W and reused when it is there already), then per seed a copy of
it: `registry train --seed S --activate` and `registry evaluate --split test --json`, all as real CLI subprocesses.
The table gives hit@1 (and AUC where the method has probabilities) of: served (the policy routing serves, with its
name), predictor (LOCUS alone), predictor + interaction, KNN, MF, IRT, per-category, per-source, best single.

Folders that are the five folds of one draw (bench/devdata.py --fold F: `<name>-fold<F>`) are also pooled per seed:
every question tested once, hit@1 over all of them, served minus each method query by query summed over the folds
with its paired standard error, AUC the folds' mean weighted by queries. A dev dataset of 805 questions has a test
split of 161 (a paired SE near 0.022, four times the bar's 0.005); pooled, 805.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = (("served", "served"), ("predictor", "locus"), ("predictor+interaction", "locus_interaction"),
        ("KNN", "knn"), ("MF", "mf"), ("IRT", "irt"), ("per-category", "per_category"),
        ("per-source", "per_source"), ("best single", "best_single"), ("oracle", "oracle"))
SIMPLE = ("knn", "mf", "irt", "per_category", "per_source")


def cli(db: Path, *args: str, log: Path) -> str:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    with open(log, "a") as err:
        out = subprocess.run([sys.executable, "-m", "registry", "--db", str(db), *args], check=True, text=True,
                             stdout=subprocess.PIPE, stderr=err, env=env, cwd=ROOT).stdout
    print(f"  {' '.join(args[:2])}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return out


def run(folder: Path, seed: int, work: Path) -> dict:
    name = folder.name
    base = work / f"{name}.duckdb"
    log = work / f"{name}.log"
    if not base.exists():
        cli(base, "import", str(folder), log=log)
    db = work / f"{name}-seed{seed}.duckdb"
    if not db.exists():
        shutil.copy(base, db)
        cli(db, "train", "--seed", str(seed), "--activate", log=log)
    report = json.loads(cli(db, "evaluate", "--split", "test", "--json", log=log))
    out = {"dataset": name, "seed": seed, "queries": report["queries"], "models": report["models"],
           "served": report.get("served", {}), "methods": report["methods"]}
    if priced(folder):
        f = json.loads(cli(db, "route", "--frontier", "--cost-by", "cost", "--split", "test", "--json",
                           "--out", str(work / f"{name}-seed{seed}-frontier.png"), log=log))
        out["frontier"] = {"priced_models": len(f["models"]), "best_single": f["best_single"], "reach": f["reach"]}
    return out


def priced(folder: Path) -> bool:
    """Whether the dataset's models file gives prices (a `cost` column): then the cost frontier is measured too."""
    models = folder / "models.csv"
    return models.exists() and "cost" in models.read_text(encoding="utf-8").splitlines()[0].split(",")


def frontier_bar(r: dict) -> bool | None:
    """The router reaches 95% of the best single model's accuracy for less than any single model that reaches it,
    and for at most 60% of the best one's cost (None: no prices)."""
    if "frontier" not in r:
        return None
    row = r["frontier"]["reach"]["0.95"]
    router, single = row["router"], row["single"]
    return router is not None and router["cost_ratio"] <= 0.6 and (
        single is None or router["mean_cost"] < single["mean_cost"])


def bars(r: dict) -> dict:
    m = r["methods"]
    hit = {k: m[k]["hit@1"] for k in m if "hit@1" in m[k]}
    simple = max(hit[k] for k in SIMPLE if k in hit)
    auc = lambda k: m.get(k, {}).get("auc")  # noqa: E731
    return {"router at 95% of best: cheaper than any single, <= 60%": frontier_bar(r),
            "served >= simple - 0.005": hit["served"] >= simple - 0.005,
            "served > best single": hit["served"] > hit["best_single"],
            "predictor AUC >= KNN, MF": all(auc("locus") is not None and auc(k) is not None and auc("locus") >= auc(k)
                                            for k in ("knn", "mf")),
            "predictor+interaction AUC >= KNN, MF": all(
                auc("locus_interaction") is not None and auc(k) is not None and auc("locus_interaction") >= auc(k)
                for k in ("knn", "mf"))}


def versus_best_simple(r: dict) -> str:
    """Served minus the best simple router on test, query by query (evaluate's vs_served): the difference and its
    paired standard error, with the router's name."""
    m = r["methods"]
    best = max((k for k in SIMPLE if k in m), key=lambda k: m[k]["hit@1"], default=None)
    if best is None or "vs_served" not in m[best]:
        return ""
    v = m[best]["vs_served"]
    return f"{v['diff']:+.4f} ({v['se']:.4f}, {best})"


FOLD = re.compile(r"^(.*)-fold(\d+)$")


def pooled(results: list[dict]) -> list[dict]:
    """One result per (dataset, seed) over its folds (two or more `<name>-fold<F>` results of the seed): hit@1 and
    AUC weighted by each fold's queries, vs_served from the summed query counts."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        m = FOLD.match(r["dataset"])
        if m:
            groups.setdefault((m.group(1), r["seed"]), []).append(r)
    out = []
    for (name, seed), rs in sorted(groups.items()):
        if len(rs) < 2:
            continue
        n = sum(r["queries"] for r in rs)
        methods = {}
        for key in {k for r in rs for k in r["methods"]}:
            parts = [(r["queries"], r["methods"][key]) for r in rs if key in r["methods"]]
            if len(parts) < len(rs):
                continue                              # a method some fold lacks (per-source without sources)
            row = {}
            for metric in ("hit@1", "auc"):
                if all(v.get(metric) is not None for _, v in parts):
                    row[metric] = round(sum(q * v[metric] for q, v in parts) / n, 4)
            if all("served_better" in v.get("vs_served", {}) for _, v in parts):
                better = sum(v["vs_served"]["served_better"] for _, v in parts)
                worse = sum(v["vs_served"]["served_worse"] for _, v in parts)
                mean = (better - worse) / n
                var = max(better + worse - n * mean * mean, 0.0) / max(n - 1, 1)
                row["vs_served"] = {"served_better": better, "served_worse": worse, "diff": round(mean, 4),
                                    "se": round(math.sqrt(var / n), 4)}
            methods[key] = row
        policies = sorted({r["served"].get("policy", "") for r in rs})
        out.append({"dataset": f"{name} ({len(rs)} folds)", "seed": seed, "queries": n, "models": rs[0]["models"],
                    "served": {"policy": "/".join(policies)}, "methods": methods})
    return out


def table(results: list[dict]) -> str:
    heads = [f"{r['dataset']} s{r['seed']}" for r in results]
    lines = ["| method | " + " | ".join(heads) + " |", "|---" * (len(heads) + 1) + "|"]
    for label, key in ROWS:
        cells = []
        for r in results:
            v = r["methods"].get(key)
            if not v:
                cells.append("")
                continue
            cell = f"{v['hit@1']:.4f}" + (f" ({v['auc']:.4f})" if v.get("auc") is not None else "")
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| served policy | " + " | ".join(r["served"].get("policy", "") for r in results) + " |")
    lines.append("| served minus the best simple router (paired SE) | "
                 + " | ".join(versus_best_simple(r) for r in results) + " |")
    for share in ("0.95", "0.99"):
        cells = []
        for r in results:
            row = r.get("frontier", {}).get("reach", {}).get(share)
            cells.append("" if row is None else " / ".join(
                "none" if row[k] is None else f"{row[k]['cost_ratio']:.3f} ({row[k]['label']})"
                for k in ("router", "single")))
        lines.append(f"| cost for {share} of best single: router / cheapest single | " + " | ".join(cells) + " |")
    for bar in ("served >= simple - 0.005", "served > best single", "predictor AUC >= KNN, MF",
                "predictor+interaction AUC >= KNN, MF", "router at 95% of best: cheaper than any single, <= 60%"):
        marks = {True: "yes", False: "NO", None: ""}
        lines.append(f"| {bar} | " + " | ".join(marks[bars(r)[bar]] for r in results) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="*", type=Path)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench-benchmarks"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--from", dest="saved", type=Path, help="print the table of a saved --json run instead")
    args = ap.parse_args(argv)
    if args.saved:
        saved = json.loads(args.saved.read_text(encoding="utf-8"))
        print(table([r for r in saved if not r.get("pooled")] + pooled(saved)))
        return
    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    for folder in args.dirs:
        if not (folder / "evaluations.csv.gz").exists() and not (folder / "evaluations.csv").exists():
            raise SystemExit(f"{folder}: not a dataset folder (no evaluations.csv.gz)")
        for seed in args.seeds:
            print(f"{folder.name} seed {seed}", file=sys.stderr, flush=True)
            results.append(run(folder, seed, args.work))
    pools = pooled(results)
    if args.json:
        print(json.dumps([dict(r, bars=bars(r)) for r in results]
                         + [dict(r, bars=bars(r), pooled=True) for r in pools], indent=1))
    else:
        print("hit@1 on the test split (AUC of the method's probabilities)\n")
        print(table(results + pools))


if __name__ == "__main__":
    main()
