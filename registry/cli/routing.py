"""CLI commands for routing (route, log, mark-unavailable, mark-available): thin calls of the Registry's
routing methods, defined with cli.common's `command` decorator; cli/__init__.py attaches COMMANDS to the root group.
Nothing heavy is imported at start-up."""
from __future__ import annotations

import sys

import click

from registry.cli.common import command, emit_json, num, open_registry, table
from registry.routing.decision import LISTED, RouteOptions

CHUNK = 256  # texts per batch call: the progress bar moves per chunk; each chunk is one transaction and one log insert


def _names(values) -> list[str]:
    """--unavailable A --unavailable B, or A,B."""
    return [n.strip() for v in values for n in v.split(",") if n.strip()]


@command()
@click.argument("text", required=False)
@click.option("--file", "file_", type=click.Path(), help="Queries to route: JSONL or CSV (text, or question+options).")
@click.option("--out", type=click.Path(), help="Decisions out: .jsonl or .csv (with --frontier: the plot, .png, .pdf "
                                               "or .svg; without --out none is drawn).")
@click.option("--cost-weight", type=float, help="Maximise P(correct) - L x cost.")
@click.option("--min-prob", type=float, help="The cheapest model whose P(correct) reaches P (else the most likely).")
@click.option("--cost-by", type=click.Choice(["cost", "params"]), default=None,
              help="What cost means: the models' price (`cost`, route default; every candidate needs one) or their "
                   "size (`params`: params_b, models without it left out; --frontier default).")
@click.option("--include-probation", is_flag=True,
              help="Let models on probation (too few evaluations behind their embedding) be chosen.")
@click.option("--unavailable", multiple=True, help="A model never to choose (repeat, or comma-separated).")
@click.option("--no-log-text", is_flag=True, help="Log the query's hash but not its text.")
@click.option("--no-log", is_flag=True, help="Do not write the routing log.")
@click.option("--frontier", is_flag=True, help="Accuracy vs mean cost over a sweep of cost weights.")
@click.option("--split", default="test", show_default=True, help="Split for --frontier.")
@click.option("--top", type=click.IntRange(min=0), default=None,
              help="Candidates listed (default: 5 in the table, 50 with --json and --file, as over HTTP; 0: all).")
def route(ctx, *, text, file_, out, cost_weight, min_prob, cost_by, include_probation, unavailable, no_log_text,
          no_log, frontier, split, top, as_json):
    """Route a query (or a file of queries) to the model most likely to answer it."""
    if sum(x is not None and x is not False for x in (text, file_, frontier or None)) != 1:
        raise click.UsageError("give a query TEXT, --file, or --frontier (one of them)")
    if out is not None and text is not None:
        raise click.UsageError("--out writes the decisions of --file (or the plot of --frontier)")
    if out is not None:       # before anything is routed: a file named for one format never gets another
        from registry.data import route_files
        from registry.routing import frontier as fr

        (fr.check_plot_path if frontier else route_files.check_out_path)(out)
    reg = open_registry(ctx)
    if frontier:
        return _frontier(reg, split, cost_by or "params", out, as_json)
    options = RouteOptions(cost_weight=cost_weight, min_prob=min_prob, unavailable=tuple(_names(unavailable)),
                           log=not no_log, log_text=not no_log_text, cost_by=cost_by or "cost",
                           include_probation=include_probation, top=LISTED if top is None else top)
    if text is not None:
        d = reg.route(text, options)
        if as_json:
            return emit_json(d)
        if d.model is None:
            raise click.ClickException(d.note)
        click.echo(f"{d.model}{'  (fallback: the top choice is unavailable)' if d.fallback else ''}"
                   + (f"  (cost-aware, cost = {d.cost_basis})" if d.cost_basis else ""))
        # the table lists the models the policy could choose; those it left out are named below it
        shown = [c for c in d.candidates if c.eligible][:5 if top is None else top or None]
        if d.model not in {c.model for c in shown}:   # the choice is always in the table, even ranked lower
            shown = shown + [c for c in d.candidates if c.model == d.model]
        left_out = [c.model for c in d.candidates if not c.eligible and not c.probation]
        table([["*" if c.model == d.model else "", c.model, f"{c.prob:.3f}", f"{c.raw_prob:.3f}", c.embedded_from,
                num(c.cost), num(c.params_b), _status(c)] for c in shown],
              ["", "candidate", "P(correct)", "own P", "embedded from", "cost", "params_b", "status"])
        if left_out:
            click.echo(f"left out (no parameter count; cost by params_b): {', '.join(left_out)}")
        click.echo(f"encoder {d.encoder}; versions: " + ", ".join(f"{c.model} v{d.versions[c.model]}"
                                                                  for c in shown))
        click.echo("P(correct) is the model's own prediction (own P) with what the registry's answers add for queries "
                   "like this one (category offsets, nearest answered queries), shrunk toward the pool's by how "
                   "uncertain its embedding is")
        if d.policy:
            click.echo(d.policy)
        if d.note:
            click.echo(f"note: {d.note}")
        return
    from registry.data import route_files

    ids, texts = route_files.read_queries(file_)
    decisions = []
    # a bar only on a terminal: elsewhere click prints its label alone, a stray line in a log or a pipe
    with click.progressbar(length=len(texts), label="routing", file=sys.stderr,
                           hidden=not sys.stderr.isatty()) as bar:
        for s in range(0, len(texts), CHUNK):
            decisions += reg.route_batch(texts[s:s + CHUNK], options)
            bar.update(len(texts[s:s + CHUNK]))
    if out:
        route_files.write_decisions(out, ids, decisions)
    chosen = {}
    for d in decisions:
        chosen[d.model] = chosen.get(d.model, 0) + 1
    summary = {"queries": len(decisions), "fallbacks": sum(d.fallback for d in decisions), "chosen": chosen,
               "out": out}
    if as_json:
        return emit_json(summary if out else [{"id": i, **_asdict(d)} for i, d in zip(ids, decisions)])
    click.echo(f"{len(decisions)} queries routed, {summary['fallbacks']} fallbacks" + (f"; written to {out}" if out
                                                                                       else ""))
    table([[m, n] for m, n in sorted(chosen.items(), key=lambda kv: -kv[1])], ["model", "queries"])
    if decisions and decisions[0].policy:
        click.echo(decisions[0].policy)


def _asdict(d):
    from dataclasses import asdict

    return asdict(d)


def _status(c) -> str:
    return ", ".join(s for s, on in (("probation", c.probation), ("unavailable", not c.available)) if on)


def _frontier(reg, split, cost_by, png, as_json):
    from registry.routing import frontier as fr

    f = reg.frontier(split=split, cost_by=cost_by)
    if png:
        fr.plot(f, png)
    if as_json:
        return emit_json(f)
    click.echo(f"{f.queries} {split} queries, {len(f.models)} models; cost = {f.cost_basis}")
    seen, rows = set(), []
    for p in sorted(f.router, key=lambda p: p.cost_weight):
        key = (round(p.accuracy, 4), f"{p.mean_cost:.4g}")
        if key not in seen:
            seen.add(key)
            rows.append([p.label, f"{p.accuracy:.4f}", f"{p.mean_cost:.4g}", p.models_used, f"{p.coverage:.3f}"])
    table(rows, ["router", "accuracy", "mean cost", "models used", "coverage"])
    click.echo("")
    table([[p.label, f"{p.accuracy:.4f}", "" if p.scored_accuracy is None else f"{p.scored_accuracy:.4f}",
            p.scored, f"{p.mean_cost:g}"] for p in sorted(f.single, key=lambda p: p.mean_cost)],
          ["single model", "accuracy", "on its own results", "its results", "cost"])
    click.echo("accuracy: each query's choice among the models with a result for it, as `registry evaluate` "
               "scores routing" + (f" ({len(partial)} models lack results for some queries: where one has none, "
                                   f"its point takes the model with a result most likely right)"
                                   if (partial := [p for p in f.single if p.coverage < 1]) else ""))
    click.echo("")
    table([[p.label, f"{p.accuracy:.4f}", f"{p.mean_cost:.4g}"] for p in f.pareto],
          ["Pareto frontier", "accuracy", "mean cost"])
    b, c = f.best_single, f.cheapest_matching
    click.echo("")
    if c:
        click.echo(f"best single model {b.label}: accuracy {b.accuracy:.4f} at cost {b.mean_cost:g}; the router "
                   f"reaches {c.accuracy:.4f} at mean cost {c.mean_cost:.4g} ({c.label}): {100 * f.cost_ratio:.0f}%"
                   f" of it")
    for share, r in f.reach.items():
        got = ", ".join(f"{kind}: {r[kind]['label']} at {100 * r[kind]['cost_ratio']:.1f}%" if r[kind] and
                        r[kind]["cost_ratio"] is not None else f"{kind}: none" for kind in ("router", "single"))
        click.echo(f"reaching {100 * float(share):.0f}% of {b.label}'s accuracy ({r['target_accuracy']:.4f}), "
                   f"cost as a share of its: {got}")
    for n in f.notes:
        click.echo(f"note: {n}")
    click.echo(f"plot: {png}" if png else "plot: none drawn (--out f.png draws one)")


@command("log")
@click.option("--since", help="Only entries at or after this time (e.g. 2026-01-31 or '2026-01-31 12:00').")
@click.option("--limit", type=int, help="At most this many entries (the newest; with --oldest, the oldest).")
@click.option("--oldest", is_flag=True, help="Oldest first (default: newest first).")
def log_(ctx, since, limit, oldest, as_json):
    """The routing log, newest first: when, query hash (and text), chosen model, top candidates, versions used."""
    rows = open_registry(ctx).routing_log(since=since, limit=limit, oldest=oldest)
    if as_json:
        return emit_json(rows)
    table([[e.created[:19], e.query_hash[:12], (e.text or "")[:40].replace("\n", " "), e.model or "(none)",
            "yes" if e.fallback else "", ", ".join(f"{c['model']} {c['prob']:.2f}" for c in e.candidates[:3])]
           for e in rows], ["when", "query", "text", "model", "fallback", "top candidates"])


@command("mark-unavailable")
@click.argument("models", nargs=-1, required=True)
@click.option("--reason", help="Why (kept with the mark, and shown with it).")
def mark_unavailable(ctx, models, reason, as_json):
    """Never route to these models until marked available again."""
    _availability(open_registry(ctx).mark_unavailable(list(models), reason), as_json)


@command("mark-available")
@click.argument("models", nargs=-1, required=True)
@click.option("--reason", help="Why (kept with the mark, and shown with it).")
def mark_available(ctx, models, reason, as_json):
    """Let routing choose these models again."""
    _availability(open_registry(ctx).mark_available(list(models), reason), as_json)


def _availability(rows, as_json):
    if as_json:
        return emit_json(rows)
    down = [a.model for a in rows if not a.available]
    click.echo(f"unavailable: {', '.join(down) if down else '(none)'}")


COMMANDS = [route, log_, mark_unavailable, mark_available]
