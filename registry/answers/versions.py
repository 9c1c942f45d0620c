"""A model's embedding versions: its history (when, why, from how many evaluations and where they came from, how
stable) and the difference between two versions (how far it moved, how its neighbours and predicted accuracy per
category changed)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from registry.answers import catalog, neighbours, tidying
from registry.answers.neighbours import Neighbour
from registry.core.errors import InputError, NotFound, unknown_model
from registry.core.transaction import Tx
from registry.data import query_cache
from registry.data.current_evaluations import newest_per_query
from registry.embedding import embed, encoders, onboarding

IMPORTED = "imported"       # evidence from imports, registrations and answers asked: not from production traffic


@dataclass
class VersionInfo:
    version: int
    encoder: str
    encoder_id: int
    n_evaluations: int                  # used for the embedding: the evaluations outside the test split
    created: str
    reason: str
    batch_id: int | None
    stability: float | None
    digest: str
    distance_moved: float | None        # from the previous version under the same encoder
    # where the evaluations it read came from: {"imported": n, "feedback:<source>": n, ...} (they sum to
    # n_evaluations while the splits stand as they did)
    evidence: dict[str, int] = field(default_factory=dict)


@dataclass
class History:
    model: str
    versions: list[VersionInfo]
    deleted: str | None = None          # when the model was deleted (its versions kept: answers/tidying.py)
    changes: list = field(default_factory=list)   # its renames and deletion, oldest first (tidying.Change)


@dataclass
class Diff:
    model: str
    v1: int
    v2: int
    distance: float
    neighbours_v1: list[Neighbour]
    neighbours_v2: list[Neighbour]
    predicted_accuracy: dict[str, dict]  # category -> {"v1", "v2", "change"}
    # the neighbours of each version, by the vector alone (the answers now are not those of either version):
    # `similar` ranks by shared answers too, so its first may differ
    ranked_by: str = neighbours.RANKED_BY_EMBEDDING


def history(tx: Tx, name: str) -> History:
    """A registered model's versions; a deleted one's too, under the name it had (the newest deleted under it)."""
    row = tx.sql("SELECT id FROM models WHERE name = ?", [name])
    mid = int(row[0][0]) if row else tidying.deleted_id(tx, name)
    if mid is None:
        raise unknown_model(name, catalog.names(tx))
    rows = tx.sql("""
        SELECT v.version, e.name, v.encoder_id, v.n_evaluations, v.created::VARCHAR, v.reason, v.batch_id,
               coalesce(s.stability, v.stability), v.digest, v.vector
        FROM embedding_versions v JOIN encoders e ON e.id = v.encoder_id
        LEFT JOIN version_stability s ON s.version_id = v.id
        WHERE v.model_id = ? ORDER BY v.version""", [mid])
    out: list = []
    last: dict = {}
    for version, enc, enc_id, n, created, reason, batch, stab, digest, vec in rows:
        vec = np.asarray(vec, dtype=np.float32)
        moved = None if enc_id not in last else round(float(np.linalg.norm(vec - last[enc_id])), 4)
        last[enc_id] = vec
        out.append(VersionInfo(version, enc, enc_id, n, created, reason, batch,
                               None if stab is None else round(stab, 4), digest, moved))
    for v, counts in zip(out, evidence(tx, mid)):
        v.evidence = counts
    changes = [c for c in tidying.changes(tx) if c.model_id == mid]
    return History(name, out, None if row else next(c.created for c in reversed(changes) if c.change == "deleted"),
                   changes)


def evidence(tx: Tx, mid: int) -> list[dict[str, int]]:
    """For each of the model's versions (by version number), how many of the evaluations its embedding read came
    from each feedback source and how many were imported: the read of embed.evaluation_sets again (current ones up
    to its batch, outside the test split, capped as its encoder caps), with the sources that were off or weighed 0
    when the version was made left out, as they were then."""
    versions = tx.sql("""SELECT v.version, v.through_batch, e.meta::VARCHAR FROM embedding_versions v
                         JOIN encoders e ON e.id = v.encoder_id WHERE v.model_id = ? ORDER BY v.version""", [mid])
    if not versions:
        return []
    source_of = dict(tx.sql("SELECT DISTINCT batch_id, source FROM feedback WHERE model_id = ?", [mid]))
    left_out: dict[int, set[str]] = {}
    for version, name in tx.sql("""
            SELECT v.version, s.name FROM embedding_versions v JOIN feedback_sources s ON s.created <= v.created
            WHERE v.model_id = ? AND (NOT s.enabled OR s.weight = 0)
              AND s.id = (SELECT max(g.id) FROM feedback_sources g WHERE g.name = s.name AND g.created <= v.created)
            """, [mid]):
        left_out.setdefault(version, set()).add(name)
    rows = tx.numpy(f"""SELECT model_id, query_id, correct::INT AS correct, batch_id FROM evaluations
                        WHERE model_id = {int(mid)}""")
    batch = np.asarray(rows["batch_id"], dtype=np.int64)
    meta = query_cache.query_meta(tx)
    out = []
    for version, through, enc_meta in versions:
        off = [b for b, src in source_of.items() if src in left_out.get(version, ())]
        keep = (batch <= through) & ~np.isin(batch, np.asarray(off, dtype=np.int64))
        cur = newest_per_query({c: np.asarray(v)[keep] for c, v in rows.items()})
        sel = embed.chosen(meta, meta.rows(cur["query_id"]), json.loads(enc_meta).get("embed_max_set"))
        counts: dict[str, int] = {}
        for b, n in zip(*np.unique(cur["batch_id"][sel], return_counts=True)):
            key = f"feedback:{source_of[int(b)]}" if int(b) in source_of else IMPORTED
            counts[key] = counts.get(key, 0) + int(n)
        out.append(dict(sorted(counts.items(), key=lambda kv: (kv[0] != IMPORTED, kv[0]))))
    return out


def diff(tx: Tx, name: str, v1: int | None = None, v2: int | None = None, k: int = 5) -> Diff:
    rows = {r[0]: r[1:] for r in tx.sql("""
        SELECT v.version, v.encoder_id, v.vector, v.created::VARCHAR FROM embedding_versions v
        JOIN models m ON m.id = v.model_id WHERE m.name = ? ORDER BY v.version""", [name])}
    if not rows:
        if not tx.sql("SELECT 1 FROM models WHERE name = ?", [name]):
            raise unknown_model(name, catalog.names(tx))
        raise NotFound(f"model {name!r} has no embedding versions")
    newest = sorted(rows)
    if len(newest) == 1 and v1 is None and v2 is None:
        raise InputError(f"{name!r} has one embedding version (v{newest[0]}): nothing to compare yet "
                         f"(a new version comes with new evaluations or another encoder)")
    v2 = v2 if v2 is not None else newest[-1]
    v1 = v1 if v1 is not None else (newest[-2] if len(newest) > 1 else newest[-1])
    for v in (v1, v2):
        if v not in rows:
            raise NotFound(f"model {name!r} has no version {v} (versions: {newest})")
    (e1, z1, t1), (e2, z2, t2) = rows[v1], rows[v2]
    z1, z2 = np.asarray(z1, np.float32), np.asarray(z2, np.float32)
    distance = float(np.linalg.norm(z1 - z2)) if e1 == e2 else float("nan")
    n1 = neighbours.of_vector_as_model(tx, name, z1, k, e1, as_of=t1)
    n2 = neighbours.of_vector_as_model(tx, name, z2, k, e2, as_of=t2)
    acc: dict[str, dict] = {}
    for version, enc, z in ((v1, e1, z1), (v2, e2, z2)):
        for cat, p in predicted_category_accuracy(tx, enc, z).items():
            acc.setdefault(cat, {})["v1" if version == v1 else "v2"] = round(p, 4)
    for d in acc.values():
        d.setdefault("v2", d.get("v1"))
        d["change"] = round(d["v2"] - d["v1"], 4)
    return Diff(name, v1, v2, round(distance, 4), n1, n2, acc)


def predicted_category_accuracy(tx: Tx, encoder_id: int, z) -> dict[str, float]:
    """Mean predicted P(correct) per query category, over every query the registry has a vector for."""
    model, _ = encoders.load(tx, encoder_id)
    qids = np.array([r[0] for r in tx.sql("SELECT id FROM queries ORDER BY id")], dtype=np.int64)
    if not len(qids):
        return {}
    row_of, qmat = query_cache.query_vectors(tx, qids)
    cats = dict(tx.sql("SELECT id, coalesce(category, '(none)') FROM queries"))
    p = model.p_correct(np.asarray(z, np.float32)[None, :], qmat[[row_of[int(i)] for i in qids]],
                        query_cache.query_categories(tx, qids, model))[0]
    out: dict[str, list] = {}
    for qid, pq in zip(qids.tolist(), p):
        out.setdefault(cats[qid], []).append(pq)
    return {c: float(np.mean(v)) for c, v in sorted(out.items())}


def recompute(tx: Tx, name: str, version: int):
    """(stored vector, recomputed vector, digest matches) for one version of a model: versions are reproducible."""
    row = tx.sql("""SELECT v.id FROM embedding_versions v JOIN models m ON m.id = v.model_id
                    WHERE m.name = ? AND v.version = ?""", [name, version])
    if not row:
        raise NotFound(f"model {name!r} has no version {version}")
    return onboarding.recompute(tx, row[0][0])
