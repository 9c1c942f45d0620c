"""The proxied requests feedback can name: one record per request the proxy routed (model `auto`) and an upstream
answered, under an id it returns (the `x-registry-request-id` header and the body's `id`). A record keeps what an
outcome needs to become an evaluation and what drift compares it with: the model that answered, the query's hash,
text vector and category, and routing's P(correct) for that model; tokens and the model's price; the text itself
only where the owner keeps texts (`serve --keep-texts`). The server's writer appends records in bulk with the
routing log's rows (serve/group_commit.py): a request answered just before a crash may be lost with its log row,
and feedback naming it is then refused as unknown."""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from registry.core.transaction import Tx

ID_PREFIX = "req-"
ID = re.compile(r"^req-[0-9a-f]{24}$")     # what `new_id` makes, and so all feedback may name (read with fullmatch)
COLUMNS = ("id", "model", "chosen", "category", "query_hash", "text", "vector", "predicted", "prompt_tokens",
           "completion_tokens", "cost", "encoder_id")


def new_id() -> str:
    """A request id no client can guess (96 random bits): feedback is taken only for ids the proxy issued."""
    return ID_PREFIX + secrets.token_hex(12)


class Record(NamedTuple):
    """A tuple, so that it travels with the routing log's rows to the server's writer (which tells them apart)."""
    id: str
    model: str                       # the model whose upstream answered
    chosen: str | None               # routing's choice (another model: the answer came from its fallback chain)
    category: str | None
    query_hash: str
    text: str | None                 # None unless the owner keeps texts
    vector: bytes | None             # the query's text vector, float32
    predicted: float | None          # routing's P(correct) for `model`, without traffic's corrections
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost: float | None = None
    encoder_id: int | None = None


def vector_bytes(vec: np.ndarray | None) -> bytes | None:
    return None if vec is None else np.ascontiguousarray(vec, dtype=np.float32).tobytes()


def usage(body: bytes) -> tuple[int | None, int | None]:
    """(prompt tokens, completion tokens) from an OpenAI chat completion's `usage`, where it has them."""
    try:
        u = json.loads(body).get("usage") or {}
    except (ValueError, AttributeError, RecursionError):
        return None, None
    ints = [u.get(k) if isinstance(u, dict) and isinstance(u.get(k), int) else None
            for k in ("prompt_tokens", "completion_tokens")]
    return ints[0], ints[1]


def append(tx: Tx, records: list[Record]) -> None:
    """Append records in one bulk insert (Arrow); an id already stored is kept as it was."""
    import pyarrow as pa

    if not records:
        return
    cols = list(zip(*records))
    types = [pa.string()] * 6 + [pa.binary(), pa.float64(), pa.int64(), pa.int64(), pa.float64(), pa.int64()]
    tbl = pa.table({c: pa.array(list(v), type=t) for c, t, v in zip(COLUMNS, types, cols)})
    names = ", ".join(COLUMNS)
    with tx.table("_proxy_requests", tbl):
        tx.sql(f"INSERT INTO proxy_requests ({names}) SELECT {names} FROM _proxy_requests ON CONFLICT DO NOTHING")


@dataclass
class Stored:
    id: str
    age_s: float
    model: str | None
    category: str | None
    query_hash: str
    text: str | None
    vector: bytes | None
    predicted: float | None


def lookup(tx: Tx, ids: list[str]) -> dict[str, Stored]:
    """The stored records among `ids`, with their age in seconds."""
    if not ids:
        return {}
    rows = tx.sql("""SELECT id, extract(epoch FROM now()::TIMESTAMP) - extract(epoch FROM created), model, category,
                            query_hash, text, vector, predicted
                     FROM proxy_requests WHERE id IN (SELECT unnest(?::VARCHAR[]))""", [ids])
    return {r[0]: Stored(r[0], float(r[1]), r[2], r[3], r[4], r[5], None if r[6] is None else bytes(r[6]), r[7])
            for r in rows}
