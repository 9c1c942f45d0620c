"""`registry evaluate`: routing accuracy and predictor quality of LOCUS on a split, beside the baselines, over the
established models with an up-to-date embedding (pending onboarding finished first), or, with `held_out`, models
known only from a few evaluations (nothing written); the measuring is evaluate/. `route --frontier`: routing's
accuracy against its mean cost on a split, over a sweep of cost weights (routing/frontier.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from registry.core.store import Store
from registry.embedding import evidence
from registry.usecases import onboard as onboard_uc

if TYPE_CHECKING:       # (torch behind them: imported when a measure runs)
    from registry.evaluate.harness import EvaluationReport
    from registry.evaluate.heldout import HeldOutReport
    from registry.routing.frontier import Frontier


def evaluate(store: Store, split: str = "test", *, min_evaluations: int, probation: int | None,
             baselines: bool = True, sample_efficiency: bool = False, seeds: int | None = None,
             held_out: int | None = None, n: int = 128, max_steps: int | None = None, epochs: int | None = None,
             progress: Any = None, planned: bool = False) -> EvaluationReport | HeldOutReport:
    """`harness.Evaluation` (or, with `held_out`, `heldout.HeldOut`); options checked before any read."""
    from registry.embedding import dataset  # (torch: only for the commands that measure)
    from registry.evaluate import harness  # (heldout imports sklearn: 3 s, only for --held-out)

    harness.check_options(split, baselines=baselines, sample_efficiency=sample_efficiency, held_out=held_out,
                          planned=planned)
    if held_out is not None:
        from registry.evaluate import heldout

        with store.tx() as tx:
            data = dataset.dataset(tx)
        return heldout.run(data, held_out, n=n, seeds=3 if seeds is None else seeds, max_steps=max_steps,
                           epochs=epochs, progress=progress, planned=planned)
    onboard_uc.finish_pending(store, min_evaluations)
    with store.tx() as tx:
        return harness.evaluate(tx, split, baselines=baselines, sample_efficiency=sample_efficiency,
                                seeds=5 if seeds is None else seeds, probation_min=evidence.minimum(tx, probation),
                                planned=planned, progress=progress)


def frontier(store: Store, split: str = "test", cost_by: str = "params", weights: list[float] | None = None, *,
             probation: int | None = None) -> Frontier:
    """Accuracy vs mean cost over a sweep of cost weights, beside every single model (routing/frontier.py)."""
    from registry.routing import fit
    from registry.routing import frontier as frontiers

    with store.tx() as tx:
        return frontiers.compute(tx, fit.keep(tx, probation), split, cost_by, weights)
