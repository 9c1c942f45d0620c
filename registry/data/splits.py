"""Which queries are train, validation and test: set from a file (`import_run`) or drawn here with a seed.

Every figure `registry evaluate` prints is on the test split, and held-out queries never reach the encoder (see
embedding/embed.py). So a query that enters or leaves the test split changes what every model that has it is embedded
from, and those models are enqueued for a new version in the same transaction.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from registry.core.errors import InputError
from registry.core.transaction import Tx
from registry.data import outbox


@dataclass
class DrawResult:
    seed: int
    drawn: dict[str, int]            # split -> queries that got it from this draw
    kept: int                        # queries whose split this draw left as it was
    onboarding: list = field(default_factory=list)
    by: str = "random"               # "random" | "category"
    test_categories: list[str] = field(default_factory=list)   # by category: the categories held out as test
    changed: int = 0                 # queries whose split changed (by category: splits are replaced)


def apply(tx: Tx, source: str, batch_id: int | None) -> int:
    """Set the splits in `source` (a table with columns qid = query external id, split = train | val | test) and
    enqueue the models whose embedding input changes. -> number of queries whose split changed."""
    flipped = f"""SELECT DISTINCT q.id FROM {source} s JOIN queries q ON q.external_id = s.qid
                  LEFT JOIN query_splits cur ON cur.query_id = q.id
                  WHERE (s.split = 'test') IS DISTINCT FROM coalesce(cur.split = 'test', false)"""
    models = [r[0] for r in tx.sql(f"SELECT DISTINCT model_id FROM evaluations WHERE query_id IN ({flipped})")]
    changed = tx.sql(f"""
        INSERT INTO query_splits (query_id, split)
        SELECT DISTINCT q.id, s.split FROM {source} s JOIN queries q ON q.external_id = s.qid
        LEFT JOIN query_splits cur ON cur.query_id = q.id
        WHERE cur.split IS DISTINCT FROM s.split
        ON CONFLICT (query_id) DO UPDATE SET split = excluded.split RETURNING query_id""")
    if changed:
        tx.invalidate("query_meta")
    waiting = {m for _, m, _, _ in outbox.pending(tx)}   # (new evaluations in this very import, say)
    outbox.enqueue(tx, [m for m in models if m not in waiting], "test split changed", batch_id=batch_id)
    return len(changed)


def check_shares(val: float, test: float) -> None:
    for name, share in (("val", val), ("test", test)):   # training selects on val; every figure is on test
        if not 0.0 < share < 1.0:
            raise InputError(f"the {name} share must be in (0, 1), got {share}")
    if val + test >= 1.0:
        raise InputError(f"val and test shares leave nothing to train on ({val} + {test} >= 1)")


def quotas(sizes: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray:
    """How many queries of each category get a split of this share: the floors of share x size, plus one for the
    categories with the largest remainders (ties broken at random) until the total is round(share x all). Rounding
    each category alone would give a category of 4 queries no test query at 0.1, at every draw, for good."""
    exact = share * sizes
    q = np.floor(exact).astype(np.int64)
    extra = int(round(share * sizes.sum())) - int(q.sum())
    order = np.lexsort((rng.random(len(sizes)), -(exact - q)))          # largest remainder first
    q[order[:max(extra, 0)]] += 1
    return q


def draw(tx: Tx, val: float = 0.1, test: float = 0.1, seed: int = 0) -> DrawResult:
    """Give every query without a split one, at random within each category (so each category is split in the
    same shares); queries that have a split keep it, so figures stay on the same test set."""
    import pyarrow as pa

    check_shares(val, test)
    rows = tx.arrow("""SELECT q.external_id, coalesce(q.category, '') AS category FROM queries q
                       LEFT JOIN query_splits s ON s.query_id = q.id WHERE s.query_id IS NULL
                       ORDER BY category, q.external_id""").to_pydict()
    kept = tx.sql("SELECT count(*) FROM query_splits")[0][0]
    ids, cats = np.asarray(rows["external_id"], dtype=object), np.asarray(rows["category"], dtype=object)
    split = np.full(len(ids), "train", dtype=object)
    rng = np.random.default_rng(seed)
    names = sorted(set(cats))
    sizes = np.array([int((cats == c).sum()) for c in names], dtype=np.int64)
    n_test = quotas(sizes, test, rng)
    n_val = quotas(sizes - n_test, val / (1.0 - test), rng)
    for cat, t, v in zip(names, n_test, n_val):
        at = np.flatnonzero(cats == cat)[rng.permutation(int((cats == cat).sum()))]   # this category, shuffled
        split[at[:t]] = "test"
        split[at[t:t + v]] = "val"
    with tx.table("_drawn_splits", pa.table({"qid": ids.tolist(), "split": split.tolist()})):
        apply(tx, "_drawn_splits", None)
    return DrawResult(seed, {s: int((split == s).sum()) for s in ("train", "val", "test")}, int(kept))


BY = ("random", "category")


def check_draw(by: str, *, val: float, test: float | None, test_categories) -> None:
    """The options of a draw, checked before anything is read."""
    if by not in BY:
        raise InputError(f"--by must be one of {', '.join(BY)}, got {by!r}")
    if by == "category" and test is not None:
        raise InputError("--by category takes no --test share: the test split is the held-out categories")
    if by == "random" and test_categories:
        raise InputError("--test-categories goes with --by category")
    if by == "random":
        check_shares(val, 0.1 if test is None else test)


def draw_by_category(tx: Tx, test_categories: list[str], val: float = 0.1, seed: int = 0) -> DrawResult:
    """Whole categories held out (`registry draw-splits --by category`): every query of `test_categories` becomes
    test, every other query train or val (val drawn at random within each category, share `val`). Unlike the random
    draw this sets every query's split, replacing the one it had: a held-out category must have no query anywhere
    else, and the test set must be those categories only. So the figures measure routing on questions of a kind the
    training never saw. Queries without a category are never test."""
    import pyarrow as pa

    wanted = [c.strip() for c in test_categories if c and c.strip()]
    if not wanted:
        raise InputError("--by category needs the categories to hold out (--test-categories A,B)")
    if not 0.0 < val < 1.0:
        raise InputError(f"the val share must be in (0, 1), got {val}")
    rows = tx.arrow("""SELECT external_id, coalesce(category, '') AS category FROM queries
                       ORDER BY category, external_id""").to_pydict()
    ids, cats = np.asarray(rows["external_id"], dtype=object), np.asarray(rows["category"], dtype=object)
    names = sorted(set(cats) - {""})
    unknown = [c for c in wanted if c not in names]
    if unknown:
        raise InputError(f"unknown category {unknown[0]!r}; the registry's categories: {', '.join(names) or 'none'}")
    rest = sorted(set(cats) - set(wanted))
    if not rest:
        raise InputError("holding out every category leaves nothing to train on")
    split = np.where(np.isin(cats, wanted), "test", "train").astype(object)
    rng = np.random.default_rng(seed)
    sizes = np.array([int((cats == c).sum()) for c in rest], dtype=np.int64)
    for cat, v in zip(rest, quotas(sizes, val, rng)):
        at = np.flatnonzero(cats == cat)[rng.permutation(int((cats == cat).sum()))]
        split[at[:v]] = "val"
    with tx.table("_drawn_splits", pa.table({"qid": ids.tolist(), "split": split.tolist()})):
        changed = apply(tx, "_drawn_splits", None)
    return DrawResult(seed, {s: int((split == s).sum()) for s in ("train", "val", "test")}, len(ids) - changed,
                      by="category", test_categories=sorted(set(wanted)), changed=changed)
