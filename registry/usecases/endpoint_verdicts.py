"""What an endpoint has answered, and the verdict on it now: one function for `verify`'s report, each `watch`
round, the endpoint page and HTTP, so the four never disagree on the same evidence. The evidence is every answer the
endpoint gave under the prompt template since its last verdict change (watch's event; all of them where there was
none), on the questions the reference answered too, judged by asking/verdicts.judge against every registered model
there. Each side's own nondeterminism is read from its random repeats only: a question asked again because it
disagreed would overstate it (those batches are labelled DISAGREEMENTS)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from registry.answers import catalog
from registry.asking import claims, client, prompt, verdicts
from registry.core.transaction import Tx
from registry.data import current_evaluations


@dataclass
class Target:
    claim: claims.Claim
    endpoint: client.Endpoint
    model_id: int
    price: float | None


def counts(tx: Tx, model_id: int, base_url: str, qids: list[int]) -> dict[int, int]:
    """How many answers the endpoint gave each of `qids` under the template."""
    rows = tx.sql("""SELECT query_id, count(*) FROM asked_answers WHERE model_id = ? AND base_url = ? AND template = ?
                     AND query_id IN (SELECT unnest(?::BIGINT[])) GROUP BY 1""",
                  [model_id, base_url, prompt.TEMPLATE_VERSION, list(qids)])
    return {int(q): int(c) for q, c in rows}


def answers(tx: Tx, model_id: int, base_url: str, qids: list[int]) -> dict[int, list[bool]]:
    """The endpoint's answers to each of `qids` under the template, oldest first."""
    rows = tx.sql("""SELECT query_id, correct FROM asked_answers WHERE model_id = ? AND base_url = ? AND template = ?
                     AND query_id IN (SELECT unnest(?::BIGINT[])) ORDER BY batch_id""",
                  [model_id, base_url, prompt.TEMPLATE_VERSION, list(qids)])
    out: dict[int, list[bool]] = {}
    for q, ok in rows:
        out.setdefault(int(q), []).append(bool(ok))
    return out


def reference_outcomes(tx: Tx, model: str, ref: Target | None, plan: list[int]) -> dict[int, bool]:
    """The reference's first answer per plan question; without a reference endpoint, X's registered results."""
    if ref is not None:
        return {q: a[0] for q, a in answers(tx, ref.model_id, ref.endpoint.base_url, plan).items()}
    return registered(tx, model, plan)


def registered(tx: Tx, model: str, plan: list[int]) -> dict[int, bool]:
    mid = tx.sql("SELECT id FROM models WHERE name = ?", [model])[0][0]
    rows = current_evaluations.of_models(tx, [mid])
    keep = set(plan)
    return {int(q): bool(c) for q, c in zip(rows["query_id"], rows["correct"]) if int(q) in keep}


def candidates(tx: Tx, model: str) -> dict[int, str]:
    """The registered models an endpoint claiming `model` might really serve: all but endpoints, `model` and its
    aliases."""
    names = dict(tx.sql("SELECT id, name FROM models"))
    x = {n: i for i, n in names.items()}[model]
    groups = catalog.alias_groups(tx)
    root = groups.get(x, x)
    skip = claims.claimant_ids(tx) | {m for m, g in groups.items() if g == root} | {root, x}
    return {int(i): n for i, n in names.items() if int(i) not in skip}


def outcomes(tx: Tx, ids: list[int], qids: list[int]) -> np.ndarray:
    """Registered current outcomes [models, questions] (1/0, -1: none)."""
    out = np.full((len(ids), len(qids)), -1, dtype=np.int8)
    if not ids or not qids:
        return out
    rows = current_evaluations.of_models(tx, ids)
    row, col = {m: i for i, m in enumerate(ids)}, {q: j for j, q in enumerate(qids)}
    for m, q, c in zip(rows["model_id"], rows["query_id"], rows["correct"]):
        if int(q) in col:
            out[row[int(m)], col[int(q)]] = c
    return out


def others_of(tx: Tx, model: str, qids: list[int], claimed: dict[int, bool]) -> verdicts.Others:
    """What the substitution and mixing tests need on the shared questions: the claimed model's outcomes and every
    candidate's (endpoints and the claimed model's aliases aside)."""
    cands = candidates(tx, model)
    ids = sorted(cands)
    mat = outcomes(tx, ids, list(qids))
    mine = np.array([int(claimed[q]) if q in claimed else -1 for q in qids], dtype=np.int8)
    return verdicts.Others(mine, {cands[m]: mat[i] for i, m in enumerate(ids) if (mat[i] >= 0).any()})


def second(got: dict[int, list[bool]], qids: list[int]) -> np.ndarray:
    """Each question's second answer (1/0, -1: none)."""
    return np.array([int(got[q][1]) if len(got.get(q, [])) > 1 else -1 for q in qids], dtype=np.int8)


def self_repeats(got: dict[int, list[bool]], qids: list[int]) -> tuple[int, int]:
    """(disagreements, repeats) between the first two answers to each of `qids` (the plan's random repeats: the
    questions asked again because they disagreed would overstate it)."""
    pairs = [got[q][:2] for q in qids if len(got.get(q, [])) >= 2]
    return sum(a != b for a, b in pairs), len(pairs)


DISAGREEMENTS = "disagreements"     # in the label of a batch of questions asked again because the two sides disagreed


def since_batch(tx: Tx, model_id: int) -> int:
    """The first batch of the endpoint's evidence now: where its last verdict change began (0: from the start). An
    outage (unreachable) and the answering again after one change no verdict."""
    rows = tx.sql("""SELECT evidence FROM watch_rounds WHERE model_id = ? AND event IS NOT NULL ORDER BY id DESC""",
                  [model_id])
    for (evidence,) in rows:
        e = json.loads(evidence) if isinstance(evidence, str) else evidence
        event = e.get("event") or {}
        if "unreachable" in (event.get("change") or ""):
            continue
        return int(e.get("since_batch") or 0)
    return 0


def answered(tx: Tx, model_id: int, base_url: str, since: int = 0) -> tuple[dict[int, list[bool]], set[int]]:
    """({question: its answers, oldest first}, the questions whose second answer was a random repeat) since batch
    `since`."""
    rows = tx.sql("""SELECT a.query_id, a.correct, b.files FROM asked_answers a JOIN import_batches b
                      ON b.id = a.batch_id WHERE a.model_id = ? AND a.base_url = ? AND a.template = ?
                      AND a.batch_id >= ? ORDER BY a.batch_id""",
                  [model_id, base_url, prompt.TEMPLATE_VERSION, since])
    out: dict[int, list[bool]] = {}
    random_again: set[int] = set()
    for q, ok, files in rows:
        got = out.setdefault(int(q), [])
        got.append(bool(ok))
        if len(got) == 2 and DISAGREEMENTS not in str(files):
            random_again.add(int(q))
    return out, random_again


def verdict_now(tx: Tx, model: str, t: Target, ref: Target | None, *, alpha: float = verdicts.ALPHA,
                tolerance: float = verdicts.TOLERANCE, since: int | None = None) -> dict[str, Any]:
    """The endpoint `t`'s verdict (verdicts.Verdict as a dict) on its evidence since batch `since` (None: since its
    last verdict change), against the reference endpoint `ref` or, without one, the model's registered results."""
    start = since_batch(tx, t.model_id) if since is None else since
    mine, mine_again = answered(tx, t.model_id, t.endpoint.base_url, start)
    qids = sorted(mine)
    published = registered(tx, model, qids)
    if ref is not None:
        theirs, theirs_again = answered(tx, ref.model_id, ref.endpoint.base_url)
        base = {q: a[0] for q, a in theirs.items() if q in mine}
    else:
        theirs, theirs_again, base = None, set(), published
    shared = [q for q in qids if q in base]
    e = np.array([mine[q][0] for q in shared], dtype=bool)
    r = np.array([base[q] for q in shared], dtype=bool)
    others = others_of(tx, model, shared, published or base) if shared else None
    sides = verdicts.Sides(e, r, pairs(mine, mine_again & set(shared)),
                           None if theirs is None else pairs(theirs, theirs_again & set(shared)))
    out = asdict(verdicts.judge(sides, others, alpha=alpha, tolerance=tolerance))
    out["since_batch"] = start
    return out


def pairs(got: dict[int, list[bool]], qids: set[int]) -> tuple[int, int]:
    """(disagreements, repeats) between the first two answers to each of `qids`."""
    two = [got[q][:2] for q in qids if len(got.get(q, [])) >= 2]
    return sum(a != b for a, b in two), len(two)


def of_model(tx: Tx, model: str, *, alpha: float = verdicts.ALPHA,
             tolerance: float = verdicts.TOLERANCE) -> dict[str, dict[str, Any]]:
    """{endpoint: its verdict now} for every endpoint claiming `model` (the reference: "reference")."""
    ids = dict(tx.sql("SELECT name, id FROM models"))
    found = [Target(c, client.Endpoint(c.base_url, c.upstream_model or c.endpoint, c.api_key_env),
                      int(ids[c.endpoint]), None)
             for c in claims.of_model(tx, model) if c.base_url]      # (nothing is sent: no key is read)
    ref = next((t for t in found if t.claim.reference), None)
    return {t.claim.endpoint: ({"verdict": "reference", "reason": "the yardstick the others are judged by"}
                               if t is ref else verdict_now(tx, model, t, ref, alpha=alpha, tolerance=tolerance))
            for t in found}
