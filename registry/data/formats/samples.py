"""What a harness reader returns: one run's model and its samples, each a question (with its options) and a result,
read and checked, nothing written. The result rule is the same for every harness: 0/1 (C/I, true/false) as is; any
other value is refused unless a threshold makes it one. A format that knows more (Every Eval Ever, HELM) fills the
optional fields: the query's own id and gold answer, the model's metadata, and where the run was read from."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from registry.core.errors import InputError

TRUE_VALUES = {"c": True, "correct": True, "true": True, "1": True, "1.0": True,
               "i": False, "incorrect": False, "false": False, "0": False, "0.0": False}


@dataclass
class Sample:
    sample_id: str
    question: str
    options: list[str] | None
    source: str | None              # the task (None: a registry export's query that has none)
    category: str | None
    correct: bool | None            # None: errored or not scored (missing, not wrong)
    answer: str | None = None       # the gold answer (a letter among the options, or the text), if the file has it
    query_id: str | None = None     # the id the file gives the query, kept for a new query where no other has it
    split: str | None = None        # train | val | test, for a new query, where the file says (a registry's export)


@dataclass
class HarnessRun:
    path: str                       # the file read
    model: str
    samples: list[Sample] = field(default_factory=list)
    provider: str | None = None     # the harness's provider prefix of `model` (Inspect's `openai/gpt-4o`): kept in
    #                                 the name unless the name without it is a registered model (`named`)
    meta: dict = field(default_factory=dict)         # a new model's metadata (family, provider, params_b, cost,
    #                                                  open_weights, tags), as import_run.insert_new_models takes it
    provenance: dict = field(default_factory=dict)   # what the import batch records of it (file, sha256, evaluation)

    @property
    def missing(self) -> int:
        return sum(s.correct is None for s in self.samples)


def as_correct(value, *, threshold: float | None, path: str, sample_id: str, what: str) -> bool | None:
    """A score as right/wrong: 0/1 values as they are; another number only with a threshold (>= it is right)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in TRUE_VALUES:
        return TRUE_VALUES[value.strip().lower()]
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(f"sample {sample_id}: {what} {value!r} is not a number or C/I", file=path) from None
    if not math.isfinite(number):          # (Python's float() and JSON readers take "NaN" and "Infinity")
        raise InputError(f"sample {sample_id}: {what} {value!r} is not a finite number", file=path)
    if number in (0.0, 1.0) and threshold is None:
        return number == 1.0
    if threshold is None:
        raise InputError(f"sample {sample_id}: {what} {value!r} is not 0 or 1 (give --threshold T to count a value "
                         f">= T as correct)", file=path)
    return number >= threshold


def model_from_provider(name: str) -> tuple[str, str | None]:
    """A harness's `provider/model` name -> (the model, the provider): `openai/gpt-4o` -> ("gpt-4o", "openai");
    `hf/meta-llama/Llama-3-8B` -> ("meta-llama/Llama-3-8B", "hf")."""
    return (name.split("/", 1)[1], name.split("/", 1)[0]) if "/" in name else (name, None)


def named(run: HarnessRun, registered) -> str:
    """The registry's name for a run's model: without the provider where that is a registered model (`openai/gpt-4o`
    is the registry's `gpt-4o`), else with it, so that `imposter/v1` and `newcomer/v1` stay two models."""
    if run.provider is None or registered(run.model):
        return run.model
    return f"{run.provider}/{run.model}"


def files_named(paths: list[str], *, wanted: Callable[[Path], bool], none_found: str) -> list[str]:
    """The files named, as given, and those under the folders named that a reader wants (sorted); a folder with
    none, or a name that is neither, is refused with the file named."""
    out = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(str(f) for f in path.rglob("*") if wanted(f))
            if not found:
                raise InputError(none_found, file=p)
            out.extend(found)
        elif path.is_file():
            out.append(str(path))
        else:
            raise InputError("no such file or folder", file=p)
    return out
