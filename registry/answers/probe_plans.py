"""`registry probe` and `registry fingerprint --plan`: which queries to ask a model next, as a file of question ids
with an empty `correct` column that `register` and `fingerprint --evals` take back once it is filled in.

- probe: for one model (registered or new), its answers so far are read by likelihood against the other models
  (locus/probe_design.py), and the next queries are those that most settle its logits where routing decides. A model
  with fewer than SEED_SIZE answers is first given random queries up to that many. Queries it has answered, and test
  queries (never embedded), are never proposed. Asking in rounds (probe, evaluate, register, probe again) lets each
  round use the answers of the last; one round of n plans the rest from what is known now.
- fingerprint plan: the queries on which the candidate models' own answers differ most evenly across pairs (each
  pick favours the pairs that the picks so far separate least), so that the answers test tells them apart.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from registry.core.errors import InputError, unknown_model
from registry.core.transaction import Tx
from registry.data import current_evaluations, query_cache
from registry.embedding import encoders, index
from registry.locus import probe_design

FILE_SUFFIXES = (".csv", ".jsonl")


@dataclass
class Probe:
    question_id: str
    category: str | None
    kind: str                   # "seed" (random) | "planned"
    text: str


@dataclass
class ProbePlan:
    model: str
    registered: bool
    answered: int               # the model's current answers outside the test split
    pool: int                   # queries it could be asked: outside the test split, not answered yet
    seed: int                   # random probes among `probes`
    planned: int                # planned probes among them
    probes: list[Probe]
    file: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class FingerprintPlan:
    candidates: list[str]
    pool: int                   # queries at least two candidates answered
    probes: list[Probe]
    closest_pair: list[str]     # the pair the planned queries separate least
    separated: int              # on how many of the planned queries that pair's answers differ
    random_separated: float     # the same least separation on as many random queries of the pool (mean of 100)
    file: str | None = None
    left_out: list[str] = field(default_factory=list)   # not candidates by default: too few answers (probation)


def _check_out(out: str | None) -> None:
    if out is not None and not str(out).endswith(FILE_SUFFIXES):
        raise InputError(f"the plan file must end in {' or '.join(FILE_SUFFIXES)}", file=str(out))


def write_file(path: str, rows: list[Probe]) -> None:
    """question_id, correct (empty: to fill in with 1/0), category, question: what `register` and `fingerprint
    --evals` read (the question text is for whoever asks; the registry already has it)."""
    p = Path(path)
    if str(p).endswith(".csv"):
        with p.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["question_id", "correct", "category", "question"])
            w.writerows([r.question_id, "", r.category or "", r.text] for r in rows)
    else:
        with p.open("w", encoding="utf-8") as f:
            f.writelines(json.dumps({"question_id": r.question_id, "correct": None, "category": r.category,
                                     "question": r.text}) + "\n" for r in rows)


def _probes(tx: Tx, qids: list[int], kinds: list[str]) -> list[Probe]:
    if not qids:
        return []
    rows = {r[0]: r[1:] for r in tx.sql(f"""SELECT id, external_id, category, text FROM queries
                                            WHERE id IN ({', '.join(str(int(q)) for q in qids)})""")}
    return [Probe(rows[q][0], rows[q][1], k, rows[q][2]) for q, k in zip(qids, kinds)]


def plan(tx: Tx, name: str, n: int, seed: int = 0, out: str | None = None) -> ProbePlan:
    """The next n queries to ask model `name` (see the module docstring)."""
    if n < 1:
        raise InputError(f"-n must be at least 1, got {n}")
    _check_out(out)
    encoder_id = encoders.require_active(tx)
    model, _ = encoders.load(tx, encoder_id)
    ids = dict(tx.sql("SELECT name, id FROM models"))
    model_id = ids.get(name)
    meta = query_cache.query_meta(tx)
    answered_q, answered_y = np.zeros(0, np.int64), np.zeros(0)
    asked_any = np.zeros(0, np.int64)
    if model_id is not None:
        rows = current_evaluations.of_models(tx, [model_id])
        asked_any = np.asarray(rows["query_id"], dtype=np.int64)
        keep = ~meta.is_test[meta.rows(asked_any)]
        answered_q, answered_y = asked_any[keep], np.asarray(rows["correct"], dtype=np.float64)[keep]
    pool = np.setdiff1d(meta.ids[~meta.is_test], asked_any)
    if not len(pool):
        raise InputError(f"{name} has answered every query outside the test split: there is nothing left to ask")
    _, mids, _, vecs = index.current_versions(tx, encoder_id)
    others = vecs[mids != (model_id if model_id is not None else -1)].astype(np.float64)
    if len(others) == 0:
        raise InputError("no other model is embedded yet: probes are planned against the registered models")
    rng = np.random.default_rng(seed)
    n = min(n, len(pool))
    n_seed = min(n, max(0, probe_design.SEED_SIZE - len(answered_q)))
    seed_q = np.sort(rng.choice(pool, n_seed, replace=False)) if n_seed else np.zeros(0, np.int64)
    planned_q = np.zeros(0, np.int64)
    if n > n_seed:
        pred = probe_design.Predictor(model)
        nontest = meta.ids[~meta.is_test]               # where routing decides: any query, asked or not
        ref_q = np.sort(rng.choice(nontest, min(probe_design.REFERENCES, len(nontest)), replace=False))
        cand_q = np.setdiff1d(pool, seed_q)
        row_of, qmat = query_cache.query_vectors(tx, np.concatenate([answered_q, cand_q, ref_q, seed_q]))
        proj = lambda qs: pred.project(qmat[[row_of[int(x)] for x in qs]],   # noqa: E731
                                       query_cache.query_categories(tx, qs, model))
        prior = probe_design.gaussian_prior(others)
        z, precision = (probe_design.read(pred, proj(answered_q), answered_y, prior) if len(answered_q)
                        else (prior.mean, prior.precision))
        precision = probe_design.expect_answers(pred, z, precision, proj(seed_q))   # the seed will be answered too
        ref = proj(ref_q)
        best_other = np.max([pred.logits(o, ref) for o in others], axis=0)
        planned_q = cand_q[probe_design.choose(pred, z, precision, proj(cand_q), ref, best_other=best_other,
                                               k=n - n_seed)]
    notes = ["register embeds with the set encoder, which reads planned answers as if they were random: they pay "
             "when read by likelihood (BENCHMARKS.md, planned probes)"]
    if model_id is None:
        notes.append(f"{name} is not registered: planned as a new model")
    if n_seed and n > n_seed:
        notes.append(f"the first {n_seed} are random (a model is first asked {probe_design.SEED_SIZE} random "
                     f"queries); the rest are planned without their answers: asking them first and planning again "
                     f"settles faster")
    result = ProbePlan(name, model_id is not None, len(answered_q), len(pool), n_seed, len(planned_q),
                       _probes(tx, seed_q.tolist() + planned_q.tolist(),
                               ["seed"] * n_seed + ["planned"] * len(planned_q)), out, notes)
    if out:
        write_file(out, result.probes)
    return result


def fingerprint_plan(tx: Tx, n: int, candidates=(), seed: int = 0, out: str | None = None,
                     min_answers: int = 0) -> FingerprintPlan:
    """The n queries that best separate the candidate models by their answers (default: every model with at least
    `min_answers` results; a model known from a handful of answers can be told from no one, and would make every
    plan chase its unknown answers)."""
    if n < 1:
        raise InputError(f"-n must be at least 1, got {n}")
    _check_out(out)
    names = dict(tx.sql("SELECT name, id FROM models"))
    left_out: list[str] = []
    if candidates:
        chosen = list(dict.fromkeys(candidates))
    else:
        # (an alias is its model under another name: one candidate, not a pair that differs on nothing)
        counts = dict(tx.sql(f"""SELECT m.name, count(*) FROM models m
                                 JOIN {current_evaluations.current(distinct=True)} e
                                 ON e.model_id = m.id GROUP BY m.name"""))
        chosen = sorted(m for m, c in counts.items() if c >= min_answers)
        left_out = sorted(m for m, c in counts.items() if c < min_answers)
    for c in chosen:
        if c not in names:
            raise unknown_model(c, names, " among the candidates")
    if len(chosen) < 2:
        raise InputError(f"at least 2 candidates are needed to separate, got {len(chosen)}"
                         + (f" ({len(left_out)} with fewer than {min_answers} answers left out: name them with "
                            f"--candidates)" if left_out else ""))
    rows = current_evaluations.of_models(tx, [names[c] for c in chosen])
    qids = np.unique(rows["query_id"])
    pos = {names[c]: i for i, c in enumerate(chosen)}
    A = np.full((len(chosen), len(qids)), -1, dtype=np.int8)
    A[[pos[int(m)] for m in rows["model_id"]], np.searchsorted(qids, rows["query_id"])] = rows["correct"]
    seen = A >= 0
    keep = seen.sum(0) >= 2
    A, seen, qids = A[:, keep], seen[:, keep], qids[keep]
    if not len(qids):
        raise InputError("no query has results from two of the candidates: nothing tells them apart")
    picks, sep = separating(A, seen, min(n, len(qids)), seed)
    iu = np.triu_indices(len(chosen), 1)
    worst = int(np.argmin(sep[iu]))
    i, j = iu[0][worst], iu[1][worst]
    rng = np.random.default_rng([seed, 3])
    at_random = [separation(A[:, c], seen[:, c])[iu].min()
                 for c in (rng.choice(len(qids), len(picks), replace=False) for _ in range(100))]
    result = FingerprintPlan(chosen, len(qids), _probes(tx, qids[picks].tolist(), ["planned"] * len(picks)),
                             sorted([chosen[i], chosen[j]]), int(sep[i, j]), round(float(np.mean(at_random)), 2),
                             out, left_out)
    if out:
        write_file(out, result.probes)
    return result


def separating(A: np.ndarray, seen: np.ndarray, n: int, seed: int = 0) -> tuple[list[int], np.ndarray]:
    """Greedy: n columns of answers A [K,N] (1/0, seen [K,N]) each separating the candidate pairs that the picks so
    far separate least: the weight of a pair is 1 / (1 + picks where its answers differ)^2. -> (columns, pair
    separation counts [K,K])."""
    right = ((A == 1) & seen).astype(np.float64)
    wrong = ((A == 0) & seen).astype(np.float64)
    K = len(A)
    sep = np.zeros((K, K))
    tie = np.random.default_rng(seed).random(A.shape[1]) * 1e-9        # seeded tie-break
    picks: list[int] = []
    taken = np.zeros(A.shape[1], dtype=bool)
    for _ in range(n):
        W = np.triu(1.0 / (1.0 + sep) ** 2, 1)
        W = W + W.T
        # sum over pairs of W_ij [i right, j wrong]: each unordered pair counted once after halving the symmetric sum
        score = np.einsum("kn,kn->n", right, W @ wrong) + tie
        score[taken] = -np.inf
        j = int(np.argmax(score))
        picks.append(j)
        taken[j] = True
        d = np.outer(right[:, j], wrong[:, j])
        sep += d + d.T
    return picks, sep


def separation(A: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """[K,K]: on how many columns of A each pair of candidates both answered and differ."""
    right = ((A == 1) & seen).astype(np.float64)
    wrong = ((A == 0) & seen).astype(np.float64)
    return right @ wrong.T + wrong @ right.T
