"""The routing state: what a route reads, one plain value (`State`) that scores query vectors (`State.scores`).

The write that changes what routing depends on (a contender registered, an import, a re-split, a new encoder)
builds it (routing/fit.py) and saves it in the registry (table routing_states); `route`, `evaluate` and the server
read the saved state under the registry's key (`read`) and only score, so a new process (each `registry route` from
the shell, a restarted server) routes at once: fitting the interaction terms and choosing the served policy take
seconds, and loading the encoder for its predictor imports torch. One cheap statement (the newest ids of
activations, versions and availability rows, and digests of the models' names and costs and of the splits) is the
key: a state saved under another key is not this registry's now.

Saved as data, never as code: the arrays in an .npz read with allow_pickle=False, everything else as JSON, and the
dataclasses it names are rebuilt only from registry's own modules. Its predictor is read back from the encoder's
checkpoint in numpy.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import importlib.util
import io
import json
import re
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from registry.core import database_file, dialect
from registry.core.transaction import Tx
from registry.locus import evidence, interaction, numpy_network
from registry.routing import served_scores

KEPT = 1            # saved states kept (the newest; about 17 MB for MMLU-Pro): a registry has one current state
FORMAT = "routing-state/1"
NOT_SAVED = ("model", "score", "corrections")   # the torch model, the scorer built again from the checkpoint, and
#                                                 traffic's corrections (saved on their own: CORRECTIONS)
CORRECTIONS = "traffic-corrections/1"      # their key in routing_states: one row, written with every landing
# what a saved state is computed by: its builder, the served policy's choice and its scores, the pair models a policy
# may hold, the method's maths, the evidence, and this module's format (their sources and settings are its digest)
BUILT_BY = ("registry.routing.state", "registry.routing.fit", "registry.routing.served",
            "registry.routing.served_scores", "registry.routing.pairs", "registry.locus.interaction",
            "registry.locus.numpy_network", "registry.locus.evidence")


@dataclass
class State:
    key: tuple
    encoder_id: int
    encoder_name: str
    model: Any                        # LocusModel (eval mode); None when read back from the registry
    names: list[str]
    model_ids: np.ndarray             # [M] models.id
    versions: np.ndarray              # [M] embedding version numbers
    version_ids: np.ndarray           # [M] embedding_versions.id
    z: np.ndarray                     # [M,128] current embeddings
    cost: np.ndarray                  # [M] price per query (nan: not set)
    params_b: np.ndarray              # [M] (nan: unknown)
    evidence: evidence.Evidence       # [M] evaluations, stability, probation, shrinkage weight
    down: set[str] = field(default_factory=set)   # marked unavailable in the registry
    score: Callable[..., np.ndarray] | None = None   # q [N,Dq] -> P(correct) [M,N] (the predictor's scorer)
    known: frozenset = frozenset()                # every registered model's name (embedded or not)
    interaction: served_scores.Served | None = None   # the routing terms beside the predictor, and the policy served
    interaction_fitted: bool = True               # False: the last fit, carried over to new models (routing/fit.py)
    category_of: dict | None = None               # content hash -> category, for an encoder whose predictor reads
                                                  #   categories (None: text only); other texts route as "none"
    corrections: served_scores.Corrections | None = None   # traffic's, added last (`corrected`)

    def scores(self, qvecs: np.ndarray, hashes: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """[N,384] (texts with these content hashes) -> (P(correct) as routing uses it: the predictor's, shrunk by
        evidence, with the interaction terms added to its logit, then the served policy's scores for its rows; the
        predictor's own), each [M,N]."""
        cats = None if self.category_of is None or hashes is None else [self.category_of.get(h) for h in hashes]
        assert self.score is not None, "a routing state scores with its predictor's scorer"
        raw = self.score(qvecs, cats)
        probs = evidence.shrink(raw, self.evidence)
        terms = self.interaction
        if terms is not None and len(raw):
            probs = interaction.sigmoid(terms.scores(interaction.logit(probs), qvecs, hashes)).astype(np.float32)
            pol = terms.policy
            if pol is not None and pol.name != "locus_interaction":     # a simple router won on val: it is served
                labels = None if hashes is None else [terms.policy_labels.get(h) for h in hashes]
                probs = probs.astype(np.float64)            # (its ties are broken below float32's precision)
                rows = terms.fitted.rows
                probs[rows] = served_scores.scores(pol, terms.fitted, probs[rows], qvecs, labels)
        if self.corrections is not None and hashes is not None and len(raw):
            probs = self.corrections.adjust(probs, self.names, hashes, terms)
        return probs, raw

    def served_line(self) -> str:
        """What routing serves and its val figures, in a line (routing/served.py chose it)."""
        pol = None if self.interaction is None else self.interaction.policy
        return pol.describe() if pol is not None else "served policy locus (no val split: the predictor alone)"


_KEY_SQL = """SELECT (SELECT coalesce(max(id), 0) FROM encoder_activations),
                     (SELECT coalesce(max(id), 0) FROM embedding_versions),
                     (SELECT coalesce(max(id), 0) FROM model_availability),
                     (SELECT count(*) FROM version_stability),
                     (SELECT coalesce(max(id), 0) FROM model_aliases),
                     (SELECT {models} FROM models),
                     (SELECT {splits} FROM query_splits WHERE split <> 'production')"""


def key(tx: Tx, probation_min: int | None = None) -> tuple:
    """The registry's state as routing depends on it, in one statement, and the probation minimum set. Its fourth
    item is the stabilities' count, its last two the splits' digest and the minimum (routing/fit.py reads them).
    Production queries (feedback's, traffic/outcomes.py) are left out of the digest: the fit reads train and val
    only, and routing takes outcomes through the models' versions and traffic's corrections."""
    sql = _KEY_SQL
    if tx.dialect == "postgresql":      # other processes commit versions too, not in id order: their counts as well
        sql = sql.replace("(SELECT count(*) FROM version_stability),",
                          "(SELECT count(*) FROM version_stability), (SELECT count(*) FROM embedding_versions),"
                          " (SELECT count(*) FROM model_availability),")
    sql = sql.format(models=dialect.xor_hash(tx.dialect, "id, name, cost, params_b"),
                     splits=dialect.xor_hash(tx.dialect, "query_id, split"))
    return tuple(tx.sql(sql)[0]) + (evidence.configured_min(probation_min),)


def read(tx: Tx, probation_min: int | None = None) -> State | None:
    """The registry's routing state now: this Store's, or the one saved under the registry's key; None where there
    is none (the write path keeps one: routing/fit.py). Reads only."""
    k = key(tx, probation_min)
    kept = tx.section("routing state")
    st = kept.get("state")
    if st is not None and st.key == k:
        return st
    fields = load(tx, k)
    if fields is None:
        return None
    st = State(**fields, model=None, score=predictor(tx, fields["encoder_id"]).scorer(fields["z"]))
    kept["state"] = st
    return st


def corrected(tx: Tx, st: State) -> State:
    """`st` with traffic's corrections as last saved (`save_corrections`): a route from the shell and a server's
    snapshot add the same ones. One small row; `st` itself where there are none."""
    rows = tx.sql("SELECT payload FROM routing_states WHERE key = ?", [CORRECTIONS])
    c = served_scores.Corrections.from_json(rows[0][0]) if rows else None
    return dataclasses.replace(st, corrections=c) if c is not None and (c.category or c.exact) else st


def save_corrections(tx: Tx, c: served_scores.Corrections) -> None:
    """Traffic's corrections as they now stand, in place of the last (in the transaction that changed them)."""
    if tx.read_only:
        return
    # (an upsert: two replicas landing at once on PostgreSQL must not collide on the key; the later one stays)
    tx.sql("""INSERT INTO routing_states (key, encoder_id, payload) VALUES (?, 0, ?)
              ON CONFLICT (key) DO UPDATE SET payload = excluded.payload""", [CORRECTIONS, c.to_json()])


def remember(tx: Tx, st: State) -> State:
    """`st` as this Store's current state (what `read` gives while the registry's key is st's)."""
    tx.section("routing state")["state"] = st
    return st


_predictors: dict = {}       # checkpoint digest -> numpy_network.Predictor, parsed once per process


def predictor(tx: Tx, encoder_id: int) -> numpy_network.Predictor:
    """The encoder's predictor, read from its checkpoint in numpy (no torch)."""
    sha = tx.sql("SELECT weights_sha256 FROM encoders WHERE id = ?", [encoder_id])[0][0]
    if sha not in _predictors:
        blob = bytes(tx.sql("SELECT weights FROM encoders WHERE id = ?", [encoder_id])[0][0])
        _predictors[sha] = numpy_network.from_checkpoint(blob, numpy_network.read_header(blob)["config"])
    return _predictors[sha]


# --- saved in the registry ---------------------------------------------------------------------------------------
def key_text(k: tuple) -> str:
    """The saved state's key: the registry's (`key`) and the code that builds a routing state from it, its source and
    its settings as they are now: a state saved by another version of the code, or under other settings, is never
    read back."""
    return f"{FORMAT} {_code_digest()} {repr(tuple(k))}"


_sources: list = []


def _code_digest() -> str:
    """The sources of BUILT_BY and their settings (upper-case module constants written as literals, as set now: a
    module not imported has its source's), found without importing them: a reader need not load the fit."""
    if not _sources:
        texts = [open(str(_origin(m)), "rb").read() for m in BUILT_BY]
        literal = {}
        for m, text in zip(BUILT_BY, texts):
            for name, value in module_constants(text.decode()):
                literal[(m, name)] = value
        _sources.append((hashlib.sha256(b"".join(texts)).hexdigest(), literal))
    digest, literal = _sources[0]
    settings = [(m, k, getattr(sys.modules[m], k) if m in sys.modules else v) for (m, k), v in literal.items()]
    return hashlib.sha256((digest + repr(settings)).encode()).hexdigest()[:16]


_ASSIGNED = re.compile(r"^_*[A-Z][A-Z0-9_]*\s*=(?!=)", re.M)


def module_constants(source: str) -> list[tuple[str, Any]]:
    """A module's upper-case names assigned a literal at its top level, with their values: each such statement
    parsed alone (its first line, and the next until it parses), not the whole module (a tenth of a second of every
    command that reads a routing state)."""
    lines, out = source.splitlines(), []
    starts = {source.count("\n", 0, m.start()) for m in _ASSIGNED.finditer(source)}
    for at in sorted(starts):
        for end in range(at + 1, min(len(lines), at + 400) + 1):
            try:
                node = ast.parse("\n".join(lines[at:end])).body[0]
            except SyntaxError:
                continue
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    out.append((node.targets[0].id, ast.literal_eval(node.value)))
                except ValueError:
                    pass
            break
    return out


def _origin(module: str) -> str:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return spec.origin


def save(tx: Tx, st: State) -> bool:
    """Save `st` under its key (the oldest beyond KEPT go); False where nothing may be written (a read-only file)
    or the store saves none (a server). A state already saved under the key is the same state: kept as it is."""
    if tx.read_only or not tx.save_routing_state:
        return False
    arrays: dict[str, np.ndarray] = {}
    doc = {f.name: _encode(getattr(st, f.name), arrays) for f in dataclasses.fields(st) if f.name not in NOT_SAVED}
    buf = io.BytesIO()
    np.savez(buf, __doc__=np.frombuffer(json.dumps(doc).encode(), dtype=np.uint8), **arrays)  # type: ignore[arg-type]
    # (another process on the same PostgreSQL database may be saving the same state: the first one stays; a DuckDB
    # file has one writer, and its ON CONFLICT costs seconds on a payload of megabytes: asked first instead)
    k = key_text(st.key)
    if not tx.sql("SELECT 1 FROM routing_states WHERE key = ?", [k]):
        tx.sql("INSERT INTO routing_states (key, encoder_id, payload) VALUES (?, ?, ?)"
               + (" ON CONFLICT (key) DO NOTHING" if tx.postgres else ""), [k, int(st.encoder_id), buf.getvalue()])
    tx.sql(f"""DELETE FROM routing_states WHERE key LIKE '{FORMAT} %' AND key NOT IN (   -- (other caches beside)
                   SELECT key FROM routing_states WHERE key LIKE '{FORMAT} %' ORDER BY created DESC, key LIMIT ?)""",
           [KEPT])
    return True


def load(tx: Tx, k: tuple) -> dict | None:
    """The fields of the state saved under `k` (without its model and scorer), or None. A copy of its payload
    beside a DuckDB file (`<db>.index/routing-state.npz`, with the key and the row's creation time it copies) is
    read in its place: a payload of megabytes out of DuckDB took a fifth of a second of every `route`."""
    text = key_text(k)
    side = None if tx.postgres else database_file.sidecar(tx.path, "routing-state.npz")
    rows = tx.sql("SELECT created::VARCHAR FROM routing_states WHERE key = ?", [text])
    if not rows:
        return None
    stamp = f"{text}\n{rows[0][0]}".encode()
    arrays = _read_copy(side, stamp)
    if arrays is None:
        payload = bytes(tx.sql("SELECT payload FROM routing_states WHERE key = ?", [text])[0][0])
        _write_copy(side, stamp, payload)
        arrays = _arrays(io.BytesIO(payload))
    doc = json.loads(arrays.pop("__doc__").tobytes().decode())
    return {name: _decode(v, arrays) for name, v in doc.items()}


def _arrays(source) -> dict:
    with np.load(source, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


def _read_copy(side: Path | None, stamp: bytes) -> dict | None:
    """The arrays of the payload copied beside the file, where it copies the row `stamp` names (key and creation
    time). Read from the file where they lie (the archive reader skips the stamp before it): no copy of the payload
    in memory first."""
    head = len(stamp).to_bytes(8, "little") + stamp
    try:
        if side is None:
            return None
        with open(side, "rb") as f:
            if f.read(len(head)) != head:
                return None
            return _arrays(f)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):   # (none yet, or cut short: the row is read)
        return None


def _write_copy(side: Path | None, stamp: bytes, payload: bytes) -> None:
    """Best effort, whole or not at all (os.replace): the copy only saves the next process a read."""
    database_file.write_whole(side, lambda tmp: tmp.write_bytes(len(stamp).to_bytes(8, "little") + stamp + payload))


def load_newest(tx: Tx, names: tuple[str, ...]) -> dict | None:
    """These fields of the newest state saved by this code (under any key), or None: what a state built anew may take
    from it where its inputs are the same (routing/fit.py). Only those fields' arrays are read."""
    rows = tx.sql("SELECT payload FROM routing_states WHERE key LIKE ? ORDER BY created DESC, key LIMIT 1",
                  [f"{FORMAT} {_code_digest()} %"])
    if not rows:
        return None
    with np.load(io.BytesIO(bytes(rows[0][0])), allow_pickle=False) as npz:
        doc = json.loads(npz["__doc__"].tobytes().decode())
        return {name: _decode(doc[name], _Lazy(npz)) for name in names if name in doc}


class _Lazy(dict):
    """An .npz's arrays, each read when a decoded field asks for it."""

    def __init__(self, npz):
        super().__init__()
        self.npz = npz

    def __missing__(self, name):
        return self.npz[name]


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
        cls: Any = getattr(importlib.import_module(module), name)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise ValueError(f"a saved routing state names {obj['$dataclass']}, which is not a dataclass")
        return cls(**{k: _decode(v, arrays) for k, v in obj["fields"].items()})
    return {k: _decode(v, arrays) for k, v in obj.items()}
