"""Models and their embeddings: `registry models`, `show`, `stats`, `register`, `probe`, `onboard`, `history`,
`diff`."""
from __future__ import annotations

import click

from registry.cli.common import command, emit_json, neighbour_rows, num, open_registry, table


@command()
@click.option("--limit", type=click.IntRange(min=0), help="at most this many models (a page), by name")
@click.option("--offset", type=click.IntRange(min=0), default=0, show_default=True, help="skip this many first")
def models(ctx, as_json, *, limit, offset):
    """Each model with its number of evaluations and accuracy (by name; --limit and --offset for a page)."""
    rows = open_registry(ctx).models(limit=limit, offset=offset)
    if as_json:
        emit_json(rows)
        return
    aliased = any(m.alias_of for m in rows)     # the column only where a model is another's alias
    table([[m.name, m.family, num(m.params_b), m.evaluations, "" if m.accuracy is None else f"{m.accuracy:.3f}",
            "" if m.version is None else f"v{m.version}", m.status, "yes" if m.available else "NO"]
           + ([m.alias_of or ""] if aliased else []) for m in rows],
          ["model", "family", "params_b", "evaluations", "accuracy", "version", "status", "available"]
          + (["alias of"] if aliased else []))
    probation = [m for m in rows if m.status == "probation"]
    if probation:
        click.echo(f"probation: {len(probation)} model(s) embedded from too few evaluations; routing leaves them out "
                   f"unless asked (--include-probation)")


@command()
@click.argument("model")
def show(ctx, model, as_json):
    """One model: metadata, accuracy overall and per category."""
    d = open_registry(ctx).show(model)
    if as_json:
        emit_json(d)
        return
    weights = {True: "open", False: "closed", None: None}[d.open_weights]
    facts = [(k, v) for k, v in (("family", d.family), ("provider", d.provider), ("params_b", num(d.params_b)),
                                 ("cost", num(d.cost)), ("weights", weights)) if v not in (None, "")]
    click.echo(d.name + ("  " + " ".join(f"{k}={v}" for k, v in facts) if facts else ""))
    if d.tags:
        click.echo("tags: " + ", ".join(f"{k}={v}" for k, v in sorted(d.tags.items())))
    acc = "n/a" if d.accuracy is None else f"{d.accuracy:.3f}"
    click.echo(f"evaluations: {d.evaluations}  accuracy: {acc}  import batch ids: "
               f"{', '.join(map(str, d.batches)) or 'none'}")
    if d.version is None:
        click.echo(f"embedding: none yet  status: {d.status}")
    else:
        click.echo(f"embedding: version {d.version}, from {d.embedded_from} evaluations (test answers held out)  "
                   f"status: {d.status}")
    click.echo(f"available: {'yes' if d.available else 'no (marked unavailable: routing and fallback skip it)'}")
    if d.alias_of:
        click.echo(f"alias of: {d.alias_of} (" + ("its answers read 'same' when it was registered" if
                                                  d.alias_source == "registration" else "as its user said") + ")")
    if d.aliases:
        click.echo("aliases: " + ", ".join(d.aliases))
    table([[c, v["evaluations"], f"{v['accuracy']:.3f}"] for c, v in d.per_category.items()],
          ["category", "evaluations", "accuracy"])


@command()
def stats(ctx, as_json):
    """Counts of what the registry holds."""
    s = open_registry(ctx).stats()
    if as_json:
        emit_json(s)
        return
    click.echo(f"{s.path}: {s.models} models, {s.queries} queries, {s.evaluations} evaluations "
               f"({s.evaluation_rows} rows stored), {s.text_vectors} text vectors, {s.import_batches} import batches")
    if s.splits or s.unsplit_queries:
        click.echo("splits: " + ", ".join([f"{k} {v}" for k, v in s.splits.items()]
                                          + ([f"no split {s.unsplit_queries}"] if s.unsplit_queries else [])))


# --- onboarding and embedding history -----------------------------------------------------------------
def _parse_tags(tags: tuple[str, ...]) -> dict:
    out = {}
    for t in tags:
        if "=" not in t:
            raise click.BadParameter(f"tag {t!r} is not K=V", param_hint="--tag")
        k, v = t.split("=", 1)
        out[k.strip()] = v.strip()
    return out


@command()
@click.argument("name")
@click.option("--evals", required=True, type=click.Path(), help="CSV, JSONL or Parquet: query id, correct "
              "(optional: model; text/question and options for queries the registry does not have).")
@click.option("--family", help="The model's family (e.g. llama-3): `similar` and the pages group by it.")
@click.option("--provider", help="Who serves or made it (e.g. Meta).")
@click.option("--params-b", type=float, help="Parameter count, billions.")
@click.option("--cost", type=float, help="Price per query (any unit, the same for every model).")
@click.option("--open-weights/--closed-weights", default=None, help="Whether its weights are published.")
@click.option("--tag", "tags", multiple=True, help="K=V, repeatable.")
@click.option("-k", default=5, show_default=True, help="Nearest models to show.")
@click.option("--min-evals", default=32, show_default=True, help="Fewest evaluations to embed a model.")
@click.option("--update", is_flag=True, help="Allow changing a registered model's metadata or stored results.")
@click.option("--alias-of", help="It is this registered model under another name (the fingerprint's calibration "
                                 "then never counts the two as distinct).")
def register(ctx, name, *, evals, family, provider, params_b, cost, open_weights, tags, k, min_evals, update,
             alias_of, as_json):
    """Register a model with its 0/1 results and embed it with the active encoder."""
    reg = open_registry(ctx, create=True)
    reg.min_evaluations = min_evals
    r = reg.register(name, evals, family=family, provider=provider, params_b=params_b, cost=cost,
                     open_weights=open_weights, tags=_parse_tags(tags), k=k, progress=not as_json, update=update,
                     alias_of=alias_of)
    if as_json:
        emit_json(r)
        return
    echo_register_report(r, min_evals)


def echo_register_report(r, min_evals: int = 32) -> None:
    """What `register` prints of a registered model (`registration.RegisterResult`); harness imports too."""
    click.echo(f"{r.model}: {r.evaluations_added} evaluations added, {r.queries_added} new queries; "
               f"{r.n_evaluations} used for the embedding, {r.held_out} held out as test")
    for field_, (old, new) in r.updated.items():
        click.echo(f"updated {field_}: {old!r} -> {new!r}")
    if r.results_changed:
        click.echo(f"updated results: {r.results_changed} (the old ones are kept as older evaluations)")
    if r.outcome == "too few evaluations":
        click.echo(f"not embedded: {r.n_evaluations} evaluations, at least {min_evals} needed")
    elif r.version is not None:
        stab = "" if r.stability is None else f", stability {r.stability:.3f} (spread over random halves)"
        click.echo(f"embedding version {r.version} ({r.outcome}{stab}); status: {r.status}")
        table(neighbour_rows(r.neighbours), ["nearest model", "distance", "disagreement", "shared queries"])
    if r.warning:
        click.echo(f"warning: {r.warning}")
    if r.alias_of:
        click.echo(f"alias of: {r.alias_of} (recorded: the fingerprint calibrates on the pairs believed distinct)")


@command()
@click.argument("model")
@click.option("-n", "n", default=16, show_default=True, help="How many queries to list.")
@click.option("--out", type=click.Path(), help="Write them here (.csv or .jsonl; fill in `correct`, then `registry "
              "register MODEL --evals FILE`).")
@click.option("--seed", default=0, show_default=True, help="Seed of the random first probes.")
def probe(ctx, model, n, out, seed, as_json):
    """The next N queries to ask MODEL (new or partly evaluated) so that its embedding and routing settle fastest."""
    p = open_registry(ctx).probe(model, n=n, seed=seed, out=out)
    if as_json:
        emit_json(p)
        return
    click.echo(f"{p.model}: {p.answered} answers outside the test split, {p.pool} queries left to ask; "
               f"{p.seed} random + {p.planned} planned:")
    table([[r.question_id, r.kind, r.category or "", r.text[:60].replace("\n", " ")] for r in p.probes],
          ["question_id", "kind", "category", "question"])
    for note in p.notes:
        click.echo(f"note: {note}")
    if p.file:
        click.echo(f"written to {p.file}: fill in `correct` (1/0), then `registry register {p.model} --evals "
                   f"{p.file}`")


@command()
@click.option("--all", "all_models", is_flag=True, help="Re-embed every model.")
@click.option("--min-evals", default=32, show_default=True, help="Fewest evaluations to embed a model.")
def onboard(ctx, all_models, min_evals, as_json):
    """Run pending onboarding jobs: embed models whose evaluations changed."""
    reg = open_registry(ctx)
    reg.min_evaluations = min_evals
    outcomes = reg.onboard(all_models=all_models)
    if as_json:
        emit_json({"jobs": outcomes})
        return
    if not outcomes:
        click.echo("nothing pending")
        return
    table([[o.model, o.outcome, o.version or "", o.n_evaluations,
            "" if o.stability is None else f"{o.stability:.3f}"] for o in outcomes],
          ["model", "outcome", "version", "evaluations", "stability"])


@command()
@click.argument("model")
def history(ctx, model, as_json):
    """Every embedding version of a model: when, why, from how many evaluations, under which encoder."""
    h = open_registry(ctx).history(model)
    if as_json:
        emit_json(h)
        return
    table([[v.version, v.created[:19], v.reason, v.n_evaluations,
            ", ".join(f"{k.removeprefix('feedback:')} {n:,}" for k, n in v.evidence.items()), v.encoder,
            "" if v.distance_moved is None else f"{v.distance_moved:.4f}",
            "" if v.stability is None else f"{v.stability:.3f}"] for v in h.versions],
          ["version", "created", "reason", "used for embedding", "from", "encoder", "moved", "stability"])
    click.echo("'used for embedding': the model's evaluations outside the test split when the version was made "
               "(test answers are held out); 'from': how many were imported, how many came from each feedback source")
    for c in h.changes:
        what = f"deleted as {c.name}" if c.change == "deleted" else f"renamed {c.name} -> {c.new_name}"
        click.echo(f"{c.created[:19]}: {what}" + (f" ({c.reason})" if c.reason else ""))


@command()
@click.argument("model")
@click.argument("v1", type=int, required=False)
@click.argument("v2", type=int, required=False)
@click.option("-k", default=5, show_default=True, help="Nearest models to compare at each version.")
def diff(ctx, model, v1, v2, k, as_json):
    """How far a model moved between two versions, and what changed around it."""
    d = open_registry(ctx).diff(model, v1, v2, k=k)
    if as_json:
        emit_json(d)
        return
    click.echo(f"{d.model}: version {d.v1} -> {d.v2}, moved {d.distance:.4f}")
    click.echo(f"nearest at v{d.v1}: " + ", ".join(f"{n.model} ({n.distance:.3f})" for n in d.neighbours_v1))
    click.echo(f"nearest at v{d.v2}: " + ", ".join(f"{n.model} ({n.distance:.3f})" for n in d.neighbours_v2))
    click.echo(f"nearest ranked by: {d.ranked_by}")
    table([[c, f"{a['v1']:.3f}", f"{a['v2']:.3f}", f"{a['change']:+.3f}"] for c, a in d.predicted_accuracy.items()],
          ["category", f"predicted acc v{d.v1}", f"v{d.v2}", "change"])


COMMANDS = [models, show, stats, register, probe, onboard, history, diff]
