"""Encoders: `registry encoders [activate|install]`, `registry train`, `registry evaluate`."""
from __future__ import annotations

import json

import click

from registry.cli.common import command, emit_json, group, open_registry, table


@group(json=True, invoke_without_command=True)
def encoders(ctx, as_json):
    """List encoder checkpoints (subcommands: activate, install)."""
    if ctx.invoked_subcommand is not None:
        return
    rows = open_registry(ctx).encoders()
    if as_json:
        emit_json(rows)
        return
    table([[e.id, "*" if e.active else "", e.name, e.text_encoder, e.created[:19], f"{e.n_bytes / 1e6:.1f} MB",
            "" if e.hit1_at_training is None else f"{e.hit1_at_training:.4f} ({e.hit1_at_training_split})"]
           for e in rows],
          ["id", "active", "name", "text encoder", "created", "size", "hit@1 at training"])
    if any(e.hit1_at_training is not None for e in rows):
        click.echo("hit@1 at training: the checkpoint's own record, from the embeddings of its training run; "
                   "today's figures on this registry: `registry evaluate`")


@command("activate", group=encoders)
@click.argument("encoder_id", type=int)
def encoders_activate(ctx, encoder_id, as_json):
    """Make an encoder active; every model is re-embedded under it (old versions stay)."""
    outcomes = open_registry(ctx).activate_encoder(encoder_id)
    if as_json:
        emit_json({"active": encoder_id, "jobs": outcomes})
    else:
        click.echo(f"encoder {encoder_id} active; {sum(o.outcome == 'embedded' for o in outcomes)} models re-embedded")


@command("install", group=encoders, json=False)
@click.argument("path", type=click.Path())
@click.option("--name", help="The encoder's name in the registry (default: from the checkpoint).")
@click.option("--activate", is_flag=True, help="Make it the active encoder (re-embeds every model).")
def encoders_install(ctx, path, name, activate):
    """Store a LOCUS checkpoint file (safetensors) in the registry."""
    encoder_id = open_registry(ctx, create=True).install_encoder(path, name=name, activate=activate)
    click.echo(f"encoder {encoder_id} installed" + (" and active" if activate else ""))


def stage_bars(quiet: bool):
    """(progress callback, close): one tqdm bar per training stage (teacher epochs, encoder steps, refit epochs),
    with its loss and val hit@1; a held-out run's {"stage": "seed"} messages title the bars of each seed."""
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}
    prefix = ["train"]

    def close() -> None:
        for b in bars.values():
            b.close()
        bars.clear()

    def progress(info: dict) -> None:
        stage = info["stage"]
        if stage == "seed":
            close()
            prefix[0] = f"seed {info['seed'] + 1}/{info['seeds']}: train"
            return
        if stage not in bars:
            for b in bars.values():
                b.close()
            bars[stage] = tqdm(total=info["max_steps"], disable=quiet, desc=f"{prefix[0]} {len(bars) + 1}: {stage}",
                               unit="step" if stage == "encoder" else "epoch")
        bar = bars[stage]
        bar.update(info["step"] - bar.n)
        bar.set_postfix({k: (round(v, 4) if isinstance(v, float) else v) for k, v in info.items()
                         if k in ("loss", "val_hit@1", "best_val_hit@1")}, refresh=True)

    return progress, close


@command()
@click.option("--seed", default=0, show_default=True, help="Seed of the training run (initial weights, batches).")
@click.option("--anchors", type=int, help="Largest anchor set per model (default: the training config's).")
@click.option("--steps", "max_steps", type=int, help="Encoder-stage steps (default: the training config's).")
@click.option("--epochs", type=int, help="Epochs of the first stage over every train pair (default: the config's).")
@click.option("--activate", is_flag=True, help="Make the new encoder active (re-embeds every model).")
@click.option("--name", help="The new encoder's name (default: one made from the training's settings).")
@click.option("--category-features", is_flag=True,
              help="The predictor also reads each query's category: a logit offset per model and category, from z.")
@click.option("--category-field", type=click.Choice(["category", "source", "category+source"]), default="category",
              show_default=True, help="The query column read as the category (with --category-features); "
              "category+source: both, each source's offsets fitted on top of its category's.")
@click.option("--category-fit", type=click.Choice(["train", "nontest"]), default="train", show_default=True,
              help="Fit the category rows to the train answers, or to train and val (as the registry embeds models).")
def train(ctx, *, seed, anchors, max_steps, epochs, activate, name, category_features, category_field, category_fit,
          as_json):
    """Train the LOCUS encoder and predictor on this registry's train split; store the checkpoint."""
    progress, close = stage_bars(as_json)
    reg = open_registry(ctx)
    encoder_id = reg.train(seed=seed, anchors=anchors, max_steps=max_steps, epochs=epochs, activate=activate,
                           name=name, progress=progress, category_features=category_features,
                           category_field=category_field, category_fit=category_fit)
    close()
    info = next(e for e in reg.encoders() if e.id == encoder_id)
    if as_json:
        emit_json(info)
    else:
        click.echo(f"encoder {encoder_id} ({info.name}) stored" + (", active" if activate else "")
                   + f"; metrics: {json.dumps(info.metrics)[:300]}")


@command()
@click.option("--split", default="test", show_default=True, type=click.Choice(["train", "val", "test"]),
              help="The split the figures are measured on.")
@click.option("--sample-efficiency", is_flag=True, help="Also embed every model from 32..512 evaluations.")
@click.option("--seeds", type=int, help="Random draws per size (--sample-efficiency; default 5), or seeds of the "
                                        "held-out run (default 3).")
@click.option("--no-baselines", is_flag=True, help="Skip the simple routers (KNN, MF, IRT, per-category, per-source) "
                                                    "and the best single model: the predictor's figures only.")
@click.option("--held-out", "held_out", type=int, help="Per seed, hold K models out of training and know them only "
                                                       "from --n evaluations (trained in memory; nothing stored).")
@click.option("--n", "n", default=128, show_default=True, help="Evaluations per held-out model (--held-out).")
@click.option("--steps", "max_steps", type=int, help="Encoder-stage steps of the held-out run's training.")
@click.option("--epochs", type=int, help="Teacher epochs of the held-out run's training.")
@click.option("--planned", is_flag=True, help="With --sample-efficiency or --held-out: planned probes (registry "
                                              "probe) against random ones at each n (takes minutes).")
def evaluate(ctx, *, split, sample_efficiency, seeds, no_baselines, held_out, n, max_steps, epochs, planned,
             as_json):
    """Routing accuracy (hit@1/3/5) and predictor quality of LOCUS beside the baselines, on one split; with
    --held-out K, on models the encoder never saw."""
    if held_out is None and (max_steps is not None or epochs is not None):
        raise click.UsageError("--steps and --epochs set the training of a --held-out run")
    progress, close = stage_bars(as_json)
    steps = method_steps(as_json)
    try:
        r = open_registry(ctx).evaluate(split, baselines=not no_baselines, sample_efficiency=sample_efficiency,
                                        seeds=seeds, held_out=held_out, n=n, max_steps=max_steps, epochs=epochs,
                                        progress=progress if held_out is not None else steps, planned=planned)
    finally:
        steps.cancel()
    close()
    if as_json:
        emit_json(r)
        return
    if held_out is not None:
        show_held_out(r)
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
    versus = lambda p: "" if p is None else f"{p['diff']:+.4f} ({p['se']:.4f})"  # noqa: E731
    table([[m, fmt(v.get("hit@1")), fmt(v.get("hit@3")), fmt(v.get("hit@5")), fmt(v.get("acc")),
            fmt(v.get("auc")), fmt(v.get("brier")), fmt(v.get("n_chosen")), fmt(v.get("differs_from_strongest")),
            fmt(v.get("hit@1_disagree")), versus(v.get("vs_served"))] for m, v in r.methods.items()],
          ["method", "hit@1", "hit@3", "hit@5", "pred acc", "AUC", "Brier", "models chosen",
           "not the strongest", f"hit@1 where models disagree ({r.disagree})", "served minus it (paired SE)"])
    sel = r.interaction
    if "val_hit" in sel:
        click.echo(f"routing (locus_interaction) = predictor logit + {sel['a']} x category offset + {sel['w']} x "
                   f"residual of the {sel['k']} nearest queries, chosen on val (val hit@1 "
                   f"{sel['val_hit']['chosen']:.4f}; the predictor alone {sel['val_hit']['predictor']:.4f}; today's "
                   f"embeddings: `registry encoders` shows the figure recorded at training)")
    if r.served:
        click.echo(f"served policy (routing as served, row `served`): {r.served['policy']}, chosen on val (hit@1 "
                   + ", ".join(f"{k} {v:.4f}" for k, v in r.served["val_hit"].items())
                   + f"; a simple router replaces the predictor only with a gain over {r.served['margin']:.4f}"
                   + (f", and the best single model serves unless one of the others beats it by its paired margin "
                      f"(the leader's: {r.served['margin_single']:.4f})" if "best_single" in r.served["val_hit"]
                      else "") + ")")
        click.echo(f"routing accuracy (as served, row `served`): {r.methods['served']['hit@1']:.4f}")
    click.echo("routing chooses: " + ", ".join(f"{m} {n}" for m, n in sorted(r.choices.items(), key=lambda kv: -kv[1])))
    for note in r.notes:
        click.echo(f"note: {note}")
    for m, v in r.methods.items():
        if v.get("scored") is not None and v["scored"] < r.queries:
            click.echo(f"note: {m}: {r.queries - v['scored']} of {r.queries} chosen models have no result for the "
                       f"query (unscored; counted as wrong in hit@1); hit@1 on the {v['scored']} scored: "
                       f"{fmt(v['hit@1_scored'])}")
    if r.per_category:
        click.echo("")
        cols = [c for c in next(iter(r.per_category.values())) if c != "queries"]
        table([[c, v["queries"]] + [fmt(v[k]) for k in cols] for c, v in r.per_category.items()],
              ["category", "queries"] + [k.replace("_", " ") if k in ("locus_acc", "locus_auc", "locus_brier")
                                         else f"{k} hit@1" for k in cols])
    if r.sample_efficiency:
        click.echo("")
        table([[n, f"{v['mean']:.4f} ± {v['std']:.4f}", v["draws"]] for n, v in r.sample_efficiency.items()]
              + [["all", fmt(r.methods["locus"]["hit@1"]), ""]], ["evaluations per model", "hit@1", "draws"])
    if r.planned_efficiency:
        cols = [(d, rd) for d in ("random", "planned") for rd in ("encoder", "likelihood")]
        click.echo(f"\nplanned probes against random ({next(iter(r.planned_efficiency.values()))['draws']} draws): "
                   f"hit@1 / AUC, each set read by the encoder (what register stores) and by likelihood")
        table([[n] + [f"{v[d][rd]['hit@1']:.4f} ± {v[d][rd]['hit@1_std']:.4f} / {v[d][rd]['auc']:.4f}"
                      for d, rd in cols] for n, v in r.planned_efficiency.items()],
              ["evaluations per model"] + [f"{d}, {rd}" for d, rd in cols])


def method_steps(quiet: bool):
    """progress(method, done, total) for `evaluate`: a line on stderr as each method starts (none with --json), and
    one saying it reads the registry if its first method has not started within a second (`progress.cancel()` when
    the command ends: a refusal that comes at once prints only itself)."""
    import threading
    import time

    start = time.monotonic()
    reading = threading.Timer(1.0, lambda: click.echo("evaluate: reading the registry's models, queries and "
                                                      "answers", err=True))
    reading.daemon = True
    if not quiet:
        reading.start()

    def progress(method, done, total):
        reading.cancel()
        if not quiet:
            click.echo(f"evaluate: {method} ({done}/{total}, {time.monotonic() - start:.0f} s)", err=True)
    progress.cancel = reading.cancel      # type: ignore[attr-defined]
    return progress


def show_held_out(r) -> None:
    from registry.evaluate.heldout import COLUMNS, cell

    cfg = r.train_config
    click.echo(f"held out: {r.held_out} of {r.models} models per seed, each known from {r.n} evaluations; "
               f"{r.queries} test queries; encoder trained per seed with teacher_epochs={cfg['teacher_epochs']}, "
               f"max_steps={cfg['max_steps']}, refit_epochs={cfg['refit_epochs']}")
    for s in r.per_seed:
        click.echo(f"\nseed {s.seed}: held out {', '.join(s.held_out)} (LOCUS best step {s.locus_train['best_step']}, "
                   f"val hit@1 {s.locus_train['val_hit@1']}; {s.wall_s:.0f} s)")
        table([[m] + [cell(k, v[k]) for k, _ in COLUMNS]
               + [", ".join(f"{k}={v[k]}" for k in ("dim", "k", "model") if k in v)] for m, v in s.methods.items()],
              ["method"] + [h for _, h in COLUMNS] + ["setting"])
    click.echo(f"\nmean over {len(r.seeds)} seeds (± std)")
    table([[m] + [f"{cell(k, v[k])} ± {r.std[m][k]:.4f}" for k, _ in COLUMNS] for m, v in r.mean.items()],
          ["method"] + [h for _, h in COLUMNS])
    if r.planned_mean:
        click.echo(f"\nthe same, every held-out model known from {r.n} planned evaluations instead (± std)")
        table([[m] + [f"{v[k]:.4f} ± {r.planned_std[m][k]:.4f}" for k, _ in COLUMNS]
               for m, v in r.planned_mean.items()], ["method"] + [h for _, h in COLUMNS])
    for note in r.notes:
        click.echo(f"note: {note}")


COMMANDS = [encoders, train, evaluate]
