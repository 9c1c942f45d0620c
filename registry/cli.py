"""The command line: each command is a thin call of the `Registry` method of the same name.

Only this module raises click.ClickException; start-up imports neither torch, sentence-transformers nor faiss.
"""
from __future__ import annotations

import functools
import json
import math
import sys
from dataclasses import asdict, is_dataclass

import click

from .errors import RegistryError


def _jsonable(obj):
    """Plain JSON values; a NaN or infinite float (an AUC over one class, say) becomes null, as JSON has no NaN."""
    if is_dataclass(obj):
        return _jsonable(asdict(obj))
    if isinstance(obj, (list, tuple)):
        return [_jsonable(o) for o in obj]
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def emit_json(obj) -> None:
    click.echo(json.dumps(_jsonable(obj), indent=2, default=str, allow_nan=False))


def table(rows: list[list], headers: list[str]) -> None:
    cells = [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    click.echo("  ".join("-" * w for w in widths))
    for r in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def handles_errors(fn):
    """Our own errors become one-line click errors (exit 1), never a stack trace."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RegistryError as exc:
            raise click.ClickException(str(exc)) from None
    return wrapper


def open_registry(ctx: click.Context, create: bool = False):
    """The registry named by --db; only commands that bring data in (`create`) may make a new file."""
    from .api import Registry

    obj = ctx.find_root().obj
    if obj.get("registry") is None:
        obj["registry"] = Registry(obj["db"], create=create, probation_min=obj.get("probation_min"))
        ctx.call_on_close(obj["registry"].close)
    return obj["registry"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", envvar="REGISTRY_DB", default="registry.duckdb", show_default=True,
              help="The registry's DuckDB file (or set REGISTRY_DB).")
@click.option("--probation-min", type=click.IntRange(min=0), envvar="REGISTRY_PROBATION_MIN", default=None,
              help="Fewest evaluations behind a model's embedding for routing to choose it unasked (default 500; "
                   "or set REGISTRY_PROBATION_MIN).")
@click.pass_context
def cli(ctx: click.Context, db: str, probation_min: int | None) -> None:
    """A model registry for LLMs: import benchmark results, embed models with LOCUS, compare and route."""
    ctx.obj = {"db": db, "registry": None, "probation_min": probation_min}


# --- db ------------------------------------------------------------------------------------------------------------
@cli.group()
def db() -> None:
    """Schema migrations (Alembic)."""


@db.command("upgrade")
@click.argument("revision", default="head")
@click.pass_context
@handles_errors
def db_upgrade(ctx, revision):
    """Migrate the database file to REVISION (default: head)."""
    from .store import Store

    store = Store(ctx.find_root().obj["db"], migrate=False)
    store.upgrade(revision)
    click.echo(f"{store.path}: at revision {store.current_revision()}")
    store.close()


@db.command("downgrade")
@click.argument("revision")
@click.pass_context
@handles_errors
def db_downgrade(ctx, revision):
    """Migrate the database file down to REVISION (e.g. 0001, or -1)."""
    from .store import Store

    store = Store(ctx.find_root().obj["db"], migrate=False)
    store.downgrade(revision)
    click.echo(f"{store.path}: at revision {store.current_revision()}")
    store.close()


@db.command("current")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def db_current(ctx, as_json):
    """Show the file's schema revision and the head revision."""
    from .store import Store, head_revision

    store = Store(ctx.find_root().obj["db"], migrate=False)
    current, head = store.current_revision(), head_revision()
    store.close()
    if as_json:
        emit_json({"current": current, "head": head})
    else:
        click.echo(f"current: {current or '(empty)'}  head: {head}")


# --- import --------------------------------------------------------------------------------------------------------
@cli.command("import")
@click.argument("directory", required=False, type=click.Path())
@click.option("--models", type=click.Path(), help="Models CSV (model, family, provider, params_b, cost, ...).")
@click.option("--queries", type=click.Path(), help="Queries: CSV, JSONL or Parquet (id, text, category, options...).")
@click.option("--evaluations", type=click.Path(), help="Evaluations, long format (model, query id, correct).")
@click.option("--splits", type=click.Path(), help="Query splits (query id, train|val|test).")
@click.option("--vectors", type=click.Path(), help="Query text vectors (Parquet, from `registry vectors export`).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def import_(ctx, directory, models, queries, evaluations, splits, vectors, as_json):
    """Import benchmark results: a folder laid out like ../shared/data/mmlu-pro, or single files."""
    reg = open_registry(ctx, create=True)
    result = reg.import_files(models=models, queries=queries, evaluations=evaluations, splits=splits,
                              directory=directory, progress=not as_json, vectors=vectors)
    if as_json:
        emit_json(result)
        return
    if result.already_imported:
        click.echo(f"already imported (batch {result.batch_id}): nothing added")
        return
    click.echo(f"batch {result.batch_id}: {result.models_added} models added ({result.models_updated} updated), "
               f"{result.queries_added} queries, {result.evaluations_added} evaluations "
               f"(of {result.evaluations_read} read), {result.splits_set} splits, "
               f"{result.texts_embedded} texts embedded by MiniLM, {result.texts_from_files} text vectors from "
               f"vector files" + (f", {result.vectors_loaded} vectors loaded" if result.vectors_loaded else ""))
    for name, cols in result.ignored_columns.items():
        click.echo(f"note: {name}: columns not stored: {', '.join(cols)}")


@cli.group()
def vectors() -> None:
    """Query text vectors as a Parquet file: export them, or import them into another registry."""


@vectors.command("export")
@click.argument("file", type=click.Path())
@click.option("--source", help="Where the vectors come from (kept in the file's metadata).")
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def vectors_export(ctx, file, source, dtype, as_json):
    """Write the registry's query text vectors (content hash, text encoder, vector) to FILE."""
    r = open_registry(ctx).export_vectors(file, source=source, dtype=dtype)
    if as_json:
        return emit_json(r)
    click.echo(f"{r.rows} vectors ({r.text_encoder}, {r.dtype}) written to {r.path}")


@vectors.command("import")
@click.argument("file", type=click.Path())
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def vectors_import(ctx, file, as_json):
    """Add the vectors of FILE (checked whole first; texts are matched by content hash only)."""
    r = open_registry(ctx, create=True).import_vectors(file)
    if as_json:
        return emit_json(r)
    click.echo(f"{r.path}: {r.rows} vectors read, {r.added} new")


@cli.command("draw-splits")
@click.option("--val", default=0.1, show_default=True, help="Share of each category's new queries for validation.")
@click.option("--test", default=0.1, show_default=True, help="Share of each category's new queries for test.")
@click.option("--seed", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def draw_splits(ctx, val, test, seed, as_json):
    """Give every query without a split a train/val/test split, drawn with a seed (when no splits file exists)."""
    result = open_registry(ctx).draw_splits(val=val, test=test, seed=seed)
    if as_json:
        emit_json(result)
        return
    click.echo(f"seed {seed}: " + ", ".join(f"{n} {s}" for s, n in result.drawn.items())
               + f" drawn; {result.kept} queries kept their split; "
               + f"{sum(o['outcome'] == 'embedded' for o in result.onboarding)} models re-embedded")


# --- reading -------------------------------------------------------------------------------------------------------
@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def models(ctx, as_json):
    """Each model with its number of evaluations and accuracy."""
    rows = open_registry(ctx).models()
    if as_json:
        emit_json(rows)
        return
    table([[m.name, m.family, _g(m.params_b), m.evaluations, "" if m.accuracy is None else f"{m.accuracy:.3f}",
            "" if m.version is None else f"v{m.version}", m.status, "yes" if m.available else "NO"]
           for m in rows], ["model", "family", "params_b", "evaluations", "accuracy", "version", "status", "available"])
    probation = [m for m in rows if m.status == "probation"]
    if probation:
        click.echo(f"probation: {len(probation)} model(s) embedded from too few evaluations; routing leaves them out "
                   f"unless asked (--include-probation)")


def _g(x) -> str:
    """A number for a table or a line: '' (not '_None_') when unknown, no trailing zeros."""
    return "" if x is None else f"{x:g}" if isinstance(x, float) else str(x)


@cli.command()
@click.argument("model")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def show(ctx, model, as_json):
    """One model: metadata, accuracy overall and per category."""
    d = open_registry(ctx).show(model)
    if as_json:
        emit_json(d)
        return
    weights = {True: "open", False: "closed", None: None}[d.open_weights]
    facts = [(k, v) for k, v in (("family", d.family), ("provider", d.provider), ("params_b", _g(d.params_b)),
                                 ("cost", _g(d.cost)), ("weights", weights)) if v not in (None, "")]
    click.echo(d.name + ("  " + " ".join(f"{k}={v}" for k, v in facts) if facts else ""))
    if d.tags:
        click.echo("tags: " + ", ".join(f"{k}={v}" for k, v in sorted(d.tags.items())))
    acc = "n/a" if d.accuracy is None else f"{d.accuracy:.3f}"
    click.echo(f"evaluations: {d.evaluations}  accuracy: {acc}  import batches: {', '.join(map(str, d.batches))}")
    if d.version is None:
        click.echo(f"embedding: none yet  status: {d.status}")
    else:
        click.echo(f"embedding: version {d.version}, from {d.embedded_from} evaluations (test answers held out)  "
                   f"status: {d.status}")
    click.echo(f"available: {'yes' if d.available else 'no (marked unavailable: routing and fallback skip it)'}")
    table([[c, v["evaluations"], f"{v['accuracy']:.3f}"] for c, v in d.per_category.items()],
          ["category", "evaluations", "accuracy"])


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
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


# --- onboarding and embedding history (issue 4) -----------------------------------------------------------------
def _parse_tags(tags: tuple[str, ...]) -> dict:
    out = {}
    for t in tags:
        if "=" not in t:
            raise click.BadParameter(f"tag {t!r} is not K=V", param_hint="--tag")
        k, v = t.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _neighbour_rows(neighbours) -> list[list]:
    return [[n.model, f"{n.distance:.4f}", "" if n.disagreement is None else f"{n.disagreement:.3f}",
             n.shared_queries or ""] for n in neighbours]


@cli.command()
@click.argument("name")
@click.option("--evals", required=True, type=click.Path(), help="CSV, JSONL or Parquet: query id, correct "
              "(optional: model; text/question and options for queries the registry does not have).")
@click.option("--family")
@click.option("--provider")
@click.option("--params-b", type=float, help="Parameter count, billions.")
@click.option("--cost", type=float, help="Price per query (any unit, the same for every model).")
@click.option("--open-weights/--closed-weights", default=None)
@click.option("--tag", "tags", multiple=True, help="K=V, repeatable.")
@click.option("-k", default=5, show_default=True, help="Nearest models to show.")
@click.option("--min-evals", default=32, show_default=True, help="Fewest evaluations to embed a model.")
@click.option("--update", is_flag=True, help="Allow changing a registered model's metadata or stored results.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def register(ctx, name, evals, family, provider, params_b, cost, open_weights, tags, k, min_evals, update, as_json):
    """Register a model with its 0/1 results and embed it with the active encoder."""
    reg = open_registry(ctx, create=True)
    reg.min_evaluations = min_evals
    r = reg.register(name, evals, family=family, provider=provider, params_b=params_b, cost=cost,
                     open_weights=open_weights, tags=_parse_tags(tags), k=k, progress=not as_json, update=update)
    if as_json:
        emit_json(r)
        return
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
        table(_neighbour_rows(r.neighbours), ["nearest model", "distance", "disagreement", "shared queries"])
    if r.warning:
        click.echo(f"warning: {r.warning}")


@cli.command()
@click.option("--all", "all_models", is_flag=True, help="Re-embed every model.")
@click.option("--min-evals", default=32, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
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


@cli.command()
@click.argument("model")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def history(ctx, model, as_json):
    """Every embedding version of a model: when, why, from how many evaluations, under which encoder."""
    h = open_registry(ctx).history(model)
    if as_json:
        emit_json(h)
        return
    table([[v.version, v.created[:19], v.reason, v.n_evaluations, v.encoder,
            "" if v.distance_moved is None else f"{v.distance_moved:.4f}",
            "" if v.stability is None else f"{v.stability:.3f}"] for v in h.versions],
          ["version", "created", "reason", "used for embedding", "encoder", "moved", "stability"])
    click.echo("'used for embedding': the model's evaluations outside the test split when the version was made "
               "(test answers are held out)")


@cli.command()
@click.argument("model")
@click.argument("v1", type=int, required=False)
@click.argument("v2", type=int, required=False)
@click.option("-k", default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def diff(ctx, model, v1, v2, k, as_json):
    """How far a model moved between two versions, and what changed around it."""
    d = open_registry(ctx).diff(model, v1, v2, k=k)
    if as_json:
        emit_json(d)
        return
    click.echo(f"{d.model}: version {d.v1} -> {d.v2}, moved {d.distance:.4f}")
    click.echo(f"nearest at v{d.v1}: " + ", ".join(f"{n.model} ({n.distance:.3f})" for n in d.neighbours_v1))
    click.echo(f"nearest at v{d.v2}: " + ", ".join(f"{n.model} ({n.distance:.3f})" for n in d.neighbours_v2))
    table([[c, f"{a['v1']:.3f}", f"{a['v2']:.3f}", f"{a['change']:+.3f}"] for c, a in d.predicted_accuracy.items()],
          ["category", f"predicted acc v{d.v1}", f"v{d.v2}", "change"])


# --- encoders: training, checkpoints, evaluation (issue 3) -------------------------------------------------------
@cli.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def encoders(ctx, as_json):
    """List encoder checkpoints (subcommands: activate, install)."""
    if ctx.invoked_subcommand is not None:
        return
    rows = open_registry(ctx).encoders()
    if as_json:
        emit_json(rows)
        return
    table([[e.id, "*" if e.active else "", e.name, e.text_encoder, e.created[:19], f"{e.n_bytes / 1e6:.1f} MB",
            e.metrics.get("test", {}).get("hit@1", e.metrics.get("val_hit@1", ""))] for e in rows],
          ["id", "active", "name", "text encoder", "created", "size", "hit@1"])


@encoders.command("activate")
@click.argument("encoder_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def encoders_activate(ctx, encoder_id, as_json):
    """Make an encoder active; every model is re-embedded under it (old versions stay)."""
    outcomes = open_registry(ctx).activate_encoder(encoder_id)
    if as_json:
        emit_json({"active": encoder_id, "jobs": outcomes})
    else:
        click.echo(f"encoder {encoder_id} active; {sum(o.outcome == 'embedded' for o in outcomes)} models re-embedded")


@encoders.command("install")
@click.argument("path", type=click.Path())
@click.option("--name")
@click.option("--activate", is_flag=True)
@click.pass_context
@handles_errors
def encoders_install(ctx, path, name, activate):
    """Store a LOCUS checkpoint file (safetensors) in the registry."""
    encoder_id = open_registry(ctx, create=True).install_encoder(path, name=name, activate=activate)
    click.echo(f"encoder {encoder_id} installed" + (" and active" if activate else ""))


@cli.command()
@click.option("--seed", default=0, show_default=True)
@click.option("--anchors", type=int, help="Largest anchor set per model (default: the training config's).")
@click.option("--steps", "max_steps", type=int, help="Encoder-stage steps (default: the training config's).")
@click.option("--epochs", type=int, help="Epochs of the first stage over every train pair (default: the config's).")
@click.option("--activate", is_flag=True, help="Make the new encoder active (re-embeds every model).")
@click.option("--name")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def train(ctx, seed, anchors, max_steps, epochs, activate, name, as_json):
    """Train the LOCUS encoder and predictor on this registry's train split; store the checkpoint."""
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}   # one bar per training stage: teacher (epochs), encoder (steps), refit (epochs)

    def progress(info: dict) -> None:
        stage = info["stage"]
        if stage not in bars:
            for b in bars.values():
                b.close()
            bars[stage] = tqdm(total=info["max_steps"], disable=as_json, desc=f"train {len(bars) + 1}: {stage}",
                               unit="step" if stage == "encoder" else "epoch")
        bar = bars[stage]
        bar.update(info["step"] - bar.n)
        bar.set_postfix({k: (round(v, 4) if isinstance(v, float) else v) for k, v in info.items()
                         if k in ("loss", "val_hit@1", "best_val_hit@1")}, refresh=True)

    reg = open_registry(ctx)
    encoder_id = reg.train(seed=seed, anchors=anchors, max_steps=max_steps, epochs=epochs, activate=activate,
                           name=name, progress=progress)
    for b in bars.values():
        b.close()
    info = next(e for e in reg.encoders() if e.id == encoder_id)
    if as_json:
        emit_json(info)
    else:
        click.echo(f"encoder {encoder_id} ({info.name}) stored" + (", active" if activate else "")
                   + f"; metrics: {json.dumps(info.metrics)[:300]}")


@cli.command()
@click.option("--split", default="test", show_default=True, type=click.Choice(["train", "val", "test"]))
@click.option("--sample-efficiency", is_flag=True, help="Also embed every model from 32..512 evaluations.")
@click.option("--seeds", default=5, show_default=True, help="Random draws per size (--sample-efficiency).")
@click.option("--no-baselines", is_flag=True)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handles_errors
def evaluate(ctx, split, sample_efficiency, seeds, no_baselines, as_json):
    """Routing accuracy (hit@1/3/5) and predictor quality of LOCUS beside the baselines, on one split."""
    r = open_registry(ctx).evaluate(split, baselines=not no_baselines, sample_efficiency=sample_efficiency,
                                    seeds=seeds)
    if as_json:
        emit_json(r)
        return
    click.echo(f"{r.split}: {r.queries} queries, {r.models} models, encoder {r.encoder}")
    for name, why in r.excluded.items():
        click.echo(f"left out: {name}: {why}")
    for name, n in r.probation.items():
        click.echo(f"left out: {name}: on probation (embedded from {n} evaluations); no method routes to it")
    if not r.held_out:
        click.echo(f"note: not held out: the embeddings are built from the {r.split} answers too, and KNN and MF "
                   f"choose their settings on val")
    fmt = lambda v: "" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))  # noqa: E731
    table([[m, fmt(v.get("hit@1")), fmt(v.get("hit@3")), fmt(v.get("hit@5")), fmt(v.get("acc")),
            fmt(v.get("auc")), fmt(v.get("brier")), fmt(v.get("n_chosen"))] for m, v in r.methods.items()],
          ["method", "hit@1", "hit@3", "hit@5", "pred acc", "AUC", "Brier", "models chosen"])
    click.echo("LOCUS routes to: " + ", ".join(f"{m} {n}" for m, n in sorted(r.choices.items(), key=lambda kv: -kv[1])))
    for m, v in r.methods.items():
        if v.get("scored") is not None and v["scored"] < r.queries:
            click.echo(f"note: {m}: {r.queries - v['scored']} of {r.queries} chosen models have no result for the "
                       f"query (unscored; counted as wrong in hit@1); hit@1 on the {v['scored']} scored: "
                       f"{fmt(v['hit@1_scored'])}")
    if r.per_category:
        click.echo("")
        cols = [c for c in next(iter(r.per_category.values())) if c != "queries"]
        table([[c, v["queries"]] + [fmt(v[k]) for k in cols] for c, v in r.per_category.items()],
              ["category", "queries"] + [k.replace("_", " ") if k.startswith("locus_") else f"{k} hit@1"
                                         for k in cols])
    if r.sample_efficiency:
        click.echo("")
        table([[n, f"{v['mean']:.4f} ± {v['std']:.4f}", v["draws"]] for n, v in r.sample_efficiency.items()]
              + [["all", fmt(r.methods["locus"]["hit@1"]), ""]], ["evaluations per model", "hit@1", "draws"])


from . import cli_geometry  # noqa: E402,F401  (registers similar, fingerprint, portfolio, fallback, map, geometry)


from .cli_routing import register as _register_routing  # noqa: E402  (route, log, mark-*, serve)

_register_routing(cli)


def main() -> None:
    cli(prog_name="registry")


if __name__ == "__main__":
    sys.exit(main())
