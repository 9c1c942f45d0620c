"""Migrations from the command line: an unknown revision is one line, a downgrade that deletes rows needs --yes
and says what it deletes, one that deletes none does not, `db current` on a missing path creates nothing."""
from __future__ import annotations

from pathlib import Path

import duckdb

from tests.helpers import one_line_error, run

from .conftest import any_snapshot

ROOT = Path(__file__).resolve().parents[1]



LONG_NAME = "x" * 140_000        # over the csv module's field limit of 131,072 characters



def test_an_unknown_revision_is_one_line(db_copy):
    for step in ("downgrade", "upgrade"):
        text = one_line_error(run(db_copy, "db", step, "nonexistent"))
        assert "nonexistent" in text and str(db_copy) in text


def test_a_downgrade_that_deletes_rows_needs_yes_and_says_what_it_deletes(any_db):
    before = any_snapshot(any_db)
    text = one_line_error(run(any_db, "db", "downgrade", "base"))
    assert "--yes" in text and "nothing was changed" in text
    assert f"evaluations {before['evaluations'][0]:,}" in text and "models" in text
    assert any_snapshot(any_db) == before
    assert run(any_db, "stats").exit_code == 0

    res = run(any_db, "db", "downgrade", "base", "--yes")
    assert res.exit_code == 0, res.output
    assert "deleted" in res.output and "evaluations" in res.output and "base" in res.output
    assert set(any_snapshot(any_db)) <= {"alembic_version"}

    # a command that only reads says the schema is missing, and does not create an empty one
    for args in (["stats"], ["models"]):
        text = one_line_error(run(any_db, *args))
        assert "no registry schema" in text and "db upgrade" in text
    assert set(any_snapshot(any_db)) <= {"alembic_version"}
    res = run(any_db, "db", "upgrade")                 # which is how one gets it back
    assert res.exit_code == 0, res.output
    assert run(any_db, "stats").exit_code == 0


def test_a_relative_downgrade_that_deletes_no_rows_needs_no_yes(db_copy):

    with duckdb.connect(str(db_copy)) as con:          # so that the newest migration's additions are empty here
        con.execute("DELETE FROM query_answers")
    res = run(db_copy, "db", "downgrade", "-1")
    assert res.exit_code == 0, res.output
    assert "deleted" not in res.output
    res = run(db_copy, "db", "current", "--json")
    assert res.exit_code == 0 and '"current": null' not in res.output, res.output


def test_db_current_on_a_missing_path_creates_nothing(tmp_path):
    missing = tmp_path / "typo.duckdb"
    text = one_line_error(run(missing, "db", "current"))
    assert "no such registry" in text
    one_line_error(run(missing, "db", "downgrade", "base"))
    assert not missing.exists()
