"""Accuracy against mean cost: the router over a sweep of cost weights, beside each single model, on queries of one
split with known results (their stored vectors: nothing is encoded), and the Pareto frontier of all those points.

Cost is one basis, said in the result: `params_b` (default; the models with a parameter count) or `cost` (the models
with a price). Every point is scored by `registry evaluate`'s rule (interaction.answered_choice): each query's choice
among the models with a result for it, a single model's point taking, where it has none, the model with a result
that is most likely right over the split. The scores are routing's as served (routing/accuracy.py), so at cost
weight 0 over every model routing may choose the router's point is `evaluate`'s `served` hit@1. Each point also
reports its first choice's coverage (the share of queries it has a result for) and its accuracy on those.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from registry.core.errors import InputError
from registry.core.transaction import Tx
from registry.locus import interaction
from registry.routing import accuracy, choice
from registry.routing.decision import COST_BASES
from registry.routing.state import State

# the cost weight is on the candidates' cost range (choice.relative_cost): from 1e-3 (a thousandth of a probability
# for the whole range) to 1e4 (the cheapest model everywhere, unless another costs within 1e-4 of the range more)
# spans the whole trade-off in any unit of price
DEFAULT_WEIGHTS = [0.0] + np.geomspace(1e-3, 1e4, 43).tolist()
SHARES = (0.95, 0.99)       # the shares of the best single model's accuracy whose cost the frontier reports


@dataclass
class Point:
    label: str              # "router L=..." or a model name
    cost_weight: float | None
    accuracy: float         # right answers over every query, each choice among the models with a result for it
    mean_cost: float        # of the models chosen so
    models_used: int
    scored: int = 0         # queries whose first choice (the router's top model, or the single model) has a result
    coverage: float = 1.0   # scored / queries
    scored_accuracy: float | None = None   # the first choice's right answers over the scored queries


@dataclass
class Frontier:
    split: str
    queries: int
    models: list[str]
    cost_basis: str         # what "cost" means here
    router: list[Point]
    single: list[Point]
    pareto: list[Point] = field(default_factory=list)   # no other point is cheaper and at least as accurate
    best_single: Point | None = None
    cheapest_matching: Point | None = None   # the cheapest router point reaching best_single's accuracy
    cost_ratio: float | None = None          # cheapest_matching.mean_cost / best_single.mean_cost
    # share of best_single's accuracy ("0.95", "0.99") -> the cheapest router point and single model reaching it,
    # their mean cost and its ratio to best_single's (None where none reaches it)
    reach: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def compute(tx: Tx, st: State, split: str = "test", cost_by: str = "params",
            weights: list[float] | None = None) -> Frontier:
    if cost_by not in COST_BASES:
        raise InputError(f"cost basis must be one of {', '.join(COST_BASES)}, got {cost_by!r}")
    scores = accuracy.on_split(tx, st, split)
    qids = scores.qids
    value = st.params_b if cost_by == "params" else st.cost
    basis = "params_b" if cost_by == "params" else "cost"
    ok = ~np.isnan(value) & scores.routable
    rows = np.flatnonzero(ok)
    if not len(rows):
        raise InputError(f"no established model has {basis}: nothing to compare"
                         + (" (set prices, or compare by size with --cost-by params)" if basis == "cost" else ""))
    notes = []
    if (~ok).any():
        notes.append(f"{int((~ok).sum())} models without {basis} (or on probation) left out")
    names = [st.names[i] for i in rows]
    cost = value[rows]
    correct = scores.correct[rows]                                    # [m,N] 1/0/-1
    probs = scores.probs[rows]
    sub = choice.Rules(set(), np.ones(len(rows), dtype=bool), cost, basis)
    router = []
    for w in (weights if weights is not None else DEFAULT_WEIGHTS):
        sub.cost_weight = w
        router.append(_point(f"router L={w:.3g}", w, correct, choice.ranking(probs, sub), cost))
    # a single model, and where it has no result the model most likely right over the split (a fixed order, as
    # evaluate's best single model falls back on the next best)
    order = probs.mean(axis=1)
    single = [_point(n, None, correct, np.where(np.arange(len(rows))[:, None] == i, 2.0, 0.0) + order[:, None], cost)
              for i, n in enumerate(names)]
    for p in single:
        if p.coverage < 1:
            on = "" if p.scored_accuracy is None else f" ({p.scored_accuracy:.4f} on those)"
            notes.append(f"{p.label} has results for {p.scored} of {len(qids)} queries{on}; on the others its point "
                         f"takes the model with a result most likely right")
    if router and router[0].coverage < 1:
        notes.append(f"the router's first choice has no result for {len(qids) - router[0].scored} queries at cost "
                     f"weight {router[0].cost_weight:g}: each goes to its best choice with one (evaluate's rule)")
    best = max(single, key=lambda p: (p.accuracy, -p.mean_cost))
    reaching = [p for p in router if p.accuracy >= best.accuracy]
    cheapest = min(reaching, key=lambda p: p.mean_cost) if reaching else None
    if cheapest is None:
        notes.append(f"no cost weight reaches {best.label}'s accuracy {best.accuracy:.4f}; the router's best is "
                     f"{max(p.accuracy for p in router):.4f}")
    ratio = None if cheapest is None or not best.mean_cost else cheapest.mean_cost / best.mean_cost
    return Frontier(split, int(len(qids)), names, basis, router, single, pareto(router + single), best, cheapest,
                    ratio, reach_costs(router, single, best), notes)


def reach_costs(router: list[Point], single: list[Point], best: Point) -> dict:
    """For each share in SHARES of best's accuracy: the cheapest router point and the cheapest single model that
    reach it, with their mean cost as a share of best's (RouteLLM's measure: the cost of reaching 95% of the
    strongest model's quality)."""
    out = {}
    for share in SHARES:
        target = share * best.accuracy
        row: dict[str, object] = {"target_accuracy": round(target, 4)}
        for kind, points in (("router", router), ("single", single)):
            p = min((p for p in points if p.accuracy >= target), key=lambda p: (p.mean_cost, -p.accuracy),
                    default=None)
            row[kind] = None if p is None else {
                "label": p.label, "accuracy": round(p.accuracy, 4), "mean_cost": p.mean_cost,
                "cost_ratio": round(p.mean_cost / best.mean_cost, 4) if best.mean_cost else None}
        out[f"{share:.2f}"] = row
    return out


def pareto(points: list[Point]) -> list[Point]:
    """The points no other point beats: cheaper-or-equal and more accurate. Cheapest first, accuracy rising."""
    out: list[Point] = []
    for p in sorted(points, key=lambda p: (p.mean_cost, -p.accuracy)):
        if not out or p.accuracy > out[-1].accuracy:
            out.append(p)
    return out


def _point(label: str, w: float | None, correct: np.ndarray, rank: np.ndarray, cost: np.ndarray) -> Point:
    """A point scored by evaluate's rule: each query's choice the best-ranked model with a result for it."""
    cols = np.arange(correct.shape[1])
    picks = interaction.answered_choice(rank, correct)
    first = correct[np.argmax(rank, axis=0), cols]                   # the first choice, with or without a result
    scored = int((first >= 0).sum())
    return Point(label, w, float((correct[picks, cols] == 1).mean()), float(cost[picks].mean()),
                 int(len(np.unique(picks))), scored, round(scored / len(cols), 4),
                 float((first == 1).sum() / scored) if scored else None)


PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def check_plot_path(path: str) -> None:
    """A plot is written only under a name that says its format."""
    from pathlib import Path

    if Path(path).suffix.lower() not in PLOT_SUFFIXES:
        raise InputError(f"--out {path}: the frontier's plot is written as {', '.join(PLOT_SUFFIXES)} (by the "
                         f"name's suffix)")


def plot(f: Frontier, path: str) -> None:
    """The Pareto frontier as a step line, the cost-weight sweep as its own labelled line, the single models as
    dots (labelled where they sit on the frontier), the legend outside the data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    costs = [p.mean_cost for p in f.router + f.single]
    log = min(costs) > 0 and max(costs) / min(costs) > 20
    sweep = sorted(f.router, key=lambda p: p.mean_cost)
    ax.plot([p.mean_cost for p in sweep], [p.accuracy for p in sweep], ".-", ms=4, lw=0.8, color="tab:blue",
            alpha=0.6, label="router, cost-weight sweep (weight rises to the left)")
    ax.scatter([p.mean_cost for p in f.single], [p.accuracy for p in f.single], c="tab:red", s=18, zorder=3,
               label="single models")
    front = f.pareto
    ax.step([p.mean_cost for p in front], [p.accuracy for p in front], where="post", color="black", lw=1.4,
            label="Pareto frontier (nothing cheaper is as accurate)")
    on_front = {p.label for p in front}
    for i, p in enumerate(sorted((p for p in f.single if p.label in on_front), key=lambda p: p.mean_cost)):
        ax.annotate(p.label, (p.mean_cost, p.accuracy), xytext=(4, -10 if i % 2 else 6), textcoords="offset points",
                    fontsize=7)
    if f.best_single is not None:
        ax.axhline(f.best_single.accuracy, color="grey", lw=0.6, ls="--",
                   label=f"best single model ({f.best_single.label})")
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(f"mean {f.cost_basis} per query" + (" (log scale)" if log else ""))
    ax.set_ylabel(f"accuracy on {f.split} ({f.queries} queries)")
    ax.set_title("Accuracy against cost: router sweep, single models and their Pareto frontier")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
