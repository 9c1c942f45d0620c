"""Issue 15, bars 2 and 3: fingerprints from shared answers.

Bar 2, on the registry's own answers (the full MMLU-Pro registry):
- naming: a rerun of model m is simulated by flipping a random 5-15% of m's answers on n random queries; it is
  named when the model it disagrees with least is m (ties: more shared queries first, as `fingerprint.by_answers`);
- false "same": model j's answers on n random queries, tested against a registry that does not hold j (p_min
  recomputed without j); any "same" verdict is false. Reported per n, overall and for the closest pairs.
The test is run in numpy, mirroring `fingerprint.by_answers`; a few draws are checked against the library itself.

Bar 3: every one of the 31 models, registered under a new name from 128 random non-test evaluations into a registry
that does not hold it (5 groups: each group's registry is built without the group's evaluations), must not be
claimed to be another model by `register`'s warning. The claim is made from answers alone, so the encoder plays no
part in it; each registry uses the shipped encoder.

    .venv/bin/python bench/fingerprint_answers.py --db registry.duckdb [--draws 40] [--skip-register]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from registry import Registry
from registry.answers import disagreement, fingerprint
from registry.data import current_evaluations

NS = (32, 64, 128, 256, 512, 1024)


def matrix(db: str):
    with Registry(db) as reg, reg.store.tx() as tx:
        res = tx.duck.execute(f"""SELECT m.name, e.model_id, e.query_id, e.correct::TINYINT AS c
                                  FROM {current_evaluations.CURRENT} e JOIN models m ON m.id = e.model_id""").fetchnumpy()
        splits = dict(tx.sql("SELECT query_id, split FROM query_splits"))
        external = dict(tx.sql("SELECT id, external_id FROM queries"))
    mids, qids = np.unique(res["model_id"]), np.unique(res["query_id"])
    names = {int(i): n for i, n in zip(res["model_id"], res["name"])}
    correct = np.full((len(mids), len(qids)), -1, dtype=np.int8)
    correct[np.searchsorted(mids, res["model_id"]), np.searchsorted(qids, res["query_id"])] = res["c"]
    return ([names[int(m)] for m in mids], mids, qids, correct, np.array([splits.get(int(q)) == "test" for q in qids]),
            [external[int(q)] for q in qids])


def verdicts(correct, rate, unknown_cols, unknown_y, leave_out: int | None, alpha=fingerprint.ALPHA):
    """(nearest model row, verdict same?) for one unknown, as fingerprint.by_answers decides it."""
    M = correct.shape[0]
    rows = [m for m in range(M) if m != leave_out]
    theirs = correct[rows][:, unknown_cols]                                    # [M', n]
    shared = (theirs >= 0).sum(1)
    dis = ((theirs != unknown_y[None]) & (theirs >= 0)).sum(1)
    ok = shared >= fingerprint.MIN_SHARED
    if not ok.any():
        return None, False
    r = np.where(ok, dis / np.maximum(shared, 1), np.inf)
    order = np.lexsort((-shared, r))
    best = order[0]
    sub = rate[np.ix_(rows, rows)]
    p_min = float(np.nanmin(sub))
    cal = fingerprint.AnswerCalibration(p_min)
    k = cal.max_disagreements(int(shared[best]))
    return rows[best], bool(k >= 0 and dis[best] <= k)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--draws", type=int, default=40, help="draws per model and n")
    ap.add_argument("--skip-register", action="store_true")
    args = ap.parse_args()
    t0 = time.time()
    names, mids, qids, correct, is_test, external = matrix(args.db)
    M = len(names)
    rate, _ = disagreement.disagreement_matrix(correct, fingerprint.MIN_PAIR_SHARED)
    np.fill_diagonal(rate, np.nan)
    rng = np.random.default_rng(0)
    print(f"{M} models, {len(qids)} queries; closest distinct pair: "
          f"{names[np.unravel_index(np.nanargmin(rate), rate.shape)[0]]} / "
          f"{names[np.unravel_index(np.nanargmin(rate), rate.shape)[1]]} at {np.nanmin(rate):.4f}")
    print("\nBar 2: n shared queries | reruns named (5-15% flipped) | reruns 'same' | distinct models 'same' "
          "| worst model's false 'same' | bar")
    close = {"gpt-4o-2024-05-13", "gemini-1.5-pro-002"}
    worst_overall = 0.0
    for n in NS:
        named = same_rerun = false_same = total = 0
        per_model_false = np.zeros(M)
        for m in range(M):
            have = np.flatnonzero(correct[m] >= 0)
            for _ in range(args.draws):
                cols = rng.choice(have, n, replace=False)
                y = correct[m, cols].astype(np.int64)
                f = rng.uniform(0.05, 0.15)
                flip = rng.random(n) < f
                best, same = verdicts(correct, rate, cols, np.where(flip, 1 - y, y), None)
                named += best == m
                same_rerun += same and best == m
                best2, same2 = verdicts(correct, rate, cols, y, m)        # j = m, not registered
                false_same += same2
                per_model_false[m] += same2
                total += 1
        worst = per_model_false.max() / args.draws
        worst_overall = max(worst_overall, false_same / total)
        ok = named / total >= 0.99 if n == 128 else True
        print(f"{n:>5} | {named / total:.4f} | {same_rerun / total:.4f} | {false_same / total:.4f} "
              f"({false_same}/{total}) | {worst:.3f} ({names[int(per_model_false.argmax())]}) | "
              f"{'named >= 0.99: ' + ('holds' if ok else 'FAILS') if n == 128 else ''}"
              f"{'; ' if n == 128 else ''}false 'same' <= 1%: {'holds' if false_same / total <= 0.01 else 'FAILS'}")
    # the closest pair, each way, at every n
    rows = [names.index(x) for x in sorted(close)]
    print("\nclosest pair (the unknown is one of them, the registry holds the other and every other model):")
    for n in NS:
        hits = tries = 0
        for j in rows:
            have = np.flatnonzero(correct[j] >= 0)
            for _ in range(args.draws * 5):
                cols = rng.choice(have, n, replace=False)
                _, same = verdicts(correct, rate, cols, correct[j, cols].astype(np.int64), j)
                hits += same
                tries += 1
        print(f"  n={n:>4}: false 'same' {hits}/{tries} = {hits / tries:.4f}")
    # the numpy mirror against the library, a few draws
    with Registry(args.db) as reg, reg.store.tx() as tx:
        for m in (0, M // 2, M - 1):
            cols = rng.choice(np.flatnonzero(correct[m] >= 0), 128, replace=False)
            lib = fingerprint.by_answers(tx, qids[cols], correct[m, cols].astype(np.int64))
            mine, same = verdicts(correct, rate, cols, correct[m, cols].astype(np.int64), None)
            assert lib.match == names[mine] and (lib.verdict == "same") == same, (lib, names[mine], same)
    print(f"(numpy mirror checked against fingerprint.by_answers on 3 draws; {time.time() - t0:.0f} s)")
    if not args.skip_register:
        bar3(args.db, names, external, correct, is_test)


def bar3(db: str, names, external, correct, is_test) -> None:
    """Each of 5 groups: a registry built without the group's evaluations, then each member registered under a new
    name from 128 random non-test evaluations; any same-model claim is counted."""
    import duckdb

    data = Path(__file__).resolve().parents[2] / "shared" / "data" / "mmlu-pro"
    tmp = Path(tempfile.mkdtemp())
    rng = np.random.default_rng(1)
    order = rng.permutation(len(names))
    groups = [order[i::5] for i in range(5)]
    claims, rows = 0, []
    t0 = time.time()
    for g, members in enumerate(groups):
        left = [names[i] for i in members]
        folder = tmp / f"g{g}"
        folder.mkdir()
        for f in ("questions.csv.gz", "splits.csv", "models.csv"):
            shutil.copy(data / f, folder / f)
        con = duckdb.connect()
        quoted = ", ".join("'" + n.replace("'", "''") + "'" for n in left)
        con.execute(f"""COPY (SELECT * FROM read_csv('{data}/evaluations.csv.gz') WHERE model NOT IN ({quoted}))
                        TO '{folder}/evaluations.csv.gz' (HEADER, COMPRESSION gzip)""")
        con.close()
        db_g = tmp / f"g{g}.duckdb"
        with Registry(db_g, probation_min=500) as reg:
            reg.import_files(directory=str(folder))
            for i in members:
                have = np.flatnonzero((correct[i] >= 0) & ~is_test)
                cols = rng.choice(have, 128, replace=False)
                f = tmp / f"{names[i]}.csv"
                f.write_text("question_id,correct\n" + "".join(f"{external[c]},{int(correct[i, c])}\n" for c in cols))
                r = reg.register(f"unknown-{names[i]}", str(f))
                claim = r.warning is not None and "answers like" in r.warning
                claims += claim
                rows.append((names[i], g, r.status, claim, r.warning or ""))
    print(f"\nBar 3: 31 models registered from 128 evaluations into registries without them (5 groups, "
          f"{time.time() - t0:.0f} s): same-model claims {claims} of {len(rows)} "
          f"({'holds' if claims == 0 else 'FAILS'})")
    for name, g, status, claim, warning in rows:
        if claim:
            print(f"  claim: {name} (group {g}): {warning}")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
