"""`registry import --from helm`: HELM's own run folders (../shared/data/eee/fixtures/helm: mmlu philosophy and
hellaswag, multiple choice; narrative_qa, free text) come in without a converter; a malformed run folder is one line
and changes nothing."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from registry.cli import cli
from tests.conftest import EEE, snapshot
from tests.helpers import run_import

HELM = EEE / "fixtures" / "helm"
MMLU = HELM / "mmlu-subject=philosophy,method=multiple_choice_joint,model=openai_gpt2"
HELLASWAG = HELM / "commonsense-dataset=hellaswag,method=multiple_choice_joint,model=eleutherai_pythia-1b-v0"
NARRATIVE = HELM / "narrative_qa-model=openai_gpt2"


def exact_match(folder: Path) -> dict[str, bool]:
    """instance id -> its exact_match, read from the fixture itself."""
    stats = json.loads((folder / "per_instance_stats.json").read_text())
    return {e["instance_id"]: next(s["mean"] for s in e["stats"] if s["name"]["name"] == "exact_match"
                                   and not s["name"].get("perturbation")) == 1.0 for e in stats}


@pytest.mark.slow
def test_the_three_helm_runs_import(tmp_path):
    db = tmp_path / "helm.duckdb"
    r = run_import(db, "--from", "helm", str(MMLU), str(HELLASWAG), "--json")
    assert r.exit_code == 0, r.output
    done = json.loads(r.output[r.output.index("{"):])
    assert [m["model"] for m in done["models"]] == ["eleutherai/pythia-1b-v0", "openai/gpt2"]
    assert done["queries_added"] == 20 and done["evaluations_added"] == 20
    # the free-text run's own metric is f1_score (HELM's main one for narrative_qa), which wants a threshold
    r = CliRunner().invoke(cli, ["--db", str(db), "import", str(NARRATIVE)])
    assert r.exit_code == 1 and "f1_score" in r.output and "is not 0 or 1 (give --threshold" in r.output
    r = run_import(db, str(NARRATIVE), "--metric", "f1_score", "--threshold", "0.3", "--json")     # recognised: helm
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["evaluations_added"] == 5
    con = duckdb.connect(str(db), read_only=True)
    got = {(m, q): c for m, q, c in con.execute("""SELECT m.name, q.external_id, e.correct FROM evaluations e
                                                   JOIN models m ON m.id = e.model_id
                                                   JOIN queries q ON q.id = e.query_id""").fetchall()}
    want = {("openai/gpt2", f"mmlu:subject=philosophy,method=multiple_choice_joint/{i}"): c
            for i, c in exact_match(MMLU).items()}
    want.update({("eleutherai/pythia-1b-v0", f"commonsense:dataset=hellaswag,method=multiple_choice_joint/{i}"): c
                 for i, c in exact_match(HELLASWAG).items()})
    assert {k: v for k, v in got.items() if "narrative" not in k[1]} == want
    f1 = {e["instance_id"]: next(s["mean"] for s in e["stats"] if s["name"]["name"] == "f1_score")
          for e in json.loads((NARRATIVE / "per_instance_stats.json").read_text())}
    narrative = {k[1].split("/")[1]: v for k, v in got.items() if "narrative" in k[1]}
    assert narrative == {i: v >= 0.3 for i, v in f1.items()}
    # multiple choice keeps its options and the gold letter; free text its gold answer's text
    text, answer, grading = con.execute("""SELECT q.text, a.answer, a.grading FROM queries q
                                           JOIN query_answers a ON a.query_id = q.id
                                           WHERE q.external_id LIKE 'mmlu%/id147'""").fetchall()[0]
    assert text.endswith("(C) internalmeaning\n(D) meaning in an afterlife") and (answer, grading) == ("C", "letter")
    assert con.execute("""SELECT a.grading, q.category FROM queries q JOIN query_answers a ON a.query_id = q.id
                          WHERE q.external_id = 'narrative_qa/id1413'""").fetchall() == [("text", None)]
    files = json.loads(con.execute("SELECT files FROM import_batches ORDER BY id LIMIT 1").fetchall()[0][0])
    assert {p["evaluation"] for p in files["read"]} == {"mmlu:subject=philosophy,method=multiple_choice_joint",
                                                        "commonsense:dataset=hellaswag,method=multiple_choice_joint"}
    assert all(len(p["sha256"]) == 64 and p["metric"] == "exact_match" for p in files["read"])


@pytest.mark.slow
def test_a_mixed_helm_folder_imports_in_one_command_each_run_by_its_own_metric(tmp_path):
    runs = tmp_path / "benchmark_output" / "runs" / "v1"
    for source in (MMLU, NARRATIVE):
        shutil.copytree(source, runs / source.name)
    db = tmp_path / "mixed.duckdb"
    r = run_import(db, str(runs.parent), "--threshold", "0.3", "--json")          # recognised as helm, no --metric
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["evaluations_added"] == 15
    con = duckdb.connect(str(db), read_only=True)
    got = {q: c for q, c in con.execute("""SELECT q.external_id, e.correct FROM evaluations e
                                           JOIN queries q ON q.id = e.query_id""").fetchall()}
    f1 = {e["instance_id"]: next(s["mean"] for s in e["stats"] if s["name"]["name"] == "f1_score")
          for e in json.loads((NARRATIVE / "per_instance_stats.json").read_text())}
    assert {q.split("/")[1]: c for q, c in got.items() if q.startswith("narrative")} == {
        i: v >= 0.3 for i, v in f1.items()}
    assert {q.split("/")[1]: c for q, c in got.items() if q.startswith("mmlu")} == exact_match(MMLU)
    files = json.loads(con.execute("SELECT files FROM import_batches ORDER BY id LIMIT 1").fetchall()[0][0])
    assert {(p["evaluation"], p["metric"], p["metric_from"]) for p in files["read"]} == {
        ("mmlu:subject=philosophy,method=multiple_choice_joint", "exact_match", "HELM's main metric of mmlu"),
        ("narrative_qa", "f1_score", "HELM's main metric of narrative_qa")}
    con.close()
    # --metric still forces one metric on every run
    forced = tmp_path / "forced.duckdb"
    r = run_import(forced, "--from", "helm", str(runs), "--metric", "exact_match", "--json")
    assert r.exit_code == 0, r.output
    con = duckdb.connect(str(forced), read_only=True)
    files = json.loads(con.execute("SELECT files FROM import_batches ORDER BY id LIMIT 1").fetchall()[0][0])
    assert {(p["metric"], p["metric_from"]) for p in files["read"]} == {("exact_match", "--metric")}


def test_malformed_helm_folders_are_one_line_and_change_nothing(db_copy, tmp_path):
    def copy(name: str, source: Path = MMLU) -> Path:
        out = tmp_path / name / source.name
        shutil.copytree(source, out)
        return out

    no_stats = copy("no_stats")
    (no_stats / "per_instance_stats.json").unlink()
    bad_json = copy("bad_json")
    (bad_json / "scenario_state.json").write_text((MMLU / "scenario_state.json").read_text()[:5000])
    no_metric = copy("no_metric")
    unknown = copy("unknown", NARRATIVE)          # a free-text run of no group HELM names, without f1_score
    spec = json.loads((unknown / "run_spec.json").read_text())
    (unknown / "run_spec.json").write_text(json.dumps({**spec, "groups": ["my_task"]}))
    stats = json.loads((unknown / "per_instance_stats.json").read_text())
    for entry in stats:
        entry["stats"] = [s for s in entry["stats"] if s["name"]["name"] != "f1_score"]
    (unknown / "per_instance_stats.json").write_text(json.dumps(stats))
    cases = [([str(no_stats)], "a HELM run folder without per_instance_stats.json"),
             ([str(bad_json)], "scenario_state.json: line"),
             ([str(no_metric), "--metric", "bleu_9"], "no per-instance stat 'bleu_9'"),
             ([str(copy("f1", NARRATIVE)), "--metric", "f1_score"], "is not 0 or 1 (give --threshold"),
             ([str(tmp_path / "nothing")], "no such file or folder"),
             ([str(MMLU), str(unknown)], f"{unknown}: cannot tell this run's metric (adapter method 'generation', "
                                         "groups my_task): give --metric NAME"),
             ([str(MMLU), "--scorer", "x"], "--scorer does not apply to helm")]
    before = snapshot(db_copy)
    for args, message in cases:
        r = CliRunner().invoke(cli, ["--db", str(db_copy), "import", "--from", "helm", *args])
        assert r.exit_code != 0, args
        errors = [ln for ln in r.output.strip().splitlines() if ln.startswith("Error")]
        assert len(errors) == 1 and message in errors[0], (message, r.output)
        assert snapshot(db_copy) == before
    # recognised (no --from), the error is as much one line (beside the progress, on stderr)
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "import", str(no_stats)])
    errors = [ln for ln in r.output.strip().splitlines() if not ln.startswith("reading ")]
    assert r.exit_code == 1 and len(errors) == 1 and errors[0].startswith("Error: "), r.output
    assert "without per_instance_stats.json" in errors[0]
