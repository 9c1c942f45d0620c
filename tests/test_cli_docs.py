"""The README documents every CLI command and every HTTP endpoint (like sqlite-utils' test_docs), every command file
follows the one pattern of registry/cli_common.py, and no registry module imports another in a circle."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import click
import pytest

from registry import cli as cli_module
from registry.cli import cli

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "registry"
README = (ROOT / "README.md").read_text(encoding="utf-8")

# FastAPI's own pages, not the registry's API
NOT_API = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for name, cmd in sorted(group.commands.items()):
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
        path = route.path.replace(":path}", "}")          # a name may hold "/": documented as {name}
        out += [(method, path) for method in sorted(route.methods) if method != "HEAD"]
    return out


def test_every_http_endpoint_is_in_the_readme(db_copy):
    from fastapi.testclient import TestClient

    from registry.serve.app import create_app

    app = create_app(str(db_copy))
    with TestClient(app):   # runs the app's start-up and shut-down (which closes the registry)
        routes = _routes(app)
    assert ("GET", "/models/{name}") in routes and ("POST", "/route") in routes
    missing = [f"{m} {p}" for m, p in routes if not re.search(re.escape(f"{m} {p}") + r"(?![\w/{}-])", README)]
    assert not missing, f"README.md does not document: {', '.join(missing)}"


# --- one pattern for every command file ---------------------------------------------------------------------------
COMMAND_FILES = sorted(p for p in PACKAGE.glob("cli_*.py") if p.name != "cli_common.py")


def test_cli_attaches_exactly_the_command_modules_lists():
    modules = {m.__name__.rsplit(".", 1)[1] for m in cli_module.COMMAND_MODULES}
    assert modules == {p.stem for p in COMMAND_FILES}, "every cli_*.py command file is attached by cli.py"
    listed = [c for m in cli_module.COMMAND_MODULES for c in m.COMMANDS]
    assert sorted(c.name for c in listed) == sorted(cli.commands)
    assert all(cli.commands[c.name] is c for c in listed)


@pytest.mark.parametrize("path", COMMAND_FILES, ids=lambda p: p.name)
def test_command_files_use_the_one_decorator(path):
    """Commands come from cli_common's `command`/`group` (options, --json, context, one-line errors), never from a
    hand-built stack, and a command file never imports cli.py (which imports it)."""
    text = path.read_text(encoding="utf-8")
    for hand_made in ("@click.command", "@click.group", "@click.pass_context", "@handles_errors",
                      '"--json", "as_json"', ".command(", ".group("):
        assert hand_made not in text, f"{path.name}: {hand_made} (use cli_common.command / group)"
    assert "COMMANDS = [" in text


# --- no import circle among registry modules ----------------------------------------------------------------------
def _type_checking_only(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def _imports() -> dict[str, dict[str, int]]:
    """module -> {imported registry module: line}, from every import in the file (inside functions too; an import
    under `if TYPE_CHECKING:` never runs and is left out)."""
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    graph: dict[str, dict[str, int]] = {}
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        edges = graph.setdefault(path.stem, {})
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level == 0:
                    if base != "registry" and not base.startswith("registry."):
                        continue
                    base = base.removeprefix("registry").lstrip(".")
                if base:
                    targets = [base.split(".")[0]]
                else:                                     # from . import x, y
                    targets = [a.name if a.name in modules else "__init__" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name.split(".")[1] for a in node.names if a.name.startswith("registry.")]
            if not targets or _type_checking_only(node, parents):
                continue
            for t in targets:
                if t in modules and t != path.stem:
                    edges.setdefault(t, node.lineno)
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_cycle_among_registry_modules():
    graph = _imports()
    assert "cli_common" in graph.get("cli", {}) and "cli" in graph.get("__main__", {})   # the walk sees imports
    lines = []
    for comp in _cycles(graph):
        edges = [f"{a}.py:{graph[a][b]} imports {b}" for a in comp for b in sorted(graph[a]) if b in comp]
        lines.append(" <-> ".join(comp) + ": " + "; ".join(edges))
    assert not lines, "import cycles among registry modules:\n" + "\n".join(lines)
