"""`registry ask NAME`: choose the questions (a fingerprint plan, probes, or at random), ask an endpoint the ones it
has not answered under the current template, grade the replies, store them as one import batch with their provenance,
then embed the model and say what its answers show: the fingerprint verdict, nearest models, probation, and the next
questions worth asking (the steps: asking/run.py)."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from registry.answers import probe_plans, registration
from registry.asking import grading, prompt, run
from registry.asking.run import AskResult
from registry.core.errors import EndpointFailed, InputError
from registry.core.keys import OWNER, UpstreamKeys
from registry.core.store import Store
from registry.data import endpoints, import_run
from registry.embedding import evidence
from registry.usecases import onboard as onboard_uc
from registry.usecases import register as register_uc
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
