"""What a routing call asks for, in one frozen value: the HTTP bodies, the CLI and the facade build it, and the
policy reads it. Checked once, where it is made, so every entry point refuses the same things the same way."""
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
