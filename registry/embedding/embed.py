"""Embedding, pure: which evaluations a model's embedding is computed from, their digest, and the batched, masked
forward pass over many sets at once. Nothing here writes: embedding/onboarding.py turns its output into versions, and
evaluation, fingerprinting and training use it directly.

What an embedding is computed from, exactly: the model's current (newest) evaluations from batches up to
`through_batch`, on queries outside the test split (held-out queries never reach the encoder, so `registry evaluate`
stays honest and agrees with routing), capped at the encoder's `embed_max_set` by query content hash when the
encoder asks for a cap. Its digest is the sha256 of those (query id, correct) pairs, so any version can be
recomputed and checked (`onboarding.recompute`).
"""
from __future__ import annotations

import concurrent.futures
import hashlib
from dataclasses import dataclass

import numpy as np

from registry.core.transaction import Tx
from registry.data.current_evaluations import newest_per_query
from registry.data.query_cache import projections, query_meta
from registry.embedding import MIN_EVALUATIONS


@dataclass
class EvalSet:
    model_id: int
    query_ids: np.ndarray   # [n] int, registry query ids
    y: np.ndarray           # [n] float32 0/1
    digest: str
    through_batch: int = 0  # the newest import batch among the evaluations read (before the test/cap filters)

    @property
    def n(self) -> int:
        return len(self.query_ids)


# production outcomes from feedback sources switched off (or weighed 0) are left out (traffic/sources.py)
LEFT_OUT = """SELECT f.batch_id FROM feedback f JOIN feedback_sources s ON s.name = f.source
              WHERE s.id = (SELECT max(id) FROM feedback_sources g WHERE g.name = s.name)
                AND (NOT s.enabled OR s.weight = 0)"""

# a registry reads the evaluations of this many rows at a time when it embeds many models (onboarding, stability):
# memory stays bounded by the chunk, not by the registry (10^7 evaluations would be about 1 GB as arrays)
CHUNK_ROWS = 1 << 20


def evaluation_sets(tx: Tx, model_ids, through_batch: int, max_set: int | None = None) -> dict[int, EvalSet]:
    """Each model's embedding input and its digest (see the module docstring for what it contains): its current
    evaluations in one query, chosen and ordered with the cached `query_meta`."""
    ids = ", ".join(str(int(m)) for m in model_ids) or "NULL"
    res = tx.numpy(f"""SELECT model_id, query_id, correct::INT AS correct, batch_id FROM evaluations
                              WHERE model_id IN ({ids}) AND batch_id <= {int(through_batch)}
                                AND batch_id NOT IN ({LEFT_OUT})""")
    res = newest_per_query(res)                       # sorted by model, then query
    meta = query_meta(tx)
    model_col = np.asarray(res["model_id"], dtype=np.int64)
    qid_col = np.asarray(res["query_id"], dtype=np.int64)
    correct_col = np.asarray(res["correct"], dtype=np.int64)
    batch_col = np.asarray(res["batch_id"], dtype=np.int64)
    at = meta.rows(qid_col)
    out = {}
    for m in model_ids:        # each model's rows are one run of the sorted columns: no pass over all rows per model
        lo, hi = np.searchsorted(model_col, [int(m), int(m) + 1])
        sel = lo + chosen(meta, at[lo:hi], max_set)
        out[int(m)] = EvalSet(int(m), qid_col[sel], correct_col[sel].astype(np.float32),
                              meta.digest(at[sel], correct_col[sel]),
                              int(batch_col[lo:hi].max()) if hi > lo else 0)
    return out


def chosen(meta, rows: np.ndarray, max_set: int | None = None) -> np.ndarray:
    """Which of one model's current evaluations (their queries' rows in `query_meta`) its embedding reads, in the
    digest's order: positions into `rows` outside the test split, capped at `max_set` by lowest content hash, in
    external id order."""
    sel = np.flatnonzero(~meta.is_test[rows])
    if max_set and len(sel) > max_set:
        sel = sel[np.argsort(meta.hash_rank[rows[sel]], kind="stable")[:max_set]]
    return sel[np.argsort(meta.ext_rank[rows[sel]], kind="stable")]


def chunked_sets(tx: Tx, model_ids, through_batch: int, max_set: int | None = None,
                 chunk_rows: int | None = None):
    """`evaluation_sets` of many models, a chunk of about `chunk_rows` (default CHUNK_ROWS) evaluations at a time
    (models in the given order): yields {model id: EvalSet} per chunk, so that only one chunk's rows are in
    memory."""
    chunk_rows = chunk_rows or CHUNK_ROWS
    model_ids = [int(m) for m in model_ids]
    if len(model_ids) <= 1:
        yield evaluation_sets(tx, model_ids, through_batch, max_set)
        return
    ids = ", ".join(map(str, model_ids))
    rows = dict(tx.sql(f"""SELECT model_id, count(*) FROM evaluations WHERE model_id IN ({ids})
                           AND batch_id <= {int(through_batch)} GROUP BY model_id"""))
    chunk: list = []
    n = 0
    for m in model_ids:
        if chunk and n + rows.get(m, 0) > chunk_rows:
            yield evaluation_sets(tx, chunk, through_batch, max_set)
            chunk, n = [], 0
        chunk.append(m)
        n += rows.get(m, 0)
    if chunk:
        yield evaluation_sets(tx, chunk, through_batch, max_set)


def digest(external_ids, correct) -> str:
    """sha256 of "external_id:correct" pairs joined by commas, in external id order (the caller's order): the
    same value as DuckDB's sha256(string_agg(external_id || ':' || correct, ',' ORDER BY external_id))."""
    text = ",".join(f"{e}:{int(c)}" for e, c in zip(external_ids, correct))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# rows per padded batch of the forward pass; a set this long or longer is embedded alone, unpadded and unmasked
# (padding buys nothing once one set fills a core, the masked attention costs more than the unmasked one, and one
# set of 8,800 rows runs 1.3x faster a row than seven in one batch: what a batch touches stays in the caches)
BUDGET = 1 << 16
LONG_SET = 2048


def embed_sets(model, sets: list[tuple[np.ndarray, np.ndarray]], budget: int = BUDGET,
               projected: bool = False, table: np.ndarray | None = None, lanes: int = 1) -> np.ndarray:
    """Embed many sets in batches. sets: [(q [n,Dq], y [n])] -> z [len(sets), D] float32; with `projected`, each
    set brings its rows' input projections instead of query vectors: [(PS [n,2,D], y [n])] (see `projections`).
    With `table` ([R,Dq] query vectors, or [R,2,D] projections with `projected`), a set brings row numbers into it
    instead, [(rows [n] int, y [n])], and a batch gathers its rows only when it runs: many sets then share the
    table, and no per-evaluation copy of a vector exists outside the batch being embedded.

    Largest first; a set of LONG_SET rows or more is a batch of its own; shorter sets of one length share a batch
    unpadded, and shorter sets that vary pad to their batch's first set (down to a quarter of its length), masked.
    With `lanes` > 1 (bulk work), torch runs that many batches at once, each on one thread of its own (on 2 cores
    1.4x one batch on 2 threads), and a long set reads its first layer from `_first_rows`. Versions are float32:
    the same set embedded in another batch or way differs by under 2e-6 (float32 sums in another order), the
    tolerance `recompute` is checked to.

    A few sets (a registration, `similar --evals`, a server's onboarding) run in numpy, without importing torch;
    bulk work (an import's onboarding, a re-embedding) runs in torch, about twice numpy's speed on 2 cores there."""
    length = [len(s[1]) for s in sets]
    if getattr(model, "torch_model", None) is not None:
        if sum(length) <= NUMPY_ROWS:
            return _embed_batches(model, sets, length, budget=budget, projected=projected, table=table,
                                  as_input=lambda a: a)
        model = model.torch_model()
    import torch

    first = _first_rows(model, sets, length, table) if projected and table is not None else None

    def run(part: list[int]) -> np.ndarray:
        with torch.no_grad():
            return _embed_batches(model, [sets[i] for i in part], [length[i] for i in part], budget=budget,
                                  projected=projected, table=table, as_input=torch.from_numpy, first=first)
    if lanes <= 1 or len(sets) < 2:
        return run(list(range(len(sets))))
    parts: list[list[int]] = [[] for _ in range(min(lanes, len(sets)))]
    rows = [0] * len(parts)
    for i in sorted(range(len(sets)), key=lambda i: -length[i]):        # each set to the lane with fewest rows
        lane = rows.index(min(rows))
        parts[lane].append(i)
        rows[lane] += length[i]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        futures = [_lanes.submit(run, part) for part in parts[1:]]
        z = np.zeros((len(sets), model.cfg.d_model), dtype=np.float32)
        z[parts[0]] = run(parts[0])
        for part, future in zip(parts[1:], futures):
            z[part] = future.result()
    finally:
        torch.set_num_threads(threads)
    return z


_lanes = concurrent.futures.ThreadPoolExecutor(max_workers=7, thread_name_prefix="registry-encoder-lane")


def _first_rows(model, sets, length, table: np.ndarray):
    """For the long sets among `sets` (rows into the projection `table`): (the distinct table rows they read
    [U], LocusModel.first_rows of them flattened to [U*2,4,D], row u with y at 2u+y), or None without long sets.
    A long set then reads its rows there (`embed_rows`): 1.4x the plain forward pass a row, vectors within 2e-6."""
    import torch

    long_sets = [sets[i][0] for i in range(len(sets)) if length[i] >= LONG_SET]
    if not long_sets:
        return None
    used = np.unique(np.concatenate(long_sets))
    with torch.no_grad():
        proj = torch.from_numpy(np.ascontiguousarray(table[used]))                # [U,2,D]
        rows = model.first_rows(proj[:, 0], proj[:, 1])                          # [U,2,4,D]
    return used, rows.reshape(-1, *rows.shape[2:])


# rows in one call up to which numpy embeds: about 40 average sets, where numpy and torch take alike
NUMPY_ROWS = 1 << 15


def _embed_batches(model, sets, length, *, budget, projected, table, as_input, first=None) -> np.ndarray:
    """embed_sets' batching, with the model's own array type (`as_input`: numpy -> its input); `first`: what
    `_first_rows` gave for these sets, where long sets are read."""
    order = sorted(range(len(sets)), key=lambda i: -length[i])
    z = np.zeros((len(sets), model.cfg.d_model), dtype=np.float32)
    start = 0
    while start < len(order):
        width = max(1, length[order[start]])
        end = start + 1
        while (end < len(order) and width < LONG_SET and (end - start + 1) * width <= budget
               and (length[order[end]] == width or 4 * length[order[end]] >= width)):
            end += 1
        chunk = order[start:end]
        if first is not None and width >= LONG_SET:                       # one set alone, unpadded
            rows, y_set = sets[chunk[0]]
            at = np.searchsorted(first[0], rows) * 2 + (np.asarray(y_set) > 0.5)
            z[chunk] = np.asarray(model.embed_rows(first[1][as_input(at)][None]))
            start = end
            continue
        shape = table.shape[1:] if table is not None else sets[chunk[0]][0].shape[1:]
        x = np.zeros((len(chunk), width, *shape), dtype=np.float32)          # [B,N,Dq] | [B,N,2,D]
        y = np.zeros((len(chunk), width), dtype=np.float32)                  # [B,N]
        mask = np.zeros((len(chunk), width), dtype=bool)                     # [B,N]
        for b, i in enumerate(chunk):
            n = length[i]
            x[b, :n] = table[sets[i][0]] if table is not None else sets[i][0]
            y[b, :n], mask[b, :n] = sets[i][1], True
        x, y, mask = as_input(x), as_input(y), as_input(mask)
        out = model.embed_proj(x[:, :, 0], x[:, :, 1], y, mask) if projected else model.embed(x, y, mask)
        z[chunk] = np.asarray(out)
        start = end
    return z


# evaluations read by a stability estimate at most: a larger set's halves come from a digest-seeded sample of this
# many, and their distance is scaled by sqrt(STABILITY_SAMPLE / n), the 1/n law of an embedding's variance that
# locus/evidence.py's shrinkage assumes. On the 31 MMLU-Pro models (about 10,800 each) the scaled figure's median
# ratio to the full halves' is 1.00 (bench/stability_sample.py); the halves then cost 2,048 rows, not n.
STABILITY_SAMPLE = 2048


def halves(es: EvalSet) -> tuple[np.ndarray, np.ndarray]:
    """Two disjoint random halves of a set (of its first STABILITY_SAMPLE in a random order), seeded by its digest
    (so stability is reproducible)."""
    rng = np.random.default_rng(int(es.digest[:16], 16))
    perm = rng.permutation(es.n)
    m = min(es.n, STABILITY_SAMPLE)
    return perm[: m // 2], perm[m // 2: m]


def stability(z_half: np.ndarray, z_other: np.ndarray, n: int) -> float:
    """A set's stability from the embeddings of its `halves`: their distance, scaled to the whole set's n."""
    return float(np.linalg.norm(z_half - z_other) * np.sqrt(min(n, STABILITY_SAMPLE) / max(n, 1)))


def projected_inputs(tx: Tx, model, sets: list[EvalSet]) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """What `embed_sets(..., projected=True, table=...)` takes for these sets: the input projections of the queries
    (one row per distinct query, `projections`) and per set its rows' numbers there, and y."""
    if not sets:
        return np.zeros((0, 2, model.cfg.d_model), dtype=np.float32), []
    row_at, proj = projections(tx, model, np.concatenate([s.query_ids for s in sets]))
    return proj, [(row_at(s.query_ids), s.y) for s in sets]


def compute(tx: Tx, model, sets: list[EvalSet]) -> np.ndarray:
    """Embeddings [len(sets), D] of evaluation sets, in one batched pass."""
    if not sets:
        return np.zeros((0, model.cfg.d_model), dtype=np.float32)
    proj, inputs = projected_inputs(tx, model, sets)
    return embed_sets(model, inputs, projected=True, table=proj)


def embed_file(tx: Tx, path: str, model, min_evaluations: int = MIN_EVALUATIONS):
    """Embed an unregistered model from its results file, as onboarding would (test queries left out), reading the
    file into temporary tables only: nothing is written. -> (z [D], answers: `import_run.Answers`)"""
    from registry.core.errors import InputError
    from registry.data import import_run, query_cache
    from registry.locus import text_encoder

    a = import_run.read_answers(tx, path)
    keep = ~a.is_test
    n = int(keep.sum()) + len(a.new_texts)
    if n < min_evaluations:
        raise InputError(f"{n} evaluations outside the test split; at least {min_evaluations} are needed to embed a "
                         f"model", file=str(path))
    row_of, qmat = query_cache.query_vectors(tx, a.query_ids[keep])
    q = qmat[[row_of[int(i)] for i in a.query_ids[keep]]]
    if a.new_texts:
        q = np.concatenate([q, text_encoder.encode(a.new_texts)])
    y = np.concatenate([a.correct[keep], a.new_correct]).astype(np.float32)
    return embed_sets(model, [(q, y)])[0], a
