"""The correctness predictor's P(correct) in numpy, from its weights (float64): what routing scores with. For a few
queries torch's per-op overhead costs more than the arithmetic (31 models x 64 hidden units), and a command that
reads the weights from a checkpoint's safetensors bytes (`from_checkpoint`) routes without importing torch at all.
network.LocusModel.scorer builds one from its own parameters and checks it against torch once."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from registry.locus import label_columns

BLOCKS = ("q_proj", "w_z", "w_u", "w_zu", "head", "q_bias", "q_cat")   # what scores a (model, query) pair


def gather_offsets(offsets, ids):
    """Offsets [M, C+1] (model x category row) and ids [N] or [N, columns] -> [M, N]: each query's offset, summed
    over its columns' rows (torch or numpy)."""
    o = offsets[:, ids]
    return o if ids.ndim == 1 else o.sum(-1)


def category_positions(categories: tuple, columns: tuple) -> dict:
    """The vocabulary's rows: one column: name -> row; several: (column's position, value) -> row (row 0: none)."""
    if len(columns) == 1:
        return {c: i + 1 for i, c in enumerate(categories)}
    return {(columns.index(c.split(":", 1)[0]), c.split(":", 1)[1]): i + 1 for i, c in enumerate(categories)}


def category_ids(names, positions: dict, n_cols: int) -> np.ndarray:
    """Category names [N] (None, "(none)" or a name outside the vocabulary: row 0) -> ids [N] int64; with several
    columns, names are labels (label_columns: the values joined) -> ids [N, columns]."""
    if n_cols == 1:
        return np.fromiter((positions.get(n, 0) if isinstance(n, str) else 0 for n in names), dtype=np.int64,
                           count=len(names))
    out = np.zeros((len(names), n_cols), dtype=np.int64)
    for i, label in enumerate(names):
        for k, v in enumerate(label_columns.split(label, n_cols)):
            out[i, k] = positions.get((k, v), 0)
    return out


@dataclass
class Predictor:
    w: dict                               # block parameter name -> float64 array (BLOCKS' parameters)
    query_bias: bool = False
    categories: tuple = ()                # the vocabulary (EncoderConfig.categories); () = text only
    category_field: str = "category"
    positions: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.categories = tuple(self.categories)
        self.columns = label_columns.parse(self.category_field) or ("category",)
        self.positions = category_positions(self.categories, self.columns) if self.categories else {}

    def category_ids(self, names) -> np.ndarray | None:
        if names is None or not self.categories:
            return None
        return category_ids(names, self.positions, len(self.columns))

    def scorer(self, z):
        """(q [N,Dq], categories [N] names or None) -> P(correct) [M,N] float32 for fixed embeddings z [M,D], with
        z's half of the predictor computed once."""
        w = self.w
        zd = np.asarray(z, dtype=np.float64)
        a = zd @ w["w_z.weight"].T + w["w_z.bias"]                                # [M,Hd]
        M, Hd = a.shape
        Wzu = w["w_zu.weight"]                                                    # [Hd,D]
        zw = []        # z's side of w_zu(z * u) [M*Hd,D]: built on the first batch of more queries than models
        Wq, bq, Wu = w["q_proj.weight"], w["q_proj.bias"], w["w_u.weight"]
        head, hb = w["head.weight"][0], float(w["head.bias"][0])
        qb = (w["q_bias.weight"][0], float(w["q_bias.bias"][0])) if self.query_bias else None
        E = w.get("q_cat.weight") if self.categories else None                   # [C+1,D+1] or None (text only)
        offsets = None if E is None else zd @ E[:, :-1].T + E[:, -1]             # [M,C+1]

        def fast(q, categories=None, chunk: int = 2048):
            out = np.empty((M, len(q)), dtype=np.float32)
            ids = self.category_ids(categories)
            for s in range(0, len(q), chunk):
                u = np.asarray(q[s:s + chunk], dtype=np.float64) @ Wq.T + bq     # [n,D]
                n = len(u)
                # w_zu(z * u)[m,h,n] = sum_d z[m,d] Wzu[h,d] u[n,d]: the same sum grouped on the smaller side, so a
                # server's scorer (hundreds of models, a few queries per route, one scorer per snapshot) never
                # builds the [M*Hd,D] block, and an evaluation's (thousands of queries) builds it once
                if zw or n > M:
                    if not zw:
                        zw.append((zd[:, None, :] * Wzu[None]).reshape(M * Hd, -1))
                    zu = (zw[0] @ u.T).reshape(M, Hd, n)                          # [M,Hd,n]
                else:
                    zu = (zd @ (u[:, None, :] * Wzu[None]).reshape(n * Hd, -1).T).reshape(M, n, Hd).transpose(0, 2, 1)
                pre = zu + a[:, :, None] + (u @ Wu.T).T[None]
                o = np.einsum("mhn,h->mn", np.maximum(pre, 0.0), head) + hb
                if qb is not None:
                    o = o + (u @ qb[0] + qb[1])[None]
                if offsets is not None and ids is not None:
                    o = o + gather_offsets(offsets, ids[s:s + chunk])
                out[:, s:s + chunk] = 1.0 / (1.0 + np.exp(-o))
            return out

        return fast


def from_checkpoint(blob: bytes, config: dict) -> Predictor:
    """The predictor of a LOCUS checkpoint (safetensors bytes; its config from checkpoint.read_header), read with
    safetensors' numpy loader: no torch."""
    from safetensors.numpy import load

    w = {k: v.astype(np.float64) for k, v in load(bytes(blob)).items() if k.split(".")[0] in BLOCKS}
    return Predictor(w, query_bias=bool(config.get("query_bias", False)),
                     categories=tuple(str(c) for c in config.get("categories", ())),
                     category_field=config.get("category_field", "category"))
