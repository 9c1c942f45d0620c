"""The steps of `registry ask` (usecases/ask.py runs them in order): which endpoint to ask (`resolve_endpoint`), which
questions (`choose`: a fingerprint plan, probes, or at random, skipping those answered under the current template),
asking them (`ask_questions`), storing the graded replies as one import batch with their provenance
(`store_answers`), and the fingerprint verdict of what an endpoint answered (`verdict`); `AskResult` is the report."""
from __future__ import annotations

import csv
import hashlib
import os
import tempfile
from dataclasses import dataclass, field

import numpy as np

from registry.answers import fingerprint, probe_plans, registration
from registry.asking import client, prompt
from registry.core.errors import Conflict, InputError, NotFound
from registry.core.keys import OWNER, UpstreamKeys
from registry.core.transaction import Tx
from registry.data import endpoints

PLANS = ("fingerprint", "probe", "random")
PROBE_UNREACHABLE_AFTER = 2     # the first question's connections refused (or timed out) that end the run
WITH_GOLD = "queries JOIN query_answers ON query_answers.query_id = queries.id"


@dataclass
class AskResult:
    model: str
    base_url: str
    upstream_model: str
    template: str
    plan: str
    target: int                     # -n: answers wanted from this endpoint under this template
    already: int                    # answered before this run
    asked: int                      # questions sent in this run
    answered: int                   # of those, with a reply (graded)
    correct: int
    unparseable: int                # replies no answer could be read from: graded wrong
    unanswered: int                 # no reply after retries and deadlines: left unanswered, not wrong
    requests: int                   # HTTP requests, retries included
    retries: int
    prompt_tokens: int
    completion_tokens: int
    cost: float | None              # tokens times the model's price per million tokens, where it has one
    batch_id: int | None
    failures: dict = field(default_factory=dict)
    verdict: dict | None = None     # fingerprint.Fingerprint of this endpoint's answers, with its summary
    registration: dict | None = None  # registration.RegisterResult: version, nearest models, probation
    next_questions: list[str] = field(default_factory=list)


def resolve_endpoint(tx: Tx, name: str, base_url: str | None, upstream_model: str | None,
                     api_key_env: str | None, keys: UpstreamKeys = OWNER, *,
                     keep: bool = False) -> tuple[client.Endpoint, bool]:
    """The endpoint to ask, checked (its URL, its key against `keys`) before anything is written, and whether it is
    to be recorded once it has answered: the one given (a new model is registered with it then), else the model's
    recorded one. The recorded base URL given again keeps its upstream model and key unless they are given too.
    keep: a given endpoint that differs from the model's recorded one is refused (Conflict) instead of recorded in
    its place (the HTTP API's rule)."""
    exists = bool(tx.sql("SELECT 1 FROM models WHERE name = ?", [name]))
    stored = endpoints.current(tx).get(name) if exists else None
    recorded = None
    if stored is not None:
        try:
            recorded = client.Endpoint(endpoints.parse_base_url(stored.base_url), stored.upstream_model,
                                       stored.api_key_env, keys)
        except InputError as exc:                     # (a row from before base URLs were checked)
            if not base_url:
                raise Conflict(f"{name!r}'s recorded endpoint cannot be asked ({exc}): set it again with `registry "
                               f"endpoints set`") from None
    if base_url:
        url = endpoints.checked(base_url, api_key_env)
        if recorded is not None and url == recorded.base_url:
            upstream_model = upstream_model or recorded.upstream_model
            api_key_env = api_key_env or recorded.api_key_env
        given = client.Endpoint(url, upstream_model or name, api_key_env, keys)
        if stored is not None and given != recorded and keep:
            raise Conflict(f"{name!r} has an endpoint ({stored.base_url}, upstream model {stored.upstream_model}): "
                           f"asking over HTTP does not replace it; give no base_url to ask it, or change it with "
                           f"PUT /endpoints/{name}")
        keys.header(given.api_key_env, url)      # (read and dropped: refused here, before a row is written)
        return given, given != recorded
    if not exists:
        raise NotFound(f"no model named {name!r}: give --base-url to ask a new endpoint")
    if stored is None:
        raise Conflict(f"{name!r} has no endpoint: give --base-url (or `registry endpoints set`)")
    assert recorded is not None     # (unreadable, it was refused above: no base_url)
    keys.header(recorded.api_key_env, recorded.base_url)
    return recorded, False


def answered_before(tx: Tx, model_id: int, base_url: str) -> set[int]:
    return {int(q) for (q,) in tx.sql("""SELECT DISTINCT query_id FROM asked_answers WHERE model_id = ?
                                         AND base_url = ? AND template = ?""",
                                      [model_id, base_url, prompt.TEMPLATE_VERSION])}


def choose(tx: Tx, name: str, plan: str, n: int, skip: set[int], *, seed: int, min_answers: int) -> list[int]:
    """n query ids with a gold answer, not in `skip`, in the plan's order."""
    gold = dict(tx.sql(f"SELECT external_id, id FROM {WITH_GOLD}"))
    if not gold:
        raise Conflict("no query has a gold answer: import a queries file with an answer column")
    if plan == "random":
        ids = np.array(sorted(set(gold.values()) - skip), dtype=np.int64)
        return np.random.default_rng(seed).permutation(ids)[:n].tolist()
    want = n + len(skip)
    if plan == "fingerprint":
        found = probe_plans.fingerprint_plan(tx, want, seed=seed, min_answers=min_answers).probes
    else:
        found = probe_plans.plan(tx, name, want, seed).probes
    picks = [gold[p.question_id] for p in found if p.question_id in gold and gold[p.question_id] not in skip]
    return picks[:n]


def store_answers(tx: Tx, name: str, graded: list[tuple], endpoint: client.Endpoint, keep: bool) -> int:
    """The graded answers as one import batch (their evaluations) plus their provenance rows. -> batch id."""
    ext = dict(tx.sql("SELECT id, external_id FROM queries"))
    fd, path = tempfile.mkstemp(suffix=".csv", prefix="asked-")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["question_id", "correct"])
            w.writerows([ext[q], int(ok)] for q, _, ok, _ in graded)
        registration.stage(tx, name, path, {}, update=True)
    finally:
        os.unlink(path)
    batch_id = int(tx.sql("SELECT max(id) FROM import_batches")[0][0])
    model_id = int(tx.sql("SELECT id FROM models WHERE name = ?", [name])[0][0])
    for q, extracted, ok, text in graded:
        tx.sql("""INSERT INTO asked_answers (model_id, query_id, batch_id, base_url, upstream_model, template,
                  extracted, correct, response_hash, response) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
               [model_id, q, batch_id, endpoint.base_url, endpoint.upstream_model, prompt.TEMPLATE_VERSION,
                extracted, ok, hashlib.sha256(text.encode()).hexdigest(), text if keep else None])
    return batch_id


def verdict(tx: Tx, model_id: int, base_url: str) -> dict | None:
    """The fingerprint of what this endpoint answered under the template (its newest answer per query)."""
    rows = tx.sql("""SELECT query_id, correct FROM asked_answers WHERE model_id = ? AND base_url = ?
                     AND template = ? ORDER BY batch_id""", [model_id, base_url, prompt.TEMPLATE_VERSION])
    if not rows:
        return None
    qids, y = np.array([r[0] for r in rows]), np.array([int(r[1]) for r in rows])
    f = fingerprint.by_answers(tx, qids, y, exclude={model_id})
    return None if f is None else {**f.__dict__, "summary": f.summary}


def ask_questions(endpoint: client.Endpoint, gold: dict, chosen: list[int], **how) -> tuple[list, client.Usage]:
    """The chosen questions asked (client.ask_all): their replies and what it took."""
    return client.ask_all(endpoint, [(q, prompt.render(gold[q][0], gold[q][2])) for q in chosen], **how)


def total_usage(a: client.Usage, b: client.Usage) -> client.Usage:
    """What two runs of questions took together."""
    from dataclasses import fields

    failures = dict(a.failures)
    for why, count in b.failures.items():
        failures[why] = failures.get(why, 0) + count
    return client.Usage(**{f.name: getattr(a, f.name) + getattr(b, f.name) for f in fields(client.Usage)
                           if f.name != "failures"}, failures=failures)
