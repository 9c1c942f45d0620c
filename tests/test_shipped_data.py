"""The example data are read from the shared data beside the checkout (never committed): `registry import --example`
finds them there, and a wheel built beside them carries them."""
from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from registry import example_data
from registry.cli import cli
from tests.conftest import SHARED

ROOT = Path(__file__).resolve().parents[1]


def test_the_example_data_are_the_shared_data_and_not_in_the_repository():
    assert example_data().resolve() == (ROOT.parent / "shared" / "data" / "mmlu-pro").resolve()
    for name in ("models.csv", "questions.csv.gz", "evaluations.csv.gz", "splits.csv", "LICENSE"):
        assert (SHARED / name).is_file(), name
    assert not (ROOT / "data" / "mmlu-pro").exists() and not (ROOT / "data" / "eee").exists()


def test_example_takes_no_paths(tmp_path):
    r = CliRunner().invoke(cli, ["--db", str(tmp_path / "r.duckdb"), "import", "--example", "some/folder"])
    assert r.exit_code == 2 and "--example imports the example dataset alone" in r.output
    assert not (tmp_path / "r.duckdb").exists()
