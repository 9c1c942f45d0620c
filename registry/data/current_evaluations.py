"""The evaluations as they count: the newest evaluation of each (model, query) pair. Older rows are kept, never
overwritten; every reader asks here (SQL: `CURRENT`; numpy, for rows already fetched: `newest_per_query`), and
disagreement between answers is computed here too.
"""
from __future__ import annotations

from registry.core.lazy import LazyModule
from registry.core.transaction import Tx

np = LazyModule("numpy")   # (the SQL rule is read by commands that need no arrays)


# the models recorded as another registered model's name (the newest row of each in model_aliases): one model with
# the one they name in every answer that pools models (routing, evaluate, portfolio, fallback, "errs alike")
ALIAS_OF = """SELECT model_id, alias_of FROM (
                  SELECT model_id, alias_of, row_number() OVER (PARTITION BY model_id ORDER BY id DESC) AS newest
                  FROM model_aliases) a
              WHERE newest = 1 AND alias_of IS NOT NULL"""
ALIASES = f"SELECT model_id FROM ({ALIAS_OF}) x"


def current(before_batch: int | None = None, model_ids=None, queries_in: str | None = None, *,
            distinct: bool = False) -> str:
    """The newest evaluation of each (model, query) pair, as a subquery (`FROM {current()} e`); with `before_batch`,
    as it stood before that import batch; with `model_ids`, of those models only, and with `queries_in` (a table or
    view with a query_id column), of those queries only (both far cheaper than filtering after). Only registered
    models' evaluations count; with `distinct`, an alias's (`ALIASES`) do not either."""
    # the newest batch's answer as the parity of max(2 * batch + answer): a built-in aggregate on both databases
    # (PostgreSQL's arg_max is the registry's own PL/pgSQL, ~3 us a row: 5 minutes at 10^8; DuckDB's 1.5x slower)
    return f"""(SELECT model_id, query_id, max(batch_id::BIGINT * 2 + correct::INT) % 2 = 1 AS correct,
                       max(batch_id) AS batch_id
               FROM {rows(before_batch, model_ids, queries_in, distinct=distinct)} r GROUP BY model_id, query_id)"""


def rows(before_batch: int | None = None, model_ids=None, queries_in: str | None = None, *,
         distinct: bool = False) -> str:
    """Every row `current` chooses among (each pair's older answers too), as a subquery: for a caller that keeps
    each pair's newest itself (`newest_per_query`)."""
    # (a deleted model's results stay in the table for audits and count nowhere: answers/tidying.py)
    conds = ["model_id IN (SELECT id FROM models)"] + (
        [f"batch_id < {int(before_batch)}"] if before_batch is not None else []) + (
        [f"model_id IN ({', '.join(str(int(m)) for m in model_ids) or 'NULL'})"] if model_ids is not None else []) + (
        [f"query_id IN (SELECT query_id FROM {queries_in})"] if queries_in else []) + (
        [f"model_id NOT IN ({ALIASES})"] if distinct else [])
    return f"(SELECT model_id, query_id, correct, batch_id FROM evaluations WHERE {' AND '.join(conds)})"


CURRENT = current()   # the rule as it stands now


def counted(repeated, before_batch: int | None = None, model_ids=None, queries_in: str | None = None) -> str:
    """current(before_batch, model_ids, queries_in, distinct=True) as a subquery, cheaper where the caller knows
    which models answered some query more than once (`repeated`, model ids; None: not known): every other model's
    rows are its current ones as they stand, read without current's group per (model, query), which costs
    gigabytes and seconds at 10^8 rows (embedding/answer_index.py keeps the list)."""
    if repeated is None:
        return current(before_batch, model_ids, queries_in, distinct=True)
    again = [int(m) for m in repeated]
    if model_ids is not None:
        wanted = {int(m) for m in model_ids}
        again = [m for m in again if m in wanted]
    conds = ["model_id IN (SELECT id FROM models)", f"model_id NOT IN ({ALIASES})"] + (
        [f"batch_id < {int(before_batch)}"] if before_batch is not None else []) + (
        # (a list joined, not an IN of literals: DuckDB scans 10^8 rows four times faster so)
        [f"model_id IN (SELECT unnest([{', '.join(str(int(m)) for m in model_ids) or 'NULL'}]))"]
        if model_ids is not None else []) + (
        # (and their range: rows lie in model order, so a range of ids skips the storage blocks of the others)
        [f"model_id BETWEEN {min(int(m) for m in model_ids)} AND {max(int(m) for m in model_ids)}"]
        if model_ids is not None and len(model_ids) else []) + (
        [f"query_id IN (SELECT query_id FROM {queries_in})"] if queries_in else []) + (
        [f"model_id NOT IN ({', '.join(map(str, again))})"] if again else [])
    once = f"SELECT model_id, query_id, correct, batch_id FROM evaluations WHERE {' AND '.join(conds)}"
    if not again:
        return f"({once})"
    return (f"({once} UNION ALL SELECT model_id, query_id, correct, batch_id "
            f"FROM {current(before_batch, again, queries_in, distinct=True)} t)")

# a count of current evaluations keeps one bit per (registered model, query id in the registry's range); above this
# many bits it groups the pairs instead
BITMAP_BITS = 1 << 31


def bitmap_bounds(tx: Tx) -> tuple[int, int] | None:
    """(lowest, highest query id) where one bit per registered model and query id between them fits in
    BITMAP_BITS, on DuckDB (its `bitstring_agg`); None elsewhere, or with no queries."""
    if tx.postgres:
        return None
    lo, hi = tx.sql("SELECT min(id), max(id) FROM queries")[0]
    if lo is None:
        return None
    models = tx.sql("SELECT count(*) FROM models")[0][0]
    return (int(lo), int(hi)) if models * (int(hi) - int(lo) + 1) <= BITMAP_BITS else None


def count(tx: Tx) -> int:
    """How many current evaluations there are: one per (registered model, query) pair. On DuckDB each model's
    distinct queries as a bitmap, one group per model, not CURRENT's group per pair (10^8 evaluations: 7 GB and
    a minute that way, a stream of 15 MB this way)."""
    bounds = bitmap_bounds(tx)
    if bounds is not None:
        return int(tx.sql(f"""SELECT coalesce(sum(n), 0)::BIGINT FROM (
                                  SELECT bit_count(bitstring_agg(query_id, {bounds[0]}, {bounds[1]})) AS n
                                  FROM evaluations WHERE model_id IN (SELECT id FROM models)
                                  GROUP BY model_id)""")[0][0])
    return int(tx.sql(f"SELECT count(*) FROM {CURRENT} e")[0][0])


def per_model(tx: Tx, model_ids=None) -> dict[int, tuple[int, float | None]]:
    """{model id: (current evaluations, their accuracy)} of every registered model, or of `model_ids`. On DuckDB one
    pass: a model whose rows hold each question once (its bitmap of questions counts all its rows) is summed as it
    stands; only the others are grouped per (model, query) (100 models of 10^8 rows: 24 ms, not 200)."""
    bounds = bitmap_bounds(tx)
    if bounds is None:
        return per_model_grouped(tx, model_ids)
    where = "model_id IN (SELECT id FROM models)"
    if model_ids is not None:      # (the registered of them, then their rows by the ids and their range: a join
        #                              with every model's id cost a third of the time)
        listed = ", ".join(str(int(m)) for m in model_ids) or "NULL"
        ids = [r[0] for r in tx.sql(f"SELECT id FROM models WHERE id IN ({listed})")]
        if not ids:
            return {}
        where = f"model_id IN ({', '.join(map(str, ids))}) AND model_id BETWEEN {min(ids)} AND {max(ids)}"
    rows = tx.sql(f"""SELECT model_id, count(*), avg(correct::INT),
                             count(*) = bit_count(bitstring_agg(query_id, {bounds[0]}, {bounds[1]}))
                      FROM evaluations WHERE {where} GROUP BY model_id""")
    out = {m: (int(n), a) for m, n, a, once in rows if once}
    again = [m for m, _, _, once in rows if not once]
    if again:
        out.update(per_model_grouped(tx, again))
    return out


def per_model_grouped(tx: Tx, model_ids) -> dict[int, tuple[int, float | None]]:
    """`per_model` by the rule itself, each (model, query)'s newest row (what the fast pass falls back on)."""
    return {m: (int(n), a) for m, n, a in tx.sql(
        f"SELECT model_id, count(*), avg(correct::INT) FROM {current(model_ids=model_ids)} e GROUP BY model_id")}


def newest_per_query(res: dict) -> dict:
    """Keep each (model, query)'s row from its newest batch, sorted by model, then query (numpy: cheaper than a
    GROUP BY for one model)."""
    model, query, batch = (np.asarray(res[c], dtype=np.int64) for c in ("model_id", "query_id", "batch_id"))
    key = (model << 32) | query                           # ids are 32-bit
    order = np.argsort(key, kind="stable")
    first = np.ones(len(order), dtype=bool)
    first[1:] = np.diff(key[order]) != 0
    if not first.all():                                   # a pair answered again: its newest batch first
        order = np.lexsort((-batch, query, model))
        first[1:] = np.diff(key[order]) != 0
    keep = order[first]
    return {c: np.asarray(res[c])[keep] for c in ("model_id", "query_id", "correct", "batch_id")}


def of_models(tx: Tx, model_ids, before_batch: int | None = None) -> dict:
    """Current evaluations of some models as numpy columns (model_id, query_id, correct, batch_id); with
    `before_batch`, as they stood before that import batch."""
    ids = ", ".join(str(int(m)) for m in model_ids) or "NULL"
    before = f"AND batch_id < {int(before_batch)}" if before_batch is not None else ""
    return newest_per_query(tx.numpy(f"""SELECT model_id, query_id, correct::INT AS correct, batch_id
                                               FROM evaluations WHERE model_id IN ({ids}) {before}"""))


def first_batch_after(tx: Tx, as_of: str | None) -> int | None:
    """The first import batch made after `as_of` (None: none, or no `as_of`): what stood then came before it."""
    if as_of is None:
        return None
    return tx.sql("SELECT min(id) FROM import_batches WHERE created > ?::TIMESTAMP", [as_of])[0][0]


def last_answers(qids, y) -> list[list[int]]:
    """[query ids, answers] with each repeated query's last answer only (the SQL parameters of `_answers`)."""
    last = len(qids) - 1 - np.unique(qids[::-1], return_index=True)[1]
    return [qids[last].tolist(), y[last].tolist()]


def disagreement(tx: Tx, qids, y, others) -> dict[int, tuple[int, float]]:
    """How often each of `others` (model ids) disagrees with the answers y [n] on query ids qids [n], over the queries
    both answered (their current evaluations): {other id: (shared queries, disagreement rate)}."""
    qids, y = np.asarray(qids, dtype=np.int64), np.asarray(y, dtype=np.int64)
    evaluated = tx.cached("evaluated_models", lambda: {r[0] for r in tx.sql(
        "SELECT DISTINCT model_id FROM evaluations")})              # imports of evaluations invalidate it
    others = [int(m) for m in others if m is not None and m in evaluated]
    if not len(qids) or not others:
        return {}
    # only the others' rows on these queries: a join on the given ids, not every evaluation of every other model
    # (the answers as array parameters, not a registered Arrow table: registering one made DuckDB import pandas,
    # a quarter of a second of `registry similar`)
    res = tx.sql(f"""
        WITH _answers AS (SELECT unnest(?::BIGINT[]) AS query_id, unnest(?::BIGINT[]) AS y)
        SELECT e.model_id, count(*) AS shared, avg((e.correct::INT <> a.y)::INT) AS rate
        FROM {current(model_ids=others, queries_in="_answers")} e JOIN _answers a ON a.query_id = e.query_id
        GROUP BY e.model_id""", last_answers(qids, y))
    return {int(m): (int(n), float(r)) for m, n, r in res}
