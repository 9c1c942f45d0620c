"""The text encoder's two backends side by side (registry/locus/text_encoder.py): ONNX Runtime against torch
(sentence-transformers) on MMLU-Pro question texts from a registry, in one process: the cosine of each text's two
vectors (and of each to the vector the registry stores for it), the throughput of each (texts/s, timed in
alternating chunks so that the machine's noise falls on both alike, after an untimed warm-up pass), and how the
test questions route with vectors embedded afresh by each backend against the stored vectors.

    PYTHONPATH=$PWD .venv/bin/python bench/text_backend.py --db registry.duckdb [--texts 2000] [--all]
        [--no-route] [--threads N]

--texts N: a seeded sample of N questions (--all: every question, for the equivalence bar: every cosine >= 0.9999).
The routing check embeds the split's questions (default test: 1,203 on MMLU-Pro) afresh and routes them with
`Registry.route_batch(..., reuse_vectors=False)` (the default backend: ONNX) against `route_batch` with the stored
vectors, and likewise torch (its vectors fed to the same routing state), with nothing logged.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np


def sample(db: Path, n: int | None, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """Question texts and their stored vectors: `n` drawn at random (seeded), or all when n is None."""
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("""SELECT q.text, v.vector FROM queries q JOIN text_vectors v USING (content_hash)
                              ORDER BY q.id""").fetchall()
    if n is not None and n < len(rows):
        pick = np.sort(np.random.default_rng(seed).choice(len(rows), n, replace=False))
        rows = [rows[i] for i in pick]
    return [r[0] for r in rows], np.array([r[1] for r in rows], dtype=np.float32)


def vectors_side_by_side(texts: list[str], chunks: int, batch_size: int) -> dict:
    from registry.locus import text_encoder

    out = {}
    for name in ("torch", "onnx"):                       # load each and run one untimed batch
        t0 = time.perf_counter()
        text_encoder.encode(texts[:batch_size], batch_size=batch_size, backend=name)
        out[name] = {"warm_s": time.perf_counter() - t0, "seconds": 0.0, "parts": []}
    bounds = np.linspace(0, len(texts), chunks + 1).astype(int)
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        for name in (("torch", "onnx") if i % 2 == 0 else ("onnx", "torch")):
            t0 = time.perf_counter()
            out[name]["parts"].append(text_encoder.encode(texts[a:b], batch_size=batch_size, backend=name))
            out[name]["seconds"] += time.perf_counter() - t0
    for name in out:
        out[name]["vectors"] = np.concatenate(out[name].pop("parts"))
    return out


def route_agreement(db: Path, split: str) -> dict:
    """The split's questions routed with stored vectors and with vectors embedded afresh: how often the chosen
    model is the same."""
    from registry import Registry
    from registry.locus import text_encoder
    from registry.routing import choice, fit, query_texts
    from registry.routing.decision import RouteOptions

    opts = RouteOptions(log=False)
    with Registry(db) as reg:
        with reg.store.tx() as tx:
            texts = [r[0] for r in tx.sql("""SELECT q.text FROM queries q JOIN query_splits s ON s.query_id = q.id
                                             WHERE s.split = ? ORDER BY q.id""", [split])]
        stored = [d.model for d in reg.route_batch(texts, opts)]
        t0 = time.perf_counter()
        onnx = [d.model for d in reg.route_batch(texts, opts, reuse_vectors=False)]   # the default: ONNX
        onnx_s = time.perf_counter() - t0
        torch_vecs = text_encoder.encode(texts, backend="torch")
        with reg.store.tx() as tx:                        # torch's vectors through the same routing state
            st = fit.keep(tx)
            cut, hashes = query_texts.clean_texts(texts)
            pol = choice.rules(st, opts)
            torch = [d.model for d in choice.decide(st, pol, torch_vecs, hashes, [False] * len(cut))]
    n = len(texts)
    return {"n": n, "split": split, "backend": text_encoder.backend(), "onnx_s": onnx_s,
            "onnx_same": sum(a == b for a, b in zip(stored, onnx)) / n,
            "torch_same": sum(a == b for a, b in zip(stored, torch)) / n,
            "onnx_torch_same": sum(a == b for a, b in zip(onnx, torch)) / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--texts", type=int, default=2000)
    ap.add_argument("--all", action="store_true", help="every question (the equivalence bar), not a sample")
    ap.add_argument("--chunks", type=int, default=4, help="alternating timed chunks per backend")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None, help="threads per pass, both backends (default: theirs)")
    ap.add_argument("--split", default="test")
    ap.add_argument("--no-route", action="store_true")
    args = ap.parse_args()
    from registry.locus import text_encoder

    text_encoder.set_threads(args.threads)
    work = Path(tempfile.mkdtemp())
    db = work / "registry.duckdb"
    shutil.copy(args.db, db)                # route_batch may save a routing state: a copy, never the original
    texts, stored = sample(db, None if args.all else args.texts)
    r = vectors_side_by_side(texts, args.chunks, args.batch_size)
    cos = (r["onnx"]["vectors"] * r["torch"]["vectors"]).sum(axis=1)
    print(f"{len(texts)} MMLU-Pro question texts ({'all' if args.all else 'seeded sample'}), batch {args.batch_size}, "
          f"{args.chunks} alternating chunks, threads {args.threads or 'default'}\n")
    print("| backend | load + first batch s | texts/s | cosine to torch min | mean | cosine to stored min | mean |")
    print("|---|---|---|---|---|---|---|")
    for name in ("torch", "onnx"):
        v = r[name]
        to_torch = (v["vectors"] * r["torch"]["vectors"]).sum(axis=1)
        to_stored = (v["vectors"] * stored).sum(axis=1)
        print(f"| {name} | {v['warm_s']:.2f} | {len(texts) / v['seconds']:.1f} | {to_torch.min():.7f} | "
              f"{to_torch.mean():.7f} | {to_stored.min():.7f} | {to_stored.mean():.7f} |")
    print(f"\nONNX/torch throughput: {r['torch']['seconds'] / r['onnx']['seconds']:.2f}x; texts with cosine < 0.9999: "
          f"{int((cos < 0.9999).sum())}; least cosine {cos.min():.8f} (text {int(cos.argmin())}), "
          f"quantiles 0.1%/1%/50%: {np.quantile(cos, [0.001, 0.01, 0.5]).round(8).tolist()}")
    if not args.no_route:
        a = route_agreement(db, args.split)
        print(f"\n{a['n']} {a['split']} questions embedded afresh and routed, same model as with stored vectors: "
              f"ONNX {a['onnx_same']:.2%} (default backend {a['backend']}, {a['onnx_s']:.1f} s), torch "
              f"{a['torch_same']:.2%}; ONNX and torch agree on {a['onnx_torch_same']:.2%}")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
