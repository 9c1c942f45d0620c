"""`verify`'s verdict on realistic nulls and real differences: how often it accuses a faithful endpoint, and how often
it names a substitute right.

    .venv/bin/python bench/verify_nulls.py [--seeds 100] [-n 256] [--only NAME] [--json]

Each seed plans n questions as `verify` does, simulates (or replays) the endpoint's answers and 32 repeats, and judges
with `verify`'s own code (asking/verdicts.judge) against the claimed model's registered results, every other
registered model's results on the same questions beside it (usecases/verify.others_of's).

MMLU-Pro (../shared/data/mmlu-pro, 31 models, 12,032 questions), the claimed model drawn at random each seed:
- the nulls, "the same model, another configuration": a rerun disagreeing with the registered run on 4-17% of the
  questions (real reruns' range; one case 17-25%, beyond it), the disagreements placed by each question's difficulty across all registered
  models (a question most models split on flips most; not the verdict's own per-model null), then an accuracy shift
  (questions turned right or wrong, again weighted by that difficulty): 0, +3 to +10 points, -2 to 0 (within the
  2-point tolerance), -3 to -10 points; and a prompt shift, each category shifted by its own draw around a common
  one (up to 10 points either way). Its repeats flip where the question is uncertain.
- a substitute: every ordered pair of registered models within 3 points of accuracy, the endpoint a rerun of the
  other model (8% disagreement), claimed as the first.
The public quantized runs (junsu0306/Quantized-Reasoning-Models, MIT: DeepSeek-R1-Distill-Qwen-1.5B on MATH-500 at
BF16 and five quantized variants, bench/data/quantized-math500.csv): a registry holding the BF16 run; each variant
replayed as the endpoint (its repeats answer as its first answers: one run each is public).

Bars (issue: verdicts that hold where the differences are real): nulls called substituted, mixed or unknown in at most
1 of 100 a case, degraded in at most 5 of 100 where the true drop is within the tolerance; 3-bit runs not faithful in
at least 95 of 100 and degraded in at least 80; substitutes named right in at least 90 of 100 per pair.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry.asking import verdicts  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "mmlu-pro"
QUANTIZED = ROOT / "bench" / "data" / "quantized-math500.csv"
REPEAT = 32
FALSE = ("substituted", "mixed", "unknown")


def mmlu():
    """(model names, [M, Q] 1/0 matrix, categories [Q], accuracy [M])."""
    import duckdb

    con = duckdb.connect()
    rows = con.execute(f"""SELECT e.model, e.question_id, e.correct::INT, q.category
                           FROM read_csv('{DATA}/evaluations.csv.gz') e
                           JOIN read_csv('{DATA}/questions.csv.gz') q USING (question_id)""").fetchall()
    models = sorted({r[0] for r in rows})
    qids = sorted({r[1] for r in rows})
    mi, qi = {m: i for i, m in enumerate(models)}, {q: i for i, q in enumerate(qids)}
    mat = np.full((len(models), len(qids)), -1, dtype=np.int8)
    cat = np.empty(len(qids), dtype=object)
    for m, q, c, g in rows:
        mat[mi[m], qi[q]] = c
        cat[qi[q]] = g
    full = (mat >= 0).all(axis=0)               # questions every model answered
    return models, mat[:, full], cat[full], (mat[:, full] == 1).mean(axis=1)


def uncertainty(mat: np.ndarray) -> np.ndarray:
    """Each question's 4 q (1 - q), q the share of registered models right on it: 1 where models split evenly."""
    q = (mat == 1).mean(axis=0)
    return 4 * q * (1 - q)


def rerun(y: np.ndarray, u: np.ndarray, rng, *, disagree: float, shift: float) -> np.ndarray:
    """A rerun of a model whose registered outcomes are y: `disagree` of the answers flipped (by u), then questions
    turned right, or wrong (again by u), until its accuracy is y's moved by `shift`: the true difference."""
    e = y.copy().astype(bool)
    w = u + 0.02
    flips = rng.random(len(y)) < np.clip(disagree * w / w.mean(), 0, 0.95)
    e[flips] = ~e[flips]
    moves = int(round((float(y.mean()) + shift - float(e.mean())) * len(y)))
    pool = np.flatnonzero(~e if moves > 0 else e)
    if moves and len(pool):
        p = w[pool] / w[pool].sum()
        take = rng.choice(pool, size=min(abs(moves), len(pool)), replace=False, p=p)
        e[take] = moves > 0
    return e


def repeats(e: np.ndarray, u: np.ndarray, rng) -> tuple[int, int]:
    """(disagreements, repeats) of the plan's first REPEAT questions asked again: each flips with a chance rising
    with u (3% on average)."""
    k = min(REPEAT, len(e))
    flip = rng.random(k) < 0.03 * (u[:k] + 0.02) / (u.mean() + 0.02)
    return int(flip.sum()), k


def judge(e, y, others: dict, self_rep) -> verdicts.Verdict:
    sides = verdicts.Sides(e, y.astype(bool), self_rep)
    return verdicts.judge(sides, verdicts.Others(y.astype(np.int8), others))


def null_cases(models, mat, cat, acc, seeds: int, n: int) -> list[dict]:
    u_all = uncertainty(mat)
    cats = sorted(set(cat.tolist()))
    real, harsh = (0.04, 0.17), (0.17, 0.25)        # disagreement with the registered run: real reruns', beyond
    specs = {"rerun, same accuracy": ((0.0, 0.0), real), "rerun, +3 to +10 points": ((0.03, 0.10), real),
             "rerun, -2 to 0 points (within tolerance)": ((-0.02, 0.0), real),
             "rerun, -3 to -10 points": ((-0.10, -0.03), real),
             "prompt shift, per category, up to 10 points": (None, real),
             "rerun 17-25% apart, -10 to +10 points": ((-0.10, 0.10), harsh)}
    out = []
    for name, (spec, apart) in specs.items():
        got: Counter = Counter()
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            x = int(rng.integers(len(models)))
            plan = rng.permutation(mat.shape[1])[:n]
            y, u = mat[x, plan], u_all[plan]
            disagree = rng.uniform(*apart)
            if spec is None:
                base = rng.uniform(-0.10, 0.10)
                e = np.empty(n, dtype=bool)
                for c in cats:
                    sel = cat[plan] == c
                    if sel.any():
                        s = float(np.clip(base + rng.normal(0, 0.05), -0.10, 0.10))
                        e[sel] = rerun(y[sel], u[sel], rng, disagree=disagree, shift=s)
            else:
                e = rerun(y, u, rng, disagree=disagree, shift=rng.uniform(*spec))
            rep = repeats(e, u, rng)
            others = {models[m]: mat[m, plan] for m in range(len(models)) if m != x}
            got[judge(e, y, others, rep).verdict] += 1
        row = {"case": name, "runs": seeds, **dict(got), "false": sum(got[k] for k in FALSE)}
        row["bar"] = (row["false"] <= max(1, seeds // 100) and
                      (got["degraded"] <= 5 * seeds / 100 if "within tolerance" in name or "same" in name else True))
        out.append(row)
    return out


def substitute_cases(models, mat, acc, seeds: int, n: int) -> list[dict]:
    u_all = uncertainty(mat)
    pairs = [(a, b) for a in range(len(models)) for b in range(len(models)) if a != b and abs(acc[a] - acc[b]) <= 0.03]
    out = []
    for a, b in pairs:
        named = got_sub = 0
        verdict_counts: Counter = Counter()
        for seed in range(seeds):
            rng = np.random.default_rng(10_000 + seed)
            plan = rng.permutation(mat.shape[1])[:n]
            e = rerun(mat[b, plan], u_all[plan], rng, disagree=0.08, shift=0.0)
            rep = repeats(e, u_all[plan], rng)
            others = {models[m]: mat[m, plan] for m in range(len(models)) if m != a}
            v = judge(e, mat[a, plan], others, rep)
            verdict_counts[v.verdict] += 1
            got_sub += v.verdict == "substituted"
            named += v.verdict == "substituted" and v.substitute == models[b]
        out.append({"claimed": models[a], "served": models[b], "accuracy gap": round(float(acc[b] - acc[a]), 4),
                    "runs": seeds, "substituted": got_sub, "named right": named, **dict(verdict_counts),
                    "bar": named >= 0.9 * seeds})
    return out


def quantized_cases(seeds: int, n: int) -> list[dict]:
    with open(QUANTIZED, newline="") as f:
        rows = list(csv.DictReader(f))
    runs = [k for k in rows[0] if k not in ("key",)]
    mat = {r: np.array([int(row[r]) for row in rows], dtype=np.int8) for r in runs}
    base = mat["bf16"]
    out = []
    for r in runs:
        if r == "bf16":
            continue
        got: Counter = Counter()
        for seed in range(seeds):
            rng = np.random.default_rng(20_000 + seed)
            plan = rng.permutation(len(base))[:min(n, len(base))]
            e, y = mat[r][plan].astype(bool), base[plan]
            got[judge(e, y, {}, (0, REPEAT)).verdict] += 1    # (a replayed run repeats itself)
        drop = float(base.mean() - mat[r].mean())
        three = "w3" in r
        row = {"case": f"MATH-500 {r} vs bf16 (drop {drop:.1%})", "runs": seeds, **dict(got),
               "false": sum(got[k] for k in FALSE)}
        row["bar"] = ((seeds - got["faithful"] >= 0.95 * seeds and got["degraded"] >= 0.8 * seeds) if three else
                      (row["false"] <= max(1, seeds // 100)
                       and (got["degraded"] <= 5 * seeds / 100 if drop <= verdicts.TOLERANCE else True)))
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--only", choices=["nulls", "substitutes", "quantized"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = {}
    if args.only in (None, "nulls", "substitutes"):
        models, mat, cat, acc = mmlu()
        if args.only in (None, "nulls"):
            result["nulls"] = null_cases(models, mat, cat, acc, args.seeds, args.n)
        if args.only in (None, "substitutes"):
            result["substitutes"] = substitute_cases(models, mat, acc, args.seeds, args.n)
    if args.only in (None, "quantized") and QUANTIZED.exists():
        result["quantized"] = quantized_cases(args.seeds, args.n)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        cols = ["faithful", "configuration", "degraded", "substituted", "mixed", "unknown", "not conclusive"]
        for part in ("nulls", "quantized"):
            if part in result:
                print(f"\n| {part} | runs | " + " | ".join(cols) + " | bar |")
                print("|---|---|" + "---|" * (len(cols) + 1))
                for r in result[part]:
                    print(f"| {r['case']} | {r['runs']} | " + " | ".join(str(r.get(c, 0)) for c in cols)
                          + f" | {'met' if r['bar'] else 'NOT MET'} |")
        if "substitutes" in result:
            subs = result["substitutes"]
            worst = sorted(subs, key=lambda r: r["named right"])[:8]
            print(f"\nsubstitutes: {len(subs)} ordered pairs within 3 points; named right in at least 90 of "
                  f"{args.seeds}: {sum(r['bar'] for r in subs)} of {len(subs)} pairs; the weakest:")
            for r in worst:
                print(f"  {r['claimed']} served as {r['served']} (gap {r['accuracy gap']:+.1%}): named right "
                      f"{r['named right']}, substituted {r['substituted']}, "
                      f"{ {k: v for k, v in r.items() if k in cols} }")
    ok = all(r["bar"] for part in result.values() for r in part)
    print(f"\nall bars met: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
