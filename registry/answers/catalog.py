"""What the registry holds, model by model: metadata, evaluations and accuracy, availability, the current embedding
version and its evidence status (`registry models`, `show`, `stats`)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from registry.core.errors import InputError, unknown_model
from registry.core.lazy import LazyModule
from registry.core.transaction import Tx
from registry.data import availability, current_evaluations
from registry.data.current_evaluations import current
from registry.embedding import answer_store, encoders, index

evidence = LazyModule("registry.locus.evidence")   # (numpy: `stats` reads counts only)
# a page of models over HTTP and on the home page: its size unless asked, and the most one request may ask for
MODEL_PAGE, MODEL_PAGE_MAX = 100, 1000


@dataclass
class ModelInfo:
    name: str
    evaluations: int
    accuracy: float | None
    family: str | None = None
    provider: str | None = None
    params_b: float | None = None
    cost: float | None = None
    open_weights: bool | None = None
    tags: dict = field(default_factory=dict)
    created: str | None = None
    available: bool = True              # False once marked unavailable (routing and fallback skip it)
    status: str = "not embedded"        # established | probation (too few evaluations to be routed to) | not embedded
    version: int | None = None          # current embedding version under the active encoder
    embedded_from: int | None = None    # evaluations behind that version (test answers are never used)
    alias_of: str | None = None         # the model this one is another name of (`aliases`), if any


@dataclass
class ModelDetail(ModelInfo):
    per_category: dict[str, dict] = field(default_factory=dict)  # category -> {"evaluations", "accuracy"}
    batches: list[int] = field(default_factory=list)
    alias_source: str | None = None     # who said it is an alias: "registration" (its answers) or "user"
    aliases: list[str] = field(default_factory=list)              # the models that are other names of this one


@dataclass
class Stats:
    models: int
    queries: int
    evaluations: int          # current evaluations: the newest per (model, query)
    evaluation_rows: int      # every stored row, superseded ones included
    text_vectors: int
    import_batches: int
    splits: dict[str, int]
    path: str
    unsplit_queries: int = 0  # queries without a train/val/test split (`registry draw-splits` gives them one)


def names(tx: Tx) -> list[str]:
    return [r[0] for r in tx.sql("SELECT name FROM models")]


def models(tx: Tx, probation_min: int, stats: dict | None = None, *, limit: int | None = None,
           offset: int = 0) -> list[ModelInfo]:
    """Every model, by name; with `limit`, that many from `offset` on (a page: only its models' evaluations are
    read). `stats` ({model id: (evaluations, accuracy)}, from `evaluation_stats`) saves reading them."""
    if (limit is not None and limit < 0) or offset < 0:
        raise InputError(f"a page needs a limit and an offset of at least 0, got {limit} and {offset}")
    paged = limit is not None or offset > 0
    page = (f" LIMIT {int(limit)}" if limit is not None else "") + (f" OFFSET {int(offset)}" if offset else "")
    rows = tx.sql(f"""SELECT id, name, family, provider, params_b, cost, open_weights, tags::VARCHAR, created::VARCHAR
                      FROM models ORDER BY lower(name), name{page}""")
    if stats is None:
        stats = evaluation_stats(tx, [r[0] for r in rows] if paged else None)
    state = _state(tx, [r[1] for r in rows] if paged else None)
    of = {name: target for name, (target, _) in aliases(tx).items()}
    out = []
    for mid, *meta in rows:
        n, acc = stats.get(mid, (0, None))
        out.append(_with_state(_info(ModelInfo, [meta[0], n, acc, *meta[1:]]), state, probation_min))
        out[-1].alias_of = of.get(meta[0])
    return out


def model_count(tx: Tx) -> int:
    return int(tx.sql("SELECT count(*) FROM models")[0][0])


def evaluation_stats(tx: Tx, model_ids=None) -> dict[int, tuple[int, float | None]]:
    """{model id: (current evaluations, accuracy)} for every model, or only `model_ids`."""
    return current_evaluations.per_model(tx, model_ids)


def newest_batch(tx: Tx) -> int:
    return int(tx.sql("SELECT coalesce(max(batch_id), 0) FROM evaluations")[0][0])


def models_since(tx: Tx, batch: int) -> list[int]:
    """The models with evaluations from batches after `batch` (what a cache of `evaluation_stats` must re-read)."""
    return [r[0] for r in tx.sql("SELECT DISTINCT model_id FROM evaluations WHERE batch_id > ?", [batch])]


def show(tx: Tx, name: str, probation_min: int) -> ModelDetail:
    mid = tx.sql("SELECT id FROM models WHERE name = ?", [name])
    if not mid:
        raise unknown_model(name, names(tx))
    mine = current(model_ids=[mid[0][0]])
    rows = tx.sql(f"""SELECT m.name, count(e.query_id), avg(e.correct::INT), m.family, m.provider, m.params_b, m.cost,
                             m.open_weights, m.tags::VARCHAR, m.created::VARCHAR
                      FROM models m LEFT JOIN {mine} e ON e.model_id = m.id WHERE m.name = ?
                      GROUP BY m.name, m.family, m.provider, m.params_b, m.cost, m.open_weights, m.tags::VARCHAR,
                               m.created::VARCHAR""", [name])
    detail = _with_state(_info(ModelDetail, rows[0]), _state(tx), probation_min)
    cats = tx.sql(f"""SELECT coalesce(q.category, '(none)'), count(*), avg(e.correct::INT)
                      FROM {mine} e JOIN queries q ON q.id = e.query_id GROUP BY 1 ORDER BY 1""")
    detail.per_category = {c: {"evaluations": n, "accuracy": round(a, 4)} for c, n, a in cats}
    detail.batches = [r[0] for r in tx.sql("""SELECT DISTINCT e.batch_id FROM evaluations e
                                              JOIN models m ON m.id = e.model_id WHERE m.name = ? ORDER BY 1""",
                                           [name])]
    known = aliases(tx)
    detail.alias_of, detail.alias_source = known.get(name, (None, None))
    detail.aliases = sorted(n for n, (target, _) in known.items() if target == name)
    return detail


# --- aliases: one model registered under another name -----------------------------------------------------------
def aliases(tx: Tx) -> dict[str, tuple[str, str]]:
    """{model name: (the model it is another name of, who said so)}: the newest row per model, where it names one."""
    rows = tx.sql("""SELECT m.name, t.name, a.source FROM (
                         SELECT model_id, alias_of, source,
                                row_number() OVER (PARTITION BY model_id ORDER BY id DESC) AS newest
                         FROM model_aliases) a
                     JOIN models m ON m.id = a.model_id JOIN models t ON t.id = a.alias_of WHERE a.newest = 1""")
    return {name: (target, source) for name, target, source in rows}


def alias_groups(tx: Tx) -> dict[int, int]:
    """{model id: its group's root} for every model that is an alias (a chain of aliases followed to its end)."""
    of = {int(m): int(t) for m, t in tx.sql("""SELECT model_id, alias_of FROM (
                                                   SELECT model_id, alias_of, row_number() OVER (
                                                              PARTITION BY model_id ORDER BY id DESC) AS newest
                                                   FROM model_aliases) a
                                               WHERE newest = 1 AND alias_of IS NOT NULL""")}
    # an endpoint claiming a model (asking/claims.py) is grouped with it as an alias is: never a distinct pair
    of.update({int(m): int(t) for m, t in tx.sql("""SELECT model_id, claims FROM (
                   SELECT model_id, claims, row_number() OVER (PARTITION BY model_id ORDER BY id DESC) AS newest
                   FROM model_claims) c WHERE newest = 1 AND claims IS NOT NULL""") if int(m) not in of})
    roots = {}
    for m in of:
        root, seen = of[m], {m}
        while root in of and root not in seen:
            seen.add(root)
            root = of[root]
        roots[m] = root
    return roots


def set_alias(tx: Tx, name: str, of: str, source: str) -> str:
    """Record that `name` is another name of `of` (an alias of an alias names the first model: one root per
    group). -> the model recorded as the one it names."""
    ids = dict(tx.sql("SELECT name, id FROM models WHERE name IN (?, ?)", [name, of]))
    for n in (name, of):
        if n not in ids:
            raise unknown_model(n, names(tx))
    root = aliases(tx).get(of, (of, None))[0]
    if root == name:
        raise InputError(f"{name!r} cannot be an alias of {of!r}: " + (
            "a model is not an alias of itself" if of == name else f"{of!r} is an alias of {name!r}"))
    if aliases(tx).get(name, (None, None))[0] != root:
        root_id = tx.sql("SELECT id FROM models WHERE name = ?", [root])[0][0]
        tx.sql("INSERT INTO model_aliases (model_id, alias_of, source) VALUES (?, ?, ?) RETURNING id",
               [ids[name], root_id, source])
        index.models_changed(tx)        # (an alias is one model with the one it names: the indexes drop it)
    return root


def stats(tx: Tx, path: str, known: tuple[int, int, int] | None = None) -> Stats:
    """What the registry holds. `known`: (current evaluations, through which import batch and model change) as a
    server's answer book counted them; taken where nothing newer is committed, else counted here (the count
    groups every evaluation: the book spares a server that read, and its memory, under many readers)."""
    models_, queries, rows, vectors, batches, newest, changed = tx.sql("""
        SELECT (SELECT count(*) FROM models), (SELECT count(*) FROM queries), (SELECT count(*) FROM evaluations),
               (SELECT count(*) FROM text_vectors), (SELECT count(*) FROM import_batches),
               (SELECT coalesce(max(batch_id), 0) FROM evaluations),
               (SELECT coalesce(max(id), 0) FROM model_changes)""")[0]
    if known is not None and not tx.postgres and known[1:] == (newest, changed):
        current = known[0]
    elif (held := answer_store.current_or_none(tx)) is not None:
        # (the answer index holds every model's but the aliases' count: those few are read; no pass over all)
        aliases = [int(m) for (m,) in tx.sql(current_evaluations.ALIASES)]
        current = int(held.model_answered.sum()) + (tx.sql(
            f"SELECT count(*) FROM {current_evaluations.current(model_ids=aliases)} e")[0][0] if aliases else 0)
    else:
        current = current_evaluations.count(tx)
    splits = dict(tx.sql("SELECT split, count(*) FROM query_splits GROUP BY split ORDER BY split"))
    return Stats(models_, queries, current, rows, vectors, batches, splits, path, queries - sum(splits.values()))


def current_versions(tx: Tx, encoder_id: int, as_of: str | None = None,
                     names: list[str] | None = None) -> dict[str, tuple[int, int]]:
    """{model name: (its newest version under the encoder, the evaluations behind it)}, as the registry stood at
    `as_of`; only the `names` given, if any. How well placed a model is (locus/evidence.py: probation) is read
    here."""
    when = "AND v.created <= ?::TIMESTAMP" if as_of else ""
    only = "AND m.name IN (SELECT unnest(?::VARCHAR[]))" if names is not None else ""
    return {r[0]: (int(r[1]), int(r[2])) for r in tx.sql(f"""
        SELECT m.name, max(v.version), arg_max(v.n_evaluations, v.version)
        FROM embedding_versions v JOIN models m ON m.id = v.model_id WHERE v.encoder_id = ? {when} {only}
        GROUP BY m.name""", [encoder_id] + ([as_of] if as_of else []) + ([list(names)] if names is not None else []))}


def _state(tx: Tx, names: list[str] | None = None):
    """({name: (current version, evaluations behind it)} under the active encoder (of `names` only, if given), names
    marked unavailable)."""
    encoder_id = encoders.active_id(tx)
    current = {} if encoder_id is None else current_versions(tx, encoder_id, names=names)
    return current, set(availability.unavailable_models(tx))


def _with_state(info, state, probation_min: int):
    current, down = state
    info.available = info.name not in down
    if info.name in current:
        info.version, info.embedded_from = current[info.name]
        info.status = "probation" if evidence.on_probation(info.embedded_from, probation_min) else "established"
    return info


def _info(cls, row):
    name, n, acc, family, provider, params_b, cost, open_weights, tags, created = row
    return cls(name=name, evaluations=int(n), accuracy=None if acc is None else round(float(acc), 4),
               family=family, provider=provider, params_b=params_b, cost=cost, open_weights=open_weights,
               tags=json.loads(tags) if tags else {}, created=created)


def held_out(tx: Tx, name: str) -> int:
    """A model's current evaluations on test queries: kept, never embedded."""
    mid = tx.sql("SELECT id FROM models WHERE name = ?", [name])[0][0]
    return int(tx.sql(f"""SELECT count(*) FROM {current(model_ids=[mid])} e
                          JOIN query_splits s ON s.query_id = e.query_id WHERE s.split = 'test'""")[0][0])
