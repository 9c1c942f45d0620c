"""Onboarding cost (issue 4, bars 1 and 3), side by side in one run.

1. A new model from 128 evaluations, end to end (read its evaluations, build the set, encode, write the version and
   the job result, commit, update the FAISS index), against the bare encoder forward pass on the same set; then the
   stability estimate that follows it in its own transaction (two half-size sets embedded), and the two together.
2. Re-embedding every model under a newly activated encoder: how many forward passes it takes (batched, not one per
   model) and how long.
3. Versions after import / re-import / 100 new evaluations for one model.

Usage: .venv/bin/python bench/onboarding.py --db REGISTRY (a registry built from ../shared/data/mmlu-pro; copied,
not changed) [--repeat 15]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from registry import Registry
from registry.data import query_cache
from registry.embedding import embed, encoders, index


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp())
    db = tmp / "r.duckdb"
    shutil.copy(args.db, db)
    reg = Registry(db)
    with reg.store.tx() as tx:
        qids = [r[0] for r in tx.sql("""SELECT q.external_id FROM queries q JOIN query_splits s ON s.query_id = q.id
                                        WHERE s.split = 'train' ORDER BY q.content_hash LIMIT 2000""")]
        base_versions = tx.sql("SELECT count(*) FROM embedding_versions")[0][0]
    rng = np.random.default_rng(0)
    ours, stab, bare = [], [], []
    for i in range(args.repeat):
        pick = rng.choice(qids, 128, replace=False)
        f = tmp / f"m{i}.csv"
        f.write_text("model,question_id,correct\n" + "".join(f"bench-{i},{q},{int(rng.random() < 0.5)}\n" for q in pick))
        reg.import_files(evaluations=str(f), onboard=False)
        t = time.perf_counter()
        out = reg.onboard(stability=False)  # reads, encodes, writes version and job result, commits, and hands
        ours.append(time.perf_counter() - t)  # the new vector to the in-memory FAISS index
        t = time.perf_counter()
        estimates = reg.estimate_stability()  # what `onboard()` does next by default
        stab.append(time.perf_counter() - t)
        assert list(estimates) == [out[0].version_id]
        with reg.store.tx() as tx:
            vi = index.get(tx, encoders.active_id(tx))
            newest = tx.sql("SELECT max(id) FROM embedding_versions")[0][0]
        assert [o.outcome for o in out] == ["embedded"] and vi.names.get(max(vi.names)) == f"bench-{i}"
        assert vi.through_version == newest
        # the floor: the encoder's forward pass on the very same set, already in memory
        with reg.store.tx() as tx:
            model, _ = encoders.load(tx, encoders.active_id(tx))
            mid = tx.sql("SELECT id FROM models WHERE name = ?", [f"bench-{i}"])[0][0]
            s = embed.evaluation_sets(tx, [mid], 10 ** 9)[mid]
            row_of, qmat = query_cache.query_vectors(tx, s.query_ids)
        q = torch.from_numpy(qmat[[row_of[int(x)] for x in s.query_ids]])[None]
        y, mask = torch.from_numpy(s.y)[None], torch.ones(1, s.n, dtype=torch.bool)
        with torch.no_grad():
            t = time.perf_counter()
            model.embed(q, y, mask)
            bare.append(time.perf_counter() - t)
    med = statistics.median
    print(f"{'measure':62} {'ours':>9} {'floor':>9} {'ratio':>6}  bar")
    print(f"{'one new model, 128 evaluations, end to end (ms, median)':62} {med(ours) * 1e3:9.2f} "
          f"{med(bare) * 1e3:9.2f} {med(ours) / med(bare):6.2f}  <= 3")
    print(f"{'  then its stability estimate (two halves; ms, median)':62} {med(stab) * 1e3:9.2f} "
          f"{med(bare) * 1e3:9.2f} {med(stab) / med(bare):6.2f}")
    both = [a + b for a, b in zip(ours, stab)]
    print(f"{'  both: `onboard()` with its default stability=True (ms, median)':62} {med(both) * 1e3:9.2f} "
          f"{med(bare) * 1e3:9.2f} {med(both) / med(bare):6.2f}")
    print(f"{'  first call of this process (loads query vectors, ms)':62} {ours[0] * 1e3:9.2f} "
          f"{bare[0] * 1e3:9.2f} {ours[0] / bare[0]:6.2f}")

    # re-embedding every model under a new encoder: count forward passes
    with reg.store.tx() as tx:
        current = encoders.active_id(tx)
        blob = bytes(tx.sql("SELECT weights FROM encoders WHERE id = ?", [current])[0][0])
    from registry.locus.checkpoint import load_checkpoint, save_checkpoint

    model, config, meta = load_checkpoint(blob)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-3)
    new_blob = save_checkpoint(model, config, dict(meta, name="bench-perturbed"))
    (tmp / "new.safetensors").write_bytes(new_blob)
    calls = {"n": 0}
    original = type(model).embed_proj          # every forward pass goes through it (embed calls it too)

    def counting(self, *a, **kw):
        calls["n"] += 1
        return original(self, *a, **kw)

    type(model).embed_proj = counting
    new_id = reg.install_encoder(str(tmp / "new.safetensors"))
    t = time.perf_counter()
    outcomes = reg.activate_encoder(new_id)
    t_all = time.perf_counter() - t
    type(model).embed_proj = original
    n = sum(o.outcome == "embedded" for o in outcomes)
    print(f"{'re-embed all models under a new encoder (s)':62} {t_all:9.2f} {'':>9} {'':>6}  "
          f"{n} models in {calls['n']} forward passes (with their stability halves)")
    with reg.store.tx() as tx:
        print(f"versions before this bench: {base_versions}; after: {tx.sql('SELECT count(*) FROM embedding_versions')[0][0]}")
    reg.close()


if __name__ == "__main__":
    main()
