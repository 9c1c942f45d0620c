"""`registry ask NAME`: choose the questions (a fingerprint plan, probes, or at random), ask an endpoint the ones it
has not answered under the current template, grade the replies, store them as one import batch with their provenance,
then embed the model and say what its answers show: the fingerprint verdict, nearest models, probation, and the next
questions worth asking (the steps: asking/run.py). `registry prompt TEXT`: one prompt sent through the router, to the
most likely model with an endpoint, the next one with an endpoint where its upstream fails."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from registry.answers import probe_plans, registration
from registry.asking import client, grading, prompt, run
from registry.asking.run import AskResult
from registry.core.errors import Conflict, EndpointFailed, InputError
from registry.core.keys import OWNER, KeyRefused, UpstreamKeys
from registry.core.store import Store
from registry.data import endpoints, import_run
from registry.embedding import evidence
from registry.routing.decision import RouteOptions
from registry.usecases import onboard as onboard_uc
from registry.usecases import register as register_uc
from registry.usecases import route as route_uc
from registry.usecases.verify import own_thread, stop_if_cancelled


def ask(store: Store, name: str, *, min_evaluations: int, probation: int | None, n: int = 128,
        plan: str = "fingerprint", concurrency: int = 8, base_url: str | None = None,
        upstream_model: str | None = None, api_key_env: str | None = None, keep_responses: bool = False,
        seed: int = 0, deadline: float = 60.0, retries: int = 4,
        backoff: float = 0.5, progress: bool = False, k: int = 5, keys: UpstreamKeys = OWNER,
        keep_endpoint: bool = False, write: Callable[[Callable[[], Any]], Any] = own_thread,
        cancel: threading.Event | None = None) -> AskResult:
    """`registry ask NAME` (`probation`: the minimum set, None: the data's); keys: where an endpoint's key may go
    (a server's bindings; the command line: the owner's own); keep_endpoint: a base URL (upstream model, key) other
    than the model's recorded endpoint is refused, not recorded in its place (the HTTP API). Raises EndpointFailed,
    having written nothing, when the endpoint answered none of the questions asked. A server passes `write` and
    `cancel` (verify.verify's: the asking runs outside its writer)."""
    from dataclasses import asdict

    name = registration.check(name, {})
    if plan not in run.PLANS:
        raise InputError(f"--plan must be one of {', '.join(run.PLANS)}, got {plan!r}")
    if n < 1 or concurrency < 1:
        raise InputError(f"-n and --concurrency must be at least 1, got {n} and {concurrency}")
    write(lambda: onboard_uc.finish_pending(store, min_evaluations))
    # nothing is written until the endpoint has answered: a URL that cannot be asked, or an endpoint that answers
    # nothing, leaves the registry as it was (no new model, no endpoint recorded or replaced)
    with store.tx() as tx:
        endpoint, record = run.resolve_endpoint(tx, name, base_url, upstream_model, api_key_env, keys,
                                                keep=keep_endpoint)
        found = tx.sql("SELECT id, cost FROM models WHERE name = ?", [name])
        model_id, price = (int(found[0][0]), found[0][1]) if found else (None, None)
        skip = run.answered_before(tx, model_id, endpoint.base_url) if model_id is not None else set()
        wanted = max(0, n - len(skip))
        chosen = run.choose(tx, name, "random", 1, skip, seed=seed, min_answers=0) if wanted else []
        gold = {int(q): (t, a, g) for q, t, a, g in tx.sql(
            f"SELECT id, text, answer, grading FROM {run.WITH_GOLD}")} if chosen else {}
    # one question, at random, alone first: an endpoint that answers nothing is told in a request or two, before
    # the plan is made (a plan of thousands of questions takes minutes)
    replies, usage = run.ask_questions(endpoint, gold, chosen, concurrency=1, deadline=deadline, retries=retries,
                                       backoff=backoff, progress=False, unreachable_after=run.PROBE_UNREACHABLE_AFTER,
                                       cancel=cancel)
    if wanted > 1 and replies and replies[0].text is not None:
        with store.tx() as tx:
            rest = run.choose(tx, name, plan, wanted - 1, skip | set(chosen), seed=seed,
                              min_answers=evidence.minimum(tx, probation))
        more, also = run.ask_questions(endpoint, gold, rest, concurrency=concurrency, deadline=deadline,
                                       retries=retries, backoff=backoff, progress=progress, cancel=cancel)
        chosen, replies, usage = chosen + rest, replies + more, run.total_usage(usage, also)
    graded, unparseable = [], 0
    for r in replies:
        if r.text is None:
            continue                                  # no reply: unanswered, asked again next time
        text, answer, kind = gold[r.key]
        extracted = grading.extract(r.text, kind, options=grading.options_in(text), gold=answer)
        unparseable += extracted is None
        graded.append((r.key, extracted, grading.grade(extracted, answer, kind), r.text))
    if chosen and not graded:
        why = max(usage.failures, key=lambda why: usage.failures[why]) if usage.failures else "no reply"
        raise EndpointFailed(f"{endpoint.base_url} answered none of the {len(chosen)} question(s) asked ({why}); "
                             f"nothing was stored")
    batch_id = None
    if graded:
        def stored() -> tuple[int | None, int]:
            with store.tx() as tx:
                if record:
                    if not tx.sql("SELECT 1 FROM models WHERE name = ?", [name]):
                        import_run.insert_new_models(tx, {name: {}})
                    endpoints.set_endpoint(tx, name, endpoint.base_url,
                                           None if endpoint.upstream_model == name else endpoint.upstream_model,
                                           endpoint.api_key_env)
                return (run.store_answers(tx, name, graded, endpoint, keep_responses),
                        int(tx.sql("SELECT id FROM models WHERE name = ?", [name])[0][0]))
        batch_id, model_id = write(stored)
    stop_if_cancelled(cancel)
    tokens = usage.prompt_tokens + usage.completion_tokens
    result = AskResult(name, endpoint.base_url, endpoint.upstream_model, prompt.TEMPLATE_VERSION, plan, n,
                       len(skip), len(chosen), len(graded), sum(g[2] for g in graded), unparseable,
                       len(chosen) - len(graded), usage.requests, usage.retries, usage.prompt_tokens,
                       usage.completion_tokens, None if price is None else round(price * tokens / 1e6, 6),
                       batch_id, usage.failures)
    outcomes = write(lambda: onboard_uc.onboard(store, min_evaluations))
    if model_id is None:                              # a new model with nothing to ask: nothing was written
        return result
    with store.tx() as tx:
        result.verdict = run.verdict(tx, model_id, endpoint.base_url)
        has_answers = bool(tx.sql("SELECT 1 FROM evaluations WHERE model_id = ? LIMIT 1", [model_id]))
    if has_answers:
        staged = registration.Staged(name, {}, len(graded), 0, 0)
        reported = register_uc.report(store, staged, {o.model: o for o in outcomes}.get(name), k=k,
                                      probation=probation)
        result.registration = asdict(reported)
        try:
            with store.tx() as tx:
                result.next_questions = [p.question_id for p in probe_plans.plan(tx, name, 16, seed).probes]
        except InputError:
            pass                                      # nothing left to ask, or nothing to plan against
    return result


PROMPT_TRIES = 3        # models with an endpoint a prompt is sent to, one after another, before it fails
SUMMARY_TOP = 5         # candidates the prompt's decision summary lists


@dataclass
class PromptResult:
    model: str                          # the model that answered
    answer: str
    chosen: str                         # routing's choice among the models with an endpoint
    decision: dict[str, Any]            # what routing weighed: policy, P(correct), the top candidates, the note
    skipped: list[dict[str, str]] = field(default_factory=list)   # [{model, why}]: models passed over, in order
    served_model: str | None = None     # the model the upstream's answer names
    prompt_tokens: int | None = None    # as the upstream reports them (None: it reported none)
    completion_tokens: int | None = None
    seconds: float = 0.0


def send_prompt(store: Store, text: str, *, probation: int | None, cost_weight: float | None = None,
                min_prob: float | None = None, cost_by: str = "cost", include_probation: bool = False,
                system: str | None = None, deadline: float = 60.0, retries: int = 2, backoff: float = 0.5,
                keys: UpstreamKeys = OWNER) -> PromptResult:
    """`registry prompt TEXT`: TEXT routed among the models with an endpoint (a more likely model without one is
    passed over and said), then sent to the chosen model's endpoint as one chat message (after `system`, if given);
    where that upstream fails, to the next most likely model with an endpoint, PROMPT_TRIES models at most. The
    decision is logged as `route` logs one, without the text. Conflict where no model has an endpoint;
    EndpointFailed where none of those tried answered."""
    if not isinstance(text, str) or not text.strip():
        raise InputError("give the prompt's text")
    started = time.perf_counter()
    with store.tx() as tx:
        eps = endpoints.current(tx)
        names = [r[0] for r in tx.sql("SELECT name FROM models ORDER BY name")]
    if not eps:
        raise Conflict("no model has an endpoint to send the prompt to: set one with `registry endpoints set MODEL "
                       "--base-url URL`")
    options = RouteOptions(cost_weight=cost_weight, min_prob=min_prob, cost_by=cost_by,
                           include_probation=include_probation, unavailable=tuple(n for n in names if n not in eps),
                           log_text=False)
    d = route_uc.route(store, text, options, probation=probation)
    if d.model is None:
        raise Conflict(f"no model with an endpoint can take the prompt: {d.note or 'none is available'}")
    rank = [c.model for c in d.candidates]
    skipped = [{"model": m, "why": "no endpoint"} for m in rank[:rank.index(d.model)] if m not in eps]
    tries = [d.model] + [c.model for c in d.candidates if c.model != d.model and c.model in eps and c.available
                         and c.eligible][:PROMPT_TRIES - 1]
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    for name in tries:
        ep = eps[name]
        target = client.Endpoint(ep.base_url, ep.upstream_model, ep.api_key_env, keys)
        try:
            replies, _ = client.ask_all(target, [(name, messages)], concurrency=1, deadline=deadline,
                                        retries=retries, backoff=backoff, unreachable_after=1)   # (refused: next)
        except KeyRefused as exc:                   # (nothing was sent)
            skipped.append({"model": name, "why": str(exc)})
            continue
        reply = replies[0]
        if reply.text is None:
            skipped.append({"model": name, "why": f"its endpoint failed: {reply.error or 'no reply'}"})
            continue
        probs = {c.model: c.prob for c in d.candidates}
        summary = {"policy": d.policy, "fallback": d.fallback, "note": d.note, "prob": probs.get(name),
                   "candidates": [{"model": c.model, "prob": c.prob, "endpoint": c.model in eps}
                                  for c in d.candidates[:SUMMARY_TOP]]}
        got = reply.prompt_tokens or reply.completion_tokens
        return PromptResult(name, reply.text, d.model, summary, skipped, reply.served_model,
                            reply.prompt_tokens if got else None, reply.completion_tokens if got else None,
                            round(time.perf_counter() - started, 3))
    raise EndpointFailed("no model answered the prompt: " + "; ".join(
        f"{s['model']}: {s['why']}" for s in skipped if s["why"] != "no endpoint"))
