"""Issue 19, bar 2: one low-evidence model must not take over routing.

On a copy of the registry `bin/build-default` builds: register `invented-strong` from 105 made-up results (97 outside
the test split, 90% correct, as the issue did), then compare `registry evaluate --split test` and routing before
and after, side by side. Also reads DeepSeek-Coder-V2's single-model figure from `route --frontier` (bar 3).

    .venv/bin/python bench/probation.py --db registry.duckdb
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np

from registry import Registry, RouteOptions


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    db = tmp / "copy.duckdb"
    shutil.copy(args.db, db)
    rows = []
    with Registry(db) as reg:
        with reg.store.tx() as tx:
            qs = tx.sql("""SELECT q.external_id, s.split, q.text FROM queries q JOIN query_splits s
                           ON s.query_id = q.id ORDER BY q.id""")
        rng = np.random.default_rng(0)
        nontest = [q for q in qs if q[1] != "test"]
        test = [q for q in qs if q[1] == "test"]
        pick = [nontest[i] for i in rng.choice(len(nontest), 97, replace=False)] + \
               [test[i] for i in rng.choice(len(test), 8, replace=False)]
        f = tmp / "invented.csv"
        f.write_text("question_id,correct\n" + "".join(f"{q[0]},{int(rng.random() < 0.9)}\n" for q in pick))
        texts = [q[2] for q in test[:4]]
        before = reg.evaluate("test", baselines=False)
        routed_before = [d.model for d in reg.route_batch(texts, RouteOptions(log=False))]
        r = reg.register("invented-strong", str(f))
        after = reg.evaluate("test", baselines=False)
        decisions = reg.route_batch(texts, RouteOptions(log=False))
        asked = reg.route_batch(texts, RouteOptions(log=False, include_probation=True))
        cand = next(c for c in decisions[0].candidates if c.model == "invented-strong")
        frontier = reg.frontier(split="test")
        ds = next(p for p in frontier.single if p.label == "DeepSeek-Coder-V2")
    rows.append(["LOCUS test hit@1", f"{before.methods['locus']['hit@1']:.4f}", f"{after.methods['locus']['hit@1']:.4f}"])
    rows.append(["LOCUS test AUC", f"{before.methods['locus']['auc']:.4f}", f"{after.methods['locus']['auc']:.4f}"])
    rows.append(["models LOCUS routes to", str(before.choices), str(after.choices)])
    rows.append(["4 test questions routed to", ", ".join(routed_before), ", ".join(d.model for d in decisions)])
    print(f"invented-strong: {r.n_evaluations} evaluations used for the embedding, {r.held_out} held out; "
          f"status {r.status}; stability {r.stability}")
    print(f"its P(correct) on the first question: own {cand.raw_prob:.3f}, shrunk {cand.prob:.3f}; with "
          f"--include-probation the 4 questions go to: {', '.join(d.model for d in asked)}")
    w = [max(len(r[i]) for r in rows + [["", "before", "after"]]) for i in range(3)]
    for r_ in [["", "before", "after"]] + rows:
        print("  ".join(c.ljust(n) for c, n in zip(r_, w)))
    print(f"\nroute --frontier, DeepSeek-Coder-V2 on test: {ds.scored_accuracy:.4f} on {ds.scored} scored queries of "
          f"{frontier.queries} ({ds.accuracy:.4f} counting the unscored as wrong)")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
