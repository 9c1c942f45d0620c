"""Routing benchmarks, printed as one table (issue 6, bars 1-3). Works on a copy of the given registry (routing logs
are written), so the registry itself is untouched.

    .venv/bin/python bench/routing.py --db registry.duckdb [--single 30] [--skip-batch]

1. Quality: `registry route --file` over the test split's questions (run as a real CLI subprocess) gives the same
   hit@1 as the evaluation (Registry.evaluate when present; else the argmax of predicted P over stored vectors).
2. Cost: among open-weight models, the cheapest router point reaching the best open-weight model's accuracy, as a
   share of that model's parameter count (bar: <= 60%).
3. Latency, side by side in one process, interleaved so that load on the machine hits both sides alike: one query
   through the Python API vs the bare MiniLM encode of that query (bar <= 1.3x); the test split's questions as one
   batch vs the bare batch encode of the same texts (bar <= 1.2x). Routing is asked to encode every text
   (reuse_vectors=False), as a new query would be.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from registry import Registry, RouteOptions
from registry.locus import text_encoder  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=str(ROOT / "registry.duckdb"))
    ap.add_argument("--single", type=int, default=30, help="single queries timed")
    ap.add_argument("--skip-batch", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-routing-"))
    db = work / "registry.duckdb"
    shutil.copy(args.db, db)
    rows = []
    with Registry(db) as reg:
        with reg.store.tx() as tx:
            test = tx.sql("""SELECT q.external_id, q.text FROM queries q JOIN query_splits s ON s.query_id = q.id
                             WHERE s.split = 'test' ORDER BY q.id""")
            correct = {(m, q): bool(c) for m, q, c in tx.sql("""
                SELECT m.name, q.external_id, arg_max(e.correct, e.batch_id) FROM evaluations e
                JOIN models m ON m.id = e.model_id JOIN queries q ON q.id = e.query_id
                JOIN query_splits s ON s.query_id = q.id WHERE s.split = 'test' GROUP BY ALL""")}
        n_models = len(reg.models())
        print(f"registry {args.db}: {n_models} models, {len(test)} test questions", flush=True)

        # 1. quality: the batch CLI vs the evaluation
        qfile, out = work / "test.jsonl", work / "routes.jsonl"
        qfile.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in test))
        reg.close()
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "registry", "--db", str(db), "route", "--file", str(qfile), "--out",
                        str(out), "--no-log-text"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        cli_s = time.perf_counter() - t0
        routes = [json.loads(ln) for ln in out.read_text().splitlines()]
        hit_cli = sum(correct.get((r["model"], r["id"]), False) for r in routes) / len(routes)
    with Registry(db) as reg:
        if hasattr(reg, "evaluate"):
            ev = reg.evaluate(baselines=False)
            hit_eval = _hit_from(ev)
            source = "Registry.evaluate"
        else:
            hit_eval, source = reg.frontier(split="test", weights=[0.0]).router[0].accuracy, \
                "argmax P over stored vectors"
        rows.append(["1 hit@1: route --file (CLI)", f"{hit_cli:.4f}", f"{len(routes)} queries, {cli_s:.1f} s"])
        rows.append([f"1 hit@1: {source}", "n/a" if hit_eval is None else f"{hit_eval:.4f}",
                     "agree" if hit_eval is not None and round(hit_eval, 4) == round(hit_cli, 4) else "DIFFER"])

        # 2. cost frontier among open-weight models
        f = reg.frontier(split="test", cost_by="params")   # open-weight models: those with params_b
        b, c = f.best_single, f.cheapest_matching
        rows.append(["2 best open-weight model", f"{b.accuracy:.4f}", f"{b.label}, {b.mean_cost:g}B params"])
        if c:
            rows.append(["2 router reaching it", f"{c.accuracy:.4f}",
                         f"mean {c.mean_cost:.1f}B = {100 * f.cost_ratio:.0f}% of it ({c.label}; bar <= 60%)"])
        else:
            rows.append(["2 router reaching it", "-", "; ".join(f.notes)])
        top = max(f.router, key=lambda p: p.accuracy)
        rows.append(["2 router at its best", f"{top.accuracy:.4f}", f"mean {top.mean_cost:.1f}B ({top.label})"])
        budget = 0.6 * b.mean_cost
        within = [p for p in f.router if p.mean_cost <= budget]
        if within:
            p = max(within, key=lambda p: p.accuracy)
            rows.append(["2 router's best within 60% of its cost", f"{p.accuracy:.4f}", f"mean {p.mean_cost:.1f}B"])
        ref = _category_router(reg, f.models, budget)
        rows.append(["2 reference: per-category router within 60%", f"{ref[1]:.4f}",
                     f"mean {ref[0]:.1f}B (each category's best model by acc - L x params on train, L swept)"])
        rows.append(["2 reference: best single open model within 60%", f"{ref[2][1]:.4f}",
                     f"{ref[2][0]}"])

        # 3. latency: interleaved pairs, fresh texts so that neither side finds a cached vector
        texts = [t for _, t in test]
        text_encoder.encode(["warm up"])
        reg.route("warm up", RouteOptions(log=False))
        enc, rt = [], []
        for i in range(args.single):
            q = f"[{i}] " + texts[i % len(texts)]
            t0 = time.perf_counter()
            text_encoder.encode([q])
            enc.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            reg.route_batch([q + " "], reuse_vectors=False)   # a different string: encoded again, logged
            rt.append(time.perf_counter() - t0)
        overhead = []
        for i in range(args.single):                          # the part that is not MiniLM: vector cached
            q = f"[{i}] " + texts[i % len(texts)] + " "
            t0 = time.perf_counter()
            reg.route(q)
            overhead.append(time.perf_counter() - t0)
        me, mr, mo = (statistics.median(x) * 1000 for x in (enc, rt, overhead))
        ratios = sorted(r / e for r, e in zip(rt, enc))
        rows.append(["3 one query: bare MiniLM encode", f"{me:.1f} ms", f"median of {args.single}"])
        rows.append(["3 one query: Registry.route (logged)", f"{mr:.1f} ms",
                     f"ratio {mr / me:.2f} (median of pairs {statistics.median(ratios):.2f}; bar <= 1.3)"])
        rows.append(["3 routing overhead alone (vector cached)", f"{mo:.2f} ms", f"{mo / me:.3f} of the encode"])
        if not args.skip_batch:
            batch = [f"[b] {t}" for t in texts]
            t0 = time.perf_counter()
            text_encoder.encode(batch)
            be = time.perf_counter() - t0
            t0 = time.perf_counter()
            reg.route_batch([t + " " for t in batch], reuse_vectors=False)
            br = time.perf_counter() - t0
            rows.append([f"3 batch of {len(batch)}: bare encode", f"{be:.2f} s", ""])
            rows.append([f"3 batch of {len(batch)}: Registry.route_batch", f"{br:.2f} s",
                         f"ratio {br / be:.2f} (bar <= 1.2)"])
    shutil.rmtree(work, ignore_errors=True)
    w = max(len(r[0]) for r in rows)
    print(f"\n{'measure'.ljust(w)}  {'value':>10}  note\n{'-' * w}  {'-' * 10}  ----")
    for name, value, note in rows:
        print(f"{name.ljust(w)}  {value:>10}  {note}")


def _category_router(reg, models: list[str], budget: float):
    """A router that knows, per query category, how each open model did on train: for each cost weight L it sends a
    category to the model maximising accuracy - L x params. -> (mean params, test accuracy) of its most accurate
    point within `budget`, and (name, test accuracy) of the best single model within it. A reference for what
    category-level knowledge allows on this data (LOCUS does not see categories)."""
    import numpy as np

    from registry.embedding.dataset import dataset

    with reg.store.tx() as tx:
        d = dataset(tx)
        params = dict(tx.sql("SELECT name, params_b FROM models WHERE params_b IS NOT NULL"))
    rows = [d.models.index(m) for m in models if m in params]
    P = np.array([params[d.models[i]] for i in rows])
    C = d.correct[rows] == 1                                      # [m, Nq]; missing counts as wrong
    tr, te = d.splits["train"], d.splits["test"]
    best, cats = (0.0, 0.0), np.unique(d.categories)
    for lam in [0.0] + np.geomspace(1e-5, 1e-1, 200).tolist():
        pick = {c: int(np.argmax(C[:, tr][:, d.categories[tr] == c].mean(1) - lam * P)) for c in cats}
        chosen = np.array([pick[c] for c in d.categories[te]])
        cost, acc = float(P[chosen].mean()), float(C[chosen, te].mean())
        if cost <= budget and acc > best[1]:
            best = (cost, acc)
    single = max(((d.models[i], float(C[j, te].mean())) for j, i in enumerate(rows) if P[j] <= budget),
                 key=lambda x: x[1])
    return best[0], best[1], single


def _hit_from(ev) -> float | None:
    d = ev if isinstance(ev, dict) else getattr(ev, "__dict__", {})
    if "methods" in d:                      # evaluation.EvaluationReport: methods -> {"locus": {"hit@1": ...}}
        d = d["methods"].get("locus") or d["methods"].get("LOCUS") or next(iter(d["methods"].values()), {})
    for key in ("hit@1", "hit1", "hit_at_1"):
        if key in d:
            return float(d[key])
    locus = d.get("locus") or d.get("router")
    if locus is not None:
        return _hit_from(locus)
    return None


if __name__ == "__main__":
    main()
