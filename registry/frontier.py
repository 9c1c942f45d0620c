"""Accuracy against mean cost: the router over a sweep of cost weights, beside each single model, on queries of one
split with known results (their stored vectors: nothing is encoded). A missing (model, query) result counts as
wrong when that model is chosen, as in every routing figure of this project (baselines.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import querycache, routing
from .errors import InputError
from .store import Tx

DEFAULT_WEIGHTS = [0.0] + np.geomspace(1e-5, 1.0, 41).tolist()


@dataclass
class Point:
    label: str              # "router L=..." or a model name
    cost_weight: float | None
    accuracy: float
    mean_cost: float
    models_used: int


@dataclass
class Frontier:
    split: str
    queries: int
    models: list[str]
    cost_basis: str         # what "cost" means here
    router: list[Point]
    single: list[Point]
    best_single: Point | None = None
    cheapest_matching: Point | None = None   # the cheapest router point reaching best_single's accuracy
    cost_ratio: float | None = None          # cheapest_matching.mean_cost / best_single.mean_cost
    notes: list[str] = field(default_factory=list)


def compute(tx: Tx, st: routing._State, split: str = "test", open_only: bool = True,
            weights: list[float] | None = None) -> Frontier:
    qids = np.array([r[0] for r in tx.sql("SELECT query_id FROM query_splits WHERE split = ? ORDER BY 1", [split])],
                    dtype=np.int64)
    if not len(qids):
        raise InputError(f"no queries in split {split!r}")
    rows = np.arange(len(st.names))
    notes = []
    if open_only:  # open-weight models: those with a parameter count, whose cost is that count
        rows = rows[~np.isnan(st.params_b)]
        cost = st.params_b[rows]
        basis = "params_b (open-weight models only)"
        if not len(rows):
            raise InputError("no model has a parameter count: nothing to compare (try without open_only)")
    else:
        cost = st.cost[rows]
        basis = "cost if set, else params_b (unknown: the dearest known)"
    names = [st.names[i] for i in rows]
    row_of, qmat = querycache.query_vectors(tx, qids)
    qmat = qmat[[row_of[int(q)] for q in qids]]
    correct = _correct_matrix(tx, names, qids)                       # [m,N] 1/0/-1
    sub = routing._State(st.key, st.encoder_id, st.encoder_name, st.model, names, st.versions[rows],
                         st.version_ids[rows], st.z[rows], cost, np.ones(len(rows), bool), st.params_b[rows])
    sub.fast = routing._numpy_scorer(st.model, sub.z)
    probs = routing.probabilities(sub, qmat)
    router = []
    for w in (weights if weights is not None else DEFAULT_WEIGHTS):
        picks = np.array([r for r, _ in routing.choose(sub, probs, set(), cost_weight=w)])
        router.append(Point(f"router L={w:.3g}", w, _acc(correct, picks), float(cost[picks].mean()),
                            int(len(np.unique(picks)))))
    single = [Point(n, None, _acc(correct, np.full(len(qids), i)), float(cost[i]), 1) for i, n in enumerate(names)]
    best = max(single, key=lambda p: (p.accuracy, -p.mean_cost))
    reaching = [p for p in router if p.accuracy >= best.accuracy]
    cheapest = min(reaching, key=lambda p: p.mean_cost) if reaching else None
    if cheapest is None:
        notes.append(f"no cost weight reaches {best.label}'s accuracy {best.accuracy:.4f}; the router's best is "
                     f"{max(p.accuracy for p in router):.4f}")
    ratio = None if cheapest is None or not best.mean_cost else cheapest.mean_cost / best.mean_cost
    return Frontier(split, int(len(qids)), names, basis, router, single, best, cheapest, ratio, notes)


def _acc(correct: np.ndarray, picks: np.ndarray) -> float:
    return float((correct[picks, np.arange(len(picks))] == 1).mean())


def _correct_matrix(tx: Tx, names: list[str], qids: np.ndarray) -> np.ndarray:
    import pyarrow as pa

    out = np.full((len(names), len(qids)), -1, dtype=np.int8)
    col = {q: j for j, q in enumerate(qids.tolist())}
    rowm = {n: i for i, n in enumerate(names)}
    tx.duck.register("_front_q", pa.table({"id": qids}))
    try:
        res = tx.duck.execute("""SELECT m.name, e.query_id, arg_max(e.correct, e.batch_id)::INT AS c
                                 FROM evaluations e JOIN models m ON m.id = e.model_id
                                 WHERE e.query_id IN (SELECT id FROM _front_q) GROUP BY ALL""").fetchall()
    finally:
        tx.duck.unregister("_front_q")
    for n, q, c in res:
        if n in rowm:
            out[rowm[n], col[q]] = c
    return out


def plot(f: Frontier, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    pts = sorted(f.router, key=lambda p: p.mean_cost)
    ax.plot([p.mean_cost for p in pts], [p.accuracy for p in pts], "o-", ms=3, label="router (cost-weight sweep)")
    ax.scatter([p.mean_cost for p in f.single], [p.accuracy for p in f.single], c="tab:red", s=14,
               label="single models")
    for p in f.single:
        ax.annotate(p.label, (p.mean_cost, p.accuracy), fontsize=6, alpha=0.7)
    if f.cheapest_matching:
        ax.axhline(f.best_single.accuracy, color="grey", lw=0.6, ls="--")
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlabel(f"mean cost per query ({f.cost_basis})")
    ax.set_ylabel(f"accuracy on {f.split} ({f.queries} queries)")
    ax.legend(loc="lower right")
    ax.set_title("Routing frontier: accuracy vs cost")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
