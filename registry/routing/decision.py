"""A routing call, asked, answered and logged: what it asks for in one frozen value (`RouteOptions`: the HTTP bodies,
the CLI and the facade build it, and the policy reads it; checked once, where it is made, so every entry point
refuses the same things the same way), what it answers (`Decision`: the chosen model, and every candidate with what
the choice weighed), and the routing log: one row per routed query (its hash, and its text unless told not to; the
choice, the top candidates, the versions behind them, the options asked for), written in bulk and read newest
first."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from registry.core.errors import InputError
from registry.core.transaction import Tx

COST_BASES = ("cost", "params")


# the candidates a route answer lists unless asked (`top`; 0: every model): the most likely first, and the chosen
# one wherever it ranks. In a registry of hundreds of models the whole list was most of an answer's bytes and time
# (the CLI's --json and HTTP alike; the CLI's table shows fewer).
LISTED = 50


@dataclass(frozen=True)
class RouteOptions:
    cost_weight: float | None = None       # cost-aware: maximise P(correct) - cost_weight x cost
    min_prob: float | None = None          # or: the cheapest model with P(correct) >= min_prob
    unavailable: tuple[str, ...] = ()      # never chosen for this call (besides the models marked unavailable)
    cost_by: str = "cost"                  # "cost" (price) or "params" (params_b, the model's size)
    include_probation: bool = False        # models embedded from few evaluations may be chosen
    top: int | None = None                 # candidates each answer lists (None or 0: every model)
    log: bool = True                       # the decision goes to the routing log
    log_text: bool = True                  # ... with its text

    def __post_init__(self):
        for name in ("cost_weight", "min_prob"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise InputError(f"{name} must be a number, got {value!r}")
        if self.cost_weight is not None and self.min_prob is not None:
            raise InputError("give either a cost weight or a minimum probability, not both")
        if self.cost_weight is not None and not (self.cost_weight >= 0 and math.isfinite(self.cost_weight)):
            raise InputError(f"cost weight must be a non-negative number, got {self.cost_weight}")
        if self.min_prob is not None and not (0.0 <= self.min_prob <= 1.0):
            raise InputError(f"minimum probability must be between 0 and 1, got {self.min_prob}")
        if self.cost_by not in COST_BASES:
            raise InputError(f"cost basis must be one of {', '.join(COST_BASES)}, got {self.cost_by!r}")
        if self.top is not None and (isinstance(self.top, bool) or not isinstance(self.top, int) or self.top < 0):
            raise InputError(f"top must be a whole number of candidates (0: every model), got {self.top!r}")
        unavailable = self.unavailable
        if isinstance(unavailable, str) or not all(isinstance(m, str) for m in unavailable or ()):
            raise InputError(f"unavailable must be a list of model names, got {unavailable!r}")
        object.__setattr__(self, "unavailable", tuple(unavailable or ()))
        for name in ("include_probation", "log", "log_text"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{name} must be true or false, got {getattr(self, name)!r}")


@dataclass
class Candidate:
    model: str
    prob: float                       # P(correct) as routing uses it: shrunk by the model's evidence, with the
                                      #   interaction terms added to its logit (locus/interaction.py)
    raw_prob: float                   # the predictor's own P(correct) from the model's embedding
    embedded_from: int                # the evaluations behind the embedding used (test answers held out): not
                                      #   the model's `evaluations` in `models` and `show`, which count them all
    probation: bool = False           # too few evaluations: chosen only when asked (include_probation)
    cost: float | None = None         # price per query, if set
    params_b: float | None = None
    available: bool = True
    eligible: bool = True             # the policy could choose it: not a model on probation (unless asked), nor,
                                      #   under cost by params_b, one without a parameter count


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
    policy: str | None = None         # the policy served (chosen on val, routing/served.py) and its val figures


# --- the routing log ---------------------------------------------------------------------------------------------
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
    if not rows:
        return
    sql = """INSERT INTO routing_log (query_hash, text, model, fallback, candidates, encoder_id, versions, options)
             SELECT query_hash, text, model, fallback, candidates::JSON, encoder_id, versions::JSON, options::JSON
             FROM {} AS r"""
    if len(rows) == 1:  # one query: a plain parameterised insert costs less than registering an Arrow table
        one = ", ".join(f"?::{t} AS {c}" for c, t in zip(LOG_COLUMNS, _LOG_TYPES))
        tx.sql(sql.format(f"(SELECT {one})"), list(rows[0]))
        return
    import pyarrow as pa

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
