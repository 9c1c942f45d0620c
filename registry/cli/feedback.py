"""`registry feedback`, `registry feedback-source` and `registry drift`: outcomes of proxied requests in, the
sources they come from, and the drift events raised on them; thin calls of the Registry's methods of the same
names (usecases/traffic/feedback.py)."""
from __future__ import annotations

import click

from registry.cli.common import command, emit_json, open_registry


@command()
@click.option("--file", "path", required=True, type=click.Path(dir_okay=False),
              help="JSONL, one {request_id, outcome, source} a line: ids the proxy returned.")
@click.option("--window", "window_s", type=float, default=None,
              help="Take outcomes of requests answered at most this many seconds ago (default 7 days).")
def feedback(ctx, path, window_s, as_json):
    """Outcomes of requests the routing proxy answered: each lands as an evaluation of the model that answered on the
    request's production query (all or nothing), the drift test runs, and the models re-embed."""
    o = {} if window_s is None else {"window_s": window_s}
    r = open_registry(ctx).feedback(path, **o)
    if as_json:
        return emit_json(r)
    per = ", ".join(f"{m} {n}" for m, n in sorted(r.models.items()))
    click.echo(f"{r.outcomes:,} outcome(s) stored ({r.correct:,} right): {per}; {r.queries_added:,} production "
               f"quer{'y' if r.queries_added == 1 else 'ies'} added")
    if r.reembedded:
        click.echo(f"re-embedded: {', '.join(r.reembedded)}")
    for e in r.events:
        click.echo(f"drift: {e.model} on {e.category}: dropped {e.drop:.3f} ({e.evidence['observed']:.3f} observed "
                   f"against {e.evidence['expected']:.3f} expected over {e.evidence['outcomes']} outcomes)")


@command("feedback-source")
@click.argument("name")
@click.option("--weight", type=float, help="How much each outcome counts (0 to 100; 0 leaves it out).")
@click.option("--threshold", type=float, help="A score at or above it is a right answer (0 to 1).")
@click.option("--on/--off", "enabled", default=None, help="Count its outcomes, or leave them out.")
def feedback_source(ctx, name, weight, threshold, enabled, as_json):
    """Set a feedback source's weight, threshold or whether it counts; the models with its outcomes re-embed when it
    goes in or out. With no option: show every source."""
    reg = open_registry(ctx)
    if weight is None and threshold is None and enabled is None:
        found = [s for s in reg.feedback_sources() if s.name == name]
        if as_json:
            return emit_json(found)
        for s in found or [None]:
            click.echo(f"{name}: no outcomes and no setting yet (weight 1, threshold 0.5, on)" if s is None else
                       f"{s.name}: weight {s.weight:g}, threshold {s.threshold:g}, {'on' if s.enabled else 'off'}, "
                       f"{s.outcomes:,} outcome(s)")
        return
    r = reg.feedback_source(name, weight=weight, threshold=threshold, enabled=enabled)
    if as_json:
        return emit_json(r)
    s = r.source
    click.echo(f"{s.name}: weight {s.weight:g}, threshold {s.threshold:g}, {'on' if s.enabled else 'off'}"
               + (f"; re-embedded: {', '.join(r.reembedded)}" if r.reembedded else ""))


@command()
@click.option("--model", help="Only this model's events.")
def drift(ctx, model, as_json):
    """The drift events: a model whose production outcomes on a category fell below what routing predicted."""
    events = open_registry(ctx).drift(model)
    if as_json:
        return emit_json(events)
    if not events:
        click.echo("no drift events")
    for e in events:
        ev = e.evidence
        click.echo(f"{e.created}  {e.model} on {e.category}: dropped {e.drop:.3f} ({ev['observed']:.3f} observed "
                   f"against {ev['expected']:.3f} expected over {ev['outcomes']} outcomes, CUSUM {e.statistic:.2f})")


COMMANDS = [feedback, feedback_source, drift]
