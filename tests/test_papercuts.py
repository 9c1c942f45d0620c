"""What a new user hit, each fixed with a test that fails on the code before: a name typed without its dashes gets a
suggestion; a one-model results file given to `import` points to `register --evals`; a spreadsheet is named as one;
a file of many unknown query ids says how many; the pages' icon is served."""
from __future__ import annotations

from click.testing import CliRunner

from registry.cli import cli
from tests.conftest import snapshot


def error_of(db, *args) -> str:
    r = CliRunner().invoke(cli, ["--db", str(db), *args])
    lines = [ln for ln in r.output.strip().splitlines() if ln.startswith("Error")]
    assert r.exit_code == 1 and len(lines) == 1, r.output
    return lines[0]


def test_a_name_typed_without_its_dashes_is_suggested(db_copy):
    assert "did you mean 'gpt-4o-2024-05-13'" in error_of(db_copy, "show", "gpt4o")


def test_one_models_results_given_to_import_point_to_register(db_copy, tmp_path):
    f = tmp_path / "my-results.csv"
    f.write_text("question_id,correct\n70,1\n")
    for args in (["import", str(f)], ["import", str(f), "--from", "csv"]):
        assert "registry register NAME --evals FILE" in error_of(db_copy, *args)


def test_a_spreadsheet_is_named_as_one_and_changes_nothing(db_copy, tmp_path):
    f = tmp_path / "results.xlsx"
    f.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 4)      # (a zip's signature, as every .xlsx starts)
    before = snapshot(db_copy)
    assert "a spreadsheet workbook" in error_of(db_copy, "register", "newbie", "--evals", str(f))
    assert snapshot(db_copy) == before


def test_many_unknown_ids_are_counted_from_the_first_line(db_copy, tmp_path):
    f = tmp_path / "unknown.csv"
    f.write_text("question_id,correct\n" + "".join(f"{900000 + i},1\n" for i in range(150)))
    line = error_of(db_copy, "register", "newbie", "--evals", str(f))
    assert "line 2: unknown query id '900000'; 149 more rows name unknown ids" in line, line


def test_the_pages_icon_is_served(db_copy):
    from fastapi.testclient import TestClient

    from registry.serve.app import create_app

    with TestClient(create_app(str(db_copy))) as client:
        r = client.get("/favicon.ico")
        assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
        assert '<link rel="icon" href="/static/web/favicon.svg"' in client.get("/").text
        assert client.get("/static/web/favicon.svg").status_code == 200


def test_an_unset_key_variable_is_said_in_plain_words():
    import pytest

    from registry.core.keys import OWNER, KeyRefused

    with pytest.raises(KeyRefused) as caught:
        OWNER.header("REGISTRY_TEST_UNSET_KEY_42", "https://api.example/v1")
    assert "in this command's environment" in str(caught.value) and "this's" not in str(caught.value)


def test_endpoints_lists_the_claimed_model_and_its_marks(db_copy):
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "endpoints", "add", "gpt-4o-2024-05-13", "--base-url",
                                 "http://127.0.0.1:9/v1", "--name", "gpt-4o-2024-05-13@p", "--reference"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "endpoints"])
    header, _, row = r.stdout.splitlines()[:3]
    assert header.split()[:2] == ["model", "claims"] and "reference" in header and "watched" in header
    assert row.split()[:2] == ["gpt-4o-2024-05-13@p", "gpt-4o-2024-05-13"] and "yes" in row.split()
