"""How much of `similar`'s exact answer its candidates keep (issue 66): among ten thousand models `similar` reads
the answers of the CANDIDATES nearest by embedding and the CANDIDATES nearest by the answer index's sketch only
(answers/neighbours.py). This runs both rules in one process on a copy of a registry: the candidates', and the
exact one (every model's answers read: neighbours.CANDIDATES raised past the pool), for `--models` query models
(half of them real models, the rest synthetic ones evenly spaced), and prints the share of the exact top k each keeps,
with the two rules' seconds side by side.

    .venv/bin/python bench/similar_recall.py --db SCALE_DB [--models 12] [--k 5] [--candidates 256]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry import Registry  # noqa: E402
from registry.answers import neighbours  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True)
    ap.add_argument("--models", type=int, default=12)
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--candidates", type=int, default=neighbours.CANDIDATES)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="recall-"))
    db = tmp / "registry.duckdb"
    shutil.copy(args.db, db)
    if Path(args.db + ".index").is_dir():
        shutil.copytree(args.db + ".index", str(db) + ".index")
    reg = Registry(str(db))
    names = [m.name for m in reg.models()]
    real = [n for n in names if not n.startswith("synth-")]
    synth = [n for n in names if n.startswith("synth-")]
    half = min(len(real), (args.models + 1) // 2)
    step = max(1, len(synth) // max(1, args.models - half))
    picks = real[:half] + synth[::step][:args.models - half]
    neighbours.CANDIDATES = args.candidates
    reg.similar(picks[0], k=args.k)                                       # warm: the answer index, the vectors
    kept, total, t_cand, t_exact = 0, 0, 0.0, 0.0
    print(f"{len(names):,} models; top {args.k}; candidates: {args.candidates} by embedding + {args.candidates} "
          f"by sketch")
    print(f"{'query model':28} {'kept':>6} {'candidates s':>13} {'exact s':>8}  missed (exact rank)")
    for name in picks:
        neighbours.CANDIDATES = args.candidates
        t = time.perf_counter()
        fast = [x.model for x in reg.similar(name, k=args.k)]
        t_c = time.perf_counter() - t
        neighbours.CANDIDATES = 10 ** 9
        t = time.perf_counter()
        exact = [x.model for x in reg.similar(name, k=args.k)]
        t_e = time.perf_counter() - t
        hit = sum(m in fast for m in exact)
        kept, total, t_cand, t_exact = kept + hit, total + len(exact), t_cand + t_c, t_exact + t_e
        missed = ", ".join(f"{m} ({exact.index(m) + 1})" for m in exact if m not in fast)
        print(f"{name[:28]:28} {hit:>3}/{len(exact):<2} {t_c:13.2f} {t_e:8.2f}  {missed}")
    print(f"{'all':28} {kept / total:6.1%} {t_cand / len(picks):13.2f} {t_exact / len(picks):8.2f}  "
          f"(seconds: mean per query model, in-process)")
    reg.close()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
