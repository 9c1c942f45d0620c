"""Does `similar` find a model's family? For every model whose family (the models file's `family` column) has
another member in the registry: is `similar`'s first neighbour a family member, and is the model with the fewest
answer disagreements (on at least --min-shared shared questions) one? Prints both counts, side by side.

    .venv/bin/python bench/families.py DB [--min-shared 100] [--json]

DB is a registry with an active encoder and embedded models (for example one that bench/benchmarks.py trained).
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

from registry import Registry


def disagreement_leaders(reg: Registry, min_shared: int) -> dict[str, tuple[str, float, int]]:
    """model -> (the model it disagrees with least, that rate, shared questions), over pairs with enough shared."""
    with reg.store.tx() as tx:
        rows = tx.sql("""
            WITH e AS (SELECT m.name, ev.query_id, ev.correct::INT AS c FROM evaluations ev
                       JOIN models m ON m.id = ev.model_id)
            SELECT a.name, b.name, avg((a.c <> b.c)::INT), count(*) FROM e a JOIN e b
              ON a.query_id = b.query_id AND a.name <> b.name
            GROUP BY 1, 2 HAVING count(*) >= ?""", [min_shared])
    best: dict[str, tuple[str, float, int]] = {}
    for a, b, rate, n in rows:
        if a not in best or (rate, b) < (best[a][1], best[a][0]):
            best[a] = (b, float(rate), int(n))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("--min-shared", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with Registry(args.db, create=False) as reg:
        family = {m.name: m.family for m in reg.models() if m.family}
        members = defaultdict(set)
        for name, fam in family.items():
            members[fam].add(name)
        leaders = disagreement_leaders(reg, args.min_shared)
        rows = []
        for name in sorted(family):
            kin = members[family[name]] - {name}
            if not kin:
                continue
            near = reg.similar(name, k=1)
            first = near[0].model if near else None
            fewest = leaders.get(name, (None, None, 0))[0]
            rows.append({"model": name, "family": family[name], "similar_first": first,
                         "similar_is_family": first in kin, "fewest_disagreement": fewest,
                         "fewest_is_family": fewest in kin})
    summary = {"models_in_families": len(rows),
               "similar_first_is_family": sum(r["similar_is_family"] for r in rows),
               "fewest_disagreement_is_family": sum(r["fewest_is_family"] for r in rows)}
    summary["bar: similar >= fewest"] = summary["similar_first_is_family"] >= summary["fewest_disagreement_is_family"]
    if args.json:
        print(json.dumps({"summary": summary, "models": rows}, indent=1))
        return
    print("| model | family | similar's first | family? | fewest disagreements | family? |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['family']} | {r['similar_first']} | {'yes' if r['similar_is_family'] else 'no'} "
              f"| {r['fewest_disagreement']} | {'yes' if r['fewest_is_family'] else 'no'} |")
    print(f"\n{summary['models_in_families']} models with family in the registry: similar's first neighbour is "
          f"family for {summary['similar_first_is_family']}, the fewest-disagreement model for "
          f"{summary['fewest_disagreement_is_family']} (bar: similar >= fewest: {summary['bar: similar >= fewest']})")


if __name__ == "__main__":
    main()
