"""A query's label: its values of the metadata columns a predictor may read as categories, one column
("category", "source") or several read together ("category+source": the source's offsets fitted on top of the
category's, category_rows.fit_category_rows). A label is one string either way, so every reader of labels (routing's
content hash -> label map, the evaluation arrays, the probes) passes it on as it did a category name: several
columns' values are joined by SEP, and only the predictor (encoder.LocusModel.category_ids) splits them."""
from __future__ import annotations

import numpy as np

FIELDS = ("category", "source")   # the query columns a predictor may read
SEP = "\x1f"                      # joins one query's values of several columns (ASCII unit separator: in no value)
NONE = "(none)"                   # the evaluation arrays' name for a missing value (Dataset): no category


def parse(field: str) -> tuple[str, ...] | None:
    """"category", "source" or columns joined by "+" (each once) -> the columns in order; None if not valid."""
    cols = tuple(str(field).split("+"))
    return cols if all(c in FIELDS for c in cols) and len(set(cols)) == len(cols) else None


def sql(field: str, alias: str = "") -> str:
    """The SQL expression of a query's label (field already parsed as valid): the column itself for one column, the
    values joined by SEP (a missing one as '') for several."""
    cols = [f"{alias}.{c}" if alias else c for c in parse(field)]
    return cols[0] if len(cols) == 1 else " || chr(31) || ".join(f"coalesce({c}, '')" for c in cols)


def join(columns) -> np.ndarray:
    """Several columns' values [N] each -> the labels [N] (object); a single column is returned as it is."""
    if len(columns) == 1:
        return columns[0]
    return np.array([SEP.join("" if v is None else str(v) for v in vals) for vals in zip(*columns)], dtype=object)


def split(label, n: int) -> list:
    """A label of n columns -> its n values (None where missing or not a string; a label with fewer parts is
    read as having the first ones)."""
    parts = label.split(SEP) if isinstance(label, str) else []
    parts = [p if p not in ("", NONE) else None for p in parts[:n]]
    return parts + [None] * (n - len(parts))
