"""Bars 1-5 of issue 5 on the MMLU-Pro data (fixed test split): fingerprint, geometry, portfolio, fallback, scale.

    .venv/bin/python bench/geometry.py --db registry.duckdb          # a registry built from the full data
    .venv/bin/python bench/geometry.py --data ../shared/data/mmlu-pro --build /tmp/full.duckdb
    .venv/bin/python bench/geometry.py --db X --only scale --scale-n 100000

Building the full registry embeds 12,032 question texts with MiniLM (10-20 minutes on 2 cores).
"""
from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from registry import Registry  # noqa: E402
from registry.answers import fingerprint, geometry  # noqa: E402
from registry.embedding import embed, encoders, index

ROWS: list[tuple[str, str, str]] = []


def row(what: str, value: str, bar: str = "") -> None:
    ROWS.append((what, value, bar))
    print(f"  {what}: {value} {bar}", flush=True)


# --- bar 1 -----------------------------------------------------------------------------------------------------------
def bench_fingerprint(reg: Registry, seeds: int = 5, sample: int = 128) -> None:
    with reg.store.tx() as tx:
        cal = fingerprint.calibration(tx, sample=sample).embedding   # seed 0: the registry's own calibration
        model, meta = encoders.load(tx, cal.encoder_id)
        ids = [r[0] for r in tx.sql("SELECT DISTINCT model_id FROM embedding_versions WHERE encoder_id = ?",
                                    [cal.encoder_id])]
        through = int(tx.sql("SELECT coalesce(max(id), 0) FROM import_batches")[0][0])
        sets = [s for s in embed.evaluation_sets(tx, ids, through).values() if s.n >= 2 * sample]
        matched, same_ok, diff_ok = [], [], []
        for seed in range(1, seeds + 1):                        # seeds 1..5: draws the calibration never saw
            za, zb = fingerprint.disjoint_pairs(tx, model, sets, sample, 1, seed=seed)
            d = np.linalg.norm(za[0][:, None, :] - zb[0][None, :, :], axis=-1)   # [first, second]
            eye = np.eye(len(sets), dtype=bool)
            matched.append(float((d.argmin(axis=0) == np.arange(len(sets))).mean()))
            same_ok.append(float((d[eye] <= cal.threshold).mean()))
            diff_ok.append(float((d[~eye] > cal.threshold).mean()))
    fmt = lambda xs: f"{np.mean(xs):.1%} (min {np.min(xs):.1%} over {seeds} seeds)"
    row(f"fingerprint: models ({len(sets)}), two disjoint {sample}-samples, nearest is itself", fmt(matched), ">= 95%")
    row(f"fingerprint: same pairs judged 'same' (threshold {cal.threshold:.3f})", fmt(same_ok), ">= 95%")
    row("fingerprint: distinct pairs judged 'different'", fmt(diff_ok), ">= 95%")


# --- bars 2-4 ----------------------------------------------------------------------------------------------------------
def bench_geometry(reg: Registry) -> None:
    g = reg.geometry()
    row(f"geometry: Pearson over {g.pairs} pairs, {g.test_queries} test queries", f"{g.pearson:.3f}", ">= 0.887")
    row("geometry: Spearman", f"{g.spearman:.3f}", "(paper 0.876)")


def bench_portfolio(reg: Registry) -> None:
    for method in ("kmedoids", "kcenter"):
        t = time.perf_counter()
        p = reg.portfolio(method=method, target=0.99)
        row(f"portfolio {method}: smallest k reaching 99% of the pool ({p.pool_accuracy:.4f})",
            f"k={p.k} ({p.accuracy:.4f} = {p.share_of_pool:.1%}; {time.perf_counter() - t:.1f}s)", "<= 8")


def bench_fallback(reg: Registry, seed: int = 0) -> None:
    with reg.store.tx() as tx:
        p = reg.pool(tx)
        qids, correct = geometry.test_outcomes(tx, p.model_ids)
        probs = geometry.predicted(tx, p.encoder_id, p.vectors, qids)
    right = correct == 1
    chosen = probs.argmax(0)                                    # route every test query over the whole pool
    d = geometry.pairwise(p.vectors)
    np.fill_diagonal(d, np.inf)
    kept, rand, pooled = [], [], [0.0, 0.0]
    for m in np.unique(chosen):
        q = chosen == m
        orig = right[m, q].mean()
        if orig == 0:
            continue
        sub = int(d[m].argmin())                                 # its nearest neighbour takes over
        kept.append(right[sub, q].mean() / orig)
        others = [o for o in range(len(p.names)) if o != m]
        rand.append(right[others][:, q].mean() / orig)          # expected value of a uniformly random substitute
        pooled[0] += right[sub, q].sum()
        pooled[1] += right[m, q].sum()
    row(f"fallback: accuracy kept by the nearest neighbour, mean over {len(kept)} routed-to models",
        f"{np.mean(kept):.1%} (pooled over queries {pooled[0] / pooled[1]:.1%})", ">= 85%")
    row("fallback: random substitute (baseline)", f"{np.mean(rand):.1%}")


# --- bar 5 -------------------------------------------------------------------------------------------------------------
def synthetic_registry(path: Path, n: int, seed: int = 0) -> Registry:
    """n synthetic models (clustered 128-d vectors) bulk-inserted with native DuckDB, not the ORM."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 3, size=(200, 128)).astype(np.float32)
    vecs = centres[rng.integers(0, 200, n)] + rng.normal(0, 1, size=(n, 128)).astype(np.float32)
    reg = Registry(path)
    t = time.perf_counter()
    with reg.store.tx() as tx:
        enc = encoders.ensure_default(tx)
        names = pa.array([f"synthetic-{i:06d}" for i in range(n)])
        tx.duck.register("_syn", pa.table({"name": names, "vector": pa.FixedSizeListArray.from_arrays(
            pa.array(vecs.ravel()), 128)}))
        tx.duck.execute("INSERT INTO models (name, tags) SELECT name, '{}'::JSON FROM _syn").fetchall()
        tx.duck.execute(f"""INSERT INTO embedding_versions (model_id, version, encoder_id, vector, n_evaluations,
                                digest, through_batch, reason)
                            SELECT m.id, 1, {enc}, s.vector::FLOAT[128], 1024, 'synthetic', 0, 'synthetic'
                            FROM _syn s JOIN models m USING (name)""").fetchall()
        tx.duck.unregister("_syn")
        index.versions_written(tx)            # a writer of versions outside onboarding says so (see embedding/index.py)
    row(f"scale: bulk insert of {n} models and embedding versions (DuckDB native)", f"{time.perf_counter() - t:.2f}s")
    return reg


def bench_scale(n: int, calls: int = 200, kmedoids: bool = True) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="geo-scale-"))
    try:
        reg = synthetic_registry(tmp / "scale.duckdb", n)
        t = time.perf_counter()
        reg.similar("synthetic-000000", k=5)                     # first call builds the index from the database
        row("scale: first `similar` (builds and saves the FAISS index)", f"{time.perf_counter() - t:.2f}s")
        with reg.store.tx() as tx:
            vi = index.get(tx, encoders.active_id(tx))
        rng = np.random.default_rng(1)
        picks = [f"synthetic-{i:06d}" for i in rng.integers(0, n, calls)]
        ids = {v: k for k, v in vi.names.items()}
        import faiss

        default_threads = faiss.omp_get_max_threads()
        for threads in (default_threads, 1):                     # FAISS's default OpenMP threads, then one thread
            faiss.omp_set_num_threads(threads)
            api_t, bare_t = [], []
            for name in picks:                                  # side by side, interleaved: same machine load
                vec = vi.index.reconstruct(ids[name])[None, :]
                t = time.perf_counter()
                vi.index.search(vec, 6)
                bare_t.append(time.perf_counter() - t)
                t = time.perf_counter()
                reg.similar(name, k=5)
                api_t.append(time.perf_counter() - t)
            a, b = statistics.median(api_t) * 1e3, statistics.median(bare_t) * 1e3
            row(f"scale: `similar` via the Python API vs bare FAISS search, median of {calls}, {threads} FAISS threads",
                f"{a:.2f} ms vs {b:.2f} ms = {a / b:.2f}x", "<= 2x")
        faiss.omp_set_num_threads(default_threads)
        for method, k in (("kcenter", 50),) + ((("kmedoids", 50),) if kmedoids else ()):
            tracemalloc.start()
            t = time.perf_counter()
            p = reg.portfolio(k, method)
            dt = time.perf_counter() - t
            peak = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
            row(f"scale: portfolio -k {k} --method {method} on {n} models",
                f"{dt:.2f}s, peak traced memory {peak:.0f} MiB, radius {p.radius:.3f}"
                + (f" ({p.note})" if p.note else ""), "no n*n matrix" if method == "kcenter" else "")
        row("scale: process peak RSS", f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        reg.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", help="an existing registry built from the MMLU-Pro data")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "mmlu-pro"))
    ap.add_argument("--build", help="build a registry from --data at this path first")
    ap.add_argument("--only", nargs="*", default=["fingerprint", "geometry", "portfolio", "fallback", "scale"])
    ap.add_argument("--scale-n", type=int, default=100_000)
    ap.add_argument("--sample", type=int, default=128, help="evaluations per fingerprint sample (bar: 128)")
    ap.add_argument("--no-kmedoids-scale", action="store_true")
    args = ap.parse_args()
    path = args.db or args.build
    if not path and set(args.only) - {"scale"}:
        ap.error("give --db (an existing registry) or --build PATH")
    if args.build:
        t = time.perf_counter()
        with Registry(args.build) as reg:
            reg.import_files(directory=args.data, progress=True)
        print(f"built {args.build} in {time.perf_counter() - t:.0f}s")
    if set(args.only) - {"scale"}:
        with Registry(path) as reg:
            s = reg.stats()
            print(f"{path}: {s.models} models, {s.queries} queries, splits {s.splits}")
            for name, fn in (("fingerprint", bench_fingerprint), ("geometry", bench_geometry),
                             ("portfolio", bench_portfolio), ("fallback", bench_fallback)):
                if name in args.only:
                    fn(reg, sample=args.sample) if name == "fingerprint" else fn(reg)
    if "scale" in args.only:
        bench_scale(args.scale_n, kmedoids=not args.no_kmedoids_scale)
    width = max(len(r[0]) for r in ROWS)
    print("\n" + "\n".join(f"{w.ljust(width)}  {v}  {b}" for w, v, b in ROWS))


if __name__ == "__main__":
    main()
