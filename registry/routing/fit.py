"""The routing state's fit: the write path's half of routing (routing/state.py is the read's). A write that changes
what routing depends on (a contender registered, an import, a re-split, a new encoder; availability and costs too,
without a refit) keeps the state (`keep`): it builds it from the registry, fits the interaction terms beside the
predictor (locus/interaction.py: category offsets and nearest-query residuals from the registry's answers) and the
served policy (routing/served.py), and saves it, where a command runs, so that the next route only reads. A server's
writer keeps it in memory: after registrations from the versions they wrote (`with_new_versions`, the last fit
carried over to new models), refitted in its background job.

The fits are kept per Store by what they depend on (encoder, versions, probation, splits), and a fit is taken from the
newest saved state where its inputs are exactly the same (a registration on probation changes no contender).
"""
from __future__ import annotations

import dataclasses
import sys

import numpy as np

from registry.core.errors import RegistryError
from registry.core.transaction import Tx
from registry.data import availability, current_evaluations
from registry.embedding import encoders, index
from registry.locus import evidence, interaction, numpy_network
from registry.routing import served_scores, state
from registry.routing.served import choose as choose_policy

PREDICTIONS_KEPT = 4096     # the predictor's P(correct) rows kept per Store (one per model version and query set)
FITS_KEPT = 2               # interaction fits kept per Store: the served one and the next (each tens of MB)
SAVED = tuple(f.name for f in dataclasses.fields(state.State) if f.name not in state.NOT_SAVED)


def keep(tx: Tx, probation_min: int | None = None, *, refit: bool = True) -> state.State:
    """The registry's routing state now, built where the one read (routing/state.py: this Store's, or saved under
    the registry's key) is not current, and saved (a command: its user waits, seconds, and is told on stderr).
    Where only availability, costs or names changed since the newest saved state, that state is taken with them
    (no fit). With `refit=False` (a server's writer after each commit: a fit takes seconds) the interaction terms of
    the last fit are carried over: models it knew keep theirs, a new model gets none until the next fit."""
    k = state.key(tx, probation_min)
    st = tx.section("routing state").get("state")
    if st is not None and st.key == k and (st.interaction_fitted or not refit):
        return st
    fields = state.load(tx, k)
    st = _from_saved(tx, fields) if fields is not None else _rekeyed(tx, k)
    if st is None:
        if tx.save_routing_state:       # (a command, not a server: its user waits on this, seconds)
            print("routing: refitting the routing state (the registry changed in a way routing depends on; "
                  "seconds)", file=sys.stderr, flush=True)
        st = _build(tx, k, refit)
    # (saved only as fitted, and where the numpy predictor agrees with torch's: what a saved state scores with)
    if fields is None and st.interaction_fitted and (st.model is None or st.model.numpy_scorer_agrees):
        terms = st.interaction and dataclasses.replace(st.interaction, nearest={})
        state.save(tx, dataclasses.replace(st, interaction=terms))
    return state.remember(tx, st)


def _from_saved(tx: Tx, fields: dict) -> state.State:
    """A saved state, its interaction terms kept as the fit of its versions (for the next `keep` of this Store)."""
    st = state.State(**fields, model=None, score=state.predictor(tx, fields["encoder_id"]).scorer(fields["z"]))
    fit_key = (st.encoder_id, tuple(int(v) for v in st.version_ids), tuple(st.evidence.probation.tolist()),
               st.key[-2])
    tx.section("routing fits")[fit_key] = st.interaction
    tx.section("routing newest fit")[st.encoder_id] = (np.asarray(st.model_ids), st.interaction)
    return st


def _rekeyed(tx: Tx, k: tuple) -> state.State | None:
    """The newest saved state under key `k`, where only availability, costs or names changed since it was saved:
    the same encoder, versions, stabilities, splits and probation minimum (so the same fit); else None."""
    fields = state.load_newest(tx, SAVED)
    if fields is None:
        return None
    old = tuple(fields["key"])
    if len(old) != len(k) or old[-2:] != k[-2:] or old[3] != k[3]:
        return None
    try:
        encoder_id = encoders.require_active(tx)
    except RegistryError:
        return None
    vids, mids, _, _ = index.current_versions(tx, encoder_id)
    if encoder_id != fields["encoder_id"] or not np.array_equal(np.asarray(vids), fields["version_ids"]):
        return None
    meta = {r[0]: r[1:] for r in tx.sql("SELECT id, cost, params_b, name FROM models")}
    fields.update(key=k, names=[meta[m][2] for m in mids.tolist()],
                  cost=np.array([_nan(meta[m][0]) for m in mids.tolist()], dtype=np.float64),
                  params_b=np.array([_nan(meta[m][1]) for m in mids.tolist()], dtype=np.float64),
                  down=set(availability.unavailable_models(tx)), known=frozenset(m[2] for m in meta.values()))
    return _from_saved(tx, fields)


def _saved_fit(tx: Tx, inputs: str) -> tuple | None:
    """The newest saved state's (fit, policy) where they were computed from exactly `inputs`: after a registration
    that leaves the contenders as they were (a model on probation is none), the first route would compute them
    again (the fit and the policy's choice were most of its seconds)."""
    served = (state.load_newest(tx, ("interaction",)) or {}).get("interaction")
    return (served.fitted, served.policy) if served is not None and served.inputs == inputs else None


def _fit_inputs(encoder_id: int, rows: np.ndarray, model_ids: np.ndarray, version_ids: np.ndarray, data,
                correct: np.ndarray) -> str:
    """A digest of what `_fit` computes the terms and the policy from: the encoder, the contenders (their positions,
    models, versions and answers) and the queries (ids, vectors, labels, splits)."""
    import hashlib

    h = hashlib.sha256(repr((encoder_id, rows.tolist(), model_ids[rows].tolist(),
                             version_ids[rows].tolist())).encode())
    for a in (correct[rows], data.query_ids, data.qvecs, data.splits["train"], data.splits["val"]):
        a = np.ascontiguousarray(a)
        h.update(repr((a.dtype.str, a.shape)).encode())     # (where train ends and val begins, among others)
        h.update(a.tobytes())
    h.update(repr((list(data.categories), None if data.sources is None else list(data.sources))).encode())
    return h.hexdigest()


def _locus_model(tx: Tx, st: state.State):
    """st's LocusModel: a saved state has none until a refit or a new version needs it."""
    return st.model if st.model is not None else encoders.load(tx, st.encoder_id)[0]


def _build(tx: Tx, key: tuple, refit: bool = True) -> state.State:
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
    fit_key = (encoder_id, tuple(int(v) for v in vids), tuple(ev.probation.tolist()), key[-2])
    served, fitted = _interaction(tx, fit_key, model, z=vecs, model_ids=np.asarray(mids, dtype=np.int64),
                                  version_ids=np.asarray(vids), ev=ev, refit=refit)
    category_of = None        # the field is valid (EncoderConfig checks it with numpy_network.label_columns)
    if model.cfg.categories:
        label = numpy_network.label_sql(model.cfg.category_field)
        category_of = dict(tx.sql(f"SELECT content_hash, {label} FROM queries"))
    return state.State(key=key, encoder_id=encoder_id, encoder_name=enc_name, model=model, names=list(names),
                 model_ids=np.asarray(mids, dtype=np.int64),
                 versions=np.array([about[int(v)][0] for v in vids], dtype=np.int64),
                 version_ids=np.asarray(vids, dtype=np.int64), z=vecs,
                 cost=np.array([_nan(meta[m][0]) for m in mids.tolist()], dtype=np.float64),
                 params_b=np.array([_nan(meta[m][1]) for m in mids.tolist()], dtype=np.float64), evidence=ev,
                 down=down, score=score, known=frozenset(m[2] for m in meta.values()), interaction=served,
                 interaction_fitted=fitted, category_of=category_of)


def with_new_versions(tx: Tx, st: state.State, registered: frozenset[str] | set[str] = frozenset()) -> state.State:
    """`st` brought up to date after commits that only appended embedding versions (and created the models they are
    of: a server's registrations), reading only those versions, the newest per model under st's encoder past st's
    newest id, with their models' cost and size. The rest is st's: encoder, availability, splits, the other
    models' versions and metadata; `registered`: the names of the models those commits registered (embedded or
    not: `known`). The interaction terms are a fit of exactly the new set of versions if one was
    made, else the last fit carried over, as `keep(refit=False)` gives them. A full `keep` gives the same state
    (tests/test_writer.py); its key is st's, so it never becomes the Store's current state."""
    after = int(st.version_ids.max()) if len(st.version_ids) else 0
    # (a few rows: the newest per model is kept below, in version order, cheaper than a window in the statement)
    new = _versions_written(tx, st, after) or tx.arrow("""
        SELECT v.id, v.model_id, m.name, v.version, v.vector, v.n_evaluations, m.cost, m.params_b,
               coalesce(s.stability, v.stability) AS stability
        FROM embedding_versions v JOIN models m ON m.id = v.model_id
        LEFT JOIN version_stability s ON s.version_id = v.id
        WHERE v.encoder_id = ? AND v.id > ?
        ORDER BY v.model_id, v.version""", [st.encoder_id, after]).to_pydict()
    aliases = {a for (a,) in tx.sql(current_evaluations.ALIASES)} if new["id"] else set()
    if aliases & set(new["model_id"]):      # (an alias is its model under another name: not a contender of its own)
        keep_rows = [j for j, m in enumerate(new["model_id"]) if m not in aliases]
        new = {k: [v[j] for j in keep_rows] for k, v in new.items()}
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
    fit_key = (st.encoder_id, tuple(vids.tolist()), tuple(ev.probation.tolist()), st.key[-2])
    model = _locus_model(tx, st)
    served, fitted = _interaction(tx, fit_key, model, z=z, model_ids=mids, version_ids=vids, ev=ev, refit=False)
    return state.State(key=st.key, encoder_id=st.encoder_id, encoder_name=st.encoder_name, model=model, names=names,
                 model_ids=mids, versions=vers, version_ids=vids, z=z, cost=cost, params_b=params, evidence=ev,
                 down=st.down, score=model.scorer(z),
                 known=st.known | frozenset(new["name"]) | frozenset(registered), interaction=served,
                 interaction_fitted=fitted, category_of=st.category_of)


def _versions_written(tx: Tx, st: state.State, after: int) -> dict | None:
    """`with_new_versions`' read, from what this transaction wrote (onboarding.run_pending and
    import_run.insert_new_models note it on the transaction): the server's writer builds the next snapshot in the
    transaction that wrote the versions. None (read them) unless they are exactly the versions that read would give:
    all under st's encoder and past st's newest, as many as the file holds there (one count), and each model's cost and
    size known (st's, or its registration's)."""
    written = tx.notes.versions_written
    if not written or any(enc != st.encoder_id or vid <= after for vid, *_, enc in written):
        return None
    created = tx.notes.new_model_meta
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


def _interaction(tx: Tx, key: tuple, model, *, z: np.ndarray, model_ids: np.ndarray, version_ids: np.ndarray,
                 ev: evidence.Evidence, refit: bool = True) -> tuple[served_scores.Served | None, bool]:
    """-> (terms, whether fitted for exactly these versions): `_fit`, or without `refit` the newest fit carried over
    to these models (a model it did not know gets no terms). The Store keeps the fits by `key` (encoder, versions,
    probation, splits) and the newest per encoder."""
    fits = tx.section("routing fits")
    if key in fits:
        return fits[key], True
    latest = tx.section("routing newest fit")        # encoder -> (model ids, Served) of the newest fit
    last = latest.get(key[0])
    if not refit and last is not None:
        return (None if last[1] is None else _carried(last[1], last[0], model_ids)), False
    out = _fit(tx, key, model, z=z, model_ids=model_ids, version_ids=version_ids, ev=ev)
    latest[key[0]] = (np.asarray(model_ids), out)
    return out, True


def _carried(served: served_scores.Served, fitted_ids: np.ndarray, model_ids: np.ndarray) -> served_scores.Served:
    """The fit's terms moved onto these models: a model the fit gave terms (one of its `rows`, the contenders) keeps
    them at its new position; any other model, new ones included, gets none."""
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
    return served_scores.Served(dataclasses.replace(f, rows=at, offsets=f.offsets[take], resid=f.resid[take],
                                                  seen=f.seen[take]), served.category_of, served.nearest,
                              served_scores.carried(served.policy, take), served.policy_labels)


def _fit(tx: Tx, key: tuple, model, *, z: np.ndarray, model_ids: np.ndarray, version_ids: np.ndarray,
         ev: evidence.Evidence):
    """The interaction terms for routing among these models (embeddings z, versions version_ids), fitted on the
    registry's train and val queries exactly as `registry evaluate` fits them (on the predictor's own logits, for
    the `interaction.contenders`); None without a train and a val split. Kept per `key` (encoder, versions,
    probation, splits), so a change of availability or cost does not refit; each version's predictions are kept
    too, so a registration scores only its new version."""
    from registry.embedding.dataset import dataset, query_labels

    # the same candidates (the same versions), encoder and splits give the same contenders and inputs: a model
    # joining on probation is no candidate, and its registration then needs neither the dataset nor a fit
    by_candidates = tx.section("routing inputs by candidates")
    eligible = np.flatnonzero(evidence.candidates(ev))         # (positions too: the terms' rows are positions)
    same = (key[0], key[3], tuple(eligible.tolist()), tuple(version_ids[eligible].tolist()))
    done = tx.section("routing fits by inputs")
    if by_candidates.get(same) in done:
        return _served(tx, by_candidates[same], done[by_candidates[same]], key)
    try:
        data = dataset(tx)
    except RegistryError:                               # no splits: the predictor alone
        data = None
    if data is not None and len(data.splits["train"]) and len(data.splits["val"]) and len(model_ids):
        pos = {int(m): i for i, m in enumerate(data.model_ids)}
        correct = data.correct[[pos[int(m)] for m in model_ids]]
        tr, va = data.splits["train"], data.splits["val"]
        rows = interaction.contenders(correct, tr, va, evidence.candidates(ev))
        inputs = _fit_inputs(key[0], rows, model_ids, version_ids, data, correct)
        taken = done.get(inputs) or _saved_fit(tx, inputs)
        if taken is None:
            kept = tx.section("routing predictions")  # (encoder, queries, version) -> the predictor's P(correct) row
            qkey = (key[0], data.query_ids.tobytes())
            todo = [i for i in rows.tolist() if qkey + (int(version_ids[i]),) not in kept]
            if todo:
                fresh = model.scorer(z[todo])(data.qvecs, query_labels(data, model))
                if len(kept) + len(todo) > PREDICTIONS_KEPT:
                    kept.clear()
                kept.update({qkey + (int(version_ids[i]),): fresh[j] for j, i in enumerate(todo)})
            raw = np.stack([kept[qkey + (int(version_ids[i]),)] for i in rows.tolist()]) if len(rows) else \
                np.zeros((0, len(data.query_ids)), dtype=np.float32)
            fitted = interaction.fit(interaction.logit(raw), correct, data.qvecs, data.categories, tr, va, rows=rows)
            taken = (fitted, choose_policy(fitted, correct, data.qvecs, data.categories, data.sources,
                                               train_idx=tr, val_idx=va))
        if inputs not in done:
            if len(done) >= FITS_KEPT:
                done.clear()
            done[inputs] = taken
        if len(by_candidates) >= FITS_KEPT:
            by_candidates.clear()
        by_candidates[same] = inputs
        return _served(tx, inputs, taken, key)
    return _served(tx, None, None, key)


def _served(tx: Tx, inputs: str | None, taken: tuple | None, key: tuple) -> served_scores.Served | None:
    """A fit (`taken`: the terms and the policy, from `inputs`) as routing serves it, kept per `key`; None: none."""
    out = None
    if taken is not None and inputs is not None:
        fitted, policy = taken
        by_hash = dict(tx.sql("SELECT content_hash, coalesce(category, '(none)') FROM queries"))
        out = served_scores.Served(fitted, by_hash, inputs=inputs)
        out.policy = policy
        if served_scores.field_of(out.policy) == "source":
            out.policy_labels = dict(tx.sql("SELECT content_hash, coalesce(source, '(none)') FROM queries"))
        elif served_scores.field_of(out.policy) == "category":
            out.policy_labels = out.category_of
    fits = tx.section("routing fits")
    if len(fits) > FITS_KEPT:
        fits.clear()
    fits[key] = out
    return out


def _nan(v) -> float:
    return float("nan") if v is None else float(v)
