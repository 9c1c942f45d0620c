"""The LOCUS network in numpy, from its checkpoint's weights: the set encoder's forward pass (evaluations -> z, what
registration, onboarding and `similar --evals` run) and the correctness predictor's P(correct) (what routing scores
with). A command that reads the weights from a checkpoint's safetensors bytes (`NumpyLocus.from_checkpoint`) embeds
and routes without importing torch at all, and for a few queries or one small set torch's per-op overhead costs more
than the arithmetic. network.LocusModel is the torch original (training); both are checked against each other.
A checkpoint's header is read here too (`read_header`, no torch), and a query's label, what the predictor reads as
its category (`label_columns`, `label_sql`, `join_labels`, `split_label`)."""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field

import numpy as np

# --- a query's label: what the predictor reads as its category ---------------------------------------------------
# Its values of the metadata columns a predictor may read, one column ("category", "source") or several read together
# ("category+source": the source's offsets fitted on top of the category's, category_rows.fit_category_rows). A label
# is one string either way, so every reader of labels (routing's content hash -> label map, the evaluation arrays,
# the probes) passes it on as it did a category name: several columns' values are joined by LABEL_SEP, and only the
# predictor (`category_ids`) splits them.
LABEL_FIELDS = ("category", "source")   # the query columns a predictor may read
LABEL_SEP = "\x1f"                       # joins one query's values of several columns (ASCII unit separator)
NO_LABEL = "(none)"                     # the evaluation arrays' name for a missing value (Dataset): no category


def label_columns(field: str) -> tuple[str, ...] | None:
    """"category", "source" or columns joined by "+" (each once) -> the columns in order; None if not valid."""
    cols = tuple(str(field).split("+"))
    return cols if all(c in LABEL_FIELDS for c in cols) and len(set(cols)) == len(cols) else None


def label_sql(field: str, alias: str = "") -> str:
    """The SQL expression of a query's label (a field `label_columns` accepts): the column itself for one column,
    the values joined by LABEL_SEP (a missing one as '') for several."""
    cols = [f"{alias}.{c}" if alias else c for c in label_columns(field) or ()]
    return cols[0] if len(cols) == 1 else " || chr(31) || ".join(f"coalesce({c}, '')" for c in cols)


def join_labels(columns) -> np.ndarray:
    """Several columns' values [N] each -> the labels [N] (object); a single column is returned as it is."""
    if len(columns) == 1:
        return columns[0]
    return np.array([LABEL_SEP.join("" if v is None else str(v) for v in vals) for vals in zip(*columns)], dtype=object)


def split_label(label, n: int) -> list:
    """A label of n columns -> its n values (None where missing or not a string; a label with fewer parts is
    read as having the first ones)."""
    parts = label.split(LABEL_SEP) if isinstance(label, str) else []
    values: list[str | None] = [p if p not in ("", NO_LABEL) else None for p in parts[:n]]
    return values + [None] * (n - len(values))


@dataclass
class EncoderConfig:
    d_query: int = 384     # query-vector width (MiniLM)
    d_model: int = 128     # encoder width, and the width of z and u
    n_inducing: int = 64   # ISAB inducing points
    n_heads: int = 4
    n_isab: int = 2
    d_hidden: int = 64     # predictor MLP hidden width
    dropout: float = 0.1
    query_bias: bool = False  # predictor adds a per-query logit bias from u alone (difficulty)
    categories: tuple = ()    # query-category vocabulary: logit += [z, 1] . row(category), row 0 (zero) for
                              # a query without one or with one not listed; () = text only (every checkpoint made
                              # before the field: it is written only when not empty). With several columns, each
                              # name is "column:value" and a query's rows (one per column) add up
    category_field: str = "category"   # the query column(s) the vocabulary names: "category", "source", or several
                                       # joined by "+" ("category+source"; label_columns)

    def __post_init__(self):
        self.categories = tuple(str(c) for c in self.categories)   # JSON gives a list back
        cols = label_columns(self.category_field)
        if cols is None:
            raise ValueError(f"category_field must be 'category', 'source' or both joined by '+', "
                             f"got {self.category_field!r}")
        if len(cols) > 1 and any(c.split(":", 1)[0] not in cols or ":" not in c for c in self.categories):
            raise ValueError(f"with category_field {self.category_field!r} every category is named 'column:value'")

    @property
    def category_columns(self) -> tuple[str, ...]:
        return label_columns(self.category_field) or ()       # (checked in __post_init__: never None here)


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
    columns, names are labels (join_labels: the values joined) -> ids [N, columns]."""
    if n_cols == 1:
        return np.fromiter((positions.get(n, 0) if isinstance(n, str) else 0 for n in names), dtype=np.int64,
                           count=len(names))
    out = np.zeros((len(names), n_cols), dtype=np.int64)
    for i, label in enumerate(names):
        for k, v in enumerate(split_label(label, n_cols)):
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
        self.columns = label_columns(self.category_field) or ("category",)
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
        Wzu, Wz, bz = w["w_zu.weight"], w["w_z.weight"], w["w_z.bias"]            # [Hd,D], [Hd,D], [Hd]
        M, Hd = len(zd), len(bz)
        # z's side of w_zu(z * u) [M*Hd,D] and w_z(z) [M,Hd]: built on the first batch of more queries than models
        # (a route of a few texts never needs them: a scorer of 10,031 models is made in 1.5 ms, not 7-26)
        zw, z32 = [], []                  # (each built on first use: the many-queries block, z in float32)
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
                        zw.extend([(zd[:, None, :] * Wzu[None]).reshape(M * Hd, -1), zd @ Wz.T + bz])
                    zu = (zw[0] @ u.T).reshape(M, Hd, n)                          # [M,Hd,n]
                    pre = zu + zw[1][:, :, None] + (u @ Wu.T).T[None]
                    o = np.einsum("mhn,h->mn", np.maximum(pre, 0.0), head) + hb
                else:
                    # w_z(z) + w_zu(z * u) = z (W_z + W_zu u)^T + b_z: one product per model and query
                    if not z32:
                        z32.append(zd.astype(np.float32))
                    o = few_queries(z32[0], (u[:, None, :] * Wzu[None] + Wz[None]).reshape(n * Hd, -1).T,
                                    (u @ Wu.T).T + bz[:, None], head) + hb
                if qb is not None:
                    o = o + (u @ qb[0] + qb[1])[None]
                if offsets is not None and ids is not None:
                    o = o + gather_offsets(offsets, ids[s:s + chunk])
                out[:, s:s + chunk] = 1.0 / (1.0 + np.exp(-o))
            return out

        return fast


BLOCK_BYTES = 1 << 20     # `few_queries`: its [models, n*Hd] float32 block at most this size ...
ROWS = (16, 500)          # ... of at least / at most this many models (one query: 125 KB, under the 128 KB at
#                           which a server's malloc maps a block afresh per call, serve/app.py `bound_malloc`)


def few_queries(z32: np.ndarray, zu_of: np.ndarray, bias: np.ndarray, head: np.ndarray) -> np.ndarray:
    """The predictor's output before its bias [M,n] for a few queries: z32 [M,D] the embeddings (float32), zu_of
    [D,n*Hd] the queries' side of w_z(z) + w_zu(z * u), bias [Hd,n] the rest of the hidden layer (w_u(u) and w_z's
    bias), head [Hd]."""
    # (float32, as the network was trained: the [M,D] x [D,Hd] product is a route's cost among ten thousand models,
    # and float32 halves it; its outputs differ from float64's by ~1e-7. A few models at a time into one block: a
    # server routes one text at a time, and temporaries of megabytes are pages mapped afresh per route)
    Hd, n = bias.shape
    M = len(z32)
    out = np.empty((M, n))
    zu32, bias32, head32 = (np.asarray(a, dtype=np.float32) for a in (zu_of, bias.T, head))   # [D,n*Hd] [n,Hd] [Hd]
    step = max(1, min(M, max(ROWS[0], min(ROWS[1], BLOCK_BYTES // (4 * n * Hd)))))
    block = np.empty((step, n * Hd), dtype=np.float32)
    for at in range(0, M, step):
        m = min(step, M - at)
        pre = np.matmul(z32[at:at + m], zu32, out=block[:m])                            # [m,n*Hd]
        by_query = pre.reshape(m, n, Hd)
        by_query += bias32
        np.maximum(pre, 0.0, out=pre)
        out[at:at + m] = by_query @ head32                                                 # [m,n]
    return out


FORMAT = "locus-checkpoint/1"      # a checkpoint's header (checkpoint.py writes it)
HEADER_KEY = "locus"


def read_header(blob: bytes) -> dict:
    """{"format", "config", "meta"} from the safetensors JSON header, checked by hand before any tensor is parsed;
    anything else raises ValueError. Needs neither torch nor safetensors."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise ValueError("checkpoint must be bytes")
    blob = bytes(blob)
    (n,) = struct.unpack("<Q", blob[:8]) if len(blob) >= 8 else (0,)
    if n == 0 or 8 + n > len(blob) or blob[8:9] != b"{":
        # the structure is checked first: a safetensors header length can itself start with 0x80 or "PK"
        if blob[:1] == b"\x80" or blob[:2] == b"PK":
            raise ValueError("checkpoint is a pickle / torch.save file, not safetensors; refusing to load it")
        raise ValueError("not a safetensors checkpoint (too short)" if len(blob) < 8 else
                         "not a safetensors checkpoint (bad header)")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
        text = header["__metadata__"][HEADER_KEY]
        info = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"not a LOCUS safetensors checkpoint: {e}") from None
    if not isinstance(info, dict) or info.get("format") != FORMAT:
        raise ValueError(f"unknown checkpoint format {info.get('format') if isinstance(info, dict) else info!r}")
    if not isinstance(info.get("config"), dict) or not isinstance(info.get("meta"), dict):
        raise ValueError("checkpoint header lacks its config or meta object")
    return info


def from_checkpoint(blob: bytes, config: dict) -> Predictor:
    """The predictor of a LOCUS checkpoint (safetensors bytes; its config from read_header), read with
    safetensors' numpy loader: no torch."""
    from safetensors.numpy import load

    w = {k: v.astype(np.float64) for k, v in load(bytes(blob)).items() if k.split(".")[0] in BLOCKS}
    return Predictor(w, query_bias=bool(config.get("query_bias", False)),
                     categories=tuple(str(c) for c in config.get("categories", ())),
                     category_field=config.get("category_field", "category"))


# --- the set encoder ------------------------------------------------------------------------------------------------
LN_EPS = 1e-5      # torch.nn.LayerNorm's default, what the checkpoints were trained with


def _linear(w: dict, name: str, x):
    return x @ w[name + ".weight"].T + w[name + ".bias"]


def _layer_norm(w: dict, name: str, x):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + LN_EPS) * w[name + ".weight"] + w[name + ".bias"]


def _mab(w: dict, name: str, x, y, y_mask, n_heads: int):
    # x [B,Nx,D] queries; y [B,Ny,D] keys/values; y_mask [B,Ny] bool (True = attend) or None -> [B,Nx,D]
    B, Nx, D = x.shape
    Ny, H = y.shape[1], n_heads
    def split(t, n):
        return t.reshape(B, n, H, D // H).transpose(0, 2, 1, 3)                       # [B,H,n,D/H]

    q, k, v = (split(_linear(w, f"{name}.{p}", t), n) for p, t, n in (("q", x, Nx), ("k", y, Ny), ("v", y, Ny)))
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D // H)                                # [B,H,Nx,Ny]
    if y_mask is not None:
        s = np.where(y_mask[:, None, None, :], s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    a = (s / s.sum(-1, keepdims=True)) @ v                                             # [B,H,Nx,D/H]
    a = a.transpose(0, 2, 1, 3).reshape(B, Nx, D)
    h = _layer_norm(w, f"{name}.ln1", x + _linear(w, f"{name}.o", a))
    ff = _linear(w, f"{name}.ff.2", np.maximum(_linear(w, f"{name}.ff.0", h), 0.0))
    return _layer_norm(w, f"{name}.ln2", h + ff)                                       # [B,Nx,D]


@dataclass
class SetEncoder:
    """The set encoder's forward pass (network.LocusModel.embed_proj's), in the weights' dtype (float32, as torch
    runs it: the same set's z agrees with torch's to about 1e-7)."""
    w: dict                               # parameter name -> array: inp, isabs.*, pma.*, out
    d_query: int
    n_heads: int
    n_isab: int

    def row_proj(self, q):
        """q [...,Dq] -> (P, S) [...,D]: the query parts of the input layer (LocusModel.row_proj)."""
        W, dq = self.w["inp.weight"], self.d_query
        q = np.asarray(q, dtype=W.dtype)
        return q @ W[:, :dq].T, q @ W[:, dq + 1:].T

    def embed_proj(self, P, S, y, mask):
        # P, S [B,N,D], y [B,N] 0/1, mask [B,N] bool or None -> z [B,D]
        w = self.w
        y = np.asarray(y, dtype=P.dtype)[..., None]                                    # [B,N,1]
        h = P + (2 * y - 1) * S + y * w["inp.weight"][:, self.d_query] + w["inp.bias"]
        if mask is not None:
            if mask.all():
                mask = None
            else:
                h = np.where(mask[..., None], h, 0.0).astype(P.dtype)
        for i in range(self.n_isab):
            ind = np.broadcast_to(w[f"isabs.{i}.inducing"], (h.shape[0], *w[f"isabs.{i}.inducing"].shape[1:]))
            hi = _mab(w, f"isabs.{i}.mab_in", ind, h, mask, self.n_heads)              # [B,K,D]
            h = _mab(w, f"isabs.{i}.mab_out", h, hi, None, self.n_heads)               # [B,N,D]
        seeds = np.broadcast_to(w["pma.seeds"], (h.shape[0], *w["pma.seeds"].shape[1:]))
        return _linear(w, "out", _mab(w, "pma.mab", seeds, h, mask, self.n_heads)[:, 0])   # [B,D]

    def embed(self, q, y, mask):
        # q [B,N,Dq], y [B,N], mask [B,N] bool -> z [B,D]
        q = np.where(mask[..., None], q, 0.0)
        P, S = self.row_proj(q)
        return self.embed_proj(P, S, y, mask)


class NumpyLocus:
    """A checkpoint's network for every command that does not train: `cfg`, `embed`, `embed_proj`, `row_proj`,
    `scorer`, `p_correct`, `category_ids` in numpy; anything else (a baseline's or evaluate's torch use) is read from
    the torch model, built from the same bytes the first time it is asked for."""

    def __init__(self, blob: bytes, cfg, *, torch_loader=None):
        from safetensors.numpy import load

        self.cfg = cfg
        self._blob, self._torch_loader, self._torch = bytes(blob), torch_loader, None
        w = load(self._blob)
        self.encoder = SetEncoder({k: v for k, v in w.items() if k.split(".")[0] in ("inp", "isabs", "pma", "out")},
                                  d_query=cfg.d_query, n_heads=cfg.n_heads, n_isab=cfg.n_isab)
        self.predictor = Predictor({k: v.astype(np.float64) for k, v in w.items() if k.split(".")[0] in BLOCKS},
                                   query_bias=cfg.query_bias, categories=cfg.categories,
                                   category_field=cfg.category_field)
        self.row_proj, self.embed_proj, self.embed = self.encoder.row_proj, self.encoder.embed_proj, self.encoder.embed
        self.category_ids = self.predictor.category_ids
        self.numpy_scorer_agrees = True      # it is the numpy scorer

    def scorer(self, z):
        return self.predictor.scorer(np.asarray(z, dtype=np.float32))

    def p_correct(self, z, q, categories=None):
        return self.scorer(z)(q, categories)

    def torch_model(self):
        """The same network as a torch LocusModel (eval mode), built once."""
        if self._torch is None:
            self._torch = self._torch_loader(self._blob)
        return self._torch

    def __getattr__(self, name):          # only for what numpy does not run: the torch model's own
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.torch_model(), name)
