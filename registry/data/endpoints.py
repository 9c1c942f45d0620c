"""Where the routing proxy sends a model's requests: an OpenAI-compatible base URL, the model id the upstream knows
it by, and the name of the environment variable that holds its API key (read at request time, never stored or
logged). Append-only like availability: the newest row per model counts, and a row without a base URL removes it."""
from __future__ import annotations

import re
from dataclasses import dataclass

from registry.core.errors import InputError, NotFound, unknown_model
from registry.core.transaction import Tx
# an environment variable's name as shells write one (POSIX: letters, digits and _, not starting with a digit)
ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"


@dataclass
class Endpoint:
    model: str
    base_url: str
    upstream_model: str          # the "model" sent upstream (default: the registry's name)
    api_key_env: str | None = None


def set_endpoint(tx: Tx, model: str, base_url: str, upstream_model: str | None = None,
                 api_key_env: str | None = None) -> Endpoint:
    base_url = (base_url or "").strip().rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise InputError(f"base URL must start with http:// or https://, got {base_url!r}")
    if api_key_env is not None and not re.fullmatch(ENV_NAME, api_key_env):
        raise InputError(f"--api-key-env takes the NAME of an environment variable, got {api_key_env!r}")
    mid = _model_id(tx, model)
    tx.sql("""INSERT INTO model_endpoints (model_id, base_url, upstream_model, api_key_env) VALUES (?, ?, ?, ?)
              RETURNING id""", [mid, base_url, upstream_model, api_key_env])
    return Endpoint(model, base_url, upstream_model or model, api_key_env)


def remove(tx: Tx, model: str) -> None:
    mid = _model_id(tx, model)
    if model not in current(tx):
        raise NotFound(f"{model!r} has no endpoint")
    tx.sql("INSERT INTO model_endpoints (model_id) VALUES (?) RETURNING id", [mid])


def current(tx: Tx) -> dict[str, Endpoint]:
    rows = tx.sql("""SELECT name, base_url, upstream_model, api_key_env FROM (
                         SELECT m.name, e.base_url, e.upstream_model, e.api_key_env,
                                row_number() OVER (PARTITION BY e.model_id ORDER BY e.id DESC) AS newest
                         FROM model_endpoints e JOIN models m ON m.id = e.model_id) x
                     WHERE newest = 1 ORDER BY lower(name), name""")
    rows = [r for r in rows if r[1] is not None]      # the newest row removed it
    return {n: Endpoint(n, b, u or n, k) for n, b, u, k in rows}


def _model_id(tx: Tx, model: str) -> int:
    row = tx.sql("SELECT id FROM models WHERE name = ?", [model])
    if not row:
        raise unknown_model(model, [r[0] for r in tx.sql("SELECT name FROM models")])
    return int(row[0][0])
