"""The house: data flows one way (files -> store -> embedding -> versions -> index -> answers -> interfaces), so no
module of `registry/` imports one of a higher layer, and no imports go round in a circle. Read from the code with
`ast` (imports inside functions count too)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "registry"

# Lowest first. A module may import modules of its own layer or of lower ones.
LAYERS = [
    ("foundation", {"errors", "textvec", "schema", "dialect", "store", "dbcopy", "querylabels"}),
    ("stored rules", {"evaluations", "outbox", "availability", "endpoints", "querycache", "generation"}),
    ("files in", {"staging", "ingest", "splits", "vectors", "route_files"}),
    ("the network", {"encoder", "checkpoint", "encoders"}),
    ("embedding", {"embedding", "index", "evidence"}),
    ("versions", {"onboarding"}),
    ("answers", {"answerbook", "catalog", "neighbours", "versions", "registration", "geometry", "fingerprint", "portfolio",
                 "fallback", "maps", "routing", "frontier", "baselines", "evaluation", "training",
                 "heldout", "interaction", "probes", "probe_plans"}),
    ("facade", {"api", "__init__"}),
    ("serving", {"snapshot", "answerbook", "writer", "serving"}),
    ("interfaces", {"cli", "cli_common", "server", "web", "proxy", "__main__"}),
]


def layer_of(module: str) -> int:
    for i, (_, names) in enumerate(LAYERS):
        if module in names or (i == len(LAYERS) - 1 and module.startswith("cli_")):
            return i
    raise AssertionError(f"registry/{module}.py is in no layer: add it to LAYERS in {__file__}")


def imports() -> dict[str, set[str]]:
    out = {}
    for path in sorted(PACKAGE.glob("*.py")):
        mod = path.stem
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("registry"):
                parts = node.module.split(".")
                found.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
        out[mod] = {m for m in found if (PACKAGE / f"{m}.py").exists()} - {mod}
    return out


def test_every_module_has_a_layer_and_imports_only_downwards():
    graph = imports()
    wrong = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
             for m, deps in graph.items() for d in sorted(deps) if layer_of(d) > layer_of(m)]
    assert not wrong, "upward imports:\n" + "\n".join(wrong)


def test_no_import_circle():
    graph = imports()
    state: dict[str, int] = {}
    cycles = []

    def visit(m, path):
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_layer_test_can_fail(tmp_path):
    """The walker sees an import inside a function: a planted upward import would be caught."""
    src = "def f():\n    from . import api\n"
    found = {a.name for node in ast.walk(ast.parse(src)) if isinstance(node, ast.ImportFrom) for a in node.names}
    assert found == {"api"} and layer_of("api") > layer_of("store")
