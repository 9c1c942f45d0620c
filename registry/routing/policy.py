"""Routing: query text -> MiniLM vector -> P(correct) for every model with a current embedding under the active
encoder, with the interaction terms (locus/interaction.py: category offsets and nearest-query residuals from the registry's
answers) added to its logit -> a choice (most likely, cost-aware, or cheapest above a threshold), never an
unavailable model.

Per-query overhead is kept small by a per-process cache (`State`) of the loaded encoder, the current z matrix, the
models' costs and the persistent availability flags. One cheap SQL statement (max ids of activations, versions and
availability rows, and a hash over the models' cost columns) tells whether the cache is still current; anything new
rebuilds it. Text vectors are cached per content hash (an LRU), and a text the registry already holds reuses its
stored vector, so routing a registered query gives exactly the probabilities `evaluate` computes.

Evidence (embedding/evidence.py): each model's P(correct) is shrunk toward the established models' mean prediction by how
uncertain its embedding is, and a model on probation (too few evaluations) is not chosen unless the caller asks.

Costs: price and size are kept apart. Cost-aware routing (a cost weight or a minimum probability) ranks by `cost`
when every candidate has one; by `params_b` only when asked (`cost_by="params"`), leaving out models without a
parameter count; the decision always says which basis it used (`cost_basis`).
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
import dataclasses
from dataclasses import dataclass, field

import numpy as np

from registry.data import availability
from registry.core import dialect
from registry.embedding import encoders, evidence, index
from registry.locus import interaction, label_columns, text_encoder
from registry.core.errors import InputError, RegistryError, unknown_model
from registry.core.store import Tx

# MiniLM reads at most 256 word pieces; a word piece never spans more than ~100 characters of text, so a longer
# text routes exactly as its first MAX_CHARS characters do. Cutting first keeps a 1 MB query from costing a
# tokeniser pass over all of it.
MAX_CHARS = 32_768
LOG_TOP = 5            # candidates kept in the routing log
_VEC_CACHE_SIZE = 4096


@dataclass
class Candidate:
    model: str
    prob: float                       # P(correct) as routing uses it: shrunk by the model's evidence, with the
                                      #   interaction terms added to its logit (locus/interaction.py)
    raw_prob: float                   # the predictor's own P(correct) from the model's embedding
    evaluations: int                  # behind the embedding used
    probation: bool = False           # too few evaluations: chosen only when asked (include_probation)
    cost: float | None = None         # price per query, if set
    params_b: float | None = None
    available: bool = True


@dataclass
class Decision:
    model: str | None                 # None only when no candidate is available
    fallback: bool                    # the policy's top choice was unavailable
    candidates: list[Candidate]       # every model, most likely first
    encoder: str
    versions: dict[str, int]          # model -> embedding version used
    query_hash: str
    note: str | None = None
    cost_basis: str | None = None     # "cost" | "params_b" when the choice weighed cost, else None


@dataclass
class State:
    key: tuple
    encoder_id: int
    encoder_name: str
    model: object                     # LocusModel (eval mode)
    names: list[str]
    model_ids: np.ndarray             # [M] models.id
    versions: np.ndarray              # [M] embedding version numbers
    version_ids: np.ndarray           # [M] embedding_versions.id
    z: np.ndarray                     # [M,128] current embeddings
    cost: np.ndarray                  # [M] price per query (nan: not set)
    params_b: np.ndarray              # [M] (nan: unknown)
    evidence: evidence.Evidence       # [M] evaluations, stability, probation, shrinkage weight
    down: set[str] = field(default_factory=set)   # marked unavailable in the registry
    score: object = None                          # q [N,Dq] -> P(correct) [M,N] (LocusModel.scorer)
    known: frozenset = frozenset()                # every registered model's name (embedded or not)
    interaction: interaction.Served | None = None  # the routing terms beside the predictor (locus/interaction.py)
    interaction_fitted: bool = True               # False: the last fit, carried over to new models (see `state`)
    category_of: dict | None = None               # content hash -> category, for an encoder whose predictor reads
                                                  #   categories (None: text only); other texts route as "none"


_states: dict[str, State] = {}
_vectors: OrderedDict[str, np.ndarray] = OrderedDict()
_vectors_lock = threading.Lock()   # the server routes from several threads

_KEY_SQL = """SELECT (SELECT coalesce(max(id), 0) FROM encoder_activations),
                     (SELECT coalesce(max(id), 0) FROM embedding_versions),
                     (SELECT coalesce(max(id), 0) FROM model_availability),
                     (SELECT count(*) FROM version_stability),
                     (SELECT {models} FROM models),
                     (SELECT {splits} FROM query_splits)"""


def _key_sql(db: str) -> str:
    if db == "postgresql":      # other processes commit versions too, not in id order: their counts as well
        # (before the splits' digest: `_build` takes the key's second-to-last item as that digest)
        return _KEY_SQL.replace("(SELECT count(*) FROM version_stability),",
                                "(SELECT count(*) FROM version_stability), (SELECT count(*) FROM embedding_versions),"
                                " (SELECT count(*) FROM model_availability),").format(
            models=dialect.xor_hash(db, "id, name, cost, params_b"), splits=dialect.xor_hash(db, "query_id, split"))
    return _KEY_SQL.format(models=dialect.xor_hash(db, "id, name, cost, params_b"),
                           splits=dialect.xor_hash(db, "query_id, split"))


def state(tx: Tx, db_path: str, probation_min: int | None = None, refit: bool = True) -> State:
    """The cached routing state, rebuilt only when the registry changed in a way that matters to routing. With
    `refit=False` (a server's writer after each commit: a fit takes about a second) the interaction terms of the last
    fit are carried over: models it knew keep theirs, a new model gets none until the next fit."""
    key = tuple(tx.sql(_key_sql(tx.dialect))[0]) + (evidence.probation_min(probation_min),)
    st = _states.get(db_path)
    if st is not None and st.key == key and (st.interaction_fitted or not refit):
        return st
    st = _build(tx, key, db_path, refit)
    _states[db_path] = st
    return st


def _build(tx: Tx, key: tuple, db_path: str, refit: bool = True) -> State:
    encoder_id = encoders.require_active(tx)
    model, _ = encoders.load(tx, encoder_id)
    vids, mids, names, vecs = index.current_versions(tx, encoder_id)
    meta = {r[0]: r[1:] for r in tx.sql("SELECT id, cost, params_b, name FROM models")}
    about = {r[0]: r[1:] for r in tx.sql("""
        SELECT v.id, v.version, v.n_evaluations, coalesce(s.stability, v.stability) FROM embedding_versions v
        LEFT JOIN version_stability s ON s.version_id = v.id
        WHERE v.id IN (SELECT unnest(?::INTEGER[]))""", [vids.tolist()])}
    down = set(availability.unavailable_models(tx))
    enc_name = tx.sql("SELECT name FROM encoders WHERE id = ?", [encoder_id])[0][0]
    ev = evidence.assess(vecs, [about[int(v)][1] for v in vids], [about[int(v)][2] for v in vids], key[-1])
    score = model.scorer(vecs)
    # the interaction depends on the encoder, the versions, who is on probation and the splits; not on availability
    # or cost, whose changes leave it as it is
    fit_key = (str(db_path), encoder_id, tuple(int(v) for v in vids), tuple(ev.probation.tolist()), key[-2])
    served, fitted = _interaction(tx, fit_key, model, vecs, np.asarray(mids, dtype=np.int64), np.asarray(vids), ev,
                                  refit)
    category_of = None        # the field is valid (EncoderConfig checks it with querylabels.parse)
    if model.cfg.categories:
        category_of = dict(tx.sql(f"SELECT content_hash, {label_columns.sql(model.cfg.category_field)} FROM queries"))
    return State(key, encoder_id, enc_name, model, list(names), np.asarray(mids, dtype=np.int64),
                 np.array([about[int(v)][0] for v in vids], dtype=np.int64), np.asarray(vids, dtype=np.int64),
                 vecs, np.array([_nan(meta[m][0]) for m in mids.tolist()], dtype=np.float64),
                 np.array([_nan(meta[m][1]) for m in mids.tolist()], dtype=np.float64), ev, down,
                 score, frozenset(m[2] for m in meta.values()), served, fitted, category_of)


def with_new_versions(tx: Tx, st: State, db_path: str, registered: set[str] = frozenset()) -> State:
    """`st` brought up to date after commits that only appended embedding versions (and created the models they are
    of: a server's registrations), reading only those versions, the newest per model under st's encoder past st's
    newest id, with their models' cost and size. The rest is st's: encoder, availability, splits, the other
    models' versions and metadata; `registered`: the names of the models those commits registered (embedded or
    not: `known`). The interaction terms are a fit of exactly the new set of versions if one was
    made, else the last fit carried over, as `state(refit=False)` gives them. A full `state` read gives the same
    State (tests/test_writer.py); its key is st's, so it never enters the cache of `state`."""
    after = int(st.version_ids.max()) if len(st.version_ids) else 0
    # (a few rows: the newest per model is kept below, in version order, cheaper than a window in the statement)
    new = _versions_written(tx, st, after) or tx.arrow("""
        SELECT v.id, v.model_id, m.name, v.version, v.vector, v.n_evaluations, m.cost, m.params_b,
               coalesce(s.stability, v.stability) AS stability
        FROM embedding_versions v JOIN models m ON m.id = v.model_id
        LEFT JOIN version_stability s ON s.version_id = v.id
        WHERE v.encoder_id = ? AND v.id > ?
        ORDER BY v.model_id, v.version""", [st.encoder_id, after]).to_pydict()
    if not new["id"]:
        return dataclasses.replace(st, known=st.known | frozenset(registered))
    # the newest row of each model (rows come by model, then version), then in numpy: a snapshot is rebuilt after
    # every group of registrations, so nothing here loops over the registry's models in Python
    nm = np.asarray(new["model_id"], dtype=np.int64)
    last = np.flatnonzero(np.r_[nm[1:] != nm[:-1], True])
    nm = nm[last]

    def col(key, dtype):
        return np.array([_nan(new[key][j]) if dtype == np.float64 else new[key][j] for j in last.tolist()],
                        dtype=dtype)

    new_z = np.asarray([new["vector"][j] for j in last.tolist()], dtype=np.float32).reshape(len(last), -1)
    new_names = [new["name"][j] for j in last.tolist()]
    M = len(st.model_ids)
    pos = np.searchsorted(st.model_ids, nm)                  # st's arrays are ordered by model id (`_build`)
    have = pos < M
    have[have] = st.model_ids[pos[have]] == nm[have]
    up, add = np.flatnonzero(have), np.flatnonzero(~have)
    at = pos[up]
    mids, vers, vids = st.model_ids.copy(), st.versions.copy(), st.version_ids.copy()
    z, cost, params = st.z.copy(), st.cost.copy(), st.params_b.copy()
    n, stab = st.evidence.n.astype(np.float64), st.evidence.stability.copy()
    names = list(st.names)
    fresh = {"version": col("version", np.int64), "id": col("id", np.int64), "cost": col("cost", np.float64),
             "params_b": col("params_b", np.float64), "n_evaluations": col("n_evaluations", np.float64),
             "stability": col("stability", np.float64)}
    for arr, key in ((vers, "version"), (vids, "id"), (cost, "cost"), (params, "params_b"), (n, "n_evaluations"),
                     (stab, "stability")):
        arr[at] = fresh[key][up]
    z[at] = new_z[up]
    for i, j in zip(at.tolist(), up.tolist()):
        names[i] = new_names[j]
    if len(add):                   # new models: appended, then all put in model id order again
        mids, vers, vids = (np.concatenate([a, b]) for a, b in ((mids, nm[add]), (vers, fresh["version"][add]),
                                                                 (vids, fresh["id"][add])))
        cost, params, n, stab = (np.concatenate([a, fresh[k][add]]) for a, k in (
            (cost, "cost"), (params, "params_b"), (n, "n_evaluations"), (stab, "stability")))
        z = np.concatenate([z.reshape(M, new_z.shape[1]), new_z[add]])
        names += [new_names[j] for j in add.tolist()]
        order = np.argsort(mids, kind="stable")
        if (order != np.arange(len(order))).any():
            mids, vers, vids, z, cost, params, n, stab = (a[order] for a in (mids, vers, vids, z, cost, params, n,
                                                                               stab))
            names = [names[i] for i in order.tolist()]
    z = np.ascontiguousarray(z, dtype=np.float32)
    ev = evidence.assess(z, n, stab, st.key[-1])
    fit_key = (str(db_path), st.encoder_id, tuple(vids.tolist()), tuple(ev.probation.tolist()), st.key[-2])
    served, fitted = _interaction(tx, fit_key, st.model, z, mids, vids, ev, refit=False)
    return State(st.key, st.encoder_id, st.encoder_name, st.model, names, mids, vers, vids, z, cost, params, ev,
                 st.down, st.model.scorer(z), st.known | frozenset(new["name"]) | frozenset(registered), served,
                 fitted, st.category_of)


def _versions_written(tx: Tx, st: State, after: int) -> dict | None:
    """`with_new_versions`' read, from what this transaction wrote (onboarding.run_pending and
    ingest.insert_new_models record it): the server's writer builds the next snapshot in the transaction that
    wrote the versions. None (read them) unless they are exactly the versions that read would give: all under st's
    encoder and past st's newest, as many as the file holds there (one count), and each model's cost and size known
    (st's, or its registration's)."""
    written = tx.local.get("versions_written")
    if not written or any(enc != st.encoder_id or vid <= after for vid, *_, enc in written):
        return None
    created = tx.local.get("new_model_meta", {})
    at = {m: i for i, m in enumerate(st.model_ids.tolist())}
    if any(mid not in at and mid not in created for _, mid, *_ in written):
        return None
    if tx.sql("SELECT count(*) FROM embedding_versions WHERE encoder_id = ? AND id > ?",
              [st.encoder_id, after])[0][0] != len(written):
        return None
    out: dict[str, list] = {k: [] for k in ("id", "model_id", "name", "version", "vector", "n_evaluations", "cost",
                                             "params_b", "stability")}
    for vid, mid, name, version, vec, n, stab, _ in sorted(written, key=lambda w: (w[1], w[3])):
        cost, params = (st.cost[at[mid]], st.params_b[at[mid]]) if mid in at else created[mid]
        for k, v in zip(out, (vid, mid, name, version, vec, n, cost, params, stab)):
            out[k].append(v)
    return out


_served: dict[tuple, interaction.Served | None] = {}
_rows: dict[tuple, np.ndarray] = {}     # (db, encoder, version, queries) -> the predictor's P(correct) row
_latest: dict[tuple, tuple] = {}        # (db, encoder) -> (model ids, Served) of the newest fit


def _interaction(tx: Tx, key: tuple, model, z: np.ndarray, model_ids: np.ndarray, version_ids: np.ndarray,
                 ev: evidence.Evidence, refit: bool = True) -> tuple[interaction.Served | None, bool]:
    """-> (terms, whether fitted for exactly these versions): `_fit`, or without `refit` the newest fit carried over
    to these models (a model it did not know gets no terms)."""
    if key in _served:
        return _served[key], True
    last = _latest.get(key[:2])
    if not refit and last is not None:
        return (None if last[1] is None else _carried(last[1], last[0], model_ids)), False
    out = _fit(tx, key, model, z, model_ids, version_ids, ev)
    _latest[key[:2]] = (np.asarray(model_ids), out)
    return out, True


def _carried(served: interaction.Served, fitted_ids: np.ndarray, model_ids: np.ndarray) -> interaction.Served:
    """The fit's terms moved onto these models: a model the fit gave terms (one of its `rows`, the contenders) keeps
    them at its new position; any other model, new ones included, gets none."""
    import dataclasses

    f = served.fitted
    # (in numpy: the registry's models are many, the fit's contenders few)
    fitted = np.asarray(fitted_ids, dtype=np.int64)[f.rows]          # the model id of each row of the fit's terms
    by_id = np.argsort(fitted, kind="stable")
    model_ids = np.asarray(model_ids, dtype=np.int64)
    where = np.searchsorted(fitted[by_id], model_ids).clip(max=max(len(fitted) - 1, 0))
    at = np.flatnonzero(fitted[by_id][where] == model_ids) if len(fitted) else np.zeros(0, dtype=np.int64)
    take = by_id[where[at]].astype(np.int64)
    if np.array_equal(at, f.rows) and np.array_equal(take, np.arange(len(f.rows))):
        return served         # (the usual case: models were only added, after the fit's, so none moved)
    # the same reference queries: the texts' nearest ones found so far stay good (the dict is shared)
    return interaction.Served(dataclasses.replace(f, rows=at, offsets=f.offsets[take], resid=f.resid[take],
                                                  seen=f.seen[take]), served.category_of, served._nn)


def _fit(tx: Tx, key: tuple, model, z: np.ndarray, model_ids: np.ndarray, version_ids: np.ndarray,
         ev: evidence.Evidence):
    """The interaction terms for routing among these models (embeddings z, versions version_ids), fitted on the
    registry's train and val queries exactly as `registry evaluate` fits them (on the predictor's own logits, for
    the `interaction.contenders`); None without a train and a val split. Kept per `key` (encoder, versions,
    probation, splits), so a change of availability or cost does not refit; each version's predictions are kept
    too, so a registration scores only its new version."""
    from registry.embedding.dataset import dataset, query_labels

    try:
        data = dataset(tx)
    except RegistryError:                               # no splits: the predictor alone
        data = None
    out = None
    if data is not None and len(data.splits["train"]) and len(data.splits["val"]) and len(model_ids):
        pos = {int(m): i for i, m in enumerate(data.model_ids)}
        correct = data.correct[[pos[int(m)] for m in model_ids]]
        tr, va = data.splits["train"], data.splits["val"]
        rows = interaction.contenders(correct, tr, va, evidence.candidates(ev))
        qkey = (key[0], key[1], data.query_ids.tobytes())
        todo = [i for i in rows.tolist() if qkey + (int(version_ids[i]),) not in _rows]
        if todo:
            fresh = model.scorer(z[todo])(data.qvecs, query_labels(data, model))
            if len(_rows) + len(todo) > 4096:
                _rows.clear()
            _rows.update({qkey + (int(version_ids[i]),): fresh[j] for j, i in enumerate(todo)})
        raw = np.stack([_rows[qkey + (int(version_ids[i]),)] for i in rows.tolist()]) if len(rows) else \
            np.zeros((0, len(data.query_ids)), dtype=np.float32)
        fitted = interaction.fit(interaction.logit(raw), correct, data.qvecs, data.categories, tr, va, rows=rows)
        out = interaction.Served(fitted, dict(tx.sql("SELECT content_hash, coalesce(category, '(none)') FROM queries")))
    if len(_served) > 8:                                # a few registries and states per process at most
        _served.clear()
    _served[key] = out
    return out


def _nan(v) -> float:
    return float("nan") if v is None else float(v)


# --- query vectors ------------------------------------------------------------------------------------------------
def clean_texts(texts) -> tuple[list[str], list[str]]:
    """(texts as routed, sha256 of each full text). Empty texts are refused; over-long ones are cut (MAX_CHARS)."""
    if isinstance(texts, str):
        texts = [texts]
    out, hashes = [], []
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise InputError(f"query {i + 1}: text must be a string, got {type(t).__name__}")
        if not t.strip():
            raise InputError(f"query {i + 1}: empty query" if len(texts) > 1 else "empty query")
        hashes.append(text_encoder.content_hash(t))
        out.append(t[:MAX_CHARS])
    return out, hashes


def has_vector(content_hash: str) -> bool:
    """Whether the LRU holds this text's vector."""
    with _vectors_lock:
        return content_hash in _vectors


def query_vectors(tx: Tx | None, texts: list[str], hashes: list[str], reuse: bool = True,
                  batch_size: int = 64, progress: bool = False, fresh: list | None = None,
                  stored=None, encode=None) -> np.ndarray:
    """[N,384]: from the LRU, then from the registry's stored vectors (by content hash: in `tx`, or from `stored`,
    hashes -> {hash: vector}), then MiniLM (batched; or `encode`, texts -> [n,384]). `fresh`, if given, receives
    the indices that were encoded here."""
    out = np.zeros((len(texts), text_encoder.TEXT_DIM), dtype=np.float32)
    todo = []
    for i, h in enumerate(hashes):
        with _vectors_lock:
            v = _vectors.get(h) if reuse else None
        if v is None:
            todo.append(i)
        else:
            out[i] = v
    if todo and reuse and (tx is not None or stored is not None):
        found = (stored or (lambda hs: stored_vectors(tx, hs)))([hashes[i] for i in todo])
        rest = []
        for i in todo:
            v = found.get(hashes[i])
            if v is None:
                rest.append(i)
            else:
                out[i] = v
        todo = rest
    if todo:
        todo_texts = [texts[i] for i in todo]
        out[todo] = (encode(todo_texts) if encode is not None
                     else text_encoder.encode(todo_texts, batch_size=batch_size, progress=progress))
        if fresh is not None:
            fresh.extend(todo)
    with _vectors_lock:
        for i, h in enumerate(hashes):
            _vectors[h] = out[i]
            _vectors.move_to_end(h)
        while len(_vectors) > _VEC_CACHE_SIZE:
            _vectors.popitem(last=False)
    return out


def stored_vectors(tx: Tx, hashes: list[str]) -> dict[str, np.ndarray]:
    """The registry's stored text vectors of these content hashes (those it has)."""
    if len(hashes) == 1:  # the single-query path: one indexed lookup, no Arrow registration
        rows = tx.sql("SELECT vector FROM text_vectors WHERE content_hash = ? AND text_encoder = ?",
                      [hashes[0], text_encoder.TEXT_ENCODER])
        return {hashes[0]: np.asarray(rows[0][0], dtype=np.float32)} if rows else {}
    import pyarrow as pa

    with tx.table("_route_hashes", pa.table({"h": hashes})):
        tbl = tx.arrow("""SELECT v.content_hash, v.vector FROM text_vectors v
                             JOIN (SELECT DISTINCT h FROM _route_hashes) r ON r.h = v.content_hash
                             WHERE v.text_encoder = ?""", [text_encoder.TEXT_ENCODER])
    return _by_hash(tbl)


def every_stored_vector(tx: Tx, limit: int) -> tuple[dict[str, np.ndarray], bool]:
    """Up to `limit` of the registry's stored text vectors (the newest first) -> ({hash: vector}, whether that is
    all of them): what a server keeps in memory so that a known text routes without a read."""
    tbl = tx.arrow("""SELECT content_hash, vector FROM text_vectors WHERE text_encoder = ?
                         ORDER BY created DESC LIMIT ?""", [text_encoder.TEXT_ENCODER, limit + 1])
    complete = tbl.num_rows <= limit
    return _by_hash(tbl.slice(0, limit)), complete


def _by_hash(tbl) -> dict[str, np.ndarray]:
    if not tbl.num_rows:
        return {}
    flat = tbl.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    mat = flat.reshape(tbl.num_rows, -1).astype(np.float32)
    return dict(zip(tbl.column("content_hash").to_pylist(), mat))


def keep_vectors(tx: Tx, hashes: list[str], vectors: np.ndarray) -> None:
    """Store routed texts' vectors by content hash (text_vectors is a cache keyed by it), so that the same text routes
    again, from any process, without loading MiniLM."""
    from registry.data import vector_files as text_vectors

    text_vectors.insert(tx, hashes, vectors)


# --- scoring and choosing -----------------------------------------------------------------------------------------
def probabilities(st: State, qvecs: np.ndarray, hashes: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """[N,384] (texts with these content hashes) -> (P(correct) as routing uses it: the predictor's, shrunk by
    evidence, with the interaction terms added to its logit; the predictor's own), each [M,N]."""
    cats = None if st.category_of is None or hashes is None else [st.category_of.get(h) for h in hashes]
    raw = st.score(qvecs, cats)
    probs = evidence.shrink(raw, st.evidence)
    if st.interaction is not None and len(raw):
        probs = interaction.sigmoid(st.interaction.scores(interaction.logit(probs), qvecs, hashes)).astype(np.float32)
    return probs, raw


COST_BASES = ("cost", "params")


@dataclass
class Policy:
    """What a routing call asked for, checked: who may be chosen and what a choice costs."""
    down: set[str]                    # never chosen (marked unavailable, or named by the caller)
    eligible: np.ndarray              # [M] bool: candidates (probation models only when asked; see cost_by)
    cost: np.ndarray | None           # [M] cost per choice on the basis used, or None when cost does not count
    cost_basis: str | None            # "cost" | "params_b" | None
    cost_weight: float | None = None
    min_prob: float | None = None
    note: str | None = None


def policy(st: State, cost_weight: float | None = None, min_prob: float | None = None, unavailable=(),
           known_models=(), cost_by: str = "cost", include_probation: bool = False) -> Policy:
    if cost_weight is not None and min_prob is not None:
        raise InputError("give either a cost weight or a minimum probability, not both")
    if cost_weight is not None and not (cost_weight >= 0 and np.isfinite(cost_weight)):
        raise InputError(f"cost weight must be a non-negative number, got {cost_weight}")
    if min_prob is not None and not (0.0 <= min_prob <= 1.0):
        raise InputError(f"minimum probability must be between 0 and 1, got {min_prob}")
    if cost_by not in COST_BASES:
        raise InputError(f"cost basis must be one of {', '.join(COST_BASES)}, got {cost_by!r}")
    unknown = sorted(set(unavailable or ()) - set(known_models))
    if unknown:
        raise unknown_model(unknown[0], known_models, " in unavailable models")
    if not st.names:
        raise RegistryError("no model has an embedding under the active encoder: nothing to route to "
                            "(run `registry onboard`)")
    eligible = evidence.candidates(st.evidence, include_probation)
    if not eligible.any():
        raise RegistryError(f"every model is on probation (fewer than {st.evidence.minimum} evaluations behind its "
                            f"embedding): route with --include-probation, or lower the minimum with --probation-min N "
                            f"(REGISTRY_PROBATION_MIN)")
    down = set(unavailable or ()) | st.down
    if cost_weight is None and min_prob is None:
        return Policy(down, eligible, None, None)
    note = None
    if cost_by == "cost":
        missing = [n for n, e, c in zip(st.names, eligible, st.cost) if e and np.isnan(c)]
        if missing:
            raise InputError(f"cost-aware routing needs a price for every candidate, and {len(missing)} of "
                             f"{int(eligible.sum())} have none (e.g. {missing[0]}): set `cost` (a `cost` column in a models "
                             f"file, `registry import --models FILE`), or rank by size with --cost-by params")
        cost, basis = st.cost, "cost"
    else:
        sized = ~np.isnan(st.params_b)
        if not (eligible & sized).any():
            raise InputError("no candidate has a parameter count (params_b): nothing to rank by size")
        left = int((eligible & ~sized).sum())
        if left:
            note = f"cost by params_b: {left} models without a parameter count left out"
        eligible = eligible & sized
        cost, basis = np.nan_to_num(st.params_b), "params_b"
    return Policy(down, eligible, cost, basis, cost_weight, min_prob, note)


def choose(st: State, probs: np.ndarray, pol: Policy) -> list[tuple[int | None, bool]]:
    """For each query column of probs [M,N]: (chosen model row or None, fallback). The policy ranks the eligible
    models; the top-ranked one is taken unless unavailable, then the best-ranked available one (a fallback)."""
    M, N = probs.shape
    avail = pol.eligible & _up(st, pol)
    if not avail.any():
        return [(None, True)] * N
    if pol.min_prob is None:
        rank = probs - (pol.cost_weight or 0.0) * (pol.cost[:, None] if pol.cost is not None else 0.0)
        rank = np.where(pol.eligible[:, None], rank, -np.inf)
        top = np.argmax(rank, axis=0)                                # ties: the lower row, as baselines do
        best = np.argmax(np.where(avail[:, None], rank, -np.inf), axis=0)
        return [(int(b), bool(not avail[t])) for t, b in zip(top, best)]
    out = []
    rows = np.flatnonzero(pol.eligible)
    for j in range(N):
        # the cheapest model reaching the threshold (the most likely among equally cheap ones), then the models
        # below it by probability: with none reaching it, the most likely is chosen
        p = probs[rows, j]
        reach = p >= pol.min_prob
        order = rows[np.lexsort((-p, np.where(reach, pol.cost[rows], 0.0), ~reach))]
        first_avail = next(i for i in order if avail[i])
        out.append((int(first_avail), bool(not avail[order[0]])))
    return out


def _up(st: State, pol: Policy) -> np.ndarray:
    """[M] bool: not down (marked unavailable or named by the caller); without any down, no look at the names."""
    if not pol.down:
        return np.ones(len(st.names), dtype=bool)
    return np.array([n not in pol.down for n in st.names], dtype=bool)


def decisions(st: State, probs: np.ndarray, raw: np.ndarray, picks, pol: Policy, hashes: list[str],
              truncated: list[bool], top: int | None = None) -> list[Decision]:
    """`top`: list that many candidates, most likely first, and the chosen one wherever it ranks (None or 0:
    every model); the versions are those of the listed models."""
    listed = len(st.names) if not top or top >= len(st.names) else int(top)
    ev = st.evidence
    up = _up(st, pol)
    skipped = int((ev.probation & ~pol.eligible).sum())
    out = []
    for j, (row, fallback) in enumerate(picks):
        order = np.argsort(-probs[:, j], kind="stable")
        if listed < len(order):
            head = order[:listed]
            order = head if row is None or row in head else np.append(head, row)
        # the listed models' fields as Python values, in numpy first: with hundreds of models, a route must not
        # touch every model in Python
        p = np.round(probs[order, j].astype(np.float64), 6).tolist()
        r = np.round(raw[order, j].astype(np.float64), 6).tolist()
        cands = [Candidate(st.names[i], pk, rk, n, flag, None if c != c else c, None if b != b else b, a)
                 for i, pk, rk, n, flag, c, b, a in zip(
                     order.tolist(), p, r, ev.n[order].astype(np.int64).tolist(), ev.probation[order].tolist(),
                     st.cost[order].tolist(), st.params_b[order].tolist(), up[order].tolist())]
        notes = [pol.note] if pol.note else []
        if row is None:
            notes.append(f"no model available: all {int(pol.eligible.sum())} candidates are unavailable")
        elif truncated[j]:
            notes.append(f"query longer than {MAX_CHARS} characters: routed on its first {MAX_CHARS}")
        if skipped:
            notes.append(f"{skipped} model(s) on probation (under {ev.minimum} evaluations) not considered")
        # (the versions of the listed models: every model's when all are listed)
        used = dict(zip([c.model for c in cands], st.versions[order].tolist()))
        out.append(Decision(None if row is None else st.names[row], fallback, cands, st.encoder_name, used,
                            hashes[j], "; ".join(notes) or None, pol.cost_basis))
    return out


def decide(st: State, pol: Policy, qvecs: np.ndarray, hashes: list[str], truncated: list[bool],
           top: int | None = None) -> list[Decision]:
    """The decisions for texts already turned into vectors [N,384]: no database, no lock (the server answers from
    its in-memory snapshot with this)."""
    probs, raw = probabilities(st, qvecs, hashes)
    return decisions(st, probs, raw, choose(st, probs, pol), pol, hashes, truncated, top)


@dataclass
class Routed:
    decisions: list[Decision]
    log_rows: list[tuple]             # routing_log rows of these decisions (`append_log`)
    new_hashes: list[str]             # texts encoded here whose text the log keeps: keep their vectors too
    new_vectors: np.ndarray           # [n,384]


def route_texts(st: State, texts: list[str], vectors, cost_weight: float | None = None,
                min_prob: float | None = None, unavailable: list[str] | None = None, log_text: bool = True,
                cost_by: str = "cost", include_probation: bool = False, top: int | None = None) -> Routed:
    """Route texts on a routing state: `vectors(texts, hashes, fresh)` turns them into [N,384] (appending to
    `fresh` the indices it encoded). Writes nothing: the caller logs (`route` in its transaction, the server through
    its writer). `top`: the candidates each answer lists (`decisions`)."""
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 0):
        raise InputError(f"top must be a whole number of candidates (0: every model), got {top!r}")
    cut, hashes = clean_texts(texts)
    if not cut:
        return Routed([], [], [], np.zeros((0, text_encoder.TEXT_DIM), np.float32))
    pol = policy(st, cost_weight, min_prob, unavailable, st.known, cost_by, include_probation)
    fresh: list[int] = []
    q = vectors(cut, hashes, fresh)
    decs = decide(st, pol, q, hashes, [len(t) > len(c) for t, c in zip(texts, cut)], top)
    keep = fresh if log_text else []
    return Routed(decs, log_rows(decs, cut if log_text else None, st.encoder_id,
                                 log_options(pol, cost_weight, min_prob, include_probation)),
                  [hashes[i] for i in keep], q[keep])


def route(tx: Tx, db_path: str, texts: list[str], cost_weight: float | None = None, min_prob: float | None = None,
          unavailable: list[str] | None = None, log_decisions: bool = True, log_text: bool = True,
          reuse_vectors: bool = True, batch_size: int = 64, progress: bool = False, cost_by: str = "cost",
          include_probation: bool = False, probation_min: int | None = None, top: int | None = None) -> list[Decision]:
    """`Registry.route_batch`: texts -> vectors -> P(correct) -> the policy's choice, logged in the same transaction
    (texts routed for the first time keep their vectors, when their text is logged)."""
    if not texts:
        return []
    r = route_texts(state(tx, db_path, probation_min), texts,
                    lambda cut, hashes, fresh: query_vectors(tx, cut, hashes, reuse_vectors, batch_size, progress,
                                                             fresh),
                    cost_weight, min_prob, unavailable, log_text, cost_by, include_probation, top)
    if log_decisions:
        if reuse_vectors:
            keep_vectors(tx, r.new_hashes, r.new_vectors)
        append_log(tx, r.log_rows)
    return r.decisions


# --- the routing log ----------------------------------------------------------------------------------------------
LOG_COLUMNS = ("query_hash", "text", "model", "fallback", "candidates", "encoder_id", "versions", "options")
_LOG_TYPES = ("VARCHAR", "VARCHAR", "VARCHAR", "BOOLEAN", "VARCHAR", "BIGINT", "VARCHAR", "VARCHAR")


def log_options(pol: Policy, cost_weight: float | None, min_prob: float | None, include_probation: bool) -> dict:
    """What the log records of the options a decision was made under."""
    return {"cost_weight": cost_weight, "min_prob": min_prob, "unavailable": sorted(pol.down),
            "cost_basis": pol.cost_basis, "include_probation": include_probation}


def log_rows(decs: list[Decision], texts: list[str] | None, encoder_id: int, options: dict) -> list[tuple]:
    """One routing_log row per decision (LOG_COLUMNS; JSON columns as text), for `append_log` now or later."""
    opts = json.dumps(options)
    rows = []
    for i, d in enumerate(decs):
        top = d.candidates[:LOG_TOP]
        # the versions behind what the row records (its candidates and the choice), not every model's: a row stays
        # small however many models the registry holds, and the rest is in the versions' history at its time
        used = {c.model: d.versions[c.model] for c in top}
        if d.model is not None:
            used[d.model] = d.versions[d.model]
        rows.append((d.query_hash, texts[i] if texts is not None else None, d.model, d.fallback,
                     json.dumps([{"model": c.model, "prob": c.prob} for c in top]), encoder_id, json.dumps(used),
                     opts))
    return rows


def append_log(tx: Tx, rows: list[tuple]) -> None:
    """Append routing_log rows (`log_rows`) in one native bulk insert (Arrow), whatever their number: the server's
    writer appends many requests' rows at once."""
    import pyarrow as pa

    if not rows:
        return
    sql = """INSERT INTO routing_log (query_hash, text, model, fallback, candidates, encoder_id, versions, options)
             SELECT query_hash, text, model, fallback, candidates::JSON, encoder_id, versions::JSON, options::JSON
             FROM {} AS r"""
    if len(rows) == 1:  # one query: a plain parameterised insert costs less than registering an Arrow table
        one = ", ".join(f"?::{t} AS {c}" for c, t in zip(LOG_COLUMNS, _LOG_TYPES))
        tx.sql(sql.format(f"(SELECT {one})"), list(rows[0]))
        return
    types = {"BOOLEAN": pa.bool_(), "BIGINT": pa.int64(), "VARCHAR": pa.string()}
    tbl = pa.table({c: pa.array(v, type=types[t]) for c, t, v in zip(LOG_COLUMNS, _LOG_TYPES, zip(*rows))})
    with tx.table("_route_log", tbl):
        tx.sql(sql.format("_route_log"))


@dataclass
class LogEntry:
    id: int
    created: str
    query_hash: str
    text: str | None
    model: str | None
    fallback: bool
    candidates: list
    encoder_id: int | None
    versions: dict
    options: dict | None


def read_log(tx: Tx, since: str | None = None, limit: int | None = None, oldest: bool = False) -> list[LogEntry]:
    """Newest first (a log reader wants the latest), or oldest first."""
    where, params = "", []
    if since:
        try:
            tx.sql("SELECT ?::TIMESTAMP", [since])
        except Exception:
            raise InputError(f"not a timestamp: {since!r} (use e.g. 2026-01-31 or '2026-01-31 12:00')") from None
        where, params = "WHERE created >= ?::TIMESTAMP", [since]
    lim = f"LIMIT {int(limit)}" if limit else ""
    rows = tx.sql(f"""SELECT id, created::VARCHAR, query_hash, text, model, fallback, candidates::VARCHAR, encoder_id,
                             versions::VARCHAR, options::VARCHAR FROM routing_log {where}
                             ORDER BY id {'ASC' if oldest else 'DESC'} {lim}""", params)
    return [LogEntry(i, c, h, t, m, f, json.loads(cs), e, json.loads(v), json.loads(o) if o else None)
            for i, c, h, t, m, f, cs, e, v, o in rows]
