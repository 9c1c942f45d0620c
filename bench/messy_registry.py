"""A lived-in registry, and what `similar` says in it. From a copy of the default registry, registers what a few
ordinary days bring: an exact copy of Meta-Llama-3-8B from 128 answers under a name with a space and a slash
(`my model/1`), a 128-answer copy of Mistral-7B-Instruct-v0.1 with 10% of its outcomes flipped (`my-model`), a
coin flip (`rand-model`), a model answering a random letter (`rand-ans`) and one always answering "A" (`always-a`),
all on the same 128 train questions. Then, for every established model M, `similar M` over the whole pool, checked:

- junk: a random answerer (coin, letter, constant letter) listed above an established member of M's family;
- copy: `similar "my model/1"` lists Meta-Llama-3-8B first;
- support: a 128-answer model listed above an established family member F of M where the model it copies is not
  itself above F in M's list (its answers do not support the place);
- and each model's first five, with how each was placed.

    .venv/bin/python bench/messy_registry.py [--db registry.duckdb] [--seed 0] [--json]
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry import Registry  # noqa: E402

RANDOM = ("rand-model", "rand-ans", "always-a")
COPIES = {"my model/1": "Meta-Llama-3-8B", "my-model": "Mistral-7B-Instruct-v0.1"}
N = 128


def build(db: Path, seed: int) -> None:
    """Register the five newcomers into `db`."""
    rng = np.random.default_rng(seed)
    with Registry(db) as reg, reg.store.tx() as tx:
        train = [r[0] for r in tx.sql("""SELECT q.external_id FROM queries q JOIN query_splits s ON s.query_id = q.id
                                          WHERE s.split = 'train' ORDER BY q.external_id""")]
        picked = sorted(rng.choice(train, N, replace=False).tolist())
        gold = dict(tx.sql("""SELECT q.external_id, a.answer FROM queries q JOIN query_answers a
                              ON a.query_id = q.id WHERE q.external_id IN (SELECT unnest(?::VARCHAR[]))""", [picked]))
        answers = {}
        for copy, original in COPIES.items():
            got = dict(tx.sql("""SELECT q.external_id, e.correct::INT FROM evaluations e
                                 JOIN queries q ON q.id = e.query_id JOIN models m ON m.id = e.model_id
                                 WHERE m.name = ? AND q.external_id IN (SELECT unnest(?::VARCHAR[]))""",
                              [original, picked]))
            answers[copy] = {q: got[q] for q in picked}
    flip = rng.random(N) < 0.10
    answers["my-model"] = {q: c ^ int(f) for (q, c), f in zip(answers["my-model"].items(), flip)}
    answers["rand-model"] = {q: int(rng.random() < 0.5) for q in picked}
    letters = "ABCDEFGHIJ"
    answers["rand-ans"] = {q: int(letters[rng.integers(10)] == str(gold.get(q, "")).strip()) for q in picked}
    answers["always-a"] = {q: int(str(gold.get(q, "")).strip() == "A") for q in picked}
    work = Path(tempfile.mkdtemp(prefix="messy-"))
    with Registry(db) as reg:
        for name, got in answers.items():
            path = work / f"{len(list(work.iterdir()))}.csv"
            with open(path, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["question_id", "correct"])
                w.writerows(got.items())
            reg.register(name, str(path))
    shutil.rmtree(work, ignore_errors=True)


def check(db: Path) -> dict:
    with Registry(db) as reg:
        models = reg.models()
        family = {m.name: m.family for m in models}
        established = [m.name for m in models if m.status == "established"]
        lists = {m: reg.similar(m, k=len(models)) for m in established}
        copy_list = reg.similar("my model/1", k=5)
    junk, unsupported, rows = [], [], []
    for m, near in lists.items():
        order = [x.model for x in near]
        kin = [x for x in order if x in established and family.get(x) and family.get(x) == family.get(m)]
        first_kin = min((order.index(x) for x in kin), default=None)
        if first_kin is not None:
            junk += [(m, r, order.index(r) + 1, order[first_kin]) for r in RANDOM if order.index(r) < first_kin]
            for copy, original in COPIES.items():
                if original == m or copy not in order:
                    continue
                at = order.index(copy)
                for f in kin:
                    if at < order.index(f) and order.index(original) > order.index(f):
                        unsupported.append((m, copy, at + 1, f))
        rows.append({"model": m, "first5": [(x.model, x.combined, x.placed_by) for x in near[:5]]})
    return {"junk_above_family": junk, "copy_first": copy_list[0].model if copy_list else None,
            "copy_list": [(x.model, x.combined, x.placed_by) for x in copy_list],
            "unsupported_above_family": unsupported, "models": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default=str(ROOT / "registry.duckdb"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", help="keep the messy registry at this path")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-messy-"))
    db = Path(args.keep) if args.keep else work / "messy.duckdb"
    shutil.copy(args.db, db)
    build(db, args.seed)
    out = check(db)
    shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out, indent=1))
        return
    for row in out["models"]:
        print(f"{row['model']:30s} " + "  ".join(f"{n} ({c:.3f} {p})" for n, c, p in row["first5"]))
    print(f"\nsimilar 'my model/1': {', '.join(f'{n} ({c:.3f} {p})' for n, c, p in out['copy_list'])}")
    print(f"copy lists its original first: {out['copy_first'] == COPIES['my model/1']}")
    print(f"random answerers above an established family member: {len(out['junk_above_family'])} "
          f"{out['junk_above_family'][:6]}")
    print(f"128-answer models above a family member without support: {len(out['unsupported_above_family'])} "
          f"{out['unsupported_above_family'][:6]}")


if __name__ == "__main__":
    main()
