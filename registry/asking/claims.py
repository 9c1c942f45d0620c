"""Endpoints that claim a registered model: each is a model of its own (`X@provider`, with its own endpoint row and
its own answers, so they never enter X's results or embedding), tied to X by a claim. Append-only, as aliases are:
the newest row per endpoint model counts, and a row whose `claims` is NULL withdraws it. One endpoint per model may
be its reference (the official API, asked under the same prompt template)."""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from registry.core.errors import Conflict, InputError, NotFound, unknown_model
from registry.core.transaction import Tx
from registry.data import availability, endpoints, import_run
from registry.data.import_models_queries import MAX_NAME, model_name_problem

MAX_CLAIMS = 16       # endpoints claiming one model: each asked in every verify and watch round

NEWEST = """SELECT model_id, claims, reference, watched FROM (
                SELECT model_id, claims, reference, watched,
                       row_number() OVER (PARTITION BY model_id ORDER BY id DESC) AS newest FROM model_claims) c
            WHERE newest = 1 AND claims IS NOT NULL"""


@dataclass
class Claim:
    endpoint: str                 # the endpoint's own model name (X@provider)
    model: str                    # the registered model it claims to serve
    reference: bool
    watched: bool
    base_url: str | None = None
    upstream_model: str | None = None
    api_key_env: str | None = None


def current(tx: Tx) -> list[Claim]:
    names = dict(tx.sql("SELECT id, name FROM models"))
    ends = endpoints.current(tx)
    out = []
    for m, x, ref, watched in tx.sql(NEWEST):
        if int(m) not in names or int(x) not in names:       # (a deleted model's claims: answers/tidying.py)
            continue
        e = ends.get(names[int(m)])
        out.append(Claim(names[int(m)], names[int(x)], bool(ref), bool(watched), e.base_url if e else None,
                         e.upstream_model if e else None, e.api_key_env if e else None))
    return sorted(out, key=lambda c: (c.model, not c.reference, c.endpoint))


def of_model(tx: Tx, model: str) -> list[Claim]:
    """The endpoints claiming `model`, the reference first. NotFound for an unknown model."""
    if not tx.sql("SELECT 1 FROM models WHERE name = ?", [model]):
        raise unknown_model(model, [r[0] for r in tx.sql("SELECT name FROM models")])
    return [c for c in current(tx) if c.model == model]


def claimant_ids(tx: Tx) -> set[int]:
    """Every model that is an endpoint claiming another: never a candidate for "what does it serve"."""
    return {int(m) for m, *_ in tx.sql(NEWEST)}


def default_name(model: str, base_url: str) -> str:
    """model@host, the model's part cut so that the whole keeps to the name rule's length."""
    host = f"@{urlsplit(base_url).hostname}"[:MAX_NAME // 2]
    return model[:MAX_NAME - len(host)].rstrip() + host


def add(tx: Tx, model: str, base_url: str, *, name: str | None = None, upstream_model: str | None = None,
        api_key_env: str | None = None, reference: bool = False, watched: bool = True) -> Claim:
    """Record an endpoint claiming `model`: its own model `name` (default model@host, created if new, marked
    unavailable so that routing never chooses it in X's place), its endpoint, the claim; `reference`: it becomes X's
    reference (any other loses the mark)."""
    url = endpoints.checked(base_url, api_key_env)
    ids = dict(tx.sql("SELECT name, id FROM models"))
    if model not in ids:
        raise unknown_model(model, list(ids))
    name = (name or default_name(model, url)).strip()
    problem = model_name_problem(name) if name else "the endpoint's name is empty"
    if problem:
        raise InputError(f"the endpoint's name: {problem}")
    others = [c for c in current(tx) if c.model == model and c.endpoint != name]
    if len(others) >= MAX_CLAIMS:
        raise Conflict(f"{model!r} has {len(others)} claiming endpoints, the most a model may have: remove one first "
                       f"(`registry endpoints remove NAME`)")
    if name == model:          # (the registry as it stands: a model of that name exists)
        raise Conflict(f"an endpoint claiming {model!r} needs a name of its own (e.g. {default_name(model, url)!r}): "
                         f"its answers must not enter {model}'s")
    claimed = {c.endpoint: c for c in current(tx)}
    if model in claimed:
        raise Conflict(f"{model!r} is itself an endpoint claiming {claimed[model].model!r}: claim that model instead")
    if name in ids and name not in claimed and tx.sql("SELECT 1 FROM evaluations WHERE model_id = ? LIMIT 1",
                                                      [ids[name]]):
        raise Conflict(f"{name!r} is a registered model with results of its own: give the endpoint another --name")
    if name in claimed and claimed[name].model != model:
        raise Conflict(f"{name!r} claims {claimed[name].model!r}: remove that claim first")
    if name not in ids:
        ids.update(import_run.insert_new_models(tx, {name: {}}))
    endpoints.set_endpoint(tx, name, url, upstream_model, api_key_env)
    availability.set_available(tx, [name], False, f"an endpoint claiming {model}: verified, never routed in its place")
    if reference:
        for c in claimed.values():
            if c.model == model and c.reference and c.endpoint != name:
                _row(tx, ids[c.endpoint], ids[model], False, c.watched)
    _row(tx, ids[name], ids[model], reference, watched)
    return next(c for c in current(tx) if c.endpoint == name)


def mark(tx: Tx, endpoint: str, *, reference: bool | None = None, watched: bool | None = None) -> Claim:
    """Change a claim's marks (the reference mark moves: the model's other endpoints lose it)."""
    claimed = {c.endpoint: c for c in current(tx)}
    if endpoint not in claimed:
        raise NotFound(f"{endpoint!r} claims no model: add it with `registry endpoints add MODEL --base-url URL "
                       f"--name {endpoint}`")
    c = claimed[endpoint]
    ids = dict(tx.sql("SELECT name, id FROM models"))
    if reference:
        for o in claimed.values():
            if o.model == c.model and o.reference and o.endpoint != endpoint:
                _row(tx, ids[o.endpoint], ids[o.model], False, o.watched)
    _row(tx, ids[endpoint], ids[c.model], c.reference if reference is None else reference,
         c.watched if watched is None else watched)
    return next(x for x in current(tx) if x.endpoint == endpoint)


def withdraw(tx: Tx, endpoint: str) -> None:
    """The endpoint no longer claims its model (its answers stay, as its own model's)."""
    claimed = {c.endpoint: c for c in current(tx)}
    if endpoint not in claimed:
        raise NotFound(f"{endpoint!r} claims no model")
    mid = tx.sql("SELECT id FROM models WHERE name = ?", [endpoint])[0][0]
    tx.sql("INSERT INTO model_claims (model_id, claims, reference, watched) VALUES (?, NULL, false, false) "
           "RETURNING id", [mid])


def _row(tx: Tx, model_id: int, claims: int, reference: bool, watched: bool) -> None:
    tx.sql("INSERT INTO model_claims (model_id, claims, reference, watched) VALUES (?, ?, ?, ?) RETURNING id",
           [model_id, claims, reference, watched])
