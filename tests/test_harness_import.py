"""`registry import --from inspect|lm-eval`: logs made by the real harnesses, offline, in the test run (Inspect's
eval loop with a model provider defined here, lm-evaluation-harness's own run with a model class defined here),
over registered MMLU-Pro questions; then imported through the CLI."""
from __future__ import annotations

import csv
import gzip
import json
import os
import random

import pytest
from click.testing import CliRunner

from registry import Registry
from registry.cli import cli
from tests.conftest import snapshot
from tests.helpers import run_import

LLAMA = "Meta-Llama-3_1-70B-Instruct"
LETTERS = "ABCDEFGHIJ"
N = 150


def questions_and_llama(small_data) -> list[dict]:
    """N registered questions (with options and answer letter) and whether Llama-3.1-70B got each right."""
    with gzip.open(small_data / "evaluations.csv.gz", "rt") as f:
        llama = {r["question_id"]: r["correct"].lower() in ("1", "true") for r in csv.DictReader(f)
                 if r["model"] == LLAMA}
    with gzip.open(small_data / "questions.csv.gz", "rt") as f:
        rows = [r for r in csv.DictReader(f) if r["question_id"] in llama]
    rows = sorted(rows, key=lambda r: int(r["question_id"]))[:N]
    assert len(rows) == N
    return [{"id": r["question_id"], "question": r["question"], "options": json.loads(r["options"]),
             "answer": r["answer"], "category": r["category"], "llama": llama[r["question_id"]]} for r in rows]


def answers_of(qs: list[dict], like_llama: bool) -> dict[str, int]:
    """question text -> the option index a model answers: as Llama did (its right/wrong), or right at random."""
    rng = random.Random(5)
    out = {}
    for q in qs:
        right = q["llama"] if like_llama else rng.random() < 0.5
        target = LETTERS.index(q["answer"])
        out[q["question"].strip()] = target if right else (target + 1) % len(q["options"])
    return out


# --- Inspect AI ---------------------------------------------------------------------------------------------------

ANSWERS: dict[str, dict[str, int]] = {}     # model name -> question text -> option index


def inspect_log(qs: list[dict], model: str, log_dir) -> str:
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.model import GenerateConfig, ModelAPI, ModelOutput, modelapi
    from inspect_ai.scorer import choice
    from inspect_ai.solver import multiple_choice

    @modelapi(name="replay")
    class Replay(ModelAPI):
        """Answers each question as ANSWERS says its model does."""
        def __init__(self, model_name, base_url=None, api_key=None, config=GenerateConfig(), **kwargs):  # noqa: B008 (inspect's own signature)
            super().__init__(model_name, base_url, api_key, [], config)

        async def generate(self, input, tools, tool_choice, config):
            prompt = input[-1].text
            book = ANSWERS[self.model_name]
            index = next(i for q, i in book.items() if q in prompt)
            return ModelOutput.from_content(self.model_name, f"ANSWER: {LETTERS[index]}")

    dataset = MemoryDataset([Sample(input=q["question"], choices=q["options"], target=q["answer"], id=q["id"],
                                    metadata={"category": q["category"]}) for q in qs])
    logs = inspect_eval(Task(dataset=dataset, solver=multiple_choice(), scorer=choice(), name="mmlu_pro_slice"),
                        model=f"replay/{model}", log_dir=str(log_dir), display="none")
    assert logs[0].status == "success"
    return logs[0].location


@pytest.fixture(scope="module")
def inspect_logs(small_data, tmp_path_factory):
    qs = questions_and_llama(small_data)
    ANSWERS["llama-twin"] = answers_of(qs, like_llama=True)
    ANSWERS["coin-flip"] = answers_of(qs, like_llama=False)
    out = tmp_path_factory.mktemp("inspect_logs")
    return {m: inspect_log(qs, m, out / m) for m in ANSWERS}


@pytest.mark.slow
def test_inspect_logs_import_onto_registered_queries(db_copy, inspect_logs):
    with Registry(db_copy) as reg, reg.store.tx() as tx:
        queries_before = len(tx.sql("SELECT id FROM queries"))
    r = run_import(db_copy, "--from", "inspect", inspect_logs["llama-twin"], inspect_logs["coin-flip"], "--json")
    assert r.exit_code == 0, r.output
    done = json.loads(r.output[r.output.index("{"):])
    # named with Inspect's provider ("replay/"): neither name is a registered model, and the provider may be all
    # that tells two models apart
    assert [m["model"] for m in done["models"]] == ["replay/coin-flip", "replay/llama-twin"]
    assert done["queries_added"] == 0 and done["evaluations_added"] == 2 * N
    assert all(m["matched"] == N and m["missing"] == 0 for m in done["models"])
    reports = {m["model"].removeprefix("replay/"): m["report"] for m in done["models"]}
    assert reports["llama-twin"]["alias_of"] == LLAMA            # its answers are "same" as Llama-3.1-70B's
    assert reports["coin-flip"]["alias_of"] is None
    assert all(rep["version"] is not None for rep in reports.values())
    with Registry(db_copy) as reg:
        with reg.store.tx() as tx:
            assert len(tx.sql("SELECT id FROM queries")) == queries_before
        assert {m.name for m in reg.models()} >= {"replay/llama-twin", "replay/coin-flip"}
    # a re-import adds nothing
    before = snapshot(db_copy)
    r = run_import(db_copy, "--from", "inspect", os.path.dirname(inspect_logs["llama-twin"]))
    assert r.exit_code == 0, r.output
    assert "0 new queries, 0 evaluations added" in r.output and "nearest model" in r.output
    assert snapshot(db_copy) == before


def rewritten(path: str, out: str, change) -> str:
    """The log at `path`, changed by `change(log)` and written by Inspect's own writer to `out`."""
    from inspect_ai.log import read_eval_log, write_eval_log

    log = read_eval_log(path)
    change(log)
    write_eval_log(log, out)
    return out


def _no_samples(log):
    log.samples = []


def _score_07(log):
    log.samples[0].scores["choice"].value = 0.7


def _cancelled_unscored(log):
    log.status = "cancelled"
    log.samples[0].scores = None


def _repeated(log):
    twin = log.samples[0].model_copy(deep=True)
    twin.id = log.samples[0].id
    twin.scores["choice"].value = "I" if log.samples[0].scores["choice"].value == "C" else "C"
    log.samples.append(twin)


def _named(model):
    def change(log):
        log.eval.model = model
    return change


def _all_errored(log):
    log.status = "error"
    for s in log.samples:
        s.scores = None


@pytest.mark.slow
def test_two_providers_models_of_one_name_stay_two_and_a_registered_name_is_kept(db_copy, inspect_logs, tmp_path):
    log = inspect_logs["coin-flip"]
    logs = [rewritten(log, str(tmp_path / f"{who}.eval"), _named(f"{who}/v1")) for who in ("imposter", "newcomer")]
    r = run_import(db_copy, "--from", "inspect", *logs, "--json")
    assert r.exit_code == 0, r.output
    assert [m["model"] for m in json.loads(r.output[r.output.index("{"):])["models"]] == ["imposter/v1", "newcomer/v1"]
    # a provider in front of a registered model's name: that model
    known = rewritten(log, str(tmp_path / "known.eval"), _named(f"openai/{LLAMA}"))
    r = run_import(db_copy, "--from", "inspect", known, "--json", "--partial")
    assert r.exit_code == 0 and [m["model"] for m in json.loads(r.output[r.output.index("{"):])["models"]] == [LLAMA]
    # a log whose every sample errored: said so, nothing written
    before = snapshot(db_copy)
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "import", "--from", "inspect", "--partial",
                                 rewritten(log, str(tmp_path / "errored.eval"), _all_errored)])
    assert r.exit_code == 1 and "no scored sample" in r.output and "unknown model" not in r.output, r.output
    assert snapshot(db_copy) == before


@pytest.mark.slow
def test_inspect_malformed_logs_are_one_line_and_change_nothing(db_copy, inspect_logs, tmp_path):
    log = inspect_logs["llama-twin"]
    truncated = tmp_path / "truncated.eval"
    data = open(log, "rb").read()
    truncated.write_bytes(data[:len(data) // 2])
    cases = [
        ([str(truncated)], "not a readable zip archive"),
        ([rewritten(log, str(tmp_path / "empty.eval"), _no_samples)], "holds no samples"),
        ([rewritten(log, str(tmp_path / "score.eval"), _score_07)], "is not 0 or 1 (give --threshold"),
        ([rewritten(log, str(tmp_path / "twice.json"), _repeated)], "appears twice with two different results"),
        ([log, "--scorer", "f1"], "no scorer 'f1'"),
        ([rewritten(log, str(tmp_path / "cancelled.eval"), _cancelled_unscored)], "not 'success' (pass --partial"),
    ]
    before = snapshot(db_copy)
    for args, message in cases:
        r = CliRunner().invoke(cli, ["--db", str(db_copy), "import", "--from", "inspect", *args])
        assert r.exit_code != 0, args
        lines = [ln for ln in r.output.strip().splitlines() if ln.startswith("Error")]
        assert len(lines) == 1 and message in lines[0], r.output
        assert args[0].split("/")[-1] in lines[0] or "scorer" in message
        assert snapshot(db_copy) == before
    # the non-binary score imports with a threshold
    r = run_import(db_copy, "--from", "inspect", str(tmp_path / "score.eval"), "--threshold", "0.5", "--json")
    assert r.exit_code == 0, r.output
    # a cancelled log with --partial: its unscored sample is missing, not wrong
    r = run_import(db_copy, "--from", "inspect", str(tmp_path / "cancelled.eval"), "--partial",
                   "--model", "partial-run", "--json")
    assert r.exit_code == 0, r.output
    m = json.loads(r.output[r.output.index("{"):])["models"][0]
    assert (m["model"], m["samples"], m["missing"], m["evaluations_added"]) == ("partial-run", N, 1, N - 1)


# --- lm-evaluation-harness ----------------------------------------------------------------------------------------

TASK_YAML = """task: mmlu_pro_slice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{options}}}}"
doc_to_target: "{{{{answer_index}}}}"
metric_list:
  - metric: acc
"""


def lm_eval_run(qs: list[dict], model: str, answers: dict[str, int], folder) -> None:
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_DATASETS_CACHE=str(folder / "hf"))
    import lm_eval
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    @register_model(f"replay-{model}")      # one class per replayed model
    class Replay(LM):
        """Likeliest: the option the replayed model chose."""
        def __init__(self, pretrained=None, **kwargs):
            super().__init__()

        def loglikelihood(self, requests):
            out = []
            for r in requests:
                context, continuation = r.args
                q = next(q for q in qs if q["question"].strip() == context.strip())
                chosen = q["options"][answers[q["question"].strip()]]
                out.append((0.0 if continuation.strip() == chosen.strip() else -5.0, False))
            return out

        def loglikelihood_rolling(self, requests):
            raise NotImplementedError

        def generate_until(self, requests):
            raise NotImplementedError

    (folder / "task").mkdir(parents=True)
    data = folder / "task" / "data.jsonl"
    data.write_text("".join(json.dumps({"question_id": q["id"], "question": q["question"], "options": q["options"],
                                        "answer_index": LETTERS.index(q["answer"])}) + "\n" for q in qs))
    (folder / "task" / "mmlu_pro_slice.yaml").write_text(TASK_YAML.format(data=data))
    tracker = EvaluationTracker(output_path=str(folder / "out"))
    results = lm_eval.simple_evaluate(model=f"replay-{model}", model_args=f"pretrained={model}",
                                      tasks=["mmlu_pro_slice"],
                                      task_manager=TaskManager(include_path=str(folder / "task")),
                                      log_samples=True, evaluation_tracker=tracker)
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for task in results["configs"]:
        tracker.save_results_samples(task_name=task, samples=samples[task])


@pytest.mark.slow
def test_lm_eval_run_imports_onto_registered_queries(db_copy, small_data, tmp_path):
    qs = questions_and_llama(small_data)
    lm_eval_run(qs, "llama-twin-lm", answers_of(qs, like_llama=True), tmp_path / "twin")
    lm_eval_run(qs, "coin-flip-lm", answers_of(qs, like_llama=False), tmp_path / "coin")
    r = run_import(db_copy, "--from", "lm-eval", str(tmp_path / "twin" / "out"), str(tmp_path / "coin" / "out"),
                   "--json")
    assert r.exit_code == 0, r.output
    done = json.loads(r.output[r.output.index("{"):])
    assert [m["model"] for m in done["models"]] == ["coin-flip-lm", "llama-twin-lm"]    # from the results files
    assert done["queries_added"] == 0 and done["evaluations_added"] == 2 * N
    reports = {m["model"]: m["report"] for m in done["models"]}
    assert reports["llama-twin-lm"]["alias_of"] == LLAMA and reports["coin-flip-lm"]["alias_of"] is None
    before = snapshot(db_copy)
    r = run_import(db_copy, "--from", "lm-eval", str(tmp_path / "twin" / "out"))
    assert r.exit_code == 0 and "0 new queries, 0 evaluations added" in r.output, r.output
    assert snapshot(db_copy) == before
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "import", "--from", "lm-eval", str(tmp_path / "coin" / "out"),
                                 "--metric", "f1"])
    assert r.exit_code != 0 and "sample 0: no metric 'f1'" in r.output and "samples_mmlu_pro_slice" in r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("Error")]) == 1, r.output
    assert snapshot(db_copy) == before
