"""What routing keeps of the served policy and scores with (routing/served.py chooses it on val, at a fit): the
policy's fitted parts (`ServedPolicy`, with a pair model's `PairModel`), its routing scores for the interaction's rows
(`scores`), and the terms with the policy as the routing state keeps them (`Served`). Pure numpy, and nothing of the
fit: a route reads this, never the choice.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import numpy as np

from registry.locus import interaction


@dataclass
class PairModel:
    kind: str                 # "mf" or "irt"
    mean: np.ndarray          # [D] the reference vectors' mean, removed before the projection
    basis: np.ndarray         # [D, C] principal directions
    u: np.ndarray             # [R, d] per-model vectors (MF's e_m, IRT's theta_m)
    bias: np.ndarray          # [R] per-model offsets (MF; zeros for IRT)
    proj: np.ndarray          # [C, d]
    proj0: np.ndarray         # [d]
    diff: np.ndarray          # [C] difficulty weights (IRT; zeros for MF)
    diff0: float
    steps: int = 0

    @property
    def dim(self) -> int:
        return int(self.u.shape[1])

    def reduce(self, qvecs: np.ndarray) -> np.ndarray:
        return (np.asarray(qvecs, dtype=np.float64) - self.mean) @ self.basis

    def logits(self, qvecs: np.ndarray, reduced: bool = False) -> np.ndarray:
        """[R, N] for the queries' text vectors [N, D] (or already reduced ones [N, C])."""
        q = np.asarray(qvecs, dtype=np.float64) if reduced else self.reduce(qvecs)
        h = q @ self.proj + self.proj0
        return self.u @ h.T + self.bias[:, None] - (q @ self.diff + self.diff0)[None]

    def rows(self, take: np.ndarray) -> PairModel:
        return replace(self, u=self.u[take], bias=self.bias[take])


@dataclass
class ServedPolicy:
    name: str                                         # one of CHOICES
    val: dict[str, float] = field(default_factory=dict)   # val hit@1 of each policy judged
    setting: dict = field(default_factory=dict)       # the chosen one's settings (k, prior)
    answers: np.ndarray | None = None                 # [R, Nref] int8 1/0/-1: the rows' reference answers (knn)
    groups: list[str] = field(default_factory=list)   # per_category / per_source: the table's columns
    ref_group: np.ndarray | None = None               # [Nref] group index of each reference query
    table: np.ndarray | None = None                   # [R, G] each row's shrunk accuracy per group
    margin: float = 0.0                               # the val gain a simple router had to exceed (MARGIN_SE)
    pair: PairModel | None = None               # mf / irt: the model fitted on train + val
    members: list = field(default_factory=list)       # blend: its member policies, each fitted on train + val
    rank: np.ndarray | None = None                    # best_single: [R] each row's accuracy on train
    margin_single: float = 0.0                        # the val gain over the best single model that the leader of
                                                      #   the others needed (MARGIN_SE, paired with it)

    def describe(self) -> str:
        figures = ", ".join(f"{k} {v:.4f}" for k, v in self.val.items())
        single = f"; the others need +{self.margin_single:.4f} over best_single" if "best_single" in self.val else ""
        return f"served policy {self.name} (val hit@1: {figures}; a simple router needs +{self.margin:.4f}{single})"


def knn(answers: np.ndarray, nn: np.ndarray, k: int) -> np.ndarray:
    """[R,N]: each row's mean answer over the k nearest reference queries it answered (ties: the stronger row)."""
    nn = nn[:, :k]
    y, seen = (answers == 1).astype(np.float32), (answers >= 0).astype(np.float32)
    overall = y.sum(1) / np.maximum(seen.sum(1), 1)
    return y[:, nn].sum(-1) / np.maximum(seen[:, nn].sum(-1), 1) + 1e-6 * overall[:, None]


def group_indices(values, names: list[str]) -> np.ndarray:
    pos = {c: i for i, c in enumerate(names)}
    return np.array([pos.get(v, -1) if v is not None else -1 for v in values], dtype=np.int64)


def scores(policy: ServedPolicy, fitted: interaction.Interaction, routed_rows: np.ndarray, qvecs: np.ndarray,
           groups) -> np.ndarray:
    """[R,N] the served policy's routing scores for the interaction's rows: `routed_rows` (the predictor with the
    interaction terms, P(correct)) for locus_interaction, else the simple router's (a blend: its members' mean);
    `groups` [N]: the queries' category or source (the policy's field; None where unknown: their nearest reference
    queries' mix)."""
    if policy.name == "locus_interaction" or not len(fitted.ref_vecs):
        return routed_rows
    if policy.members:
        return np.mean([scores(m, fitted, routed_rows, qvecs, groups) for m in policy.members], axis=0)
    if policy.rank is not None:                     # the best single model: each row's accuracy, everywhere
        return np.repeat(np.asarray(policy.rank, dtype=np.float64)[:, None], len(qvecs), axis=1)
    q = np.asarray(qvecs, dtype=np.float32)
    if policy.pair is not None:
        return interaction.sigmoid(policy.pair.logits(q))
    if policy.name == "knn":
        assert policy.answers is not None
        return knn(policy.answers, interaction.neighbours(fitted.ref_vecs, q, policy.setting["k"]),
                   policy.setting["k"])
    assert policy.table is not None and policy.ref_group is not None        # (a group router: per category/source)
    g = group_indices([None] * len(q) if groups is None else groups, policy.groups)
    nn = interaction.neighbours(fitted.ref_vecs, q, interaction.CAT_K) if (g < 0).any() else \
        np.zeros((len(q), 1), dtype=np.int64)
    return policy.table @ interaction.category_mix(g, nn, policy.ref_group, len(policy.groups)).T


def carried(policy: ServedPolicy | None, take: np.ndarray) -> ServedPolicy | None:
    """The policy with its per-row arrays moved onto the rows `take` of a fit carried over to new models."""
    if policy is None:
        return None
    return replace(policy, answers=None if policy.answers is None else policy.answers[take],
                   table=None if policy.table is None else policy.table[take],
                   pair=None if policy.pair is None else policy.pair.rows(take),
                   rank=None if policy.rank is None else policy.rank[take],
                   members=[carried(m, take) for m in policy.members])


def field_of(policy: ServedPolicy | None) -> str | None:
    """The query column the policy reads ("category", "source"; a blend: its group member's), or None."""
    if policy is not None and policy.members:
        return next((f for f in map(field_of, policy.members) if f), None)
    return None if policy is None else {"per_category": "category", "per_source": "source"}.get(policy.name)


# --- the terms as routing keeps them ----------------------------------------------------------------------------
@dataclass
class Served:
    """What routing keeps: the fitted terms for the routing state's models, and each registered query's category by
    content hash (a routed text the registry holds is routed with its category; any other text with its
    neighbours')."""
    fitted: interaction.Interaction
    category_of: dict[str, str]
    # a text's nearest reference queries by content hash: the same text always has the same ones, and the search
    # is most of a known text's route (bounded: cleared when full)
    nearest: dict = field(default_factory=dict, repr=False, compare=False)
    # the policy served on these terms, chosen on val (`ServedPolicy`; None: these terms), and
    # each registered query's value of the field it reads, by content hash
    policy: ServedPolicy | None = None
    policy_labels: dict = field(default_factory=dict, repr=False, compare=False)
    # a digest of everything the fit and the policy were computed from (state.py): the same inputs give them again
    inputs: str = ""

    NN_KEEP = 50_000

    def scores(self, logits: np.ndarray, qvecs: np.ndarray, hashes) -> np.ndarray:
        cats = [self.category_of.get(h) for h in hashes] if hashes is not None else [None] * logits.shape[1]
        f = self.fitted
        nn = None
        if hashes is not None and len(f.ref_vecs) and len(f.rows) and (f.a or f.w) and len(hashes):
            width = min(max(f.k, interaction.CAT_K), len(f.ref_vecs))   # enough for either use; scores takes its own
            rows: list = [self.nearest.get(h) for h in hashes]
            miss = [i for i, r in enumerate(rows) if r is None]
            if miss:
                if len(self.nearest) + len(miss) > self.NN_KEEP:
                    self.nearest.clear()
                for i, r in zip(miss, interaction.neighbours(f.ref_vecs, qvecs[miss], width).astype(np.int32)):
                    rows[i] = self.nearest[hashes[i]] = r
            nn = np.stack(rows)
        return f.scores(logits, qvecs, f.category_index(cats), nn)


# --- traffic's corrections, as a route reads them -----------------------------------------------------------------
# computed from production outcomes by the write path (traffic/corrections.py) and saved beside the routing state
# (routing/state.py), so a route from the shell adds what a server routes with
@dataclass(frozen=True)
class Corrections:
    """Logit shifts from production outcomes, added after the served policy: a drifted (model, category)'s shift,
    and each model's residual on a query that came before (by its content hash)."""
    category: dict = field(default_factory=dict)     # (model, category) -> logit shift
    exact: dict = field(default_factory=dict)        # query hash -> {model: logit shift}
    outcomes: int = 0                                # the counted outcomes they were read from

    def shift(self, model: str, category: str | None, query_hash: str | None) -> float:
        out = self.category.get((model, category), 0.0) if category is not None else 0.0
        return out + (self.exact.get(query_hash, {}).get(model, 0.0) if query_hash is not None else 0.0)

    def adjust(self, probs: np.ndarray, names: list[str], hashes: list[str], terms: Served | None) -> np.ndarray:
        """probs [M,N] (models `names`, texts `hashes`) with the shifts added to their logits."""
        if not (self.category or self.exact):
            return probs
        logits = interaction.logit(np.asarray(probs, dtype=np.float64))
        for j, h in enumerate(hashes):
            cat = category_for(terms, h)
            for i, m in enumerate(names):
                d = self.shift(m, cat, h)
                if d:
                    logits[i, j] += d
        return interaction.sigmoid(logits).astype(probs.dtype)

    def to_json(self) -> bytes:
        return json.dumps({"category": [[m, c, v] for (m, c), v in sorted(self.category.items())],
                           "exact": self.exact, "outcomes": self.outcomes}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, blob: bytes) -> Corrections:
        doc = json.loads(bytes(blob).decode())
        return cls({(m, c): float(v) for m, c, v in doc["category"]},
                   {h: {m: float(v) for m, v in per.items()} for h, per in doc["exact"].items()}, int(doc["outcomes"]))


def category_for(terms: Served | None, query_hash: str) -> str | None:
    """A routed text's category: the registry's, else its nearest reference query's (found by its route)."""
    if terms is None:
        return None
    c = terms.category_of.get(query_hash)
    if c is not None:
        return c
    nn = terms.nearest.get(query_hash)
    f = terms.fitted
    if nn is None or not len(nn) or not len(f.ref_cat):
        return None
    at = int(f.ref_cat[int(nn[0])])
    return f.categories[at] if 0 <= at < len(f.categories) else None

