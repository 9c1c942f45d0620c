"""`registry ask`: ask an endpoint questions, grade them, and say what its answers show."""
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


COMMANDS = [ask]
