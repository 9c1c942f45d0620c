"""Tidying the registry: a model deleted or renamed (`registry delete`, `registry rename`), each kept in
model_changes, append-only.

A deleted model's `models` row leaves (so every list and answer, which read models through that table, leaves it
out) and is kept whole in its change row; its versions, results, claims and availability marks stay in their tables
under its id, readable for audits: `registry history NAME` still shows its versions, and says when it was deleted.
Its endpoint and its pending onboarding jobs go with it. A rename changes the name only: the versions, results and
aliases are the model id's, so they stay its own.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from registry.answers import catalog
from registry.core import dialect
from registry.core.errors import Conflict, InputError, unknown_model
from registry.core.transaction import Tx
from registry.data import import_models_queries
from registry.embedding import index

MODEL_COLUMNS = ("id", "name", "family", "provider", "params_b", "cost", "open_weights", "tags", "created")


@dataclass
class Deleted:
    model: str
    model_id: int
    versions: int                     # kept, readable under the model id (`registry history NAME`)
    evaluations: int                  # kept likewise
    also: list[str]                   # the endpoints claiming it, deleted with it


@dataclass
class Renamed:
    old: str
    new: str
    model_id: int


@dataclass
class Change:
    model_id: int
    change: str                       # "deleted" | "renamed"
    name: str
    new_name: str | None
    reason: str | None
    created: str


def model_id(tx: Tx, name: str) -> int:
    row = tx.sql("SELECT id FROM models WHERE name = ?", [name])
    if not row:
        raise unknown_model(name, [r[0] for r in tx.sql("SELECT name FROM models")])
    return int(row[0][0])


def delete(tx: Tx, name: str, reason: str | None = None) -> Deleted:
    """Delete `name` (see the module's docstring). A model others are recorded as aliases of is refused: delete or
    re-register those first (their answers are the same model's)."""
    mid = model_id(tx, name)
    aliases = sorted(n for n, (target, _) in catalog.aliases(tx).items() if target == name)
    if aliases:
        raise Conflict(f"{name} is the model that {', '.join(aliases[:3])} {'is' if len(aliases) == 1 else 'are'} "
                       f"recorded as another name of: delete {'it' if len(aliases) == 1 else 'them'} first")
    row = tx.sql(f"SELECT {', '.join(MODEL_COLUMNS)} FROM models WHERE id = ?", [mid])[0]
    record = {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v))
              for k, v in zip(MODEL_COLUMNS, row)}
    tx.sql("""INSERT INTO model_changes (model_id, change, name, record, reason) VALUES (?, 'deleted', ?, ?, ?)
              RETURNING id""", [mid, name, json.dumps(record), reason])
    if tx.sql("SELECT 1 FROM model_endpoints WHERE model_id = ? LIMIT 1", [mid]):
        tx.sql("INSERT INTO model_endpoints (model_id) VALUES (?) RETURNING id", [mid])     # (the newest row: none)
    tx.sql("DELETE FROM onboarding_jobs WHERE model_id = ?", [mid])
    tx.sql("DELETE FROM models WHERE id = ?", [mid])
    _forget(tx)
    versions = int(tx.sql("SELECT count(*) FROM embedding_versions WHERE model_id = ?", [mid])[0][0])
    evaluations = int(tx.sql("SELECT count(*) FROM evaluations WHERE model_id = ?", [mid])[0][0])
    return Deleted(name, mid, versions, evaluations, [])


def rename(tx: Tx, old: str, new: str, reason: str | None = None) -> Renamed:
    """`old` is called `new` from now on: its versions, results, aliases and claims are its id's and stay its own."""
    new = (new or "").strip()
    problem = import_models_queries.model_name_problem(new)
    if problem:
        raise InputError(problem)
    mid = model_id(tx, old)
    if new == old:
        raise Conflict(f"{old} is already called {new}")
    if tx.sql("SELECT 1 FROM models WHERE name = ?", [new]):
        raise Conflict(f"a model called {new} is registered already: rename or delete it first")
    tx.sql("""INSERT INTO model_changes (model_id, change, name, new_name, reason) VALUES (?, 'renamed', ?, ?, ?)
              RETURNING id""", [mid, old, new, reason])
    tx.sql("UPDATE models SET name = ? WHERE id = ?", [new, mid])
    _forget(tx)
    return Renamed(old, new, mid)


def _forget(tx: Tx) -> None:
    """What this process keeps of models' names and states is read again (the indexes, and the rows another process
    may change: dialect.MUTABLE_CACHE)."""
    index.models_changed(tx)
    for key in dialect.MUTABLE_CACHE:
        tx.cache.pop(key, None)


def changes(tx: Tx, name: str | None = None) -> list[Change]:
    """The deletions and renames, oldest first (of the model once called `name`, under any of its names)."""
    rows = tx.sql("""SELECT model_id, change, name, new_name, reason, created::VARCHAR FROM model_changes
                     ORDER BY id""")
    out = [Change(int(m), c, n, nn, r, t) for m, c, n, nn, r, t in rows]
    if name is None:
        return out
    ids = {c.model_id for c in out if name in (c.name, c.new_name)}
    return [c for c in out if c.model_id in ids]


def deleted_id(tx: Tx, name: str) -> int | None:
    """The id of the model most recently deleted under `name` (None: none was)."""
    row = tx.sql("""SELECT model_id FROM model_changes WHERE change = 'deleted' AND name = ?
                    ORDER BY id DESC LIMIT 1""", [name])
    return int(row[0][0]) if row else None

