"""Every failure one line, on the CLI and data side: CSV headers past the csv module's field limit, mixed line
endings, a failed import into a new path (no file left), damaged database files, read-only files, unknown
revisions, and downgrades that delete rows (only with --yes; a file without a schema is not re-created by reads)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from registry.cli import cli

from .conftest import any_snapshot, start_server

ROOT = Path(__file__).resolve().parents[1]


def run(db, *args):
    return CliRunner().invoke(cli, ["--db", str(db), *map(str, args)], catch_exceptions=False)


def one_line_error(res) -> str:
    """The output of a failed command, checked to be one `Error:` line."""
    assert res.exit_code == 1, res.output
    text = res.output.strip()
    assert "\n" not in text and text.startswith("Error: "), text
    return text


def first_model(db) -> str:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT name FROM models ORDER BY name LIMIT 1").fetchall()[0][0]
    finally:
        con.close()


# --- CSV input ---------------------------------------------------------------------------------------------------

LONG_NAME = "x" * 140_000        # over the csv module's field limit of 131,072 characters


def test_a_header_field_past_the_csv_field_limit_is_one_line_for_import_and_register(tmp_path, db_copy):
    models = tmp_path / "models.csv"
    models.write_text(f"model,{LONG_NAME}\nm1,\n")
    new = tmp_path / "new.duckdb"
    text = one_line_error(run(new, "import", "--models", models))
    assert str(models) in text and "131,072" in text
    assert not new.exists()                       # and the failed import left no file behind

    evals = tmp_path / "evals.csv"
    evals.write_text(f"question_id,correct,{LONG_NAME}\nq1,1,\n")
    text = one_line_error(run(db_copy, "register", "newcomer", "--evals", evals))
    assert str(evals) in text and "131,072" in text and "line 1" in text


@pytest.mark.parametrize("content, line, ending", [(b"model,family\r\nm1,f\nm2,g\r\n", 2, "LF"),
                                                   (b"model,family\nm1,f\nm2,g\r\nm3,h\n", 3, "CRLF")])
def test_mixed_line_endings_name_the_file_the_line_and_the_fix(tmp_path, content, line, ending):
    models = tmp_path / "models.csv"
    models.write_bytes(content)
    new = tmp_path / "new.duckdb"
    text = one_line_error(run(new, "import", "--models", models))
    assert f"{models}: line {line}: line ends with {ending}" in text
    assert "mixed line endings" in text and "dos2unix" in text
    assert not new.exists()


def test_a_failed_import_into_a_new_path_leaves_no_file_but_a_good_one_keeps_it(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "models.csv").write_text("family\nf\n")                      # no model column
    new = tmp_path / "new.duckdb"
    text = one_line_error(run(new, "import", bad))
    assert "missing column" in text
    assert not new.exists() and not Path(f"{new}.wal").exists()

    good = tmp_path / "good"
    good.mkdir()
    (good / "models.csv").write_text("model,family\nm1,f\n")
    assert run(new, "import", good).exit_code == 0
    assert new.exists()
    one_line_error(run(new, "import", bad))                              # a file that existed is kept
    assert run(new, "models", "--json").exit_code == 0


# --- damaged and read-only database files ------------------------------------------------------------------------

def damaged(base_db, tmp_path, how: str) -> Path:
    path = tmp_path / f"{how}.duckdb"
    shutil.copy(base_db, path)
    if how == "noise":
        with open(path, "r+b") as fh:
            fh.seek(300_000)
            fh.write(os.urandom(16 * 1024))
    else:
        os.truncate(path, {"cut1m": 1_000_000, "cut8m": 8_000_000}[how])
    return path


@pytest.mark.parametrize("how", ["cut1m", "cut8m", "noise"])
def test_a_damaged_database_file_is_one_line_naming_it(base_db, tmp_path, how):
    assert base_db.stat().st_size > 8_000_000         # (the truncations cut into the file's data)
    model = first_model(base_db)
    path = damaged(base_db, tmp_path, how)
    failed = 0
    for args in (["stats"], ["models"], ["similar", model], ["show", model]):
        res = run(path, *args)
        if res.exit_code == 0:                         # a command may read only blocks that are intact
            continue
        text = one_line_error(res)
        assert str(path) in text and "database file is damaged" in text, (args, text)
        failed += 1
    assert failed                                     # stats reads every table: it meets the damage


def as_unprivileged(cmd: list[str]) -> list[str]:
    """The command run without the power to override file modes: root (as these tests run in CI) keeps its uid,
    since the interpreter may live under /root, but drops every capability (setpriv)."""
    if os.geteuid() != 0:
        return cmd
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a file mode cannot stop this process from writing")
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all", *cmd]


@pytest.mark.parametrize("where", ["file", "folder"])
def test_read_commands_read_a_file_they_may_not_write(base_db, tmp_path, where):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "registry.duckdb"
    shutil.copy(base_db, path)
    path.chmod(0o444)
    if where == "folder":                             # as on a read-only mount: no write-ahead log can be made
        folder.chmod(0o555)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    model = first_model(base_db)
    try:
        for args in (["stats"], ["models"], ["show", model]):
            out = subprocess.run(as_unprivileged([sys.executable, "-m", "registry", "--db", str(path), *args]),
                                 capture_output=True, text=True, env=env, timeout=120)
            assert out.returncode == 0, (args, out.stderr)
        out = subprocess.run(as_unprivileged([sys.executable, "-m", "registry", "--db", str(path),
                                              "mark-unavailable", model]),
                             capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 1 and out.stderr.strip().count("\n") == 0, out.stderr
        assert "read-only" in out.stderr and str(path) in out.stderr
    finally:
        folder.chmod(0o755)


# --- migrations --------------------------------------------------------------------------------------------------

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
    import duckdb

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


@pytest.mark.slow
def test_over_http_a_header_past_the_field_limit_is_a_400(db_copy):
    import httpx

    proc, origin = start_server(db_copy, token="t")
    try:
        body = f"question_id,correct,{LONG_NAME}\nq1,1,\n".encode()
        r = httpx.post(f"{origin}/models/newcomer/evaluations", content=body, timeout=60,
                       headers={"Authorization": "Bearer t", "Content-Type": "text/csv"})
        assert r.status_code == 400, r.text
        assert "131,072" in r.json()["detail"] and "\n" not in r.json()["detail"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
