"""Inspect AI eval logs (`.eval` or `.json`, or a folder of them), read with Inspect's own reader (the optional
`harness` extra, imported here only)."""
from __future__ import annotations

from registry.core.errors import InputError
from registry.data.formats import file_limits
from registry.data.formats.samples import HarnessRun, Sample, as_correct, files_named, model_from_provider


def log_files(paths: list[str]) -> list[str]:
    """The logs named: files as given, folders by their `.eval` and `.json` files (sorted)."""
    return files_named(paths, wanted=lambda f: f.suffix in (".eval", ".json"),
                       none_found="no Inspect log (.eval or .json) in this folder")


def read(path: str, *, model: str | None = None, scorer: str | None = None, threshold: float | None = None,
         partial: bool = False) -> HarnessRun:
    try:
        from inspect_ai.log import read_eval_log
    except ImportError:
        raise InputError("reading Inspect logs needs inspect_ai: pip install 'locus-registry[harness]'") from None
    if path.endswith(".eval"):
        file_limits.check_archive(path)
    else:
        file_limits.check_size(path)
    try:
        log = read_eval_log(path)
    except Exception as exc:      # a truncated zip, a JSON that is no log: Inspect's reader says which
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(f"not a readable Inspect log ({type(exc).__name__}: {first[:200]})", file=path) from None
    if log.status != "success" and not partial:
        raise InputError(f"the log's status is {log.status!r}, not 'success' (pass --partial to import its "
                         f"scored samples)", file=path)
    if not log.samples:
        raise InputError("the log holds no samples", file=path)
    task = log.eval.task
    if model:
        run = HarnessRun(path, model)
    else:
        name, provider = model_from_provider(log.eval.model)
        run = HarnessRun(path, name, provider=provider)
    for s in log.samples:
        question = s.input if isinstance(s.input, str) else "\n".join(
            m.text for m in s.input if getattr(m, "role", "") == "user")
        correct = None
        if s.error is None and s.scores:
            if scorer is None and len(s.scores) > 1:
                raise InputError(f"sample {s.id}: the log holds several scorers ({', '.join(sorted(s.scores))}): "
                                 f"pass --scorer NAME", file=path)
            name = scorer or next(iter(s.scores))
            if name not in s.scores:
                raise InputError(f"sample {s.id}: no scorer {name!r} (the log has {', '.join(sorted(s.scores))})",
                                 file=path)
            correct = as_correct(s.scores[name].value, threshold=threshold, path=path, sample_id=str(s.id),
                                 what=f"score of {name}")
        meta = s.metadata or {}
        category = meta.get("category") or meta.get("subject")
        run.samples.append(Sample(str(s.id), question, list(s.choices) if s.choices else None, task,
                                  str(category) if category else None, correct))
    return run
