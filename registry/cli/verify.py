"""`registry verify` (is each endpoint that claims a model (`registry endpoints add`) serving it faithfully?) and
`registry watch` (and is it still?)."""
from __future__ import annotations

import click

from registry.cli.common import command, emit_json, open_registry, table


def pct(x) -> str:
    return "" if x is None else f"{x:.1%}"


def interval(ci) -> str:
    return f"[{ci[0]:.1%}, {ci[1]:.1%}]" if ci else ""


def verify_rows(result) -> list[list]:
    rows = []
    for e in result.endpoints:
        v = e.verdict or {}
        cost = "" if e.cost is None else f"{e.cost:.4f}"
        tokens = e.prompt_tokens + e.completion_tokens
        name = e.endpoint + (" (ref)" if e.reference else "")
        verdict = v.get("verdict", "") + (f": {v['substitute']}" if v.get("substitute") else "")
        rows.append([name, v.get("n", ""), f"{pct(v.get('accuracy'))} {interval(v.get('accuracy_ci'))}".strip(),
                     pct(v.get("disagreement")), pct(v.get("self_disagreement")), pct(v.get("expected_disagreement")),
                     "" if v.get("drop") is None else f"{v['drop']:+.1%} {interval(v.get('drop_ci'))}",
                     verdict, tokens, cost])
    return rows


@command()
@click.argument("model")
@click.option("--endpoint", "names", multiple=True, help="Only this claiming endpoint (repeatable; the reference "
                                                         "is always asked).")
@click.option("-n", "n", default=256, show_default=True, help="Planned questions every endpoint answers.")
@click.option("--repeat", default=32, show_default=True, help="Of those, asked twice to measure nondeterminism.")
@click.option("--seed", default=0, show_default=True, help="Seed of the plan (the same seed extends the same plan).")
@click.option("--concurrency", default=8, show_default=True, help="Requests in flight per endpoint.")
@click.option("--deadline", default=60.0, show_default=True, help="Seconds one request may take.")
@click.option("--alpha", default=0.002, show_default=True, help="Each test's false-alarm rate.")
@click.option("--tolerance", "--min-drop", default=0.02, show_default=True,
              help="Accuracy drop tolerated: degraded only when the drop's 95% interval lies beyond it.")
def verify(ctx, model, *, names, n, repeat, seed, concurrency, deadline, alpha, tolerance, as_json):
    """Ask every endpoint claiming MODEL the same planned questions and say whether each serves it faithfully, or
    degraded, or another model (exit 3 when one is not faithful)."""
    r = open_registry(ctx).verify(model, endpoints=list(names) or None, n=n, repeat=repeat, seed=seed,
                                  concurrency=concurrency, deadline=deadline, alpha=alpha, tolerance=tolerance,
                                  progress=not as_json)
    if as_json:
        emit_json({**r.__dict__, "faithful": r.faithful})
    else:
        click.echo(f"{r.model}: {r.n} planned questions (+{r.repeat} repeats), template {r.template}, reference: "
                   f"{r.reference}; {r.seconds:.1f} s")
        if r.note:
            click.echo(f"note: {r.note}")
        table(verify_rows(r), ["endpoint", "n", "accuracy (95% CI)", "disagrees", "self", "allowed", "drop (95% CI)",
                               "verdict", "tokens", "cost"])
        for e in r.endpoints:
            sent = f"{e.asked} sent, {e.already} answered before"
            fails = "; ".join(f"{c} {why}" for why, c in e.failures.items())
            unanswered = "; no answer: " + fails if fails else ""
            click.echo(f"{e.endpoint}: {e.verdict.get('reason', '')} ({sent}{unanswered})")
            for flag in e.flags:
                click.echo(f"{e.endpoint}: flagged: {flag}")
    if not r.faithful:
        ctx.exit(3)


def seconds_of(every: str) -> float:
    """'6h', '30m', '90s', '1d' or a number of seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = every.strip().lower()
    try:
        value = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        value = -1
    if value <= 0:
        raise click.BadParameter(f"a duration such as 6h, 30m or 90s, got {every!r}", param_hint="--every")
    return value


def show_timeline(r) -> None:
    table([[x.endpoint, x.round, x.at[:19], x.n, f"{pct(x.accuracy)} {interval(x.accuracy_ci)}",
            f"{pct(x.disagreement)} {interval(x.disagreement_ci)}", f"{x.worse_held}/{x.better_held}",
            f"{x.statistic:.2f}", x.verdict, x.event or ""] for x in r.rounds],
          ["endpoint", "round", "at", "n", "accuracy (95% CI)", "disagrees (95% CI)", "held worse/better",
           "test", "verdict", "event"])


@command()
@click.option("--once", is_flag=True, help="One round, then exit (for cron and systemd timers; the default).")
@click.option("--every", help="A round every DURATION (6h, 30m, 90s), until interrupted.")
@click.option("-n", "n", default=64, show_default=True, help="Fresh questions per round.")
@click.option("--model", "models", multiple=True, help="Only the endpoints claiming this model (repeatable).")
@click.option("--status", is_flag=True, help="Each watched endpoint's timeline so far; nothing is asked.")
@click.option("--webhook", help="POST each event as JSON to this URL (the owner's, set at start-up).")
@click.option("--seed", default=0, show_default=True, help="Seed of the question order the rounds rotate through.")
@click.option("--concurrency", default=8, show_default=True, help="Requests in flight per endpoint.")
@click.option("--deadline", default=60.0, show_default=True, help="Seconds one request may take.")
def watch(ctx, *, once, every, n, models, status, webhook, seed, concurrency, deadline, as_json):
    """Ask every watched endpoint a round of fresh questions and run its sequential test: a change from faithful
    prints as one JSON line (exit 3 when a round raised one)."""
    import json
    import time

    if once and every:
        raise click.UsageError("give --once or --every, not both")
    wait = seconds_of(every) if every else None
    reg = open_registry(ctx)
    if status:
        r = reg.watch(status=True, models=list(models) or None)
        return emit_json(r) if as_json else show_timeline(r)
    raised = False
    start = time.monotonic()
    while True:
        r = reg.watch(n=n, models=list(models) or None, seed=seed, concurrency=concurrency, deadline=deadline,
                      webhook=webhook, progress=False)
        raised = raised or bool(r.events)
        if as_json:
            emit_json(r)
        else:
            for e in r.events:
                click.echo(json.dumps(e.__dict__, default=str))
            for x in r.rounds:
                click.echo(f"{x.endpoint} round {x.round}: {x.verdict}, {x.note}" if x.note else
                           f"{x.endpoint} round {x.round}: accuracy {pct(x.accuracy)}, disagrees {pct(x.disagreement)}"
                           f", held {x.worse_held} worse / {x.better_held} better, test {x.statistic:.2f} of 1, "
                           f"{x.verdict}", err=True)
        for why in r.webhook_failures:
            click.echo(f"webhook: {why}", err=True)
        if wait is None:
            break
        # by the clock, not after each round: a slow round (a webhook's budget spent) does not push the later ones
        late = (time.monotonic() - start) % wait
        time.sleep(wait - late)
    if raised:
        ctx.exit(3)


COMMANDS = [verify, watch]
