"""Every Eval Ever (schema 0.3) read: each aggregate `<uuid>.json` (checked against EEE's own schema) with the
`<uuid>_samples.jsonl` beside it (its sha256 checked against the aggregate's checksum), one run per evaluation name,
each sample a question (`input.raw`, `input.choices`), its gold answer (`input.reference`) and its result
(`evaluation.is_correct`, else a 0/1 `evaluation.score`, else the score against `--threshold`). The model is named
from `model_id` as it is. What the registry itself wrote (eee_write.py) comes back whole: the `registry.*` keys of a
sample's metadata and of the model's details give back the query's id, source and category and the model's metadata.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import orjson

from registry.core.errors import InputError
from registry.data.formats import eee_schema, file_limits
from registry.data.formats.samples import HarnessRun, Sample, as_correct

READS = "0.3."          # schema versions read: 0.3.x
PREFIX = "registry."    # the keys of metadata the registry writes for itself
QUERY_ID, SOURCE, CATEGORY, SPLIT = (PREFIX + k for k in ("query_id", "source", "category", "split"))


def aggregates(paths: list[str]) -> list[tuple[Path, Path]]:
    """(aggregate, samples file) of every evaluation named or under a folder named (sorted); a samples file whose
    aggregate is not beside it is an InputError."""
    found: dict[Path, Path] = {}
    for p in paths:
        path = Path(p)
        if path.is_dir():
            files = sorted(f for f in path.rglob("*") if f.is_file())
            if not any(f.suffix in (".json", ".jsonl") for f in files):
                raise InputError("no Every Eval Ever aggregate (.json) in this folder", file=p)
        elif path.is_file():
            files = [path]
        else:
            raise InputError("no such file or folder", file=p)
        for f in files:
            if f.name in (MANIFEST, MANIFEST + ".tmp"):
                continue
            if f.name.endswith("_samples.jsonl"):
                agg = f.with_name(f.name.removesuffix("_samples.jsonl") + ".json")
                if not agg.is_file():
                    raise InputError(f"a samples file without its aggregate ({agg.name} is not beside it)", file=str(f))
                found[agg] = f
            elif f.suffix == ".json":
                found.setdefault(f, f.with_name(f.stem + "_samples.jsonl"))
    return sorted(found.items())


MANIFEST = "registry-export.manifest"   # JSON, not .json: no EEE reader takes it for an aggregate
OWN = "locus-registry"                # the source organisation its aggregates name


def check_finished(agg: Path) -> None:
    """An aggregate this registry exported must come from an export that finished: its manifest (four folders up, at
    the export's root: data/<benchmark>/<developer>/<model>/) names it. InputError, one line, otherwise."""
    try:
        head = file_limits.json_document(agg)
        own = head.get("source_metadata", {}).get("source_organization_name") == OWN
    except (InputError, AttributeError):
        return                                     # (what is wrong with it is read() to say)
    if not own or len(agg.parents) < 5 or agg.parents[3].name != "data":    # (a pair taken out of its export)
        return
    root = agg.parents[4]
    try:
        listed = set(file_limits.json_document(root / MANIFEST).get("models", {}).values())
    except (InputError, AttributeError):
        raise InputError(f"written by an export of this registry that did not finish (no {MANIFEST} at {root}): it "
                         f"may lack models; export again", file=str(agg)) from None
    if str(agg.relative_to(root)) not in listed:
        raise InputError(f"not in its export's {MANIFEST} (at {root}): left by another, unfinished export; export "
                         f"again", file=str(agg))


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_aggregate(path: Path) -> dict:
    agg = file_limits.json_document(path)
    if not isinstance(agg, dict) or "evaluation_results" not in agg:
        raise InputError("not an Every Eval Ever aggregate (no evaluation_results)", file=str(path))
    version = agg.get("schema_version")
    if not (isinstance(version, str) and version.startswith(READS)):
        raise InputError(f"schema version {version!r}: this registry reads Every Eval Ever {READS}x", file=str(path))
    problem = eee_schema.first_error("aggregate", agg)
    if problem:
        raise InputError(f"not a valid Every Eval Ever aggregate: {problem}", file=str(path))
    return agg


def gold(reference, choices: list[str] | None) -> str | None:
    """The first reference as the registry's gold answer: the letter of the choice it names (or is), else its text."""
    if not reference or not isinstance(reference, list) or not isinstance(reference[0], str):
        return None
    ref = reference[0].strip()
    if choices:
        letters = [chr(ord("A") + i) for i in range(len(choices))]
        if ref.upper() in letters:
            return ref.upper()
        for letter, text in zip(letters, choices):
            if text.strip() == ref:
                return letter
    return ref or None


def model_meta(info: dict) -> dict:
    """A new model's metadata from `model_info`: what the registry wrote (`registry.*`), else developer and
    availability."""
    details = info.get("additional_details") or {}
    own = {k.removeprefix(PREFIX): v for k, v in details.items() if k.startswith(PREFIX)}
    if own:
        return {"family": own.get("family"), "provider": own.get("provider"),
                "params_b": float(own["params_b"]) if own.get("params_b") else None,
                "cost": float(own["cost"]) if own.get("cost") else None,
                "open_weights": {"true": True, "false": False}.get(own.get("open_weights", "")),
                "tags": json.loads(own["tags"]) if own.get("tags") else {},
                "alias_of": own.get("alias_of")}     # (the model it was recorded as another name of, if any)
    return {"provider": info.get("developer"),
            "open_weights": {"open_weights": True, "closed_weights": False}.get(details.get("model_availability", ""))}


def read_all(paths: list[str], *, model: str | None = None, metric: str | None = None,
             threshold: float | None = None, progress: bool = False) -> list[HarnessRun]:
    pairs = aggregates(paths)
    if not pairs:
        raise InputError("no Every Eval Ever aggregate (.json) found", file=paths[0] if paths else None)
    for agg, _ in pairs:
        check_finished(agg)
    runs: list[HarnessRun] = []
    golds: dict = {}
    for i, (agg, samples) in enumerate(pairs, 1):
        if progress:
            import sys
            print(f"reading {samples} ({i}/{len(pairs)})", file=sys.stderr, flush=True)
        runs.extend(read(agg, samples, model=model, metric=metric, threshold=threshold, golds=golds))
    return runs


def read(agg_path: Path, samples_path: Path, *, model: str | None = None, metric: str | None = None,
         threshold: float | None = None, golds: dict | None = None) -> list[HarnessRun]:
    """One run per evaluation name of the samples file (`metric`: only the one of that name or result id). `golds`:
    (reference, choices) -> gold answer, shared by the files of one import (their models answer the same questions)."""
    agg = load_aggregate(agg_path)
    detail = agg.get("detailed_evaluation_results") or {}
    if not samples_path.is_file():
        named = Path(detail["file_path"]).name if detail.get("file_path") else None
        if named and (agg_path.parent / named).is_file():
            samples_path = agg_path.parent / named
        else:
            raise InputError(f"no samples file beside it ({samples_path.name}): only per-sample results can be "
                             f"imported", file=str(agg_path))
    sha = digest(samples_path)
    if detail.get("checksum") and detail.get("hash_algorithm", "sha256") == "sha256" and detail["checksum"] != sha:
        raise InputError(f"its sha256 is not the aggregate's checksum ({agg_path.name} says "
                         f"{detail['checksum'][:12]}..., the file is {sha[:12]}...)", file=str(samples_path))
    info = agg["model_info"]
    name = model or info["id"]
    meta = model_meta(info)
    provenance = {"reader": "eee", "file": str(agg_path.resolve()), "sha256": digest(agg_path),
                  "samples": str(samples_path.resolve()), "samples_sha256": sha,
                  "evaluation_id": agg["evaluation_id"]}
    runs: dict[str, HarnessRun] = {}
    golds = {} if golds is None else golds
    path = str(samples_path)
    for line_no, row in file_limits.json_lines(samples_path, loads=orjson.loads):
        if type(row) is not dict:
            raise InputError("a sample must be a JSON object", file=path, line=line_no)
        sample = _sample(row, agg, path, line_no, threshold, golds)
        ev = row["evaluation_name"]
        if metric and metric not in (ev, row.get("evaluation_result_id")):
            continue
        run = runs.get(ev)
        if run is None:
            run = runs[ev] = HarnessRun(path, name, meta=meta,
                                        provenance={**provenance, "evaluation": ev})
        run.samples.append(sample)
    if not runs:
        what = f" of evaluation {metric!r}" if metric else ""
        raise InputError(f"the samples file holds no samples{what}", file=path)
    return list(runs.values())


def _sample(row: dict, agg: dict, path: str, line: int, threshold: float | None, golds: dict) -> Sample:
    """One line (a JSON object) as a Sample (`golds`: the gold answers worked out so far, by reference and choices,
    and the texts and options seen so far)."""
    sid, inp = row.get("sample_id"), row.get("input")
    if type(sid) is not str or type(row.get("evaluation_name")) is not str:
        raise InputError("a sample without its sample_id or evaluation_name", file=path, line=line)
    if row.get("evaluation_id") != agg["evaluation_id"]:
        raise InputError(f"sample {sid}: evaluation_id {row.get('evaluation_id')!r} is not its aggregate's "
                         f"({agg['evaluation_id']!r})", file=path, line=line)
    if row.get("model_id") != agg["model_info"]["id"]:
        raise InputError(f"sample {sid}: model_id {row.get('model_id')!r} is not its aggregate's "
                         f"({agg['model_info']['id']!r})", file=path, line=line)
    inp = inp if type(inp) is dict else {}
    raw = inp.get("raw")
    if type(raw) is not str or not raw.strip():
        raise InputError(f"sample {sid}: no question (input.raw)", file=path, line=line)
    choices, reference = inp.get("choices"), inp.get("reference")
    try:
        key = (tuple(reference) if type(reference) is list else None, tuple(choices) if choices else None)
        answer = golds[key]
    except KeyError:
        if choices is not None and not (type(choices) is list and all(type(c) is str for c in choices)):
            raise InputError(f"sample {sid}: input.choices must be a list of strings", file=path, line=line) from None
        answer = golds[key] = gold(reference, choices)
    except TypeError:           # (a list holding objects)
        raise InputError(f"sample {sid}: input.choices and input.reference must be lists of strings", file=path,
                         line=line) from None
    ev_block = row.get("evaluation")
    is_correct, score = (ev_block.get("is_correct"), ev_block.get("score")) if type(ev_block) is dict else (None, None)
    correct: bool | None
    if is_correct is True or is_correct is False:
        correct = is_correct
    elif score is not None:
        correct = as_correct(score, threshold=threshold, path=path, sample_id=sid, what="evaluation.score")
    elif row.get("error"):
        correct = None          # errored: missing, not wrong
    else:
        raise InputError(f"sample {sid}: no score (evaluation.is_correct or evaluation.score)", file=path, line=line)
    meta = row.get("metadata")
    meta = meta if type(meta) is dict else {}
    own = meta.get(QUERY_ID)
    # one copy of each question and options for all the models that answered it (a registry's worth in memory)
    raw = golds.setdefault(raw, raw)
    options = golds.setdefault(("options", key[1]), list(key[1])) if key[1] else None
    if own is None:
        return Sample(sid, raw, options, row["evaluation_name"], meta.get("category") or meta.get("subject"),
                      correct, answer=answer)
    split = meta.get(SPLIT)
    if split is not None and split not in ("train", "val", "test"):
        raise InputError(f"sample {sid}: {SPLIT} must be train, val or test, got {split!r}", file=path, line=line)
    return Sample(sid, raw, options, meta.get(SOURCE), meta.get(CATEGORY), correct, answer=answer, query_id=own,
                  split=split)
