"""Fallback chains: when a model is down, its nearest available neighbours in embedding space, nearest first
(the paper keeps about 85% of routing accuracy this way). One FAISS search answers every model at once, so
`--all` costs one batched search, not one per model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from registry.answers import catalog
from registry.answers.geometry import Pool
from registry.answers.neighbours import RANKED_BY_EMBEDDING
from registry.core.errors import InputError, unknown_model
from registry.data import availability
from registry.embedding import index


@dataclass
class Link:
    model: str
    distance: float


@dataclass
class Chain:
    model: str
    chain: list[Link] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)   # skipped: marked unavailable, or named by the caller
    # skipped: embedded from too few evaluations (locus/evidence.py)
    probation: list[str] = field(default_factory=list)
    ranked_by: str = RANKED_BY_EMBEDDING     # (`similar` ranks by shared answers too: its first may differ)
    alias_of: str | None = None              # the model was named by an alias: this is that model's chain


@dataclass
class Chains:
    chains: dict[str, list[Link]]
    unavailable: list[str]
    probation: list[str] = field(default_factory=list)
    ranked_by: str = RANKED_BY_EMBEDDING


def check_names(p: Pool, names, label: str, *, aliases=()) -> None:
    known = set(p.names) | set(aliases)
    for n in names:
        if n not in known:
            raise unknown_model(n, known, (f" (in {label})" if label else "") + " or it has no embedding")


def chains(vi, p: Pool, k: int, unavailable=(), only: list[int] | None = None) -> dict[str, list[Link]]:
    """Each model's (or only those rows') k nearest available other models. vi: the pool's index.VectorIndex."""
    if k < 1:
        raise InputError(f"k must be at least 1, got {k}")
    down = set(unavailable)
    rows = np.arange(len(p.names)) if only is None else np.asarray(only)
    if not len(rows):
        return {}
    width = min(vi.size, k + 1 + len(down))              # room for the model itself and every unavailable one
    dist, ids = vi.search(p.vectors[rows], width)
    out = {}
    for r, drow, irow in zip(rows, dist, ids):
        me = p.names[r]
        links = [Link(vi.names[int(i)], round(float(d), 4)) for d, i in zip(drow, irow)
                 if i >= 0 and vi.names[int(i)] != me and vi.names[int(i)] not in down]
        out[me] = links[:k]
    return out


def for_model(tx, p: Pool, model: str, *, unavailable=(), k: int = 5, as_of: str | None = None,
              probation_min: int = 0, include_probation: bool = False) -> Chain:
    """A model's chain, skipping the models marked unavailable, those named in `unavailable` and, unless
    `include_probation`, those embedded from fewer than `probation_min` evaluations (routing does not trust them
    either)."""
    named = catalog.aliases(tx)
    asked, model = model, _root(model, p, named)
    check_names(p, [model], "", aliases=named)
    check_names(p, unavailable, "--unavailable", aliases=named)
    down = set(unavailable) | set(availability.unavailable_models(tx))
    weak = set() if include_probation else p.on_probation(probation_min) - down - {model}
    links = chains(index.get(tx, p.encoder_id, as_of), p, k, down | weak, only=[p.names.index(model)])[model]
    if not links:
        raise InputError(f"no available substitute for {model!r}: every other model is unavailable"
                         + (" or on probation (--include-probation to allow those)" if weak else ""))
    return Chain(asked, links, sorted(down, key=str.casefold), sorted(weak, key=str.casefold),
                 alias_of=model if model != asked else None)


def _root(name: str, p: Pool, named: dict[str, tuple[str, str]]) -> str:
    """The model an alias names, followed to one in the pool (an alias is its model under another name, so its
    substitutes are that model's); a name in the pool, or unknown, as it is."""
    seen = {name}
    while name not in p.names and name in named and named[name][0] not in seen:
        name = named[name][0]
        seen.add(name)
    return name


def for_all(tx, p: Pool, *, unavailable=(), k: int = 5, as_of: str | None = None,
            probation_min: int = 0, include_probation: bool = False) -> Chains:
    check_names(p, unavailable, "--unavailable", aliases=catalog.aliases(tx))
    down = set(unavailable) | set(availability.unavailable_models(tx))
    weak = set() if include_probation else p.on_probation(probation_min) - down
    every = chains(index.get(tx, p.encoder_id, as_of), p, k, down | weak)
    return Chains({m: every[m] for m in sorted(every, key=str.casefold)}, sorted(down, key=str.casefold),
                  sorted(weak, key=str.casefold))
