"""CSV input, each failure one line: header fields past the csv module's limit (import, register and HTTP),
mixed line endings named with the fix, a failed import into a new path leaves no file."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import one_line_error, run

from .conftest import start_server

ROOT = Path(__file__).resolve().parents[1]



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
