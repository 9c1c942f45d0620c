"""Every Eval Ever's two JSON schemas (0.3.0, from evaleval/every_eval_ever, MIT: schemas/LICENSE), and the check
of a record against them: `jsonschema_rs` (compiled, ~100x faster: an export checks every line it writes) says
whether it is valid, and for one that is not, the `jsonschema` package says where and why, as one short line."""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path

FILES = {"aggregate": "eval.schema.json", "sample": "instance_level_eval.schema.json"}
VERSION = "0.3.0"


@cache
def schema(kind: str) -> dict:
    return json.loads((Path(__file__).with_name("schemas") / FILES[kind]).read_text(encoding="utf-8"))


@cache
def fast_validator(kind: str):
    import jsonschema_rs

    # formats unchecked, as `jsonschema` leaves them without a format checker: both say the same
    return jsonschema_rs.validator_for(schema(kind), validate_formats=False)


@cache
def validator(kind: str):
    import jsonschema

    return jsonschema.validators.validator_for(schema(kind))(schema(kind))


def first_error(kind: str, record) -> str | None:
    """Why `record` is not a valid `kind` ("aggregate" | "sample"), or None: where in it, and what."""
    if fast_validator(kind).is_valid(record):
        return None
    errors = sorted(validator(kind).iter_errors(record), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    e = errors[0]
    where = "/".join(str(p) for p in e.absolute_path) or "(top)"
    return f"{where}: {e.message[:200]}"
