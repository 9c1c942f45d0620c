"""The house, read from the code with `ast`: the folders of `registry/` are its layers, data flows one way (core ->
locus -> data -> embedding -> answers -> routing -> evaluate -> asking -> traffic -> usecases -> facade -> serve ->
cli), so no module imports one of a higher layer and no imports go round in a circle; nothing below the facade imports
it or is handed it; each folder and module stays small enough to read at once; no function takes more than six
positional parameters; no module calls another's underscore names; comments say why without tracker numbers; and the
modules from `registry route` to its decision are counted."""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "registry"

# Lowest first. A module may import modules of its own layer or of lower ones.
# routing serves the policy evaluate measures: evaluate reads the served policy from routing/, never the other way
LAYERS = ["core", "locus", "data", "embedding", "answers", "routing", "evaluate", "asking", "traffic", "usecases",
          "facade", "serve", "cli"]
FACADE = {"api", "__init__"}
MAX_MODULES = 12
MAX_LINES = 400
MAX_POSITIONAL = 6


def module_name(path: Path) -> str:
    """registry/core/store.py -> "core.store"; registry/cli/__init__.py -> "cli"; registry/api.py -> "api"."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    head = module.split(".")[0]
    if module in FACADE:
        return LAYERS.index("facade")
    if module == "__main__":
        return LAYERS.index("cli")
    if head in LAYERS:
        return LAYERS.index(head)
    raise AssertionError(f"registry/{module} is in no layer: put it in one of the folders {LAYERS}")


def _resolve(module: str, node: ast.ImportFrom) -> list[str]:
    """The registry modules an import statement names (a package's names that are modules count as those)."""
    if node.level:
        package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
        base_parts = package[:len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
    elif node.module and (node.module == "registry" or node.module.startswith("registry.")):
        base_parts = node.module.split(".")[1:]
    else:
        return []
    base = ".".join(base_parts)
    found = []
    for alias in node.names:
        sub = f"{base}.{alias.name}" if base else alias.name
        if sub in MODULES:
            found.append(sub)
        elif base in MODULES:
            found.append(base)
        elif not base:
            found.append("__init__")
    return found


@functools.cache          # (parsing every module takes a second or more: once per run; callers only read it)
def imports(typing: bool = False) -> dict[str, dict[str, int]]:
    """module -> {imported registry module: first line}, imports inside functions included; an import under
    `if TYPE_CHECKING:` never runs and is left out, unless `typing` (a reader, and mypy, follow it all the same)."""
    graph = {}
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        typing_only = set() if typing else {
            id(n) for t in ast.walk(tree) if isinstance(t, ast.If) and "TYPE_CHECKING" in ast.unparse(t.test)
            for n in ast.walk(t)}
        edges = graph.setdefault(mod, {})
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and id(node) not in typing_only:
                for dep in _resolve(mod, node):
                    if dep != mod:
                        edges.setdefault(dep, node.lineno)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("registry."):
                        edges.setdefault(a.name.removeprefix("registry."), node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
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


def test_the_walk_sees_imports_of_every_form():
    graph = imports()
    assert "cli.common" in graph["cli"] and "cli" in graph["__main__"] and "api" in graph["__init__"]
    assert "core.store" in graph["api"]


def test_every_module_has_a_layer_and_imports_only_downwards():
    graph = imports()
    wrong = [f"{m} ({LAYERS[layer_of(m)]}) imports {d} ({LAYERS[layer_of(d)]}) at line {line}"
             for m, deps in graph.items() for d, line in sorted(deps.items()) if layer_of(d) > layer_of(m)]
    assert not wrong, "upward imports:\n" + "\n".join(wrong)


def test_no_import_circle():
    """None, counting the imports made only for type checking."""
    graph = imports(typing=True)
    lines = [" <-> ".join(c) + ": " + "; ".join(f"{a}:{graph[a][b]} imports {b}" for a in c for b in graph[a] if b in c)
             for c in cycles(graph)]
    assert not lines, "import circles:\n" + "\n".join(lines)


def test_the_checks_can_fail():
    """A planted circle is found, and an import inside a function of a low layer would be read as upward."""
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []
    node = ast.parse("def f():\n    from registry import api\n").body[0].body[0]
    assert _resolve("core.store", node) == ["api"] and layer_of("api") > layer_of("core.store")
    node = ast.parse("from ..routing import choice\n").body[0]
    assert _resolve("serve.app", node) == ["routing.choice"]


def test_folders_are_the_layers_and_say_what_they_own():
    folders = sorted(p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert sorted(p.name for p in folders) == sorted(set(LAYERS) - {"facade"})
    # a full folder may take subfolders (one level: registry/data/formats/), which belong to its layer
    subfolders = sorted(p.parent for p in PACKAGE.glob("*/*/__init__.py"))
    for folder in folders + subfolders:
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= MAX_MODULES, f"registry/{folder.relative_to(PACKAGE)}/ holds {len(modules)} modules"
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8")))
        assert doc and len(doc.splitlines()) <= 2, \
            f"registry/{folder.relative_to(PACKAGE)}/__init__.py: say in two lines what it owns"
    assert not list(PACKAGE.rglob("*/*/*/__init__.py")), "two levels of folders at most"


@pytest.mark.parametrize("module", sorted(MODULES), ids=str)
def test_module_is_small_enough_to_read_at_once(module):
    n = len(MODULES[module].read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"registry/{module}: {n} lines"


def _functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def positional(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    if args and args[0] in ("self", "cls"):
        args = args[1:]
    return len(args)


def test_no_function_takes_more_than_six_positional_parameters():
    wide = [f"registry/{m}:{fn.lineno} {fn.name}: {positional(fn)}" for m, p in MODULES.items()
            for fn in _functions(ast.parse(p.read_text(encoding="utf-8"))) if positional(fn) > MAX_POSITIONAL]
    assert not wide, "past the first few, parameters are keyword-only:\n" + "\n".join(wide)
    fn = ast.parse("def f(self, a, b, c, d, e, f, g): pass").body[0]
    assert positional(fn) == 7                          # the check can fail


def own_private_names(tree: ast.Module) -> set[str]:
    """Underscore names a module defines: its functions, classes and variables, and its classes' attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, (ast.AnnAssign,)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if n.startswith("_")}


# Python's and libraries' own underscore API, not another module of ours
FOREIGN_PRIVATE_OK = {"_asdict", "_replace", "_fields", "_exit", "_getframe", "_current_frames",
                      "_version"}      # torch: a tensor's in-place change counter


def reach_ins(module: str, source: str) -> list[str]:
    tree = ast.parse(source)
    own = own_private_names(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out += [f"imports {a.name}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
        elif isinstance(node, ast.Attribute):
            name = node.attr
            if (name.startswith("_") and not name.startswith("__") and name not in own
                    and name not in FOREIGN_PRIVATE_OK):
                out.append(f"line {node.lineno}: {ast.unparse(node)}")
    return [f"registry/{module}: {o}" for o in out]


def test_no_module_calls_another_modules_underscore_names():
    found = [line for m, p in MODULES.items() for line in reach_ins(m, p.read_text(encoding="utf-8"))]
    assert not found, "reach-ins (make it public, or pass it as an argument):\n" + "\n".join(found)
    assert reach_ins("x", "def f(reg):\n    reg._pool()\n")
    assert not reach_ins("x", "class A:\n    def f(self):\n        self._p = 1\n        return self._p\n")


TRACKER = re.compile(r"\b(issue|bar)s? ?#?[0-9]+", re.IGNORECASE)


def test_no_tracker_numbers_in_the_code():
    found = [f"registry/{m}:{i}: {line.strip()}" for m, p in MODULES.items()
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if TRACKER.search(line)]
    assert not found, "say why in words; a reader of the code cannot see the tracker:\n" + "\n".join(found)


# What only the facade has: a parameter used for these is the `Registry` handed down under another name
FACADE_ATTRS = {"store", "onboard", "finish_pending", "finish_stabilities", "estimate_stability", "probation_min",
                "probation_setting", "min_evaluations", "import_files", "register", "route_batch"}
FACADE_NAMES = {"reg", "registry"}


def facade_uses(module: str, source: str) -> list[str]:
    """Where a module imports the facade (`registry.api`, or `Registry` from the package: under TYPE_CHECKING too),
    or a function takes it: a parameter annotated `Registry`, named `reg`/`registry`, or whose uses reach for what
    only the facade has (`x.store`, `x.onboard()`, `x.finish_pending()`, `x.probation_min`...)."""
    tree = ast.parse(source)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [f"line {node.lineno}: imports {a.name}" for a in node.names if a.name == "registry.api"]
        elif isinstance(node, ast.ImportFrom):
            names = {a.name for a in node.names}
            if node.module == "registry.api" or (node.module == "registry" and names & {"api", "Registry"}) or (
                    node.level and node.module in (None, "api") and names & {"api", "Registry"}):
                out.append(f"line {node.lineno}: imports {node.module or '.'}: {', '.join(sorted(names))}")
    for fn in _functions(tree):
        params = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs + [a for a in (fn.args.vararg,
                                                                                        fn.args.kwarg) if a]
        for a in params:
            if a.annotation is not None and re.search(r"\bRegistry\b", ast.unparse(a.annotation)):
                out.append(f"line {fn.lineno}: {fn.name}({a.arg}: {ast.unparse(a.annotation)})")
            elif a.arg in FACADE_NAMES:
                out.append(f"line {fn.lineno}: {fn.name}({a.arg}): a parameter named for the facade")
        names = {a.arg for a in params} - {"self", "cls"}
        reached = sorted({f"{n.value.id}.{n.attr}" for n in ast.walk(fn) if isinstance(n, ast.Attribute)
                          and isinstance(n.value, ast.Name) and n.value.id in names and n.attr in FACADE_ATTRS})
        if reached:
            out.append(f"line {fn.lineno}: {fn.name} uses {', '.join(reached)}: the facade's, handed down")
    return [f"registry/{module}: {o}" for o in out]


def test_nothing_below_the_facade_imports_or_receives_it():
    """The use cases and every layer under them are handed a Store or a Tx and plain values, never the `Registry`:
    an operation a reader looks for is in one layer, and calls only go down."""
    below = [m for m in MODULES if layer_of(m) <= LAYERS.index("usecases")]
    assert len(below) > 100 and "usecases.register" in below and "answers.registration" in below
    found = [line for m in below for line in facade_uses(m, MODULES[m].read_text(encoding="utf-8"))]
    assert not found, "the facade handed down:\n" + "\n".join(found)
    # the check can fail, on each form
    for planted in ("from registry.api import Registry\n", "def f():\n    from registry import Registry\n",
                    "from .. import api\n", "import registry.api\n",
                    "def f(r: 'Registry'):\n    pass\n", "def f(reg, name):\n    return name\n",
                    "def f(owner):\n    owner.finish_pending()\n", "def f(x, *, y):\n    with x.store.tx() as tx:\n"
                    "        return y\n", "def f(x):\n    return x.probation_min\n"):
        assert facade_uses("answers.x", planted), planted
    assert not facade_uses("answers.x", "from registry.core.errors import RegistryError\n"
                                        "def f(tx, store):\n    with store.tx() as t:\n        return t.path\n")


ROUTE_WING = ("cli", "usecases", "routing", "locus")     # where a reader of routing should find all of it
ROUTE_PATH_BAR = 12
THE_FIT = ("routing.fit", "routing.served", "routing.pairs")   # what builds the state: never on a route's path


def _facade_target(method: str) -> str:
    """The use-case module a one-line facade method calls (`route_uc.route(...)` -> "usecases.route")."""
    tree = ast.parse(MODULES["api"].read_text(encoding="utf-8"))
    lazy = {}
    for node in tree.body:          # name = lazy_modules("registry.usecases", "a b c")
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                getattr(node.value.func, "id", "") == "lazy_modules":
            package, names = (a.value for a in node.value.args)
            targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else [node.targets[0]]
            lazy.update({t.id: f"{package.removeprefix('registry.')}.{n}" for t, n in zip(targets, names.split())})
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Registry")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)
    called = {lazy[n.func.value.id] for n in ast.walk(fn) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and n.func.value.id in lazy}
    assert len(called) == 1, f"Registry.{method} calls {called}: one use case"
    return called.pop()


def route_path() -> list[str]:
    """The modules a reader opens from `registry route TEXT` to the decision: the command (cli/routing.py), the
    facade's one-line `route`, the use case it calls, and every module that use case imports, followed on through
    the routing wing (cli/, usecases/, routing/, locus/); a module of another folder is opened (counted) but its
    own imports are not followed; core/ and the text encoder are neither followed nor counted."""
    graph = imports()
    start = _facade_target("route")
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        if m in seen or m.startswith("core") or m.startswith("locus.text_"):
            continue
        seen.add(m)
        if m.split(".")[0] in ROUTE_WING:
            todo += list(graph.get(m, {}))
    return sorted(seen | {"cli.routing", "api"})


def test_from_route_to_the_decision_a_reader_opens_few_modules():
    """A route reads the routing state and scores: the fit (routing/fit.py, the served policy's choice, embedding/,
    evaluate/) is never on its path. The facade (api.py) counts as the use-case layer here: it is that layer's list
    of one-line calls, the file a reader passes through from the command to the use case."""
    path = route_path()
    assert {"cli.routing", "api", "usecases.route", "routing.choice", "routing.decision", "routing.state",
            "routing.served_scores", "locus.interaction"} <= set(path)
    built = [m for m in path if m in THE_FIT or m.split(".")[0] in ("embedding", "evaluate")]
    assert not built, f"a route opens what builds the routing state: {built}"
    assert len(path) <= ROUTE_PATH_BAR, f"{len(path)} modules from `registry route` to the decision:\n" + \
        "\n".join(path)
