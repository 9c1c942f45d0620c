"""Routing accuracy as served, on a split's stored queries: one figure wherever "routing accuracy" is shown.

The scores are what `route` ranks by (policy.probabilities: the predictor shrunk by evidence, the interaction terms,
the served policy), read for the split's queries from their stored vectors (nothing is encoded); each query's choice
is scored by the one rule of `registry evaluate` (interaction.answered_choice: among the models with a result for
it). Over the models routing may choose (not on probation) this is `evaluate`'s `served` hit@1; `route --frontier`
(routing/frontier.py) sweeps cost weights over the same scores, and a portfolio's routing accuracy (CLI, HTTP, the
web page) is this figure among its members.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from registry.core.errors import InputError
from registry.core.transaction import Tx
from registry.data import current_evaluations, query_cache
from registry.locus import evidence, interaction
from registry.routing.state import State


@dataclass
class SplitScores:
    split: str
    qids: np.ndarray              # [N] the split's query ids, ascending
    names: list[str]              # the routing state's models (its row order)
    probs: np.ndarray             # [M,N] the served scores routing ranks by
    correct: np.ndarray           # [M,N] int8 1/0, -1 = no result
    routable: np.ndarray          # [M] bool: models routing may choose (not on probation)

    def rows(self, members=None) -> np.ndarray:
        """Row indices of `members` (names; unknown ones are skipped), or of every routable model."""
        if members is None:
            return np.flatnonzero(self.routable)
        at = {n: i for i, n in enumerate(self.names)}
        return np.array(sorted({at[n] for n in members if n in at}), dtype=np.int64)

    def accuracy(self, members=None) -> float | None:
        """Routing accuracy as served among `members` (default: every model routing may choose); None without
        queries or models."""
        rows = self.rows(members)
        if not len(self.qids) or not len(rows):
            return None
        return float(interaction.answered_right(self.probs[rows], self.correct[rows]).mean())


def on_split(tx: Tx, st: State, split: str = "test") -> SplitScores:
    """The served scores and the current results of every model of the routing state on the split's queries."""
    qids = np.array([r[0] for r in tx.sql("SELECT query_id FROM query_splits WHERE split = ? ORDER BY 1", [split])],
                    dtype=np.int64)
    if not len(qids):
        raise InputError(f"no queries in split {split!r}")
    row_of, qmat = query_cache.query_vectors(tx, qids)
    qmat = qmat[[row_of[int(q)] for q in qids]]
    hashes = [r[0] for r in tx.sql("""SELECT content_hash FROM queries WHERE id IN (SELECT unnest(?::INTEGER[]))
                                      ORDER BY id""", [qids.tolist()])]
    probs = st.scores(qmat, hashes)[0] if len(st.names) else np.zeros((0, len(qids)))
    return SplitScores(split, qids, list(st.names), np.asarray(probs, dtype=np.float64),
                       correct_matrix(tx, st.names, qids), evidence.candidates(st.evidence))


def correct_matrix(tx: Tx, names: list[str], qids: np.ndarray) -> np.ndarray:
    """[len(names), len(qids)] int8: each model's current result on each query (1/0), -1 where it has none."""
    import pyarrow as pa

    out = np.full((len(names), len(qids)), -1, dtype=np.int8)
    col = {q: j for j, q in enumerate(qids.tolist())}
    rowm = {n: i for i, n in enumerate(names)}
    with tx.table("_acc_q", pa.table({"id": qids})):
        res = tx.sql(f"""SELECT m.name, e.query_id, e.correct::INT AS c
                          FROM {current_evaluations.CURRENT} e JOIN models m ON m.id = e.model_id
                          WHERE e.query_id IN (SELECT id FROM _acc_q)""")
    for n, q, c in res:
        if n in rowm:
            out[rowm[n], col[q]] = c
    return out


def scorer(tx: Tx, probation_min: int | None = None, split: str = "test"):
    """accuracy(members=None) -> routing accuracy as served on `split` (SplitScores.accuracy), the scores read on
    the first call (in the caller's transaction `tx`, which must still be open); None where the split is empty."""
    from registry.routing.fit import keep

    kept: list = []

    def accuracy(members=None) -> float | None:
        if not kept:
            try:
                kept.append(on_split(tx, keep(tx, probation_min), split))
            except InputError:
                kept.append(None)
        return None if kept[0] is None else kept[0].accuracy(members)
    return accuracy
