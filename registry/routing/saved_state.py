"""The routing state saved in the registry (table routing_states), so that a new process (each `registry route` from
the shell, a restarted server) routes at once: fitting the interaction terms and choosing the served policy take
seconds, and loading the encoder for its predictor imports torch. A saved state is the built one exactly, under the
same key (state.current's: anything that matters to routing changes it), with its predictor read back from the
encoder's checkpoint in numpy.

Saved as data, never as code: the arrays in an .npz read with allow_pickle=False, everything else as JSON, and the
dataclasses it names are rebuilt only from registry's own modules.
"""
from __future__ import annotations

import dataclasses
import importlib
import io
import json

import numpy as np

from registry.core.transaction import Tx

KEPT = 1            # saved states kept (the newest; about 17 MB for MMLU-Pro): a registry has one current state
FORMAT = "routing-state/1"
NOT_SAVED = ("model", "score")   # the torch model, and the scorer built again from the checkpoint


def key_text(key: tuple) -> str:
    """The saved state's key: the registry's state (state.current's key) and the code that builds a routing state
    from it, its source and its settings as they are now: a state saved by another version of the code, or under
    other settings, is never read back."""
    return f"{FORMAT} {_code_digest()} {repr(tuple(key))}"


_sources: list = []


def _code_digest() -> str:
    import hashlib
    import sys

    from registry.locus import evidence, interaction, numpy_network
    from registry.routing import pairs, served

    # what a saved state is computed by: its builder, the served policy and the terms as routing keeps them
    # (served), the pair models a policy may hold (pairs), the method's maths, the evidence, and this module's format
    # (routing/state.py, which builds the state, is this module's caller: loaded, and not imported back)
    modules = (sys.modules["registry.routing.state"], served, pairs, interaction, numpy_network, evidence,
               sys.modules[__name__])
    if not _sources:
        _sources.append(hashlib.sha256(b"".join(open(m.__file__, "rb").read() for m in modules)).hexdigest())
    settings = [(m.__name__, k, v) for m in modules for k, v in sorted(vars(m).items())
                if k.isupper() and isinstance(v, (int, float, str, tuple))]
    return hashlib.sha256((_sources[0] + repr(settings)).encode()).hexdigest()[:16]


def save(tx: Tx, st) -> bool:
    """Save `st` under its key (the oldest beyond KEPT go); False where nothing may be written (a read-only file)
    or the store saves none (a server). A state already saved under the key is the same state: kept as it is."""
    if tx.read_only or not tx.save_routing_state:
        return False
    arrays: dict[str, np.ndarray] = {}
    doc = {f.name: _encode(getattr(st, f.name), arrays) for f in dataclasses.fields(st) if f.name not in NOT_SAVED}
    buf = io.BytesIO()
    np.savez(buf, __doc__=np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8), **arrays)
    key = key_text(st.key)
    # (another process on the same PostgreSQL database may be saving the same state: the first one stays)
    tx.sql("INSERT INTO routing_states (key, encoder_id, payload) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
           [key, int(st.encoder_id), buf.getvalue()])
    tx.sql(f"""DELETE FROM routing_states WHERE key LIKE '{FORMAT} %' AND key NOT IN (   -- (other caches beside)
                   SELECT key FROM routing_states WHERE key LIKE '{FORMAT} %' ORDER BY created DESC, key LIMIT ?)""",
           [KEPT])
    return True


def load(tx: Tx, key: tuple) -> dict | None:
    """The fields of the state saved under `key` (without its model and scorer), or None."""
    rows = tx.sql("SELECT payload FROM routing_states WHERE key = ?", [key_text(key)])
    if not rows:
        return None
    with np.load(io.BytesIO(bytes(rows[0][0])), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    doc = json.loads(arrays.pop("__doc__").tobytes().decode())
    return {name: _decode(v, arrays) for name, v in doc.items()}


def load_newest_field(tx: Tx, name: str):
    """One field of the newest state saved by this code (under any key), or None: what a state built anew may
    take from it where its inputs are the same (state.py's saved fit). Only that field's arrays are read."""
    rows = tx.sql("SELECT payload FROM routing_states WHERE key LIKE ? ORDER BY created DESC, key LIMIT 1",
                  [f"{FORMAT} {_code_digest()} %"])
    if not rows:
        return None
    with np.load(io.BytesIO(bytes(rows[0][0])), allow_pickle=False) as npz:
        doc = json.loads(npz["__doc__"].tobytes().decode())
        return _decode(doc[name], _Lazy(npz)) if name in doc else None


class _Lazy(dict):
    """An .npz's arrays, each read when a decoded field asks for it."""

    def __init__(self, npz):
        super().__init__()
        self.npz = npz

    def __missing__(self, key):
        return self.npz[key]


def _encode(obj, arrays: dict):
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            return {"$list": _encode(obj.tolist(), arrays), "$dtype": "object"}
        name = f"a{len(arrays)}"
        arrays[name] = obj
        return {"$array": name}
    if isinstance(obj, np.generic):
        return obj.item()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        cls = type(obj)
        return {"$dataclass": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {f.name: _encode(getattr(obj, f.name), arrays) for f in dataclasses.fields(obj) if f.init}}
    if isinstance(obj, tuple):
        return {"$tuple": [_encode(v, arrays) for v in obj]}
    if isinstance(obj, (set, frozenset)):
        return {"$frozenset" if isinstance(obj, frozenset) else "$set": [_encode(v, arrays) for v in sorted(obj)]}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in obj):
            return {k: _encode(v, arrays) for k, v in obj.items()}
        return {"$items": [[_encode(k, arrays), _encode(v, arrays)] for k, v in obj.items()]}
    if isinstance(obj, list):
        return [_encode(v, arrays) for v in obj]
    if obj is None or isinstance(obj, (str, bool, int, float)):
        return obj
    raise TypeError(f"a routing state cannot save a {type(obj).__name__}")


def _decode(obj, arrays: dict):
    if isinstance(obj, list):
        return [_decode(v, arrays) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "$array" in obj:
        return arrays[obj["$array"]]
    if "$list" in obj:
        out = np.empty(len(obj["$list"]), dtype=object)
        out[:] = _decode(obj["$list"], arrays)
        return out
    if "$tuple" in obj:
        return tuple(_decode(v, arrays) for v in obj["$tuple"])
    if "$set" in obj:
        return {_decode(v, arrays) for v in obj["$set"]}
    if "$frozenset" in obj:
        return frozenset(_decode(v, arrays) for v in obj["$frozenset"])
    if "$items" in obj:
        return {_decode(k, arrays): _decode(v, arrays) for k, v in obj["$items"]}
    if "$dataclass" in obj:
        module, _, name = obj["$dataclass"].partition(":")
        if not module.startswith("registry."):
            raise ValueError(f"a saved routing state names {obj['$dataclass']}, not one of the registry's classes")
        cls = getattr(importlib.import_module(module), name)
        if not dataclasses.is_dataclass(cls):
            raise ValueError(f"a saved routing state names {obj['$dataclass']}, which is not a dataclass")
        return cls(**{k: _decode(v, arrays) for k, v in obj["fields"].items()})
    return {k: _decode(v, arrays) for k, v in obj.items()}
