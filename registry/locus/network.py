"""LOCUS networks: a set encoder (evaluations of one model -> embedding z) and a correctness predictor (z, q -> logit).

Shapes: B = models in a batch, N = rows (evaluations) per set, Dq = query-vector width, D = d_model, H = heads,
K = inducing points. Masks are bool with True = real row; padded rows never reach z (every attention over the set
masks them, and they are zeroed on entry). Blocks follow the Set Transformer paper (Lee et al. 2019): MAB, ISAB, PMA.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from registry.locus.numpy_network import (
    BLOCKS,
    LABEL_SEP,
    EncoderConfig,
    Predictor,
    category_ids,
    category_positions,
    gather_offsets,
)


class MAB(nn.Module):
    """Multihead attention block: MAB(X, Y) = LN(H + rFF(H)), H = LN(X + Attn(X, Y, Y))."""

    def __init__(self, d: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, y, y_mask=None, *, q=None, k=None, v=None):
        # x [B,Nx,D] queries; y [B,Ny,D] keys/values; y_mask [B,Ny] bool or None (all real); q [B,Nx,D], k, v
        # [B,Ny,D]: the projections when known already (then y may be None)
        B, Nx, D = x.shape
        Ny, H = (y if k is None else k).shape[1], self.n_heads
        def split(t, n):
            return t.view(B, n, H, D // H).transpose(1, 2)                    # [B,H,n,D/H]

        q = split(self.q(x) if q is None else q, Nx)
        k, v = split(self.k(y) if k is None else k, Ny), split(self.v(y) if v is None else v, Ny)
        attn_mask = None if y_mask is None else y_mask[:, None, None, :]      # [B,1,1,Ny] True = attend
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)     # [B,H,Nx,D/H]
        a = a.transpose(1, 2).reshape(B, Nx, D)                              # [B,Nx,D]
        h = self.ln1(x + self.drop(self.o(a)))
        return self.ln2(h + self.drop(self.ff(h)))                           # [B,Nx,D]


class ISAB(nn.Module):
    """Induced set attention: K learned points read the (masked) set, then the set reads them back: O(N*K)."""

    def __init__(self, d: int, n_heads: int, n_inducing: int, dropout: float):
        super().__init__()
        self.inducing = nn.Parameter(torch.randn(1, n_inducing, d) / d ** 0.5)  # [1,K,D]
        self.mab_in = MAB(d, n_heads, dropout)
        self.mab_out = MAB(d, n_heads, dropout)

    def forward(self, x, mask):
        # x [B,N,D], mask [B,N]
        h = self.mab_in(self.inducing.expand(x.shape[0], -1, -1), x, mask)   # [B,K,D], padded rows masked out
        return self.mab_out(x, h)                                            # [B,N,D]; padded rows: junk, never read


class PMA(nn.Module):
    """Pooling by multihead attention with learned seeds: [B,N,D] -> [B,S,D]."""

    def __init__(self, d: int, n_heads: int, n_seeds: int, dropout: float):
        super().__init__()
        self.seeds = nn.Parameter(torch.randn(1, n_seeds, d) / d ** 0.5)     # [1,S,D]
        self.mab = MAB(d, n_heads, dropout)

    def forward(self, x, mask):
        return self.mab(self.seeds.expand(x.shape[0], -1, -1), x, mask)      # [B,S,D]

    def pool(self, x):
        # x [B,N,D] unpadded -> [B,D]: forward(x, None)[:, 0] of one seed in eval mode, without every row's keys
        # and values: the seed's score of a row is x . (W_k^T q) per head (its q . b_k is the same for every row,
        # so softmax drops it), and its output W_v (sum_i a_i x_i) + b_v, as the weights sum to 1
        mab, H = self.mab, self.mab.n_heads
        B, N, D = x.shape
        q = mab.q(self.seeds[0, 0]).view(H, D // H, 1)                      # [H,D/H,1]
        u = (mab.k.weight.view(H, D // H, D) * q).sum(1) * (D // H) ** -0.5  # [H,D]
        a = torch.softmax(x @ u.T, dim=1)                                    # [B,N,H]
        pooled = a.transpose(1, 2) @ x                                       # [B,H,D]
        vals = (pooled[:, :, None, :] * mab.v.weight.view(H, D // H, D)).sum(-1) + mab.v.bias.view(H, D // H)
        h = mab.ln1(self.seeds[0] + mab.o(vals.reshape(B, D)))              # [B,D]
        return mab.ln2(h + mab.ff(h))


class LocusModel(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.cfg = cfg
        d, dq = cfg.d_model, cfg.d_query
        # encoder
        self.inp = nn.Linear(2 * dq + 1, d)                                  # row [q, y, q*(2y-1)] -> D
        self.isabs = nn.ModuleList(ISAB(d, cfg.n_heads, cfg.n_inducing, cfg.dropout) for _ in range(cfg.n_isab))
        self.pma = PMA(d, cfg.n_heads, 1, cfg.dropout)
        self.out = nn.Linear(d, d)
        # predictor ("decoder"): first layer split into the z, u and z*u parts so M x N scoring never builds [M,N,3D]
        self.q_proj = nn.Linear(dq, d)                                       # u = Linear(q)
        self.w_z = nn.Linear(d, cfg.d_hidden)                                # carries the hidden bias
        self.w_u = nn.Linear(d, cfg.d_hidden, bias=False)
        self.w_zu = nn.Linear(d, cfg.d_hidden, bias=False)
        self.head = nn.Linear(cfg.d_hidden, 1)
        self.drop = nn.Dropout(cfg.dropout)
        if cfg.query_bias:
            self.q_bias = nn.Linear(d, 1)                                    # difficulty: logit += q_bias(u)
        if cfg.categories:
            # each category's row, read against the model embedding: a per-(model, category) logit offset that
            # depends on z only, so a model embedded later gets its own (category_rows.fit_category_rows); created last
            # and at zero, so the other weights start as a text-only model's would
            self.q_cat = nn.Embedding(len(cfg.categories) + 1, d + 1)        # row 0: no or unknown category (zero)
            nn.init.zeros_(self.q_cat.weight)
        self._cat_pos = category_positions(cfg.categories, cfg.category_columns)   # name (or column, value) -> row

    def row_proj(self, q):
        """q [...,Dq] -> (P, S) [...,D]: the query parts of the input layer. A row [q, y, q*(2y-1)] enters as
        P + (2y-1) * S + y * w_y + b, so P and S can be computed once per query and shared by every model's set."""
        dq = self.cfg.d_query
        w = self.inp.weight                                                  # [D, 2Dq+1]
        return F.linear(q, w[:, :dq]), F.linear(q, w[:, dq + 1:])

    def embed_proj(self, P, S, y, mask):
        # P, S [B,N,D] (row_proj of the rows' query vectors), y [B,N] 0/1, mask [B,N] bool or None -> z [B,D]
        y = y.to(P.dtype)[..., None]                                         # [B,N,1]
        h = P + (2 * y - 1) * S + y * self.inp.weight[:, self.cfg.d_query] + self.inp.bias   # = inp([q, y, q*(2y-1)])
        if mask is not None:
            if bool(mask.all()):
                mask = None                                                  # no padding: unmasked attention
            else:
                h = h.masked_fill(~mask[..., None], 0.0)                     # padded values never enter, even NaN
        for isab in self.isabs:
            h = isab(h, mask)                                                # [B,N,D]
        return self.out(self.pma(h, mask)[:, 0])                             # [B,D]

    def first_rows(self, P, S):
        # P, S [R,D] (row_proj of R queries) -> [R,2,4,D]: for y = 0 and 1, the input row h of each query and the
        # first ISAB's q (the set reading its inducing points back), k and v (the points reading the set) of it:
        # they depend on the query and y alone, so bulk embedding computes them once a query, not once a row
        first, out = self.isabs[0], []
        for y in (0.0, 1.0):
            h = P + (2 * y - 1) * S + y * self.inp.weight[:, self.cfg.d_query] + self.inp.bias   # as embed_proj's
            out.append(torch.stack([h, first.mab_out.q(h), first.mab_in.k(h), first.mab_in.v(h)], 1))
        return torch.stack(out, 1)

    def embed_rows(self, rows):
        # rows [B,N,4,D]: first_rows at each row's query and y, unpadded -> z [B,D], embed_proj's in eval mode
        h, q1, k1, v1 = rows.unbind(2)                                       # [B,N,D] each
        first = self.isabs[0]
        points = first.mab_in(first.inducing.expand(h.shape[0], -1, -1), None, None, k=k1, v=v1)   # [B,K,D]
        h = first.mab_out(h, points, q=q1)                                   # [B,N,D]
        for isab in self.isabs[1:]:
            h = isab(h, None)
        return self.out(self.pma.pool(h))                                    # [B,D]

    def embed(self, q, y, mask):
        # q [B,N,Dq] float, y [B,N] float 0/1, mask [B,N] bool -> z [B,D]
        q = q.masked_fill(~mask[..., None], 0.0)                             # padded values never enter, even NaN
        P, S = self.row_proj(q)
        return self.embed_proj(P, S, y, mask)

    def category_ids(self, names) -> np.ndarray | None:
        """Category names [N] (None, "(none)" or a name outside the vocabulary: row 0) -> ids [N] int64, or None for
        a text-only model or when no names are given. With several columns, names are labels
        (numpy_network.join_labels: the values joined) -> ids [N, columns], each column's row 0 where its value is
        missing or unknown."""
        if names is None or not self.cfg.categories:
            return None
        return category_ids(names, self._cat_pos, len(self.cfg.category_columns))

    def query_proj(self, q):
        return self.q_proj(q)                                                # [N,Dq] -> u [N,D]

    def category_offsets(self, z):
        """z [M,D] -> [M,C+1]: each model's logit offset on each category (column 0, none: 0). In float64: the rows
        are a least-norm fit over close embeddings, large enough that float32 would lose 1e-4 of a logit."""
        w = self.q_cat.weight.double()                                       # [C+1,D+1]
        return (z.double() @ w[:, :-1].T + w[:, -1]).to(z.dtype)

    def predict_logits(self, z, q, chunk_elems: int = 1 << 24, cat=None):
        # z [M,D], q [N,Dq], cat [N] int64 category ids or None (none) -> logits [M,N]; u is computed once per
        # query, the z*u term as M*Hd rows x N matmul
        u = self.query_proj(q)                                               # [N,D]
        out = self.logits_from_u(z, u, chunk_elems)
        if self.cfg.categories and cat is not None:
            out = out + gather_offsets(self.category_offsets(z), cat)
        return out

    def logits_from_u(self, z, u, chunk_elems: int = 1 << 24):
        M, D = z.shape
        Hd = self.cfg.d_hidden
        a = self.w_z(z)                                                      # [M,Hd] (with bias)
        zw = (z[:, None, :] * self.w_zu.weight[None]).reshape(M * Hd, D)     # [M*Hd,D]: row (m,h) = z_m * W_zu[h]
        step = max(1, chunk_elems // max(1, M * Hd))                         # queries per chunk, bounds memory
        out = []
        for s in range(0, u.shape[0], step):
            uc = u[s:s + step]                                               # [n,D]
            pre = (zw @ uc.T).view(M, Hd, -1)                                # [M,Hd,n] = W_zu (z*u)
            pre = pre + a[:, :, None] + self.w_u(uc).T[None]                 # + W_z z + b + W_u u
            h = self.drop(F.relu(pre))                                       # [M,Hd,n]
            o = torch.einsum("mhn,h->mn", h, self.head.weight[0]) + self.head.bias         # [M,n]
            if self.cfg.query_bias:
                o = o + self.q_bias(uc)[:, 0][None]
            out.append(o)
        return torch.cat(out, dim=1)                                         # [M,N]

    def pair_logits(self, z, u):
        # z [P,D], u [P,D] (one model embedding and one query projection per pair) -> logits [P]
        h = self.drop(F.relu(self.w_z(z) + self.w_u(u) + self.w_zu(z * u)))        # [P,Hd]
        o = self.head(h)[:, 0]                                               # [P]
        return o + self.q_bias(u)[:, 0] if self.cfg.query_bias else o

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # --- P(correct): the one scorer every reader uses (routing, evaluate, diff, portfolio, frontier) -------------
    def p_correct(self, z, q, categories=None):
        # z [M,D], q [N,Dq] numpy float32, categories [N] names or None -> P(correct) [M,N] numpy float32 (eval
        # mode, no grad)
        return self.scorer(z)(q, categories)

    def scorer(self, z):
        """(q [N,Dq], categories [N] names or None) -> P(correct) [M,N] for fixed embeddings z [M,D], in numpy with
        z's half of the predictor precomputed: for a few queries torch's per-op overhead costs more than the
        arithmetic (31 models x 64 hidden units). Checked against `predict_logits` once; any mismatch falls back
        to torch. A text-only model ignores the categories."""
        zt = torch.as_tensor(np.ascontiguousarray(z, dtype=np.float32))

        def exact(q, categories=None):
            ids = self.category_ids(categories)
            with torch.inference_mode():
                return torch.sigmoid(self.predict_logits(zt, torch.as_tensor(
                    np.ascontiguousarray(q, dtype=np.float32)), cat=None if ids is None else torch.from_numpy(ids)
                )).numpy()

        if len(zt) == 0:
            return exact
        # the predictor's weights in float64, converted once per state of the weights (a server builds a scorer with
        # every snapshot; training changes the weights in place, which bumps each tensor's _version)
        # (the parameters themselves are found once: walking the modules costs more than the rest of a snapshot's
        # scorer)
        if getattr(self, "_predictor_params", None) is None:
            self._predictor_params = {k: v for k, v in self.named_parameters() if k.split(".")[0] in BLOCKS}
        params = self._predictor_params
        key = tuple(p._version for p in params.values())
        if getattr(self, "_weights64", (None,))[0] != key:
            w = {k: v.detach().cpu().double().numpy() for k, v in params.items()}
            self._weights64 = (key, Predictor(w, query_bias=self.cfg.query_bias, categories=self.cfg.categories,
                                              category_field=self.cfg.category_field), None)
        key, predictor, agrees = self._weights64
        fast = predictor.scorer(zt.numpy())
        if agrees is None:                          # checked once per state of the weights
            probe = np.random.default_rng(0).standard_normal((4, self.cfg.d_query)).astype(np.float32)
            cats = self._probe_labels()
            agrees = bool(np.allclose(fast(probe, cats), exact(probe, cats), atol=1e-5))
            self._weights64 = (key, predictor, agrees)
        return fast if agrees else exact

    @property
    def numpy_scorer_agrees(self) -> bool:
        """Whether the numpy predictor of the current weights was checked against torch and agreed (`scorer`)."""
        return bool(getattr(self, "_weights64", (None, None, None))[2])

    def _probe_labels(self) -> list | None:
        """Four labels for the scorer's self-check: none, and the vocabulary's first names (several columns: each
        column's first values together, then the first column alone)."""
        names, cols = self.cfg.categories, self.cfg.category_columns
        if not names:
            return None
        if len(cols) == 1:
            picks = [None, *names[:3]]
        else:
            first: dict = {}
            for c in names:
                first.setdefault(c.split(":", 1)[0], c.split(":", 1)[1])
            vals = [first.get(c, "") for c in cols]
            picks = [None, LABEL_SEP.join(vals), vals[0]]
        return picks[:4] + [None] * (4 - len(picks[:4]))
