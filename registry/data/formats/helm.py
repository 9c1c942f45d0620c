"""HELM's own run folders (`benchmark_output/runs/<suite>/<run>/`), read without a converter: `scenario_state.json`
gives each instance (its input, its references, the correct ones tagged) and the model (`adapter_spec.model`, named as
it is); `per_instance_stats.json` gives each instance's metrics. Each run is right or wrong by its own metric
(`metric_for`): `--metric` where given (for every run), else the main metric HELM's schemas name for the run's group
(`run_spec.json`'s `groups`), else `exact_match` for multiple choice (adapter method `multiple_choice_*`, which keeps
its options and the gold letter), else `f1_score` for a free-text run that has it (HELM's question answering); a run
with none of these is one line naming its folder. `--threshold` makes a metric that is not 0/1 right or wrong. Only
the first train trial, unperturbed, counts."""
from __future__ import annotations

import hashlib
from pathlib import Path

from registry.core.errors import InputError
from registry.data.formats import file_limits
from registry.data.formats.samples import HarnessRun, Sample, as_correct

STATE, STATS, SPEC = "scenario_state.json", "per_instance_stats.json", "run_spec.json"
MC_METRIC = "exact_match"
QA_METRIC = "f1_score"
# The main metric (`environment.main_name`) HELM's own schemas (schema_lite.yaml, schema_classic.yaml) give a run group
MAIN_METRIC = {
    **dict.fromkeys(("narrative_qa", "natural_qa_openbook_longans", "natural_qa_closedbook", "quac", "squad"),
                    "f1_score"),
    **dict.fromkeys(("mmlu", "openbookqa", "hellaswag", "truthful_qa", "commonsense"), "exact_match"),
    **dict.fromkeys(("boolq", "imdb", "raft", "civil_comments", "legalbench", "med_qa"), "quasi_exact_match"),
    "gsm": "exact_match_indicator", "math_chain_of_thought": "math_equiv_chain_of_thought",
    "code_humaneval": "pass", "wmt_14": "bleu_4",
    "summarization_cnndm": "rouge_2", "summarization_xsum": "rouge_2",
}


def run_folders(paths: list[str]) -> list[Path]:
    """The run folders named, or found under the folders named (a folder holding any of a run's files)."""
    out = []
    for p in paths:
        path = Path(p)
        if path.is_file():
            path = path.parent
        if not path.is_dir():
            raise InputError("no such file or folder", file=p)
        found = sorted({f.parent for name in (STATE, STATS, SPEC) for f in path.rglob(name)})
        if not found:
            raise InputError(f"no HELM run folder ({STATE}) in this folder", file=p)
        out.extend(found)
    return sorted(set(out))


def load(path: Path):
    return file_limits.json_document(path)


def read_all(paths: list[str], *, model: str | None = None, metric: str | None = None,
             threshold: float | None = None, progress: bool = False) -> list[HarnessRun]:
    folders = run_folders(paths)
    runs = []
    for i, folder in enumerate(folders, 1):
        if progress:
            import sys
            print(f"reading {folder} ({i}/{len(folders)})", file=sys.stderr, flush=True)
        runs.append(read(folder, model=model, metric=metric, threshold=threshold))
    return runs


def _source(folder: Path) -> str:
    """The run's name without its model (`mmlu:subject=philosophy,method=multiple_choice_joint`): the benchmark."""
    spec = load(folder / SPEC) if (folder / SPEC).is_file() else {}
    given = spec.get("name") if isinstance(spec, dict) else None
    name = given if isinstance(given, str) else folder.name
    head, _, args = name.partition(":")
    if "=" in head and not args:           # a folder name such as `narrative_qa-model=openai_gpt2`
        head, _, args = name.partition("-")
    kept = [a for a in args.split(",") if a and not a.startswith(("model=", "model_deployment="))]
    return head + (":" + ",".join(kept) if kept else "")


def read(folder: Path, *, model: str | None = None, metric: str | None = None,
         threshold: float | None = None) -> HarnessRun:
    for part in (STATE, STATS):
        if not (folder / part).is_file():
            what = "its instances and completions" if part == STATE else "each instance's metrics"
            raise InputError(f"a HELM run folder without {part} ({what})", file=str(folder))
    state, stats = load(folder / STATE), load(folder / STATS)
    if not isinstance(state, dict) or not isinstance(state.get("request_states"), list):
        raise InputError("not a HELM scenario state (no request_states)", file=str(folder / STATE))
    if not isinstance(stats, list):
        raise InputError("not HELM per-instance stats (a list of instances)", file=str(folder / STATS))
    adapter = state.get("adapter_spec") or {}
    method = str(adapter.get("method") or "")
    choice = method.startswith("multiple_choice")
    values = _metric_values(stats, folder / STATS)
    key, why = metric_for(folder, method, values, metric)
    name = model or adapter.get("model")
    if not name:
        raise InputError("the run names no model (adapter_spec.model): pass --model NAME", file=str(folder / STATE))
    h = hashlib.sha256()
    for f in (STATE, STATS):
        h.update((folder / f).read_bytes())
    source = _source(folder)
    run = HarnessRun(str(folder), str(name), provenance={"reader": "helm", "file": str(folder.resolve()),
                                                         "sha256": h.hexdigest(), "evaluation": source,
                                                         "metric": key, "metric_from": why})
    seen = set()
    for rs in state["request_states"]:
        inst = rs.get("instance") or {}
        iid = inst.get("id")
        if rs.get("train_trial_index", 0) != 0 or inst.get("perturbation") or iid in seen:
            continue
        seen.add(iid)
        text = (inst.get("input") or {}).get("text")
        if not isinstance(iid, str) or not isinstance(text, str) or not text.strip():
            raise InputError(f"instance {iid!r}: no id or input text", file=str(folder / STATE))
        refs = [r for r in inst.get("references") or [] if isinstance(r, dict)]
        texts = [str((r.get("output") or {}).get("text", "")) for r in refs]
        right = [i for i, r in enumerate(refs) if "correct" in (r.get("tags") or [])]
        options = texts if choice and texts else None
        answer = (chr(ord("A") + right[0]) if options else texts[right[0]]) if right else None
        metrics = values.get(iid)
        if metrics is None or key not in metrics:
            have = ", ".join(sorted(metrics or {})[:12]) or "none"
            raise InputError(f"instance {iid}: no per-instance stat {key!r} (its stats: {have})",
                             file=str(folder / STATS))
        correct = as_correct(metrics[key], threshold=threshold, path=str(folder / STATS), sample_id=iid, what=key)
        category = inst.get("sub_split") or _subject(source)
        run.samples.append(Sample(iid, text, options, source, category, correct, answer=answer))
    if not run.samples:
        raise InputError("the run holds no instances", file=str(folder / STATE))
    return run


def metric_for(folder: Path, method: str, values: dict[str, dict[str, float]],
               forced: str | None) -> tuple[str, str]:
    """The run's own metric and where it came from: `--metric`; HELM's main metric of the run's group; exact_match for
    multiple choice; f1_score for free text that has it. None of them: one line naming the run's folder."""
    if forced:
        return forced, "--metric"
    have = {n for v in values.values() for n in v}
    for group in _groups(folder):
        main = MAIN_METRIC.get(group)
        if main in have:
            return main, f"HELM's main metric of {group}"
    if method.startswith("multiple_choice"):
        return MC_METRIC, "multiple choice"
    if QA_METRIC in have:
        return QA_METRIC, "free text with f1_score"
    names = sorted(have)
    raise InputError(f"cannot tell this run's metric (adapter method {method!r}, groups "
                     f"{', '.join(_groups(folder)) or 'none'}): give --metric NAME (its per-instance metrics: "
                     f"{', '.join(names[:12])}{', ...' if len(names) > 12 else ''})", file=str(folder))


def _groups(folder: Path) -> list[str]:
    """The run's groups as its spec names them (`groups`), else its benchmark (the run's name before `:`)."""
    spec = load(folder / SPEC) if (folder / SPEC).is_file() else {}
    given = spec.get("groups") if isinstance(spec, dict) else None
    groups = [g for g in given if isinstance(g, str)] if isinstance(given, list) else []
    return groups or [_source(folder).partition(":")[0]]


def _subject(source: str) -> str | None:
    args = dict(a.split("=", 1) for a in source.partition(":")[2].split(",") if "=" in a)
    return args.get("subject") or args.get("dataset")


def _metric_values(stats: list, path: Path) -> dict[str, dict[str, float]]:
    """instance id -> {metric: mean} for the first train trial, unperturbed."""
    out: dict[str, dict[str, float]] = {}
    for entry in stats:
        if not isinstance(entry, dict) or not isinstance(entry.get("stats"), list):
            raise InputError("an instance's entry without its stats", file=str(path))
        if entry.get("train_trial_index", 0) != 0 or entry.get("perturbation"):
            continue
        mine = out.setdefault(str(entry.get("instance_id")), {})
        for s in entry["stats"]:
            name = s.get("name") or {}
            metric = name.get("name")
            if name.get("perturbation") or not s.get("count") or not isinstance(metric, str):
                continue       # (a stat without its metric's name: nothing could ask for it)
            mine.setdefault(metric, s.get("mean", s.get("sum", 0) / s["count"]))
    return out
