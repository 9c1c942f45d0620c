"""bench/devdata.py builds a development dataset from a copy of ZeroEval's repository: here a tiny fake of its
layout (result_dirs/<task>/<model>.json and the summaries), as a checkout and as a bare git directory. The scoring
rules are the repository's: JSON answer, key patterns, Llama-3.1's boxed answer, first numbers for math, exact
strings for crux, no answer counts as wrong."""
from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("devdata", ROOT / "bench" / "devdata.py")
devdata = importlib.util.module_from_spec(spec)
spec.loader.exec_module(devdata)


def _out(answer) -> list[str]:
    return ["```json\n" + json.dumps({"reasoning": "because", "answer": answer}, indent=2) + "\n```"]


def _item(task: str, i: int, truth: str, output: list[str]) -> dict:
    key = "problem" if task == "math-l5" else "question"
    ids = {"gsm": f"gsm8k-main-test-#{i}", "math-l5": str(i), "crux": f"crux-test-#{i}"}
    return {"id": ids[task], key: f"{task} question {i}?", "answer": truth, "output": output}


def _fake_repo(root: Path) -> Path:
    gsm = {  # model file -> outputs for questions 0..3 (truths 18, 3, 70000, 5)
        "deepseek-chat": [_out("$18.00"), ['{"reasoning": "x", "answer": 3, }'], _out("70,000"),
                          ["I cannot answer"]],
        "Meta-Llama-3.1-8B-Instruct": [["so the result is $\\boxed{18}$"], _out(4), _out("70000 dollars"),
                                       _out(None)],
        "gpt-4o": [["the answer is 18"], ['"answer": 3,'], _out("__import__('os').getcwd()/1"), _out("5")],
    }
    truths = ["# 18", "# 3", "# 70,000", "# 5"]
    math = {"gpt-4o": [_out("3/4"), _out("\\frac{1}{2}"), _out("2")],
            "Meta-Llama-3.1-8B-Instruct": [_out("0.75"), _out("0.5"), ["no json \\boxed{2}"]]}
    math_truths = ["0.75", "\\frac{1}{2}", "2"]
    crux = {"deepseek-v2-chat-0628": [_out("'abc'"), _out("[1, 2]"), _out(None)],
            "gpt-4o": [_out("abc"), _out("[1,2]"), _out("a\nb")]}
    crux_truths = ["'abc'", "[1, 2]", "None"]
    for task, files, tr in (("gsm", gsm, truths), ("math-l5", math, math_truths), ("crux", crux, crux_truths)):
        folder = root / "result_dirs" / task
        folder.mkdir(parents=True)
        for model, outs in files.items():
            items = [_item(task, i, tr[i], o) for i, o in enumerate(outs)]
            (folder / f"{model}.json").write_text(json.dumps(items))
        summary = [{"Model": devdata.unified_name(m), "Mode": "greedy", "Acc": "50.00"} for m in files]
        (root / "result_dirs" / f"{task}.summary.json").write_text(json.dumps(summary))
    (root / "LICENSE").write_text("Apache License 2.0 (fake)\n")
    return root


def _read(out: Path):
    with gzip.open(out / "evaluations.csv.gz", "rt") as f:
        evals = {(r["model"], r["question_id"]): int(r["correct"]) for r in csv.DictReader(f)}
    with gzip.open(out / "questions.csv.gz", "rt") as f:
        questions = list(csv.DictReader(f))
    with open(out / "splits.csv") as f:
        splits = {r["question_id"]: r["split"] for r in csv.DictReader(f)}
    models = [r["model"] for r in csv.DictReader(open(out / "models.csv"))]
    return evals, questions, splits, models


def test_scoring_follows_the_repositorys_rules(tmp_path):
    summary = devdata.zeroeval(_fake_repo(tmp_path / "ZeroEval"), tmp_path / "out", seed=0)
    evals, questions, splits, models = _read(tmp_path / "out")
    ds, llama, gpt = "deepseek-v2-chat-0628", "Meta-Llama-3.1-8B-Instruct", "gpt-4o"
    # gsm: "$18.00" is 18; an unparsable object falls back to key patterns; "70,000" loses its comma; no answer
    # is wrong and still counted
    assert [evals[(ds, f"gsm8k/gsm8k-main-test-#{i}")] for i in range(4)] == [1, 1, 1, 0]
    # Llama-3.1 models' trailing \boxed{} answer counts; a JSON null answer is "None", wrong for a number
    assert [evals[(llama, f"gsm8k/gsm8k-main-test-#{i}")] for i in range(4)] == [1, 0, 1, 0]
    # prose has no answer; an unquoted key pattern is read; a fraction that is not arithmetic is never evaluated
    assert [evals[(gpt, f"gsm8k/gsm8k-main-test-#{i}")] for i in range(4)] == [0, 1, 0, 1]
    # math: 3/4 is 0.75; \frac{1}{2} vs \frac{1}{2}: first numbers 1 and 1; a Llama-3.1 output may end in \boxed{}
    assert [evals[(gpt, f"math-l5/{i}")] for i in range(3)] == [1, 1, 1]
    assert [evals[(llama, f"math-l5/{i}")] for i in range(3)] == [1, 0, 1]
    # crux: exact strings after stripping quotes; a null answer equals the truth "None"; "[1,2]" != "[1, 2]"
    assert [evals[(ds, f"cruxeval/crux-test-#{i}")] for i in range(3)] == [1, 1, 1]
    assert [evals[(gpt, f"cruxeval/crux-test-#{i}")] for i in range(3)] == [1, 0, 0]
    # deepseek-chat (gsm) and deepseek-v2-chat-0628 (crux) are one model, as in the repository's summaries
    assert sorted(models) == sorted([ds, llama, gpt])
    assert summary["models"] == 3 and summary["questions"] == 10 and summary["evaluations"] == len(evals) == 24
    assert {q["category"] for q in questions} == {"gsm8k", "math-l5", "cruxeval"}
    assert all(q["category"] == q["source"] and q["question"].endswith("?") for q in questions)
    assert set(splits) == {q["question_id"] for q in questions} and set(splits.values()) <= {"train", "val", "test"}
    assert summary["published_check"]["gsm"]["models"] == 3
    assert (tmp_path / "out" / "LICENSE").read_text().startswith("Apache")


def test_a_bare_git_copy_gives_the_same_files_and_its_commit(tmp_path):
    repo = _fake_repo(tmp_path / "ZeroEval")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "fake"], check=True)
    commit = subprocess.run(git[:3] + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout
    a = devdata.zeroeval(repo, tmp_path / "a", seed=0)
    b = devdata.zeroeval(repo / ".git", tmp_path / "b", seed=0)
    assert b["commit"] == commit.strip() and commit.strip() in (tmp_path / "b" / "README.md").read_text()
    assert _read(tmp_path / "a") == _read(tmp_path / "b") and a["evaluations"] == b["evaluations"]


def test_the_split_is_fixed_by_seed_within_each_task():
    qs = {f"t{t}/{i}": None for t in range(2) for i in range(100)}
    s0, s0b, s1 = devdata.split_of(qs, 0), devdata.split_of(qs, 0), devdata.split_of(qs, 1)
    assert s0 == s0b and s0 != s1
    for t in range(2):
        got = [s0[f"t{t}/{i}"] for i in range(100)]
        assert (got.count("train"), got.count("val"), got.count("test")) == (60, 20, 20)
    other = devdata.split_of(qs, 0, (0.8, 0.1, 0.1))
    assert [other[f"t0/{i}"] for i in range(100)].count("val") == 10


def test_five_folds_test_every_question_once_and_fold_4_is_the_plain_split():
    qs = {f"t{t}/{i}": None for t in range(2) for i in range(103)}
    folds = [devdata.split_of(qs, 0, fold=f) for f in range(devdata.FOLDS)]
    assert folds[4] == devdata.split_of(qs, 0)
    for q in qs:
        roles = [f[q] for f in folds]
        assert roles.count("test") == 1 and roles.count("val") == 1 and roles.count("train") == 3
        # the block validated in fold F is the one tested in fold F-1
        assert roles.index("val") == (roles.index("test") + 1) % devdata.FOLDS
    for f in folds:
        got = [f[f"t0/{i}"] for i in range(103)]
        assert abs(got.count("test") - 21) <= 1 and abs(got.count("val") - 21) <= 1
    with pytest.raises(ValueError, match="fold must be"):
        devdata.split_of(qs, 0, (0.8, 0.1, 0.1), fold=0)


def test_a_missing_source_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="no such folder"):
        devdata.main(["zeroeval", "--source", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])


@pytest.mark.slow
def test_the_folder_imports_into_a_registry(tmp_path):
    from registry import Registry

    devdata.zeroeval(_fake_repo(tmp_path / "ZeroEval"), tmp_path / "out", seed=0)
    with Registry(tmp_path / "r.duckdb") as reg:
        reg.import_files(directory=str(tmp_path / "out"))
        assert sorted(m.name for m in reg.models()) == sorted(_read(tmp_path / "out")[3])
        with reg.store.tx() as tx:
            assert tx.sql("SELECT count(*) FROM evaluations")[0][0] == 24
            assert tx.sql("SELECT count(DISTINCT category) FROM queries")[0][0] == 3


def test_prices_give_each_complete_model_its_mean_dollars_per_question(tmp_path):
    repo = _fake_repo(tmp_path / "ZeroEval")
    prices = tmp_path / "prices.csv"
    prices.write_text("model,input_usd_per_mtok,output_usd_per_mtok,source\n"
                      "gpt-4o,4.0,8.0,a page\ndeepseek-v2-chat-0628,1.0,1.0,another\n")
    devdata.zeroeval(repo, tmp_path / "out", seed=0, prices=prices)
    cost = {r["model"]: r["cost"] for r in csv.DictReader(open(tmp_path / "out" / "models.csv"))}
    # gpt-4o answered all 10 questions: by hand, characters / 4 tokens at 4 and 8 $ per million
    per = []
    for task in ("gsm", "math-l5", "crux"):
        for item in json.loads((repo / "result_dirs" / task / "gpt-4o.json").read_text()):
            text = devdata.question_text(item)
            per.append((len(text) * 4.0 + len(item["output"][0]) * 8.0) / 4 / 1e6)
    assert float(cost["gpt-4o"]) == pytest.approx(sum(per) / len(per), rel=1e-6)
    # deepseek answered 7 of them (gsm and crux): a price would be scored on gaps, so none; unpriced models: none
    assert cost["deepseek-v2-chat-0628"] == "" and cost["Meta-Llama-3.1-8B-Instruct"] == ""
    assert "cost" in (tmp_path / "out" / "README.md").read_text()
    prices.write_text("model,input_usd_per_mtok,output_usd_per_mtok,source\nno-such-model,1,1,x\n")
    with pytest.raises(SystemExit, match="no results for no-such-model"):
        devdata.zeroeval(repo, tmp_path / "out2", seed=0, prices=prices)


def _fake_alpaca(root: Path) -> Path:
    subsets = ["helpful_base", "koala", "vicuna"]
    prefs = {"vicuna-7b-v1.5": [1.2, 1.8, 1.5], "vicuna-13b_concise": [1.9, "1.51", None],
             "gpt4_1106_preview": [1.5, 1.5, 1.5]}
    for model, ps in prefs.items():
        folder = root / "results" / model / devdata.AE_ANNOTATOR
        folder.mkdir(parents=True)
        items = [{"dataset": subsets[i], "instruction": f" Say {i} things. ", "output_2": "x", "generator_2": model,
                  "preference": p} for i, p in enumerate(ps)]
        (folder / "annotations.json").write_text(json.dumps(items))
    (root / "results" / "judged-elsewhere" / "alpaca_eval_gpt4").mkdir(parents=True)    # no 2.0 judgement
    # a constant output that games the judge, named so by the repository: won judgements, nothing to route to
    folder = root / "results" / "NullModel" / devdata.AE_ANNOTATOR
    folder.mkdir(parents=True)
    (folder / "annotations.json").write_text(json.dumps(
        [{"dataset": subsets[i], "instruction": f" Say {i} things. ", "preference": 2.0} for i in range(3)]))
    configs = root / "src" / "alpaca_eval" / "models_configs"
    for model, pretty in (("NullModel", '"NullModel (adversarial)"'), ("vicuna-7b-v1.5", "Vicuna 7B v1.5")):
        (configs / model).mkdir(parents=True)
        (configs / model / "configs.yaml").write_text(f"{model}:\n  pretty_name: {pretty}\n")
    board = root / "src" / "alpaca_eval" / "leaderboards" / "data_AlpacaEval_2"
    board.mkdir(parents=True)
    (board / f"{devdata.AE_ANNOTATOR}_leaderboard.csv").write_text(
        ",win_rate,discrete_win_rate\nvicuna-7b-v1.5,30.0,33.33\nvicuna-13b_concise,60.0,66.67\n")
    (root / "LICENSE").write_text("Apache License 2.0 (fake)\n")
    return root


def test_alpacaeval_wins_are_judgements_above_a_tie(tmp_path):
    summary = devdata.alpacaeval(_fake_alpaca(tmp_path / "alpaca_eval"), tmp_path / "out", seed=0)
    evals, questions, splits, models = _read(tmp_path / "out")
    # the baseline (judged against itself) and a model without an AlpacaEval 2.0 judgement are left out
    assert sorted(models) == ["vicuna-13b_concise", "vicuna-7b-v1.5"] and summary["skipped"] == 1
    assert summary["adversarial"] == ["NullModel"]
    qid = {q["question"]: q["question_id"] for q in questions}
    assert [evals[("vicuna-7b-v1.5", qid[f"Say {i} things."])] for i in range(3)] == [0, 1, 0]    # 1.5: a tie
    assert [evals[("vicuna-13b_concise", qid[f"Say {i} things."])] for i in range(3)] == [1, 1, 0]  # none: lost
    assert {q["category"] for q in questions} == {"helpful_base", "koala", "vicuna"}
    assert all(q["question_id"].startswith(q["category"] + "/") for q in questions)
    assert summary["published_check"] == {"models": 2, "within_0.5": 2, "max_gap": pytest.approx(0.0, abs=0.01)}
    family = {r["model"]: r["family"] for r in csv.DictReader(open(tmp_path / "out" / "models.csv"))}
    assert family == {"vicuna-7b-v1.5": "vicuna", "vicuna-13b_concise": "vicuna"}
    assert devdata.ae_family("gpt4_0613_concise") == devdata.ae_family("gpt4_gamed") == "gpt-4"
    assert devdata.ae_family("gpt35_turbo_instruct") == devdata.ae_family("gpt-3.5-turbo-1106") == "gpt-3.5"


def test_alpacaeval_from_a_bare_git_copy_is_the_same(tmp_path):
    repo = _fake_alpaca(tmp_path / "alpaca_eval")
    (repo / "results" / "judged-elsewhere" / "alpaca_eval_gpt4" / "annotations.json").write_text("[]")  # git keeps it
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "fake"], check=True)
    a = devdata.alpacaeval(repo, tmp_path / "a", seed=0)
    b = devdata.alpacaeval(repo / ".git", tmp_path / "b", seed=0)
    assert _read(tmp_path / "a") == _read(tmp_path / "b") and a["evaluations"] == b["evaluations"] == 6
    assert a["skipped"] == b["skipped"] == 1
