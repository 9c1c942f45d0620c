"""A routing call, asked and answered: what it asks for in one frozen value (`RouteOptions`: the HTTP bodies, the
CLI and the facade build it, and the policy reads it; checked once, where it is made, so every entry point refuses
the same things the same way), and what it answers (`Decision`: the chosen model, and every candidate with what the
choice weighed)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from registry.core.errors import InputError

COST_BASES = ("cost", "params")


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
    evaluations: int                  # behind the embedding used
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
