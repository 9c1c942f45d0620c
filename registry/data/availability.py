"""Which models are marked unavailable (routing and fallback skip them until marked available again). The newest
mark of each model counts; older marks are kept as the history."""
from __future__ import annotations

from dataclasses import dataclass

from registry.core.errors import InputError, unknown_model
from registry.core.transaction import Tx


@dataclass
class Availability:
    model: str
    available: bool


def set_available(tx: Tx, names: list[str], available: bool, reason: str | None = None) -> None:
    if not names:
        raise InputError("name at least one model")
    ids = dict(tx.sql("SELECT name, id FROM models WHERE name IN (SELECT unnest(?::VARCHAR[]))", [list(names)]))
    for n in names:
        if n not in ids:
            raise unknown_model(n, [r[0] for r in tx.sql("SELECT name FROM models")])
    tx.executemany("INSERT INTO model_availability (model_id, available, reason) VALUES (?, ?, ?)",
                   [[ids[n], available, reason] for n in names])


def set_and_list(tx: Tx, names: list[str], available: bool, reason: str | None = None) -> list[Availability]:
    set_available(tx, names, available, reason)
    return listing(tx)


def unavailable_models(tx: Tx) -> list[str]:
    return [r[0] for r in tx.sql("""SELECT m.name FROM models m JOIN (
                SELECT model_id, arg_max(available, id) AS available FROM model_availability GROUP BY model_id
            ) a ON a.model_id = m.id WHERE NOT a.available ORDER BY 1""")]


def listing(tx: Tx) -> list[Availability]:
    down = set(unavailable_models(tx))
    return [Availability(n, n not in down) for (n,) in tx.sql("SELECT name FROM models ORDER BY lower(name), name")]
