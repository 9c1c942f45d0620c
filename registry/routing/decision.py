"""What a routing call answers: the chosen model, and every candidate with what the choice weighed."""
from __future__ import annotations

from dataclasses import dataclass


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
