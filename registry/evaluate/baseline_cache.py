"""`evaluate`'s baselines (best single, per-category, per-source, KNN, MF, IRT) kept in the registry: each one's
scores on the evaluated split and the settings it chose on val, fitted once per state of the data they read and of
the code that fits them, so that asking again with unchanged data costs a read (IRT alone trains for a minute on
MMLU-Pro). Stored beside the routing state (table routing_states, a cache of derived values) under a key of their own;
scores are saved as the arrays they were, so a figure read back is the figure fitted.
"""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np

from registry.core.transaction import Tx

FORMAT = "evaluate-baselines/1"
KEPT = 6              # saved sets kept (baselines and served scores per split evaluated, and older ones): KBs each


def key_text(data, split: str, idx: np.ndarray, seed: int, *, caller: str, sources: tuple = (),
             arrays: tuple = ()) -> str:
    """The key of the baselines of `data` on `split`: everything they read (answers, splits, models, query vectors,
    categories, sources), the split's queries, the seed, and the source of the code that fits them (locus/baselines,
    evaluate/pair_baselines, this module, and `caller`'s file, which calls them); `sources` and `arrays`: more files
    and values read (the served policy's: its modules, the embeddings and the evidence behind them)."""
    from registry.evaluate import pair_baselines
    from registry.locus import baselines

    h = hashlib.sha256()
    for source in (baselines.__file__, pair_baselines.__file__, __file__, caller, *sources):
        h.update(Path(source).read_bytes())
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(data.digest().encode())
    for a in (data.qvecs, idx, np.asarray([seed])):
        h.update(np.ascontiguousarray(a).tobytes())
    for labels in (data.categories, data.sources):
        h.update(b"\x00" if labels is None else "\x1f".join(map(str, labels)).encode())
    return f"{FORMAT} {split} {h.hexdigest()}"


class BaselineCache:
    """`get(name, fit)`: a baseline's (scores, settings) as saved under the key, else `fit()`'s, kept for `save`."""

    def __init__(self, tx: Tx, key: str, *, enabled: bool = True):
        self.tx, self.key = tx, key
        self.found: dict[str, tuple[np.ndarray, dict]] = {}     # name -> (scores, settings), read
        self.fitted: dict[str, tuple[np.ndarray, dict]] = {}    # and fitted now
        rows = tx.sql("SELECT payload FROM routing_states WHERE key = ?", [key]) if enabled else []
        if rows:
            with np.load(io.BytesIO(bytes(rows[0][0])), allow_pickle=False) as npz:
                doc = json.loads(npz["__doc__"].tobytes().decode())
                self.found = {name: (npz[name], settings) for name, settings in doc.items()}

    def get(self, name: str, fit) -> tuple[np.ndarray, dict]:
        if name in self.found:
            return self.found[name]
        self.fitted[name] = fit()
        return self.fitted[name]

    @property
    def hits(self) -> list[str]:
        return sorted(self.found)

    def save(self, encoder_id: int) -> bool:
        """Write what was fitted now beside what was read (nothing where the file is read-only or the store keeps
        no saved state, as a server's does); the oldest saved sets beyond KEPT go."""
        if not self.fitted or self.tx.read_only or not self.tx.save_routing_state:
            return False
        kept = {**self.found, **self.fitted}
        buf = io.BytesIO()
        doc = {name: settings for name, (_, settings) in kept.items()}
        text = json.dumps(doc, default=lambda o: o.item() if isinstance(o, np.generic) else o.tolist())
        # (allow_pickle: numpy's default, named so that its types take every other keyword for an array)
        np.savez(buf, allow_pickle=True, __doc__=np.frombuffer(text.encode(), dtype=np.uint8),
                 **{name: np.asarray(scores) for name, (scores, _) in kept.items()})
        self.tx.sql("DELETE FROM routing_states WHERE key = ?", [self.key])
        self.tx.sql("INSERT INTO routing_states (key, encoder_id, payload) VALUES (?, ?, ?)",
                    [self.key, int(encoder_id), buf.getvalue()])
        self.tx.sql(f"""DELETE FROM routing_states WHERE key LIKE '{FORMAT} %' AND key NOT IN (
                           SELECT key FROM routing_states WHERE key LIKE '{FORMAT} %'
                           ORDER BY created DESC, key LIMIT ?)""", [KEPT])
        return True
