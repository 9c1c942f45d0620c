"""The example data live in the repository (and the wheel): a bare clone runs both README commands, and
`registry import --example` finds them from any folder."""
from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from registry import example_data
from registry.cli import cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_example_data_and_their_licences_are_in_the_repository():
    mmlu = ROOT / "data" / "mmlu-pro"
    assert example_data() == mmlu
    for name in ("models.csv", "questions.csv.gz", "evaluations.csv.gz", "splits.csv", "LICENSE", "README.md"):
        assert (mmlu / name).is_file(), name
    assert "Apache License" in (mmlu / "LICENSE").read_text()
    assert "TIGER-AI-Lab/MMLU-Pro" in (mmlu / "README.md").read_text()
    eee = ROOT / "data" / "eee"
    assert "MIT" in (eee / "LICENSE").read_text() and "evaleval/every_eval_ever" in (eee / "README.md").read_text()
    assert (eee / "schemas" / "eval.schema.json").is_file() and any((eee / "fixtures" / "helm").iterdir())
    assert "../shared" not in (ROOT / "bin" / "build-default").read_text()


def test_example_takes_no_paths(tmp_path):
    r = CliRunner().invoke(cli, ["--db", str(tmp_path / "r.duckdb"), "import", "--example", "some/folder"])
    assert r.exit_code == 2 and "--example imports the example dataset alone" in r.output
    assert not (tmp_path / "r.duckdb").exists()
