"""`registry watch`: one round asks every watched endpoint (and its model's reference) a rotating sample of fresh
planned questions, asks each disagreement with the reference again of both sides, stores the answers as the round's
own import batches, and steps each endpoint's sequential test (asking/sequential.py). A change from faithful is an
event, with its time and evidence (the verdict's tests over the rounds since the change began); `status` reads each
endpoint's timeline back. Events are POSTed to the owner's webhook where one is given."""
from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from registry.asking import claims, sequential, verdicts
from registry.asking import webhook as deliveries
from registry.core.errors import Conflict, InputError
from registry.core.keys import OWNER, UpstreamKeys
from registry.core.store import Store
from registry.core.transaction import Tx
from registry.data import endpoints
from registry.usecases import endpoint_verdicts
from registry.usecases import onboard as onboard_uc
from registry.usecases import verify as v
from registry.usecases.endpoint_verdicts import Target


@dataclass
class Round:
    endpoint: str
    model: str
    round: int
    at: str
    n: int
    accuracy: float | None
    accuracy_ci: list[float]
    reference_accuracy: float | None
    disagreement: float | None
    disagreement_ci: list[float]
    worse_held: int
    better_held: int
    statistic: float                  # the larger CUSUM as a share of its threshold (1: an event)
    verdict: str
    event: str | None = None
    note: str = ""                    # why a round judged nothing (unreachable, or the reference answered nothing)


@dataclass
class Event:
    endpoint: str
    model: str
    at: str
    round: int
    change: str                       # e.g. "faithful -> degraded"
    verdict: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass
class WatchResult:
    rounds: list[Round]
    events: list[Event]
    asked: int = 0                    # requests sent this round (0 for status)
    webhook_failures: list[str] = field(default_factory=list)
    claims: list[claims.Claim] = field(default_factory=list)      # (status) the endpoints claiming each model


def watched(tx: Tx, models: list[str] | None) -> dict[str, list[claims.Claim]]:
    """{model: its watched endpoints, the reference first (asked whether watched or not)}."""
    out: dict[str, list[claims.Claim]] = {}
    for c in claims.current(tx):
        if (c.watched or c.reference) and (not models or c.model in models):
            out.setdefault(c.model, []).append(c)
    return {m: cs for m, cs in out.items() if any(c.watched and not c.reference for c in cs)}


def last_states(tx: Tx) -> dict[int, tuple[int, sequential.State, list[list[int]], str]]:
    """{endpoint model id: (rounds so far, its test's state, [the questions of each round], its last verdict)}."""
    out: dict[int, tuple[int, sequential.State, list[list[int]], str]] = {}
    for mid, evidence, verdict in tx.sql("SELECT model_id, evidence, verdict FROM watch_rounds ORDER BY id"):
        e = json.loads(evidence) if isinstance(evidence, str) else evidence
        rounds, _, qs, _ = out.get(int(mid), (0, None, [], ""))
        out[int(mid)] = (rounds + 1, sequential.State(**e["state"]), qs + [e["questions"]], verdict)
    return out


def round_of(store: Store, model: str, group: list[claims.Claim], n: int, *, seed: int, keys: UpstreamKeys,
             how: dict[str, Any]) -> tuple[list[Target], Target | None, list[int], list[int], int,
                                           dict[str, v.EndpointReport]]:
    """Ask one model's endpoints their round. -> (targets, the reference, the round's questions, batches, requests
    sent, each endpoint's report)."""
    with store.tx() as tx:
        found = v.targets(tx, model, [c.endpoint for c in group], keys)
        gold: v.Gold = {int(q): (ext, t, a, g) for q, ext, t, a, g in tx.sql(v.GOLD)}
        published = endpoint_verdicts.registered(tx, model, list(gold))
        order = v.planned(published if len(published) >= n else gold, len(gold), seed)
        had = {t.claim.endpoint: set(endpoint_verdicts.counts(tx, t.model_id, t.endpoint.base_url, order))
               for t in found}
    fresh = [q for q in order if any(q not in h for h in had.values())][:n]
    if not fresh:
        raise Conflict(f"every planned question has been asked of {model}'s endpoints: nothing fresh is left")
    reports = {t.claim.endpoint: v.EndpointReport(t.claim.endpoint, t.endpoint.base_url, t.claim.reference, n, 0,
                                                  0, 0, 0, 0, 0, 0, 0, 0, None) for t in found}
    jobs = [(t, [(q, False) for q in fresh if q not in had[t.claim.endpoint]]) for t in found]
    batches = v.ask_pass(store, f"watch {model}", jobs, gold, reports, **how)
    ref = next((t for t in found if t.claim.reference), None)
    with store.tx() as tx:
        base = endpoint_verdicts.reference_outcomes(tx, model, ref, fresh)
        got = {t.claim.endpoint: endpoint_verdicts.answers(tx, t.model_id, t.endpoint.base_url, fresh) for t in found}
    again: dict[str, set[int]] = {t.claim.endpoint: set() for t in found}
    for t in found:
        if t is ref:
            continue
        mine = got[t.claim.endpoint]
        off = {q for q in fresh if q in mine and q in base and mine[q][0] != base[q]}
        again[t.claim.endpoint] |= {q for q in off if len(mine[q]) < 2}
        if ref is not None:
            again[ref.claim.endpoint] |= {q for q in off if len(got[ref.claim.endpoint].get(q, [])) < 2}
    jobs = [(t, [(q, True) for q in fresh if q in again[t.claim.endpoint]]) for t in found]
    batches += v.ask_pass(store, f"watch {model}, {endpoint_verdicts.DISAGREEMENTS}", jobs, gold, reports, **how)
    return found, ref, fresh, batches, sum(r.requests for r in reports.values()), reports


def figures(e: np.ndarray, r: np.ndarray, e2: np.ndarray, r2: np.ndarray | None) -> tuple[int, int]:
    held = e2 == e.astype(np.int8)
    if r2 is not None:
        held &= r2 == r.astype(np.int8)
    return int((~e & r & held).sum()), int((e & ~r & held).sum())


def sides(tx: Tx, t: Target, ref: Target | None, base: dict[int, bool], qids: list[int]
          ) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, dict[int, list[bool]],
                     dict[int, list[bool]] | None]:
    """The endpoint's and the reference's first and second answers on `qids` (those both answered)."""
    mine = endpoint_verdicts.answers(tx, t.model_id, t.endpoint.base_url, qids)
    theirs = None if ref is None else endpoint_verdicts.answers(tx, ref.model_id, ref.endpoint.base_url, qids)
    shared = [q for q in qids if q in mine and q in base]
    e = np.array([mine[q][0] for q in shared], dtype=bool)
    r = np.array([base[q] for q in shared], dtype=bool)
    second = endpoint_verdicts.second
    return shared, e, r, second(mine, shared), None if theirs is None else second(theirs, shared), mine, theirs


def round_batch(tx: Tx, model_id: int, number: int, current: int | None) -> int:
    """The first batch of the endpoint's round `number` (the round being judged: `current`)."""
    rows = [b for (b,) in tx.sql("SELECT batch_id FROM watch_rounds WHERE model_id = ? ORDER BY id", [model_id])]
    return int(rows[number - 1] or 0) if number <= len(rows) else int(current or 0)


def watch(store: Store, *, min_evaluations: int, n: int = 64, models: list[str] | None = None,
          status: bool = False, seed: int = 0, keys: UpstreamKeys = OWNER, concurrency: int = 8,
          deadline: float = 60.0, retries: int = 4, backoff: float = 0.5, progress: bool = False,
          webhook: str | None = None, write: Callable[[Callable[[], Any]], Any] = v.own_thread,
          cancel: threading.Event | None = None, max_in_flight: int | None = None) -> WatchResult:
    """`registry watch`: one round (or, with `status`, the timeline so far: nothing is asked). `webhook`: the
    owner's URL each event is POSTed to as JSON. A server passes `write` and `cancel` (verify.verify's)."""
    if n < 8:
        raise InputError(f"-n must be at least 8 questions a round, got {n}")
    if status:
        return timeline(store, models)
    if webhook is not None:
        webhook = endpoints.parse_webhook_url(webhook)
    how = dict(concurrency=concurrency, progress=progress, deadline=deadline, retries=retries, backoff=backoff,
               cancel=cancel, write=write)
    write(lambda: onboard_uc.finish_pending(store, min_evaluations))
    with store.tx() as tx:
        groups = watched(tx, models)
    if not groups:
        raise Conflict("no endpoint is watched: add one with `registry endpoints add MODEL --base-url URL`")
    out, asked = WatchResult([], []), 0
    for model, group in groups.items():
        if max_in_flight is not None:      # (the model's endpoints share what the server allows at once)
            how["concurrency"] = max(1, min(concurrency, max_in_flight // max(1, len(group))))
        found, ref, fresh, batches, sent, reports = round_of(store, model, group, n, seed=seed, keys=keys, how=how)
        asked += sent
        write(functools.partial(judge_round, store, model, found, ref, fresh, batches=batches, reports=reports,
                                out=out, webhook=webhook))
    out.asked = asked
    if webhook:
        out.webhook_failures = deliveries.deliver(store, webhook, write=write)
    return out


def judge_round(store: Store, model: str, found: list[Target], ref: Target | None, fresh: list[int], *,
                batches: list[int], reports: dict[str, v.EndpointReport], out: WatchResult,
                webhook: str | None) -> None:
    """The round's verdicts: each watched endpoint's test stepped, its row and any event stored (with the event's
    delivery, for a webhook), in one transaction (a server's writer runs it); rounds and events added to `out`."""
    with store.tx() as tx:
        states = last_states(tx)
        base = endpoint_verdicts.reference_outcomes(tx, model, ref, fresh)
        at = str(tx.sql("SELECT now()::TIMESTAMP")[0][0])
        for t in found:
            if t is ref or not t.claim.watched:
                continue
            shared, e, r, e2, r2, *_ = sides(tx, t, ref, base, fresh)
            worse, better = figures(e, r, e2, r2)
            count, state, past, last = states.get(t.model_id, (0, sequential.State(), [], None))
            report = reports[t.claim.endpoint]
            if not shared:       # nothing to judge: the test is not stepped (no answer is no evidence)
                row, event = silent_round(t.claim.endpoint, model, count + 1, at, report, ref=ref, state=state,
                                          last=last)
                record(tx, t, model, batches, row, state=state, event=event,
                       evidence={"questions": [], "unanswered": report.unanswered, "failures": report.failures})
                out.rounds.append(row)
                out.events += [event] if event else []
                continue
            state, alarm, evidence = sequential.step(state, worse, better, len(shared))
            event = None
            if last == UNREACHABLE:
                event = Event(t.claim.endpoint, model, at, count + 1, f"{UNREACHABLE} -> {state.verdict}",
                              state.verdict, {"answered": report.answered})
            first = batches[0] if batches else None
            now = None
            if alarm and state.verdict == "faithful":
                # the test saw a change: the verdict on the answers since it began says what it is (one that reads
                # faithful raises nothing yet: the test goes on gathering)
                since = round_batch(tx, t.model_id, state.since or state.rounds, first)
                now = endpoint_verdicts.verdict_now(tx, model, t, ref, since=since)
                if now["verdict"] not in ("faithful", "not conclusive"):
                    event = Event(t.claim.endpoint, model, at, count + 1, f"faithful -> {now['verdict']}",
                                  now["verdict"], {**evidence, "verdict": now, "since_batch": since,
                                                   "rounds": [state.since or state.rounds, count + 1]})
                    state.verdict = now["verdict"]
            elif state.verdict != "faithful" and state.since is None:
                now = endpoint_verdicts.verdict_now(tx, model, t, ref, since=first or 0)
                event = Event(t.claim.endpoint, model, at, count + 1, f"{state.verdict} -> faithful", "faithful",
                              {**evidence, "verdict": now, "since_batch": first or 0})
                state.verdict = "faithful"
            if event is None or UNREACHABLE in event.change:
                now = endpoint_verdicts.verdict_now(tx, model, t, ref)     # (the evidence since the last change)
            assert now is not None      # (an event other than an outage's came with its verdict)
            row = round_row(t.claim.endpoint, model, count + 1, at, e, r, evidence=evidence, verdict=now["verdict"],
                            event=event)
            record(tx, t, model, batches, row, state=state, evidence={**evidence, "questions": shared}, event=event,
                   e=e, r=r)
            out.rounds.append(row)
            if event:
                out.events.append(event)
        if webhook:       # (kept with the rounds, in their transaction: an event is never raised and lost)
            for event in out.events:
                if event.model == model:
                    tx.sql("INSERT INTO watch_deliveries (url, event) VALUES (?, ?) RETURNING id",
                           [webhook, json.dumps(asdict(event), default=str)])


UNREACHABLE = "unreachable"


def silent_round(endpoint: str, model: str, number: int, at: str, report: v.EndpointReport, *, ref: Target | None,
                 state: sequential.State, last: str | None) -> tuple[Round, Event | None]:
    """A round with no question both sides answered: the endpoint answered nothing (unreachable: an outage event on
    its first such round), or the reference endpoint did not (not conclusive). -> (round, event or None)."""
    down = report.answered == 0
    verdict = UNREACHABLE if down else "not conclusive"
    why = ", ".join(f"{k} x{c}" for k, c in report.failures.items()) or "no answer"
    event = None
    if down and last != UNREACHABLE:
        event = Event(endpoint, model, at, number, f"{state.verdict} -> {UNREACHABLE}", UNREACHABLE,
                      {"asked": report.asked, "answered": 0, "failures": report.failures})
    reason = (f"answered none of {report.asked} requests ({why})" if down else
              f"the reference {ref.claim.endpoint if ref else ''} answered none of them")
    row = Round(endpoint, model, number, at, 0, None, [], None, None, [], 0, 0, 0.0, verdict,
                None if event is None else event.change, note=reason)
    return row, event


def record(tx: Tx, t: Target, model: str, batches: list[int], row: Round, *, state: sequential.State,
           evidence: dict[str, Any], event: Event | None, e: np.ndarray | None = None,
           r: np.ndarray | None = None) -> None:
    """The round's row in watch_rounds, the test's state after it (unchanged by a silent round) with it."""
    e = np.zeros(0, dtype=bool) if e is None else e
    r = np.zeros(0, dtype=bool) if r is None else r
    tx.sql("""INSERT INTO watch_rounds (model_id, claims, batch_id, n, correct, reference_correct,
              disagreements, worse, better, statistic, verdict, event, evidence)
              VALUES (?, (SELECT id FROM models WHERE name = ?), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
              RETURNING id""",
           [t.model_id, model, batches[0] if batches else None, len(e), int(e.sum()), int(r.sum()),
            int((e != r).sum()), row.worse_held, row.better_held, row.statistic, row.verdict,
            event and event.change, json.dumps({**evidence, "state": state.to_dict(),
                                                "event": asdict(event) if event else None}, default=str)])


def round_row(endpoint: str, model: str, number: int, at: str, e: np.ndarray, r: np.ndarray, *,
              evidence: dict[str, Any], verdict: str, event: Event | None) -> Round:
    n = len(e)
    k, d = int(e.sum()), int((e != r).sum())
    stat = max(evidence["s_drop"] / max(evidence["h_drop"], 1e-9), evidence["s_total"] / max(evidence["h_total"], 1e-9))
    return Round(endpoint, model, number, at, n, round(k / n, 4) if n else None, verdicts.wilson(k, n),
                 round(int(r.sum()) / n, 4) if n else None, round(d / n, 4) if n else None, verdicts.wilson(d, n),
                 evidence["worse_held"], evidence["better_held"], round(min(stat, 99.0), 3), verdict,
                 None if event is None else event.change)


def timeline(store: Store, models: list[str] | None = None) -> WatchResult:
    """Every watched endpoint's rounds so far, oldest first, with the events they raised."""
    out = WatchResult([], [])
    with store.tx() as tx:
        out.claims = [c for c in claims.current(tx) if not models or c.model in models]
        names = dict(tx.sql("SELECT id, name FROM models"))
        rows = tx.sql("""SELECT model_id, claims, n, correct, reference_correct, disagreements, worse, better,
                                statistic, verdict, event, evidence, created FROM watch_rounds ORDER BY id""")
    count: dict[int, int] = {}
    for mid, x, n, k, kr, d, w, b, stat, verdict, event, evidence, at in rows:
        model = names[int(x)]
        if models and model not in models:
            continue
        count[mid] = count.get(mid, 0) + 1
        out.rounds.append(Round(names[int(mid)], model, count[mid], str(at), n, round(k / n, 4) if n else None,
                                verdicts.wilson(k, n), round(kr / n, 4) if n else None, round(d / n, 4) if n else None,
                                verdicts.wilson(d, n), w, b, stat, verdict, event))
        e = json.loads(evidence) if isinstance(evidence, str) else evidence
        if e.get("event"):
            out.events.append(Event(**e["event"]))
    return out
