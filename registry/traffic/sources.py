"""Feedback sources: who sends outcomes (a grader, users' thumbs, a test suite), each with a weight and a threshold,
and on or off. A score in [0, 1] becomes a 0/1 result at its source's threshold (>= counts as right); the weight is
how much each of its outcomes counts where outcomes are weighed (the drift test, routing's corrections); a source
switched off, or weighed 0, is left out: its evaluations are not read by the embeddings, and its outcomes neither
by the drift test nor by the corrections. A source never set is on, at weight 1 and threshold 0.5. The settings are
append-only rows (table feedback_sources): the newest per name counts."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from registry.core.errors import InputError
from registry.core.transaction import Tx

DEFAULT_WEIGHT = 1.0
DEFAULT_THRESHOLD = 0.5
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")

CURRENT = """SELECT name, weight, threshold, enabled FROM feedback_sources f
             WHERE id = (SELECT max(id) FROM feedback_sources g WHERE g.name = f.name)"""
# the import batches whose evaluations are left out: those of the sources off or weighed 0
LEFT_OUT_BATCHES = f"""SELECT DISTINCT fb.batch_id FROM feedback fb JOIN ({CURRENT}) s ON s.name = fb.source
                       WHERE NOT s.enabled OR s.weight = 0"""


@dataclass
class Source:
    name: str
    weight: float = DEFAULT_WEIGHT
    threshold: float = DEFAULT_THRESHOLD
    enabled: bool = True
    outcomes: int = 0                # outcomes stored from it


def check_name(name: object) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):     # (match's $ takes a final newline)
        raise InputError(f"source must be a name of letters, digits and . _ : - (at most 64), got {name!r}")
    return name


def check_setting(weight: float | None, threshold: float | None) -> None:
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float))
                               or not math.isfinite(weight) or not 0 <= weight <= 100):
        raise InputError(f"weight must be a number from 0 to 100, got {weight!r}")
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not 0 <= threshold <= 1):
        raise InputError(f"threshold must be a number from 0 to 1, got {threshold!r}")


def current(tx: Tx) -> dict[str, Source]:
    """Every source set or heard from, by name."""
    out = {n: Source(n, float(w), float(t), bool(e)) for n, w, t, e in tx.sql(CURRENT)}
    for name, n in tx.sql("SELECT source, count(*) FROM feedback GROUP BY source"):
        out.setdefault(name, Source(name)).outcomes = int(n)
    return out


def set_source(tx: Tx, name: str, weight: float | None = None, threshold: float | None = None,
               enabled: bool | None = None) -> tuple[Source, list[int]]:
    """A source's new setting (what is not given stays as it was) -> (the source, the models whose embedding input
    changed: those with outcomes from it, when it went in or out)."""
    check_name(name)
    check_setting(weight, threshold)
    old = current(tx).get(name, Source(name))
    new = Source(name, old.weight if weight is None else float(weight),
                 old.threshold if threshold is None else float(threshold),
                 old.enabled if enabled is None else bool(enabled), old.outcomes)
    tx.sql("INSERT INTO feedback_sources (name, weight, threshold, enabled) VALUES (?, ?, ?, ?)",
           [name, new.weight, new.threshold, new.enabled])
    counted = (old.enabled and old.weight > 0, new.enabled and new.weight > 0)
    changed = [] if counted[0] == counted[1] else [
        int(m) for (m,) in tx.sql("SELECT DISTINCT model_id FROM feedback WHERE source = ?", [name])]
    return new, changed
