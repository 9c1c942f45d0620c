"""The import formats, one `Reader` each, in one table: its name, a line for `--help` and the docs, how it
recognises its files, and how it reads them into the import's staging rows (runs of samples, data/formats/samples.py).
The command line's `--from` choices and help, and docs/input-files.md's table, are built from this table. Another
package adds a format with no edit here: an entry point in the group `locus_registry.readers` naming a `Reader` (or a
function returning one), as simonw/llm's plugins do; found with importlib.metadata when the table is first asked for.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from registry.core.errors import InputError
from registry.data.formats.samples import HarnessRun as Run  # what a reader returns (re-exported for plugins)
from registry.data.formats.samples import Sample

ENTRY_POINT_GROUP = "locus_registry.readers"
OPTIONS = ("model", "scorer", "metric", "threshold", "partial")     # the import options a reader may take
__all__ = ["ENTRY_POINT_GROUP", "Reader", "Run", "Sample", "table", "get", "detect", "markdown"]


@dataclass(frozen=True)
class Reader:
    """An input format. `read(paths, **options)` -> list[Run]: every file read and checked, nothing written; a problem
    is an InputError naming the file (and line). `options`: which of OPTIONS it takes (`--model` always applies).
    `read=None`: the registry's own CSV folder, read by DuckDB's bulk path (data/input_files.py) instead of into
    rows."""
    name: str
    summary: str
    recognises: Callable[[list[str]], bool]
    read: Callable[..., list[Run]] | None
    options: tuple[str, ...] = ()
    origin: str = "registry"        # the package that supplied it (a plugin's distribution name)


# --- recognising files --------------------------------------------------------------------------------------------

def head(path: Path, size: int = 65536) -> str:
    """The first bytes of a file as text ('' when unreadable): enough to tell a format by its keys."""
    try:
        with open(path, "rb") as f:
            return f.read(size).decode("utf-8", "replace")
    except OSError:
        return ""


def files_under(paths: list[str]):
    """Every file named or under a folder named (a missing path: none)."""
    for p in paths:
        path = Path(p)
        if path.is_dir():
            yield from (f for f in sorted(path.rglob("*")) if f.is_file())
        elif path.is_file():
            yield path


def _csv_folder(paths: list[str]) -> bool:
    from registry.data.input_files import files_in_dir

    if len(paths) != 1 or not Path(paths[0]).is_dir():
        return False
    try:
        files_in_dir(paths[0])
    except InputError:
        return False
    return True


def _inspect(paths: list[str]) -> bool:
    return any(f.suffix == ".eval" or (f.suffix == ".json" and '"eval"' in (h := head(f, 4096)) and '"status"' in h
                                        and '"schema_version"' not in h) for f in files_under(paths))


def _lm_eval(paths: list[str]) -> bool:
    return any(f.name.startswith("results_") and f.suffix == ".json" for f in files_under(paths))


def _eee(paths: list[str]) -> bool:
    return any(f.name.endswith("_samples.jsonl") or (f.suffix == ".json" and '"schema_version"' in (h := head(f, 4096))
                                                      and '"evaluation_results"' in h) for f in files_under(paths))


def _helm(paths: list[str]) -> bool:
    return any(f.name in ("scenario_state.json", "per_instance_stats.json", "run_spec.json")
               for f in files_under(paths))


def _read_inspect(paths, *, model=None, scorer=None, threshold=None, partial=False, progress=False):
    from registry.data.formats import inspect_logs

    return [inspect_logs.read(f, model=model, scorer=scorer, threshold=threshold, partial=partial)
            for f in _each(inspect_logs.log_files(paths), progress)]


def _read_lm_eval(paths, *, model=None, metric=None, threshold=None, progress=False):
    from registry.data.formats import lm_eval_samples

    return [run for f in _each(lm_eval_samples.result_files(paths), progress)
            for run in lm_eval_samples.read(f, model=model, metric=metric, threshold=threshold)]


def _read_eee(paths, **options):
    from registry.data.formats import eee_read

    return eee_read.read_all(paths, **options)


def _read_helm(paths, **options):
    from registry.data.formats import helm

    return helm.read_all(paths, **options)


def _each(files: list[str], progress: bool):
    for i, f in enumerate(files, 1):
        if progress:
            print(f"reading {f} ({i}/{len(files)})", file=sys.stderr, flush=True)
        yield f


BUILTIN = (
    Reader("csv", "a folder laid out like ../shared/data/mmlu-pro (models.csv, questions.csv.gz, "
           "evaluations.csv.gz, splits.csv)", _csv_folder, None),
    Reader("inspect", "Inspect AI eval logs (.eval or .json, or folders of them)", _inspect, _read_inspect,
           ("scorer", "threshold", "partial")),
    Reader("lm-eval", "lm-evaluation-harness output folders (results_*.json beside samples_*.jsonl)", _lm_eval,
           _read_lm_eval, ("metric", "threshold")),
    Reader("eee", "Every Eval Ever 0.3 (aggregate {uuid}.json beside {uuid}_samples.jsonl, or folders of them)", _eee,
           _read_eee, ("metric", "threshold")),
    Reader("helm", "HELM run folders (scenario_state.json and per_instance_stats.json)", _helm, _read_helm,
           ("metric", "threshold")),
)

_TABLE: dict[str, Reader] | None = None


def _plugins() -> tuple[list[Reader], dict[str, str]]:
    """The readers other packages declare, and {name: why} of those that do not load (kept out of the table, so
    that one broken package does not stop every import; naming it says why)."""
    from importlib.metadata import entry_points

    found, broken = [], {}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            obj = ep.load()
            reader = obj if isinstance(obj, Reader) else obj()
            if not isinstance(reader, Reader) or reader.read is None:
                raise TypeError("not a Reader with a read function")
        except Exception as exc:
            broken[ep.name] = f"the reader plugin {ep.name!r} ({ep.value}) does not load: {type(exc).__name__}: {exc}"
            continue
        origin = getattr(ep, "dist", None)
        found.append(Reader(reader.name, reader.summary, reader.recognises, reader.read, tuple(reader.options),
                            origin=origin.name if origin is not None else ep.value))
    return found, broken


BROKEN: dict[str, str] = {}     # plugins that did not load: name -> why


def table() -> dict[str, Reader]:
    """{name: reader}: ours first, then the plugins' (one taking a name already in the table is left out, and
    naming it says why, as for one that does not load)."""
    global _TABLE
    if _TABLE is None:
        out = {r.name: r for r in BUILTIN}
        plugins, broken = _plugins()
        for r in plugins:
            if r.name in out:
                broken[r.name + f" ({r.origin})"] = (f"the reader plugin of {r.origin} is named {r.name!r}, which "
                                                     f"{out[r.name].origin} already names")
                continue
            out[r.name] = r
        BROKEN.update(broken)
        _TABLE = out
    return _TABLE


def get(name: str) -> Reader:
    readers = table()
    if name in BROKEN:
        raise InputError(BROKEN[name])
    if name not in readers:
        raise InputError(f"unknown format {name!r} (one of {', '.join(readers)})")
    return readers[name]


def detect(paths: list[str]) -> Reader:
    """The first reader, in the table's order, that recognises the files (ours before plugins: a plugin cannot take
    a format we read); none is an InputError naming the readers."""
    for p in paths:
        if not Path(p).exists():
            raise InputError("no such file or folder", file=p)
    for r in table().values():
        if r.recognises(list(paths)):
            return r
    if len(paths) == 1 and Path(paths[0]).is_file() and paths[0].lower().endswith((".csv", ".csv.gz", ".tsv")):
        from registry.data.input_files import ONE_FILE

        raise InputError(ONE_FILE, file=paths[0])
    raise InputError(f"no reader recognises {', '.join(paths)} (readers: {', '.join(table())}): give --from FORMAT")


def markdown() -> str:
    """The readers as a Markdown table (docs/input-files.md holds it; a test keeps the two alike)."""
    rows = ["| `--from` | reads | options |", "|---|---|---|"]
    rows += [f"| `{r.name}` | {r.summary} | {', '.join('--' + o for o in r.options) or '-'} |"
             for r in table().values()]
    return "\n".join(rows)
