"""Scale on one machine (issue 14, part 6 / bar 5): 1,000 new models x 10,000 non-test MMLU-Pro questions = 10^7
evaluations from one Parquet file into a copy of the full registry, imported and embedded, side by side with floors.

- The data: each new model answers like a mix of two of the registry's 31 real models (per question, parent A's
  answer with probability w in [0.5, 1], else parent B's), with a share f in [0.02, 0.12] of its answers flipped.
  So its embedding means something: the bench checks how often a new model's nearest real model is one of its
  parents (chance: 2 in 31).
- The import is the public path, `registry import --evaluations F --json` in a child process (peak RSS of that
  child from wait4); it imports, embeds every new model (versions and the index) and estimates their stability,
  and says how long each step took (`seconds` in its JSON).
- Floors: DuckDB's own `CREATE TABLE t AS SELECT * FROM read_parquet(F)` into a new database file (best of 3, in
  this process), and the bare batched forward pass of the same encoder on the same inputs (the 10,000 distinct
  queries projected once, then each model's set gathered, no padding, `--floor-batch` models per batch), for the
  full sets and for the stability halves, timed on `--floor-models` models in a child process of its own (after a
  warm-up pass), before and after the registry's child: the better of the two counts (the machine is shared).
  The registry's stored vectors are compared with the floor's.
- Then `registry similar` for a few new models, each in its own child process.

Usage: .venv/bin/python bench/scale.py [--db /work/main/registry.duckdb] [--models 1000] [--queries 10000]
       [--floor-models 100] [--keep]
While /work/QUIET exists (the lead is measuring latency) the bench waits before each heavy step.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 1 << 16        # rows per batch, as registry.embedding.BUDGET
STABILITY_SAMPLE = 2048  # as registry.embedding.embed.STABILITY_SAMPLE
QUIET = Path("/work/QUIET")


def wait_quiet() -> None:
    waited = False
    while QUIET.exists():
        if not waited:
            print("waiting: /work/QUIET exists", flush=True)
            waited = True
        time.sleep(10)


def synthesize(db: Path, n_models: int, n_queries: int, seed: int):
    """-> (Arrow table model, question_id, correct; the parents [n_models, 2]; the real models' names; the chosen
    query ids (registry ids) in the table's order)."""
    rng = np.random.default_rng(seed)
    con = duckdb.connect(str(db), read_only=True)
    try:
        q = con.execute("""SELECT q.id, q.external_id FROM queries q JOIN query_splits s ON s.query_id = q.id
                           WHERE s.split <> 'test' ORDER BY q.id""").fetchnumpy()
        models = con.execute("SELECT id, name FROM models ORDER BY id").fetchall()
        ev = con.execute("""SELECT model_id, query_id, arg_max(correct, batch_id)::INT AS c FROM evaluations
                            GROUP BY ALL""").fetchnumpy()
    finally:
        con.close()
    pick = np.sort(rng.choice(len(q["id"]), n_queries, replace=False))
    qids, ext = np.asarray(q["id"])[pick], np.asarray(q["external_id"], dtype=object)[pick]
    order = np.argsort(ext.astype(str), kind="stable")          # files list a model's rows by question id
    qids, ext = qids[order], ext[order]
    m_index = {m: i for i, (m, _) in enumerate(models)}
    q_index = {int(x): i for i, x in enumerate(qids)}
    real = np.full((len(models), n_queries), -1, dtype=np.int8)   # -1: not answered
    for m, qq, c in zip(ev["model_id"], ev["query_id"], ev["c"]):
        i = q_index.get(int(qq))
        if i is not None:
            real[m_index[int(m)], i] = c
    acc = np.array([(r[r >= 0]).mean() for r in real])
    parents = np.stack([rng.choice(len(models), 2, replace=False) for _ in range(n_models)])
    y = np.empty((n_models, n_queries), dtype=bool)
    for i, (a, b) in enumerate(parents):
        w, f = rng.uniform(0.5, 1.0), rng.uniform(0.02, 0.12)
        ya, yb = real[a].copy(), real[b].copy()
        ya[ya < 0] = yb[ya < 0]
        yb[yb < 0] = ya[yb < 0]
        both = ya < 0
        ya[both] = rng.random(both.sum()) < (acc[a] + acc[b]) / 2
        yb[both] = ya[both]
        mix = np.where(rng.random(n_queries) < w, ya, yb).astype(bool)
        y[i] = mix ^ (rng.random(n_queries) < f)
    names = np.array([f"synth-{i:04d}" for i in range(n_models)], dtype=object)
    table = pa.table({
        "model": pa.DictionaryArray.from_arrays(pa.array(np.repeat(np.arange(n_models, dtype=np.int32), n_queries)),
                                                pa.array(names, pa.string())),
        "question_id": pa.DictionaryArray.from_arrays(pa.array(np.tile(np.arange(n_queries, dtype=np.int32),
                                                                       n_models)), pa.array(ext, pa.string())),
        "correct": pa.array(y.ravel()),
    })
    return table, parents, [n for _, n in models], qids, y


def child(args: list[str], env: dict) -> tuple[float, float, str]:
    """Run a child process: (wall s, its own peak RSS in GB (wait4), stdout). Fails with its output on an error."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(args, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        text = out.read().decode()
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{text}\n{err.read().decode()}")
    child.cpu = usage.ru_utime + usage.ru_stime          # CPU seconds of the last child (both cores count)
    return wall, usage.ru_maxrss / 1024 ** 2, text


def bare_forward(model, qvec: np.ndarray, y: np.ndarray, batch: int, halves_of=None) -> tuple[float, np.ndarray]:
    """The floor: project the distinct queries once, then each model's set (gathered rows, no padding, no mask) in
    batches of `batch` sets (0: as many as BUDGET rows take). With `halves_of` (a function set -> two index arrays), the stability halves instead."""
    import torch

    t = time.perf_counter()
    with torch.no_grad():
        P, S = model.row_proj(torch.from_numpy(qvec))
        sets = [(np.arange(y.shape[1]), y[i]) for i in range(len(y))] if halves_of is None else [
            (h, y[i][h]) for i in range(len(y)) for h in halves_of(i)]
        batch = batch or max(1, BUDGET // len(sets[0][0]))
        z = np.zeros((len(sets), model.cfg.d_model), dtype=np.float32)
        i = 0
        while i < len(sets):
            n = len(sets[i][0])
            j = i + 1
            while j < len(sets) and j - i < batch and len(sets[j][0]) == n:
                j += 1
            idx = torch.from_numpy(np.stack([s[0] for s in sets[i:j]]))
            yy = torch.from_numpy(np.stack([s[1] for s in sets[i:j]]).astype(np.float32))
            z[i:j] = model.embed_proj(P[idx], S[idx], yy, None).numpy()
            i = j
    return time.perf_counter() - t, z


def floor_child(path: Path, batch: int) -> None:
    """--floor: time the bare forward pass on the saved inputs (full sets, then halves), after a warm-up pass."""
    from registry.locus.checkpoint import load_checkpoint

    data = np.load(path)
    qvec, y = data["qvec"], data["y"]
    model = load_checkpoint((path.parent / "encoder.safetensors").read_bytes())[0].eval()
    m = min(y.shape[1], STABILITY_SAMPLE)          # the registry's halves: of a sample of at most this many
    halves = lambda i: np.split(np.random.default_rng(i).permutation(y.shape[1])[:m], [m // 2])
    bare_forward(model, qvec, y[:2], batch)                                      # warm-up
    c = time.process_time()
    full = bare_forward(model, qvec, y, batch)[0]
    c_full, c = time.process_time() - c, time.process_time()
    half = bare_forward(model, qvec, y, batch, halves)[0]
    print(json.dumps({"full": full, "halves": half, "cpu_full": c_full, "cpu_halves": time.process_time() - c}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="/work/main/registry.duckdb", help="the built default registry (copied)")
    ap.add_argument("--models", type=int, default=1000)
    ap.add_argument("--queries", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--floor-batch", type=int, default=0,
                    help="sets per batch of the bare forward pass (default: as many as the registry's row budget takes)")
    ap.add_argument("--floor-models", type=int, default=100, help="models the floor is timed on (scaled up)")
    ap.add_argument("--similar", type=int, default=3, help="new models asked `registry similar` afterwards")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    ap.add_argument("--floor", help=argparse.SUPPRESS)   # (the floor's own child process)
    args = ap.parse_args()
    import torch

    from registry.locus.checkpoint import load_checkpoint

    threads = os.cpu_count()          # torch and DuckDB take every core by default, in the registry as here
    torch.set_num_threads(threads)
    if args.floor:
        return floor_child(Path(args.floor), args.floor_batch)
    tmp = Path(tempfile.mkdtemp(prefix="scale-"))
    db = tmp / "registry.duckdb"
    shutil.copy(args.db, db)
    base_mb = db.stat().st_size / 1e6
    if Path(str(args.db) + ".index").is_dir():
        shutil.copytree(str(args.db) + ".index", str(db) + ".index")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    n_evals = args.models * args.queries

    wait_quiet()
    t = time.perf_counter()
    table, parents, real_names, qids, y = synthesize(db, args.models, args.queries, args.seed)
    f = tmp / "evaluations.parquet"
    pq.write_table(table, f)
    del table
    t_gen = time.perf_counter() - t
    print(f"synthesized {n_evals:,} evaluations of {args.models} models in {t_gen:.1f} s "
          f"({f.stat().st_size / 1e6:.1f} MB Parquet); accuracy {y.mean():.3f}", flush=True)

    floors = []
    for i in range(3):
        wait_quiet()
        con = duckdb.connect(str(tmp / f"floor{i}.duckdb"), config={"threads": threads})
        t = time.perf_counter()
        con.execute(f"CREATE TABLE t AS SELECT * FROM read_parquet('{f}')")
        floors.append(time.perf_counter() - t)
        con.close()
        os.remove(tmp / f"floor{i}.duckdb")
    t_ctas = min(floors)

    # the floor's inputs: the same encoder, the same query vectors, the same answers
    con = duckdb.connect(str(db), read_only=True)
    try:
        blob, = con.execute("""SELECT e.weights FROM encoders e WHERE e.id = (SELECT encoder_id FROM
                               encoder_activations ORDER BY id DESC LIMIT 1)""").fetchone()
        rows = con.execute("""SELECT q.id, v.vector FROM queries q JOIN text_vectors v ON v.content_hash = q.content_hash
                              WHERE q.id IN (SELECT unnest(?))""", [qids.tolist()]).fetchall()
    finally:
        con.close()
    vec_of = {int(i): np.asarray(v, dtype=np.float32) for i, v in rows}
    qvec = np.stack([vec_of[int(i)] for i in qids])
    model = load_checkpoint(bytes(blob))[0].eval()
    # the floor is timed on a sample of the models (every set has the same size, so models/s carries over), in a
    # child process of its own like the registry's (fresh, same threads, after a warm-up pass), once before the
    # registry's child and once after it: the machine is shared, so the better of the two counts
    sample = np.linspace(0, args.models - 1, min(args.floor_models, args.models)).astype(int)
    ys = y[sample].astype(np.float32)
    inputs = tmp / "floor.npz"
    (tmp / "encoder.safetensors").write_bytes(bytes(blob))
    np.savez(inputs, qvec=qvec, y=ys)
    floor_full, floor_halves, floor_cpu = [], [], []

    def time_floors():
        wait_quiet()
        _, _, out = child([sys.executable, __file__, "--floor", str(inputs), "--floor-batch", str(args.floor_batch)],
                          env)
        got = json.loads(out)
        scale = args.models / len(sample)
        floor_full.append(got["full"] * scale)
        floor_halves.append(got["halves"] * scale)
        floor_cpu.append((got["cpu_full"] + got["cpu_halves"]) * scale)

    time_floors()
    wait_quiet()
    cli = [sys.executable, "-m", "registry", "--db", str(db)]
    load_before = os.getloadavg()[0]
    wall, rss, out = child(cli + ["import", "--evaluations", str(f), "--json"], env)
    cpu_import = child.cpu
    load_after = os.getloadavg()[0]
    res = json.loads(out)
    sec = res.get("seconds") or {}
    embedded = sum(o["outcome"] == "embedded" for o in res["onboarding"])
    assert res["evaluations_added"] == n_evals and embedded == args.models, (res["evaluations_added"], embedded)
    print(f"registry import: {wall:.1f} s wall, peak RSS {rss:.2f} GB; {json.dumps(sec)}; load average "
          f"{load_before:.1f} before, {load_after:.1f} after", flush=True)
    time_floors()
    t_bare, t_bare_h = min(floor_full), min(floor_halves)

    con = duckdb.connect(str(db), read_only=True)
    try:
        stored = con.execute("""SELECT m.name, v.vector FROM embedding_versions v
                                JOIN models m ON m.id = v.model_id WHERE m.name LIKE 'synth-%'
                                ORDER BY m.name""").fetchall()
        real_vecs = con.execute("""SELECT m.name, v.vector FROM embedding_versions v JOIN models m ON m.id = v.model_id
                                   WHERE m.name NOT LIKE 'synth-%' QUALIFY row_number() OVER
                                   (PARTITION BY v.model_id ORDER BY v.version DESC) = 1""").fetchall()
    finally:
        con.close()
    z_reg = np.stack([np.asarray(v, dtype=np.float32) for _, v in stored])
    _, z_bare = bare_forward(model, qvec, ys, args.floor_batch)
    max_diff = float(np.abs(z_reg[sample] - z_bare).max())

    # do the embeddings mean something? the nearest real model of each new one, against its two parents
    real_z = np.stack([np.asarray(v, dtype=np.float32) for _, v in real_vecs])
    real_idx = [real_names.index(n) for n, _ in real_vecs]
    nearest = np.asarray(real_idx)[np.argmin(((z_reg[:, None] - real_z[None]) ** 2).sum(-1), axis=1)]
    parent_hit = float(np.mean([n in p for n, p in zip(nearest, parents)]))

    sims = []
    for i in np.linspace(0, args.models - 1, args.similar).astype(int):
        name = f"synth-{i:04d}"
        w, _, out = child(cli + ["similar", name, "-k", "5", "--json"], env)
        found = json.loads(out)
        sims.append((name, w, [n["model"] for n in found["neighbours"]]))

    t_import, t_onb, t_stab = sec.get("import"), sec.get("onboarding"), sec.get("stability") or 0.0
    db_mb = (db.stat().st_size + (db.with_name(db.name + ".wal").stat().st_size
                                  if db.with_name(db.name + ".wal").exists() else 0)) / 1e6
    fmt = lambda x: "-" if x is None else f"{x:.2f}"
    print()
    print(f"data: {args.models:,} new models x {args.queries:,} non-test MMLU-Pro questions = {n_evals:,} evaluations "
          f"({f.stat().st_size / 1e6:.1f} MB Parquet), into a copy of {args.db}; {threads} threads")
    print(f"{'measure':58} {'ours':>9} {'floor':>9} {'ratio':>7}  bar")
    print(f"{'import alone (s) vs DuckDB read_parquet CTAS (best of 3)':58} {fmt(t_import):>9} {t_ctas:9.2f} "
          f"{(t_import / t_ctas if t_import else float('nan')):7.2f}  <= 2")
    if t_onb:
        print(f"{'embed: versions written and indexed (s)':58} {t_onb:9.2f} {t_bare:9.2f} {t_onb / t_bare:7.2f}")
        print(f"{'embed throughput (models/s)':58} {args.models / t_onb:9.2f} {args.models / t_bare:9.2f} "
              f"{t_bare / t_onb:7.2f}")
        print(f"{'stability estimates after the versions (s; 0: in the embed)':58} {t_stab:9.2f} {t_bare_h:9.2f} "
              f"{t_stab / t_bare_h:7.2f}")
        print(f"{'import + embed (s), in the child':58} {t_import + t_onb + t_stab:9.2f} {'':>9} {'':>7}  "
              f"<= {0.12 * args.models:.0f}")
    print(f"{'registry import, whole child process (s, wall)':58} {wall:9.2f} {'':>9} {'':>7}  "
          f"(start-up, import, embed, stability)")
    print(f"{'CPU s: registry import child vs floor (full sets + halves)':58} {cpu_import:9.2f} {min(floor_cpu):9.2f} "
          f"{cpu_import / min(floor_cpu):7.2f}  (both cores count; robust to a busy machine)")
    print(f"{'peak RSS of the registry import process (GB)':58} {rss:9.2f} {'':>9} {'':>7}  <= 4")
    print(f"{'database file after the import (MB) vs the Parquet file':58} {db_mb:9.1f} {f.stat().st_size / 1e6:9.1f} "
          f"{db_mb * 1e6 / f.stat().st_size:7.2f}  <= 2 (before: {base_mb:.1f} MB)")
    print(f"max |stored vector - floor's vector| over the new models: {max_diff:.2e}")
    print(f"nearest real model is one of the two parents: {parent_hit:.1%} of new models (chance {2 / len(real_z):.1%})")
    for name, w, found in sims:
        print(f"registry similar {name} ({w:.2f} s, child process): {', '.join(found)}")
    if args.keep:
        print(f"kept: {tmp}")
    else:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
