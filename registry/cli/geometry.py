"""CLI mirror of the embedding-space questions: similar, fingerprint, portfolio, fallback, map, geometry.

Each command is a thin call of its `Registry` method, defined with cli.common's `command` decorator (library errors
become one-line click errors); cli/__init__.py attaches COMMANDS to the root group.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import click

from registry.cli.common import command, emit_json, neighbour_rows, open_registry, table
from registry.core.errors import InputError

AS_OF = click.option("--as-of", help="Answer as the registry stood at this time (ISO timestamp).")


@command()
@click.argument("model", required=False)
@click.option("--evals", type=click.Path(), help="Results of an unregistered model (embedded on the fly, not stored).")
@click.option("-k", default=5, show_default=True, help="How many neighbours.")
@AS_OF
def similar(ctx, model, evals, k, as_of, as_json):
    """The nearest registered models to MODEL (or to --evals FILE), with how often they really disagree: ranked by
    their shared answers where they have some, else by the embedding ('placed by'; 'ranked at': the two combined;
    'errs alike': the correlation of their mistakes beyond the questions' difficulty, which places two well-placed
    models)."""
    from registry.answers.neighbours import RANKED_BY_ANSWERS, similar_notes

    reg = open_registry(ctx)
    out = reg.similar(model, k=k, evals=evals, as_of=as_of)
    own = reg.embedded_from([model], as_of).get(model) if model else None
    notes = similar_notes(out, k, model, own, reg.probation_min)
    if as_json:
        emit_json({"neighbours": out, "ranked_by": RANKED_BY_ANSWERS, "note": "; ".join(notes) or None})
        return
    fmt = lambda v: "" if v is None else f"{v:.4f}"  # noqa: E731
    rows = [[row[0] + (" (alias)" if x.alias else "")] + row[1:] + [
        fmt(x.error_correlation), x.embedded_from or "", x.placed_by or "", fmt(x.combined)]
        for row, x in zip(neighbour_rows(out), out)]
    table(rows, ["model", "distance", "disagreement", "shared queries", "errs alike", "embedded from", "placed by",
                 "ranked at"])
    click.echo(f"ranked by: {RANKED_BY_ANSWERS}")
    for line in notes:
        click.echo(f"note: {line}")


@command()
@click.option("--evals", type=click.Path(), help="Results of the unknown endpoint: query id, correct.")
@click.option("--calibration", "show_calibration", is_flag=True, help="Show the same-model threshold's calibration.")
@click.option("--plan", "plan", is_flag=True, help="List the queries that best tell the candidates apart.")
@click.option("-n", "n", default=64, show_default=True, help="How many queries to plan (--plan).")
@click.option("--candidates", multiple=True, help="A candidate model (repeatable, or comma-separated; --plan; "
                                                  "default: every model with the probation minimum of answers).")
@click.option("--out", type=click.Path(), help="Write the plan here (.csv or .jsonl; fill in `correct`, then "
                                              "`registry fingerprint --evals FILE`).")
@click.option("--seed", default=0, show_default=True, help="Seed of the plan's tie-breaks (--plan).")
def fingerprint(ctx, *, evals, show_calibration, plan, n, candidates, out, seed, as_json):
    """Is an unknown endpoint one of the registered models? (or, with --calibration, how the verdict is calibrated;
    with --plan, which queries to ask it)"""
    if (bool(evals) + show_calibration + plan) != 1:
        raise InputError("give --evals FILE, --calibration or --plan (one of them)")
    if not plan and (candidates or out):
        raise InputError("--candidates and --out go with --plan")
    reg = open_registry(ctx)
    if plan:
        names = [c.strip() for arg in candidates for c in arg.split(",") if c.strip()]
        p = reg.fingerprint_plan(n, names, seed=seed, out=out)
        if as_json:
            emit_json(p)
            return
        click.echo(f"{len(p.probes)} queries separating {len(p.candidates)} candidates (of {p.pool} answered by "
                   f"two or more); the least separated pair, {' and '.join(p.closest_pair)}, differs on "
                   f"{p.separated} of them (on as many random queries the least separated pair differs on "
                   f"{p.random_separated:g}, mean of 100 draws)")
        if p.left_out:
            click.echo(f"not candidates (fewer than {reg.probation_min} answers; name them with --candidates): "
                       + ", ".join(p.left_out))
        table([[r.question_id, r.category or "", r.text[:60].replace("\n", " ")] for r in p.probes],
              ["question_id", "category", "question"])
        if p.file:
            click.echo(f"written to {p.file}: fill in `correct` (1/0), then `registry fingerprint --evals {p.file}`")
        return
    if show_calibration:
        c = reg.calibration()
        if as_json:
            emit_json(c)
            return
        a = c.answers
        if a.p_min is None:
            click.echo("answers test: no two models share enough evaluated queries to calibrate it")
        else:
            click.echo(f"answers test: the closest distinct pair, {' and '.join(a.closest_pair)}, disagrees on "
                       f"{a.p_min:.1%} of shared queries ({a.pairs} pairs); 'same' needs a disagreement rate at most:")
            table([[n, "never" if t is None else f"{t:.4f}"] for n, t in c.answer_thresholds.items()],
                  ["shared queries", "disagreement"])
        e = c.embedding
        if e is not None:
            click.echo(f"embedding test (too few shared queries): 'same' under distance {e.threshold:.4f}, the "
                       f"closest two distinct models came over {e.draws} draws of {e.sample} evaluations "
                       f"({e.models} models); same-model pairs under it: {e.same_below:.1%}")
        return
    f = reg.fingerprint(evals)
    if as_json:
        emit_json(f)
        return
    click.echo(f.summary)
    if f.runner_up:
        click.echo(f"next: {f.runner_up}" + ("" if f.runner_up_disagreement is None else
                                            f" ({f.runner_up_disagreement:.1%} disagreement)"))


@command()
@click.option("-k", type=int, help="Portfolio size (default 5, as over HTTP and on the web page; with --target: at "
                                   "most this many).")
@click.option("--method", type=click.Choice(["kmedoids", "kcenter", "routing"]), default=None,
              help="Keep the routing (greedy by routing value on the validation queries; the default) or cover the "
                   "embedding space (kmedoids, the default without a validation split; kcenter).")
@click.option("--max-params", type=float, help="Only models of at most this many parameters (billions).")
@click.option("--max-cost", type=float, help="Only models costing at most this much.")
@click.option("--require", multiple=True, help="A model that must be in the portfolio (repeatable).")
@click.option("--exclude", multiple=True, help="A model that must not be (repeatable).")
@click.option("--target", type=float, help="Find the smallest k (up to -k, if given) reaching this share of the pool's "
                                           "routing accuracy.")
@click.option("--seed", default=0, show_default=True, help="Seed of the search's random restarts.")
@click.option("--include-probation", is_flag=True, help="Let models on probation (too few evaluations) be members.")
@click.option("--fill", is_flag=True, help="By routing value: exactly k members, even those that add nothing.")
@AS_OF
def portfolio(ctx, *, k, method, max_params, max_cost, require, exclude, target, seed, include_probation, fill,
              as_of, as_json):
    """A few models that keep the routing (or cover the embedding space), each with what it adds, its cluster, and
    the coverage radius."""
    p = open_registry(ctx).portfolio(k, method, max_params=max_params, max_cost=max_cost, require=require,
                                     exclude=exclude, target=target, seed=seed, as_of=as_of,
                                     include_probation=include_probation, fill=fill)
    if as_json:
        emit_json(p)
        return
    click.echo(f"{p.k} models by {p.method}, coverage radius {p.radius:.4f}")
    if p.share_of_pool is not None:
        click.echo(f"routing accuracy {p.accuracy:.4f} on test (as served, among the members) = {p.share_of_pool:.1%} "
                   f"of the pool's {p.pool_accuracy:.4f}")
    if p.note:
        click.echo(f"note: {p.note}")
    rows = [[m, len(p.clusters[m]), ", ".join(p.clusters[m][1:6]) + (" ..." if len(p.clusters[m]) > 6 else "")]
            for m in p.models]
    if p.gains is not None:   # what each member adds to the predicted routing accuracy, in the order chosen
        rows = [[row[0], f"+{p.gains[row[0]]:.4f}", *row[1:]] for row in rows]
    table(rows, ["member", "routing gain", "cluster size", "covers"] if p.gains is not None
          else ["member", "cluster size", "covers"])


@command()
@click.argument("model", required=False)
@click.option("--all", "all_models", is_flag=True, help="Every model's chain (a JSON a gateway can load).")
@click.option("--unavailable", multiple=True, help="A model that is down too (repeatable).")
@click.option("-k", default=5, show_default=True, help="Substitutes per chain.")
@click.option("--include-probation", is_flag=True, help="Let models on probation (too few evaluations) substitute.")
@AS_OF
def fallback(ctx, model, *, all_models, unavailable, k, include_probation, as_of, as_json):
    """Substitutes for MODEL when it is down, nearest first, skipping models marked unavailable (and --unavailable)
    and models on probation."""
    if bool(model) == all_models:
        raise InputError("give a MODEL or --all (one of them)")
    reg = open_registry(ctx)
    if all_models:
        c = reg.fallback_all(unavailable, k, as_of, include_probation)
        if as_json:
            emit_json({"chains": {m: [asdict(link) for link in links] for m, links in c.chains.items()},
                       "unavailable": c.unavailable, "probation": c.probation, "ranked_by": c.ranked_by})
            return
        for m, links in c.chains.items():
            click.echo(f"{m}: " + " -> ".join(link.model for link in links))
        click.echo(f"ranked by: {c.ranked_by}")
        _skipped(c.unavailable, c.probation)
        return
    c = reg.fallback(model, unavailable, k, as_of, include_probation)
    if as_json:
        emit_json({"model": c.model, "chain": [asdict(link) for link in c.chain], "unavailable": c.unavailable,
                   "probation": c.probation, "ranked_by": c.ranked_by, "alias_of": c.alias_of})
        return
    if c.alias_of:
        click.echo(f"{c.model} is another name of {c.alias_of}: its substitutes")
    table([[i + 1, link.model, f"{link.distance:.4f}"] for i, link in enumerate(c.chain)], ["#", "model", "distance"])
    click.echo(f"ranked by: {c.ranked_by}")
    _skipped(c.unavailable, c.probation)


def _skipped(down: list[str], probation: Sequence[str] = ()) -> None:
    if down:
        click.echo(f"skipped as unavailable: {', '.join(down)}")
    if probation:
        click.echo(f"skipped as on probation (too few evaluations; --include-probation to allow): "
                   f"{', '.join(probation)}")


@command("map")
@click.option("--out", default="map.png", show_default=True, type=click.Path(), help="Image file (.png, .svg, .pdf).")
@click.option("--seed", default=0, show_default=True, help="Seed of the 2-d layout.")
@AS_OF
def map_(ctx, out, seed, as_of, as_json):
    """A 2-D map of the model embeddings, coloured by family, every model labelled."""
    m = open_registry(ctx).map(out, seed, as_of)
    if as_json:
        emit_json(m)
        return
    shares = "" if m.axis_shares is None else (f": {m.axis_shares[0]:.1%} and {m.axis_shares[1]:.1%} of the "
                                                f"variance on its axes")
    click.echo(f"{m.out}: {m.models} models, {m.families} families ({m.method}{shares})")


@command()
@click.option("--min-shared", default=10, show_default=True, help="Fewest shared test queries for a pair to count.")
@AS_OF
def geometry(ctx, min_shared, as_of, as_json):
    """How well embedding distance tracks disagreement on test queries (Pearson, Spearman)."""
    g = open_registry(ctx).geometry(min_shared, as_of)
    if as_json:
        emit_json(g)
        return
    click.echo(f"Pearson {g.pearson:.4f}, Spearman {g.spearman:.4f} over {g.pairs} model pairs "
               f"({g.test_queries} test queries)")


COMMANDS = [similar, fingerprint, portfolio, fallback, map_, geometry]
