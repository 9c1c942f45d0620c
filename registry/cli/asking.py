"""`registry ask`: ask an endpoint questions, grade them, and say what its answers show. `registry prompt`: send one
prompt through the router and print the answer and the model that gave it."""
from __future__ import annotations

from types import SimpleNamespace

import click

from registry.cli.common import command, emit_json, neighbour_rows, open_registry, table


@command()
@click.argument("name")
@click.option("-n", "n", default=128, show_default=True,
              help="Answers wanted from this endpoint under the prompt template (asking again asks only the rest).")
@click.option("--plan", type=click.Choice(["fingerprint", "probe", "random"]), default="fingerprint",
              show_default=True, help="Which questions: those that tell models apart, those that settle NAME's "
                                      "embedding fastest, or random ones.")
@click.option("--concurrency", default=8, show_default=True, help="Requests in flight at once.")
@click.option("--base-url", help="A new endpoint (OpenAI-compatible); NAME is registered with it.")
@click.option("--upstream-model", help="The model id the endpoint knows it by (default: NAME).")
@click.option("--api-key-env", help="The NAME of the environment variable holding the API key (read per request).")
@click.option("--keep-responses", is_flag=True, help="Store the raw reply texts too (their hashes are always kept).")
@click.option("--deadline", default=60.0, show_default=True, help="Seconds one request may take.")
@click.option("--seed", default=0, show_default=True, help="Seed of the plan.")
def ask(ctx, name, *, n, plan, concurrency, base_url, upstream_model, api_key_env, keep_responses, deadline, seed,
        as_json):
    """Ask NAME's endpoint N questions, grade and store the answers, then give its fingerprint verdict, nearest
    models and the next questions worth asking."""
    r = open_registry(ctx).ask(name, n=n, plan=plan, concurrency=concurrency, base_url=base_url,
                               upstream_model=upstream_model, api_key_env=api_key_env,
                               keep_responses=keep_responses, deadline=deadline, seed=seed, progress=not as_json)
    if as_json:
        emit_json(r)
        return
    click.echo(f"{r.model} at {r.base_url} ({r.upstream_model}), template {r.template}: {r.already} answered before, "
               f"{r.asked} asked now, {r.answered} answered ({r.correct} right, {r.unparseable} unparseable: "
               f"graded wrong), {r.unanswered} unanswered")
    cost = "" if r.cost is None else f", cost {r.cost:.4f}"
    click.echo(f"requests: {r.requests} ({r.retries} retries); tokens: {r.prompt_tokens} prompt + "
               f"{r.completion_tokens} completion{cost}")
    for why, count in r.failures.items():
        click.echo(f"no answer: {count} ({why})")
    if r.verdict:
        click.echo("fingerprint: " + r.verdict["summary"])
    reg = r.registration
    if reg:
        click.echo(f"embedding: {'none yet' if reg['version'] is None else 'version ' + str(reg['version'])}, "
                   f"status {reg['status']}")
        if reg["neighbours"]:
            near = [SimpleNamespace(**x) for x in reg["neighbours"]]
            table(neighbour_rows(near), ["nearest", "distance", "disagreement", "shared queries"])
        if reg["warning"]:
            click.echo(f"warning: {reg['warning']}")
    if r.next_questions:
        click.echo(f"next questions worth asking: {', '.join(r.next_questions[:8])}"
                   + (" ..." if len(r.next_questions) > 8 else ""))


@command()
@click.argument("text")
@click.option("--system", help="A system message sent before TEXT.")
@click.option("--cost-weight", type=float, help="Maximise P(correct) - L x cost.")
@click.option("--min-prob", type=float, help="The cheapest model whose P(correct) reaches P (else the most likely).")
@click.option("--cost-by", type=click.Choice(["cost", "params"]), default="cost", show_default=True,
              help="What cost means: the models' price or their size (params_b).")
@click.option("--include-probation", is_flag=True, help="Let models on probation be chosen.")
@click.option("--deadline", default=60.0, show_default=True, help="Seconds one request may take.")
def prompt(ctx, text, *, system, cost_weight, min_prob, cost_by, include_probation, deadline, as_json):
    """Send TEXT through the router: to the model most likely to answer it among those with an endpoint (`registry
    endpoints`), the next one where its upstream fails; print the answer, and on stderr which model gave it."""
    r = open_registry(ctx).prompt(text, system=system, cost_weight=cost_weight, min_prob=min_prob, cost_by=cost_by,
                                  include_probation=include_probation, deadline=deadline)
    if as_json:
        emit_json(r)
        return
    click.echo(r.answer)
    prob = r.decision.get("prob")
    why = "; ".join(f"{s['model']}: {s['why']}" for s in r.skipped)
    tokens = "" if r.prompt_tokens is None else f"; tokens {r.prompt_tokens} prompt + {r.completion_tokens} completion"
    click.echo(f"-- {r.model}" + ("" if prob is None else f" (P(correct) {prob:.3f})")
               + (f"; passed over {why}" if why else "") + tokens, err=True)


COMMANDS = [ask, prompt]
