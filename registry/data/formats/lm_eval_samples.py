"""lm-evaluation-harness output folders (`--output_path` with `--log_samples`): each `results_<time>.json` names
the model and its tasks, each `samples_<task>_<time>.jsonl` beside it holds one line per document with the
document (question, choices) and its metric values. Plain JSON: read without importing lm_eval."""
from __future__ import annotations

from pathlib import Path

from registry.core.errors import InputError
from registry.data.formats import file_limits
from registry.data.formats.samples import HarnessRun, Sample, as_correct, files_named

QUESTION_KEYS = ("question", "query", "input", "prompt", "text", "problem", "sentence")
CHOICE_KEYS = ("options", "choices", "endings")


def result_files(paths: list[str]) -> list[str]:
    """The results files named, or found under the folders named (sorted)."""
    return files_named(paths, wanted=lambda f: f.name.startswith("results_") and f.suffix == ".json",
                       none_found="no lm-evaluation-harness results_*.json in this folder")


def _model_name(results: dict, path: str) -> str:
    name = results.get("model_name")
    if not name:
        args = (results.get("config") or {}).get("model_args") or ""
        args = ",".join(f"{k}={v}" for k, v in args.items()) if isinstance(args, dict) else str(args)
        name = next((a.split("=", 1)[1] for a in args.split(",") if a.strip().startswith("pretrained=")), None)
    if not name:
        raise InputError("the results file names no model (no model_name, no pretrained= in model_args): pass "
                         "--model NAME", file=path)
    return str(name)


def _primary_metric(results: dict, task: str, path: str) -> str:
    config = (results.get("configs") or {}).get(task) or {}
    metrics = [m.get("metric") for m in config.get("metric_list") or [] if isinstance(m, dict)]
    if metrics and isinstance(metrics[0], str):
        return metrics[0]
    found = [k.split(",")[0] for k in (results.get("results") or {}).get(task, {}) if "," in k
             and not k.split(",")[0].endswith("_stderr")]
    if not found:
        raise InputError(f"task {task!r} names no metric: pass --metric NAME", file=path)
    return found[0]


def read(path: str, *, model: str | None = None, metric: str | None = None,
         threshold: float | None = None) -> list[HarnessRun]:
    """One run per task of the results file (all of one model)."""
    results = file_limits.json_document(path)
    if not isinstance(results, dict) or not isinstance(results.get("configs"), dict):
        raise InputError("not an lm-evaluation-harness results file (no configs)", file=path)
    name = model or _model_name(results, path)
    group_of = {t: g for g, tasks in (results.get("group_subtasks") or {}).items() for t in tasks or []}
    stamp = Path(path).stem.removeprefix("results_")
    runs = []
    for task in sorted(results["configs"]):
        sample_file = Path(path).with_name(f"samples_{task}_{stamp}.jsonl")
        if not sample_file.is_file():
            raise InputError(f"no samples file for task {task!r} beside it ({sample_file.name}; run lm_eval with "
                             f"--log_samples)", file=path)
        key = metric or _primary_metric(results, task, path)
        run = HarnessRun(str(sample_file), name)
        for line_no, row in file_limits.json_lines(sample_file):
            if not isinstance(row, dict):
                raise InputError("a line that is not a JSON object", file=str(sample_file), line=line_no)
            run.samples.append(_sample(row, task, group_of.get(task), key, threshold, str(sample_file)))
        if not run.samples:
            raise InputError("the samples file holds no samples", file=str(sample_file))
        runs.append(run)
    return runs


def _sample(row: dict, task: str, group: str | None, key: str, threshold: float | None, path: str) -> Sample:
    sid = str(row.get("doc_id"))
    given = row.get("doc")
    doc = given if isinstance(given, dict) else {}
    question = next((doc[k] for k in QUESTION_KEYS if isinstance(doc.get(k), str) and doc[k].strip()), None)
    if question is None:
        raise InputError(f"sample {sid}: its doc has no question ({', '.join(QUESTION_KEYS)})", file=path)
    options = next((doc[k] for k in CHOICE_KEYS if isinstance(doc.get(k), list)), None)
    if key not in row and key not in (row.get("metrics") or []):
        raise InputError(f"sample {sid}: no metric {key!r} (its metrics: {', '.join(row.get('metrics') or [])})",
                         file=path)
    correct = as_correct(row.get(key), threshold=threshold, path=path, sample_id=sid, what=key)
    category = group or doc.get("category") or doc.get("subject")
    return Sample(sid, question, [str(o) for o in options] if options else None, task,
                  str(category) if category else None, correct)
