"""The README documents every CLI command and the serving pages of docs/ every HTTP endpoint (like sqlite-utils'
test_docs), every command file follows the one pattern of registry/cli/common.py (the layers and circles:
test_layout.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest

from registry import cli as cli_module
from registry.cli import cli

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "registry"
README = (ROOT / "README.md").read_text(encoding="utf-8")
# the HTTP API's page and the web pages' page: every endpoint of the app is documented on one of them
HTTP_PAGES = [ROOT / "docs" / "serving.md", ROOT / "docs" / "web.md"]
HTTP_DOCS = "\n".join(p.read_text(encoding="utf-8") for p in HTTP_PAGES)

# FastAPI's own pages, not the registry's API
NOT_API = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        out.append(path + (name,))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, path + (name,))
    return out


COMMANDS = _commands(cli)


def test_walk_finds_the_subcommands():
    for sub in (("db", "upgrade"), ("encoders", "activate"), ("vectors", "export"), ("route",)):
        assert sub in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_command_is_in_the_readme(path):
    words = "registry " + " ".join(path)
    assert re.search(re.escape(words) + r"(?![\w-])", README), f"README.md does not mention `{words}`"


def _routes(app) -> list[tuple[str, str]]:
    from fastapi.routing import APIRoute

    out = []
    for route in app.routes:
        if not isinstance(route, APIRoute) or route.path in NOT_API or route.path.startswith("/static"):
            continue
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)   # a name's converter (path, model): documented as {name}
        out += [(method, path) for method in sorted(route.methods) if method != "HEAD"]
    return out


def test_every_http_endpoint_is_in_the_docs(db_copy):
    from fastapi.testclient import TestClient

    from registry.serve.app import create_app

    app = create_app(str(db_copy))
    with TestClient(app):   # runs the app's start-up and shut-down (which closes the registry)
        routes = _routes(app)
    assert ("GET", "/models/{name}") in routes and ("POST", "/route") in routes
    missing = [f"{m} {p}" for m, p in routes if not re.search(re.escape(f"{m} {p}") + r"(?![\w/{}-])", HTTP_DOCS)]
    assert not missing, f"docs/serving.md and docs/web.md do not document: {', '.join(missing)}"


# --- one pattern for every command file ---------------------------------------------------------------------------
COMMAND_FILES = sorted(p for p in (PACKAGE / "cli").glob("*.py") if p.name not in ("__init__.py", "common.py"))


def test_cli_attaches_exactly_the_command_modules_lists():
    import importlib

    assert set(cli_module.COMMANDS_BY_MODULE) == {p.stem for p in COMMAND_FILES}, \
        "every registry/cli/ command module is attached by registry/cli/__init__.py"
    ctx = click.Context(cli)
    for module, names in cli_module.COMMANDS_BY_MODULE.items():
        listed = importlib.import_module(f"registry.cli.{module}").COMMANDS
        assert [c.name for c in listed] == list(names), module
        assert all(cli.get_command(ctx, c.name) is c for c in listed)
    assert cli.list_commands(ctx) == sorted(n for names in cli_module.COMMANDS_BY_MODULE.values() for n in names)
    assert cli.get_command(ctx, "no-such-command") is None


def test_a_command_loads_its_own_module_only():
    """`registry similar` imports registry/cli/geometry.py and none of the other command modules."""
    import subprocess
    import sys

    code = ("import sys; from registry.cli import cli; "
            "sys.argv = ['registry', 'similar', '--help']; cli.main(standalone_mode=False); "
            "print(sorted(m for m in sys.modules if m.startswith('registry.cli.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "['registry.cli.common', 'registry.cli.geometry']"


def test_a_group_has_all_its_subcommands_with_its_own_module_alone():
    """A group's subcommands are defined in its own module: a process that loads that module alone (any command's
    process) has all of them, as a process that loaded every module has."""
    import subprocess
    import sys

    code = ("import json, sys, click; from registry.cli import cli, COMMANDS_BY_MODULE; ctx = click.Context(cli); "
            "alone = {n: sorted(getattr(cli.get_command(ctx, n), 'commands', {})) for n in sys.argv[1:]}; "
            "[cli.get_command(ctx, n) for ns in COMMANDS_BY_MODULE.values() for n in ns]; "
            "print(json.dumps([alone, {n: sorted(getattr(cli.get_command(ctx, n), 'commands', {})) "
            "for n in sys.argv[1:]}]))")
    for module, names in cli_module.COMMANDS_BY_MODULE.items():
        out = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, check=True)
        alone, with_all = json.loads(out.stdout.strip().splitlines()[-1])
        assert alone == with_all, module


@pytest.mark.parametrize("path", COMMAND_FILES, ids=lambda p: p.name)
def test_command_files_use_the_one_decorator(path):
    """Commands come from cli.common's `command`/`group` (options, --json, context, one-line errors), never from a
    hand-built stack, and a command file never imports cli/__init__.py (which imports it)."""
    text = path.read_text(encoding="utf-8")
    for hand_made in ("@click.command", "@click.group", "@click.pass_context", "@handles_errors",
                      '"--json", "as_json"', ".command(", ".group("):
        assert hand_made not in text, f"{path.name}: {hand_made} (use cli.common.command / group)"
    assert "COMMANDS = [" in text


def test_every_option_of_every_command_says_what_it_does():
    import click

    from registry.cli import cli

    missing = []

    def walk(cmd, path):
        missing.extend(f"{path} {p.opts[0]}" for p in cmd.params
                       if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip())
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(cli, "registry")
    assert not missing, missing
    from click.testing import CliRunner

    out = CliRunner().invoke(cli, ["--version"])
    assert out.exit_code == 0 and out.output.startswith("registry, version ")
