"""`registry serve` (the HTTP server, with the routing proxy) and `registry endpoints` (where the proxy forwards each
model's requests; `add`: an endpoint claiming a model, which `registry verify` judges)."""
from __future__ import annotations

import click

from registry.cli.common import command, emit_json, group, open_registry, table


@command(json=False)
@click.option("--host", default="127.0.0.1", show_default=True, help="Loopback unless told otherwise.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535),
              help="The TCP port to listen on.")
@click.option("--token", default=None, help="Bearer token required by writing endpoints (default: $REGISTRY_TOKEN). "
                                            "Shown by `ps`: prefer --token-file or the environment.")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="A file whose first line is the token (default: $REGISTRY_TOKEN_FILE).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A name clients reach the server by, besides loopback and --host (repeat; '*': any).")
@click.option("--upstream-deadline", "upstream_deadlines", multiple=True, metavar="[MODEL:]NAME=SECONDS",
              help="The proxy's upstream deadlines: connect, first-byte, between, total (repeat).")
@click.option("--upstream-key", "upstream_keys", multiple=True, metavar="NAME=URL",
              help="Let the server read API key variable NAME, for requests to URL's origin only (repeat; adds to "
                   "$REGISTRY_UPSTREAM_KEYS). Endpoints may name only these; without any, no key is sent.")
@click.option("--keep-texts", is_flag=True,
              help="Keep each proxied request's text for feedback's production queries (default: its hash only).")
@click.option("--feedback-window", "feedback_window", type=float, default=None, metavar="SECONDS",
              help="Take feedback for a proxied request this long after it was answered (default 7 days).")
@click.option("--drift-webhook", "drift_webhook", default=None, metavar="URL",
              help="Queue drift events for this webhook (delivered as `registry watch --webhook URL` delivers).")
def serve(ctx, host, port, token, *, token_file, allowed_hosts, upstream_deadlines, upstream_keys, keep_texts,
          feedback_window, drift_webhook):
    """Serve the registry over HTTP (FastAPI); the server owns the database file while it runs. A non-loopback
    address needs --token (or REGISTRY_TOKEN): open writes are never served to a network."""
    from registry.core import settings
    from registry.serve.app import is_loopback
    from registry.serve.app import serve as run

    if token is not None and not token.strip():     # given but blank (--token ""): never read as "no token"
        raise click.ClickException("the token is blank: give a token of printable characters, or none")
    if token is not None and token_file is not None:
        raise click.UsageError("give --token or --token-file, not both")
    token = token or settings.token_from_file(token_file, "--token-file") or settings.current().token
    if not token and not is_loopback(host):
        click.echo(f"Error: refusing to serve {host} without a token: writes would be open to the network; "
                   f"give --token (or REGISTRY_TOKEN), or bind 127.0.0.1", err=True)
        ctx.exit(2)
    obj = ctx.find_root().obj
    run(obj["db"], host=host, port=port, token=token, probation_min=obj.get("probation_min"),
        allowed_hosts=allowed_hosts, upstream_deadlines=upstream_deadlines, upstream_keys=upstream_keys,
        traffic={"keep_texts": keep_texts, "webhook": drift_webhook,
                 **({} if feedback_window is None else {"window_s": feedback_window})})


@group(json=True, invoke_without_command=True)
def endpoints(ctx, as_json):
    """Where the routing proxy (/v1/chat/completions) forwards each model's requests, and the endpoints that claim a
    model for `registry verify` (subcommands: set, remove, add)."""
    if ctx.invoked_subcommand is not None:
        return
    reg = open_registry(ctx)
    rows = reg.endpoints()
    if as_json:
        return emit_json(rows)
    by = {c.endpoint: c for c in reg.claims()}      # an endpoint that claims a model: which, and its marks
    table([[e.model, by[e.model].model if e.model in by else "", e.base_url, e.upstream_model, e.api_key_env or "",
            ("yes" if by[e.model].reference else "") if e.model in by else "",
            ("yes" if by[e.model].watched else "no") if e.model in by else ""] for e in rows],
          ["model", "claims", "base URL", "upstream model", "API key from", "reference", "watched"])


@command("set", group=endpoints)
@click.argument("model")
@click.option("--base-url", required=True, help="OpenAI-compatible base URL, e.g. https://api.example.com/v1")
@click.option("--upstream-model", help="The model id the upstream knows (default: the registry's name).")
@click.option("--api-key-env", help="The NAME of the environment variable holding the API key (read per request).")
def endpoints_set(ctx, model, base_url, upstream_model, api_key_env, as_json):
    """Set MODEL's endpoint (the API key itself is never stored: only the variable's name)."""
    e = open_registry(ctx).set_endpoint(model, base_url, upstream_model, api_key_env)
    if as_json:
        return emit_json(e)
    click.echo(f"{e.model} -> {e.base_url} as {e.upstream_model}" + (f" (key from ${e.api_key_env})" if e.api_key_env
                                                                       else ""))


@command("remove", group=endpoints)
@click.argument("model")
def endpoints_remove(ctx, model, as_json):
    """Remove MODEL's endpoint: the proxy no longer sends it requests."""
    open_registry(ctx).remove_endpoint(model)
    if as_json:
        return emit_json({"removed": model})
    click.echo(f"{model}: endpoint removed")


@command("add", group=endpoints)
@click.argument("model")
@click.option("--base-url", required=True, help="The endpoint's OpenAI-compatible base URL.")
@click.option("--name", help="Its own model name (default MODEL@host): its answers never enter MODEL's.")
@click.option("--upstream-model", help="The model id the endpoint knows it by (default: the name).")
@click.option("--api-key-env", help="The NAME of the environment variable holding its API key (read per request).")
@click.option("--reference", is_flag=True, help="It is MODEL's reference (the official API): the others are judged "
                                                "against it.")
@click.option("--unwatched", is_flag=True, help="`registry watch` does not ask it.")
def endpoints_add(ctx, model, *, base_url, name, upstream_model, api_key_env, reference, unwatched, as_json):
    """Add an endpoint that claims to serve MODEL (adding it again changes its marks)."""
    c = open_registry(ctx).claim(model, base_url, name=name, upstream_model=upstream_model, api_key_env=api_key_env,
                                 reference=reference, watched=not unwatched)
    if as_json:
        return emit_json(c)
    click.echo(f"{c.endpoint} claims {c.model}: {c.base_url} as {c.upstream_model}"
               + (" (the reference)" if c.reference else "") + ("" if c.watched else " (not watched)"))


COMMANDS = [serve, endpoints]
