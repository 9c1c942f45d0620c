"""`registry verify X`: ask every endpoint claiming X the same planned questions under the prompt template (only those
each has not answered yet), repeat the plan's first few to measure each one's own nondeterminism, store the answers
(an import batch for first answers, one for repeats, with their provenance), and judge each endpoint against X's
reference (asking/verdicts.py): faithful, configuration, degraded, substituted, mixed, unknown or not conclusive, with
the evidence."""
from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import numpy as np

from registry.asking import claims, client, grading, prompt, served_checks, verdicts
from registry.core.errors import Conflict, InputError, Interrupted, NotFound
from registry.core.keys import OWNER, UpstreamKeys
from registry.core.store import Store
from registry.core.transaction import Tx
from registry.data import import_run
from registry.usecases import endpoint_verdicts
from registry.usecases import onboard as onboard_uc
from registry.usecases.endpoint_verdicts import (
    DISAGREEMENTS,
    Target,
    answers,
    counts,
    others_of,
    reference_outcomes,
    registered,
    self_repeats,
)

GOLD = ("SELECT q.id, q.external_id, q.text, g.answer, g.grading FROM queries q "
        "JOIN query_answers g ON g.query_id = q.id")
Gold = dict[int, tuple[str, str, str, str]]        # query id -> (external id, text, gold answer, grading): GOLD's rows
Ask = tuple[int, bool]                              # (query id, asked again?)
Prompt = tuple[Ask, list[dict[str, Any]]]           # what client.ask_all sends: (its key, the messages)
Graded = tuple[Target, int, str | None, bool, str]  # (target, query id, extracted, correct, the reply's text)


@dataclass
class EndpointReport:
    endpoint: str
    base_url: str
    reference: bool
    planned: int                    # plan questions (first answers wanted) and repeats wanted
    repeats_planned: int
    already: int                    # plan questions and repeats not asked: answered before under the template
    asked: int                      # requests sent now (first answers, repeats, disagreements asked again)
    answered: int
    unanswered: int
    requests: int
    retries: int
    prompt_tokens: int
    completion_tokens: int
    cost: float | None
    failures: dict[str, int] = field(default_factory=dict)
    verdict: dict[str, Any] = field(default_factory=dict)     # verdicts.Verdict, against the reference
    flags: list[str] = field(default_factory=list)            # the served checks' lines (asking/served_checks.py)


@dataclass
class VerifyResult:
    model: str
    template: str
    n: int
    repeat: int
    seed: int
    reference: str                  # the reference endpoint's name, or "registered results"
    across_prompts: bool            # the reference is X's registered results: published under another prompt
    endpoints: list[EndpointReport]
    batches: list[int]
    seconds: float
    note: str = ""

    @property
    def faithful(self) -> bool:
        return all(e.verdict.get("verdict") == "faithful" and not e.flags for e in self.endpoints if not e.reference)


def claim(tx: Tx, model: str, base_url: str, options: dict[str, Any]) -> claims.Claim:
    """`registry endpoints add`: an endpoint claiming `model` (claims.add's options: name, upstream_model,
    api_key_env, reference, watched)."""
    return claims.add(tx, model, base_url, **options)


def planned(candidates: Iterable[int], n: int, seed: int) -> list[int]:
    """The plan: the first n of the candidate questions in a seeded order (a longer plan extends a shorter one)."""
    ids = np.array(sorted(int(q) for q in candidates), dtype=np.int64)
    plan: list[int] = np.random.default_rng(seed).permutation(ids)[:n].tolist()
    return plan


def targets(tx: Tx, model: str, names: list[str] | None, keys: UpstreamKeys) -> list[Target]:
    """The endpoints to ask, the reference first, each checked (URL, key against `keys`) before anything is sent."""
    found = claims.of_model(tx, model)
    if not found:
        raise Conflict(f"no endpoint claims {model!r}: add one with `registry endpoints add {model} --base-url URL "
                       f"--name {model}@provider`")
    known = {c.endpoint for c in found}
    for n in names or []:
        if n not in known:
            raise NotFound(f"{n!r} does not claim {model!r} (its endpoints: {', '.join(sorted(known))})")
    chosen = [c for c in found if not names or c.endpoint in names or c.reference]
    ids = dict(tx.sql("SELECT name, id FROM models"))
    price = dict(tx.sql("SELECT name, cost FROM models"))
    out = []
    for c in chosen:
        if c.base_url is None:
            raise Conflict(f"{c.endpoint!r} has no endpoint: set it with `registry endpoints set {c.endpoint} "
                           f"--base-url URL`")
        e = client.Endpoint(c.base_url, c.upstream_model or c.endpoint, c.api_key_env, keys)
        keys.header(e.api_key_env, e.base_url)          # (read and dropped: refused here, before anything is sent)
        out.append(Target(c, e, int(ids[c.endpoint]), price.get(c.endpoint)))
    return out


def ask_targets(jobs: list[tuple[Target, list[Prompt]]], *, concurrency: int, progress: bool,
                **how: Any) -> list[tuple[list[client.Reply], client.Usage]]:
    """Every endpoint's requests at once (each with `concurrency` of its own): the slowest endpoint sets the time."""
    def one(job: tuple[Target, list[Prompt]]) -> tuple[list[client.Reply], client.Usage]:
        target, prompts = job
        if not prompts:
            return [], client.Usage()
        return client.ask_all(target.endpoint, prompts, concurrency=concurrency, progress=progress,
                              label=target.claim.endpoint, **how)
    with ThreadPoolExecutor(max(1, len(jobs))) as pool:
        return list(pool.map(one, jobs))


def store_batch(tx: Tx, graded: list[Graded], label: str) -> int | None:
    """Graded answers [(target, query id, extracted, correct, text)] as one import batch of evaluations, with their
    provenance rows. -> the batch id (None: nothing to store)."""
    if not graded:
        return None
    ext = dict(tx.sql("SELECT id, external_id FROM queries"))
    ids = dict(tx.sql("SELECT name, id FROM models"))
    evaluated = [int(m) for (m,) in tx.sql("SELECT DISTINCT model_id FROM evaluations")]
    result = import_run.run_rows_import(tx, [g[0].claim.endpoint for g in graded], [ext[g[1]] for g in graded],
                                    [bool(g[3]) for g in graded], label=label, evaluated=evaluated, ids=ids)
    if result is None:
        raise Conflict("the answers could not be stored (one endpoint answered a question twice in one batch)")
    if result.batch_id is None:
        # every outcome equal to the current one (answers again, mostly): no evaluation is added, yet the answers
        # are a batch of their own, with their provenance
        result.batch_id = int(tx.sql("SELECT nextval('import_batches_id_seq')")[0][0])
        tx.sql("INSERT INTO import_batches (id, files, row_counts, digest) VALUES (?, ?, ?, ?)",
               [result.batch_id, json.dumps({"evaluations": label}),
                json.dumps({"evaluations_read": len(graded), "evaluations_added": 0}),
                hashlib.sha256(f"{label}:{result.batch_id}".encode()).hexdigest()])
    tx.executemany("""INSERT INTO asked_answers (model_id, query_id, batch_id, base_url, upstream_model, template,
                      extracted, correct, response_hash, response) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)""",
                   [[g[0].model_id, g[1], result.batch_id, g[0].endpoint.base_url, g[0].endpoint.upstream_model,
                     prompt.TEMPLATE_VERSION, g[2], bool(g[3]), hashlib.sha256(g[4].encode()).hexdigest()]
                    for g in graded])
    return result.batch_id


def own_thread(fn: Callable[[], Any]) -> Any:
    """How a write runs where no server's writer takes it: here, now."""
    return fn()


def stop_if_cancelled(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Interrupted("cancelled: the asking stopped (the client hung up, or the server is stopping); the "
                          "answers stored so far are kept")


def ask_pass(store: Store, label: str, jobs: list[tuple[Target, list[Ask]]], gold: Gold,
             reports: dict[str, EndpointReport], *, write: Callable[[Callable[[], Any]], Any] = own_thread,
             **how: Any) -> list[int]:
    """One pass of requests [(target, [(query id, is_again)])] at every endpoint at once, graded and stored: first
    answers as one import batch, second answers as another, in one short transaction that `write` runs (a server's
    writer: the asking itself never holds it). Usage is added to `reports` (by endpoint). -> batches."""
    prompts: list[tuple[Target, list[Prompt]]] = [
        (t, [((q, again), prompt.render(gold[q][1], gold[q][3])) for q, again in asks]) for t, asks in jobs]
    rows: dict[bool, list[Graded]] = {False: [], True: []}
    for (t, sent), (got, usage) in zip(prompts, ask_targets(prompts, **how)):
        for r in got:
            if r.text is not None:
                q, again = cast(Ask, r.key)        # (the key this pass gave its prompt)
                extracted = grading.extract(r.text, gold[q][3], options=grading.options_in(gold[q][1]),
                                            gold=gold[q][2])
                rows[again].append((t, q, extracted, grading.grade(extracted, gold[q][2], gold[q][3]), r.text))
        e = reports[t.claim.endpoint]
        e.flags += [f for f in served_checks.flags(t.endpoint.upstream_model, got) if f not in e.flags]
        answered = sum(r.text is not None for r in got)
        e.asked, e.answered = e.asked + len(sent), e.answered + answered
        e.unanswered += len(sent) - answered
        for f in ("requests", "retries", "prompt_tokens", "completion_tokens"):
            setattr(e, f, getattr(e, f) + getattr(usage, f))
        for why, c in usage.failures.items():
            e.failures[why] = e.failures.get(why, 0) + c
        if t.price is not None:
            e.cost = round(t.price * (e.prompt_tokens + e.completion_tokens) / 1e6, 6)
    if not rows[False] and not rows[True]:
        stop_if_cancelled(how.get("cancel"))
        return []

    def stored() -> list[int]:
        with store.tx() as tx:
            return [b for b in (store_batch(tx, rows[False], f"{label}: first answers"),
                                store_batch(tx, rows[True], f"{label}: answers again")) if b is not None]
    batches: list[int] = write(stored)
    stop_if_cancelled(how.get("cancel"))      # (what came back before is kept)
    return batches


def verify(store: Store, model: str, *, min_evaluations: int, endpoints: list[str] | None = None, n: int = 256,
           repeat: int = 32, seed: int = 0, concurrency: int = 8, deadline: float = 60.0, retries: int = 4,
           backoff: float = 0.5, progress: bool = False, keys: UpstreamKeys = OWNER, alpha: float = verdicts.ALPHA,
           tolerance: float = verdicts.TOLERANCE, write: Callable[[Callable[[], Any]], Any] = own_thread,
           cancel: threading.Event | None = None, max_in_flight: int | None = None) -> VerifyResult:
    """`registry verify MODEL`. Two passes: the plan's questions (and its first `repeat` again, for
    each side's nondeterminism), then every question where an endpoint and the reference disagree asked again of
    both (a disagreement that nondeterminism made rarely comes back; a degradation does). A server passes `write`
    (its writer runs each write, a short transaction: the asking runs on the request's thread), `cancel` (set when
    the client hangs up or the server stops) and `max_in_flight` (requests under way at once, all endpoints)."""
    if n < 1 or repeat < 0 or concurrency < 1:
        raise InputError(f"-n and --concurrency must be at least 1 and --repeat at least 0, got {n}, {concurrency}, "
                         f"{repeat}")
    if not 0 < alpha < 0.5 or not 0 <= tolerance < 1:
        raise InputError(f"alpha must be in (0, 0.5) and tolerance in [0, 1), got {alpha} and {tolerance}")
    started = time.perf_counter()
    how = dict(concurrency=concurrency, progress=progress, deadline=deadline, retries=retries, backoff=backoff,
               cancel=cancel)
    write(lambda: onboard_uc.finish_pending(store, min_evaluations))
    with store.tx() as tx:
        found = targets(tx, model, endpoints, keys)
    if max_in_flight is not None:
        how["concurrency"] = max(1, min(concurrency, max_in_flight // max(1, len(found))))
    with store.tx() as tx:
        gold: Gold = {int(q): (ext, t, a, g) for q, ext, t, a, g in tx.sql(GOLD)}
        if not gold:
            raise Conflict("no query has a gold answer: import a queries file with an answer column")
        published = registered(tx, model, list(gold))
        plan = planned(published if len(published) >= n else gold, n, seed)
        published = {q: published[q] for q in plan if q in published}
        repeats = plan[:min(repeat, len(plan))]
        jobs: list[tuple[Target, list[Ask]]] = []
        for t in found:
            had = counts(tx, t.model_id, t.endpoint.base_url, plan)
            first = [q for q in plan if not had.get(q)]
            new = set(first)
            repeat_asks = [(q, True) for q in repeats if had.get(q, 0) + (q in new) < 2]
            jobs.append((t, [(q, False) for q in first] + repeat_asks))
    reports = {t.claim.endpoint: EndpointReport(t.claim.endpoint, t.endpoint.base_url, t.claim.reference, len(plan),
                                                len(repeats), 0, 0, 0, 0, 0, 0, 0, 0, None) for t in found}
    for t, asks in jobs:
        reports[t.claim.endpoint].already = len(plan) + len(repeats) - len(asks)
    batches = ask_pass(store, f"verify {model}", jobs, gold, reports, write=write, **how)
    ref = next((t for t in found if t.claim.reference), None)
    with store.tx() as tx:              # pass two: the disagreements, asked again of both sides
        base = reference_outcomes(tx, model, ref, plan)
        got = {t.claim.endpoint: answers(tx, t.model_id, t.endpoint.base_url, plan) for t in found}
        again: dict[str, set[int]] = {t.claim.endpoint: set() for t in found}
        for t in found:
            against = published if t is ref else base
            mine = got[t.claim.endpoint]
            off = [q for q in plan if q in mine and q in against and mine[q][0] != against[q]]
            again[t.claim.endpoint] |= {q for q in off if len(mine[q]) < 2}
            if ref is not None and t is not ref:
                theirs = got[ref.claim.endpoint]
                again[ref.claim.endpoint] |= {q for q in off if len(theirs.get(q, [])) < 2}
    jobs = [(t, [(q, True) for q in plan if q in again[t.claim.endpoint]]) for t in found]
    batches += ask_pass(store, f"verify {model}, {DISAGREEMENTS}", jobs, gold, reports, write=write, **how)
    if batches:
        write(lambda: onboard_uc.onboard(store, min_evaluations))
    with store.tx() as tx:
        for t in found:
            report = reports[t.claim.endpoint]
            if t is not ref:    # the verdict now, on every answer since its last change (as watch, page and HTTP say)
                report.verdict = endpoint_verdicts.verdict_now(tx, model, t, ref, alpha=alpha, tolerance=tolerance)
            elif not published:
                report.verdict = {"verdict": "reference", "reason": "the yardstick the others are judged by"}
            else:               # the yardstick itself, against the published results
                mine = answers(tx, t.model_id, t.endpoint.base_url, plan)
                shared = [q for q in plan if q in mine and q in published]
                others = others_of(tx, model, shared, published) if shared else None
                sides = verdicts.Sides(np.array([mine[q][0] for q in shared], dtype=bool),
                                       np.array([published[q] for q in shared], dtype=bool),
                                       self_repeats(mine, repeats))
                report.verdict = asdict(verdicts.judge(sides, others, alpha=alpha, tolerance=tolerance))
    note = ("" if ref is not None else f"no reference endpoint is marked: compared with {model}'s registered results, "
            f"which may come from another prompt (a faithful endpoint then differs more than from itself)")
    return VerifyResult(model, prompt.TEMPLATE_VERSION, len(plan), len(repeats), seed,
                        ref.claim.endpoint if ref else "registered results", ref is None,
                        list(reports.values()), batches, round(time.perf_counter() - started, 3), note)


