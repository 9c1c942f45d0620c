"""The routing log: one row per routed query (its hash, and its text unless told not to; the choice, the top
candidates, the versions behind them, the options asked for), written in bulk and read newest first."""
from __future__ import annotations

import json
from dataclasses import dataclass

from registry.core.errors import InputError
from registry.core.transaction import Tx
from registry.routing.decision import Decision, RouteOptions

LOG_TOP = 5            # candidates kept in the routing log
LOG_COLUMNS = ("query_hash", "text", "model", "fallback", "candidates", "encoder_id", "versions", "options")
_LOG_TYPES = ("VARCHAR", "VARCHAR", "VARCHAR", "BOOLEAN", "VARCHAR", "BIGINT", "VARCHAR", "VARCHAR")


def log_options(options: RouteOptions, down: set[str], cost_basis: str | None) -> dict:
    """What the log records of the options a decision was made under: `down`, the models it could not choose
    (marked unavailable, or named by the caller), and the cost basis the policy used."""
    return {"cost_weight": options.cost_weight, "min_prob": options.min_prob, "unavailable": sorted(down),
            "cost_basis": cost_basis, "include_probation": options.include_probation}


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
    if since is not None:      # (an empty one too is not a time)
        try:
            tx.sql("SELECT ?::TIMESTAMP", [since])
        except Exception:
            raise InputError(f"not a timestamp: {since!r} (use e.g. 2026-01-31 or '2026-01-31 12:00')") from None
        where, params = "WHERE created >= ?::TIMESTAMP", [since]
    lim = f"LIMIT {min(int(limit), 2 ** 63 - 1)}" if limit else ""     # (past DuckDB's BIGINT: no limit)
    rows = tx.sql(f"""SELECT id, created::VARCHAR, query_hash, text, model, fallback, candidates::VARCHAR, encoder_id,
                             versions::VARCHAR, options::VARCHAR FROM routing_log {where}
                             ORDER BY id {'ASC' if oldest else 'DESC'} {lim}""", params)
    return [LogEntry(i, c, h, t, m, f, json.loads(cs), e, json.loads(v), json.loads(o) if o else None)
            for i, c, h, t, m, f, cs, e, v, o in rows]
