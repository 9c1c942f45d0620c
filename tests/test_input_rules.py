"""Ordinary actions that must not make later answers wrong, and inputs every door judges by one rule: results over
HTTP read as a results file is read, names checked the same way everywhere, model lists in the order people read."""
from __future__ import annotations

import duckdb
import pytest
from click.testing import CliRunner

from registry import InputError, Registry
from registry.cli import cli

AUTH = {"Authorization": "Bearer s3cret"}


def rows_of(small_data, model: str, limit: int) -> list[tuple[int, int]]:
    con = duckdb.connect()
    rows = con.execute(f"""SELECT question_id, correct::INT FROM read_csv('{small_data}/evaluations.csv.gz')
                           WHERE model = ? ORDER BY question_id LIMIT {limit}""", [model]).fetchall()
    con.close()
    return rows


def counts(db) -> tuple[int, int]:
    with Registry(db) as reg:
        s = reg.stats()
        return s.models, s.evaluations


@pytest.fixture
def client(db_copy):
    from fastapi.testclient import TestClient

    from registry.serve.app import create_app

    with TestClient(create_app(str(db_copy), token="s3cret")) as c:
        yield c


def test_http_results_follow_the_files_rule(client, db_copy, small_data):
    """`"yes"`, `"on"`, `"t"` are refused as the CLI refuses them in a file; numeric ids, as a CSV holds them, are
    taken."""
    before = counts(db_copy)
    rows = rows_of(small_data, "gpt-4o-2024-05-13", 80)
    for word in ("yes", "on", "t"):
        body = {"name": "api-model", "evaluations": [{"question_id": str(q), "correct": c} for q, c in rows[:3]]
                + [{"question_id": str(rows[3][0]), "correct": word}]}
        r = client.post("/models", json=body, headers=AUTH)
        assert r.status_code == 400, r.text
        assert r.json()["detail"] == f"evaluations[3]: correct must be 0, 1, true or false, got '{word}'"
    r = client.post("/models", json={"name": "api-model", "evaluations": [
        {"question_id": q, "correct": [True, False][i % 2] if i % 3 else c} for i, (q, c) in enumerate(rows)]},
        headers=AUTH)
    assert r.status_code == 200, r.text
    with Registry(db_copy) as reg:
        assert reg.show("api-model").evaluations == len(rows)
    assert counts(db_copy) == (before[0] + 1, before[1] + len(rows))


def test_a_422_about_many_rows_says_how_many_and_shows_a_few(client):
    r = client.post("/models", json={"name": "m", "evaluations": [{"question_id": 1.5, "correct": 1}] * 700},
                    headers=AUTH)
    assert r.status_code == 422
    body = r.json()
    assert "700 problems" in body["detail"] and body["detail"].startswith("field 'evaluations.0.question_id'")
    assert len(body["errors"]) == 5 and len(r.content) < 2000


@pytest.mark.parametrize("name, problem", [("a\nb", "control character"), ("a\x00b", "control character"),
                                           ("x" * 10_000, "at most 200"), ("a/history", "reads as a path"),
                                           ("m/similar", "reads as a path"), ("m/rename", "reads as a path"),
                                           ("m/verdicts", "reads as a path")])
def test_names_one_rule_for_the_cli_files_and_http(db_copy, tmp_path, small_data, client, name, problem):
    before = counts(db_copy)
    rows = rows_of(small_data, "gpt-4o-2024-05-13", 40)
    evals = tmp_path / "evals.csv"
    evals.write_text("question_id,correct\n" + "".join(f"{q},{c}\n" for q, c in rows))
    out = CliRunner().invoke(cli, ["--db", str(db_copy), "register", name, "--evals", str(evals)])
    assert out.exit_code != 0 and problem in out.output and len(out.output.strip().splitlines()) == 1, out.output
    models = tmp_path / "models.csv"
    models.write_text('name,family\nok-model,x\n"' + name.replace('"', '""') + '",x\n')
    with pytest.raises(InputError, match=problem) as err, Registry(db_copy) as reg:
        reg.import_files(models=str(models))
    assert err.value.line == 3
    long = tmp_path / "long.csv"
    long.write_text("model,question_id,correct\n" + "".join(f'"{name}",{q},{c}\n' for q, c in rows))
    with pytest.raises(InputError, match=problem) as err, Registry(db_copy) as reg:
        reg.import_files(evaluations=str(long))
    assert err.value.line is not None
    r = client.post("/models", json={"name": name, "evaluations": [{"question_id": q, "correct": c}
                                                                   for q, c in rows]}, headers=AUTH)
    assert r.status_code == 400 and problem in r.json()["detail"], r.text
    assert counts(db_copy) == before


def test_every_path_under_a_model_is_one_a_name_may_not_end_in():
    """The name rule and the routes read one list: a path added under /models/NAME/ (or a model's page) without it
    would make a model registered with that ending unreachable."""
    from registry.data.import_models_queries import PATH_SUFFIXES
    from registry.serve.app import create_app

    under = {route.path.split("}", 1)[1] for route in create_app(":memory:").routes
             if getattr(route, "path", "").startswith(("/models/{name", "/ui/models/{name"))
             and not route.path.endswith("}")}
    assert under and under == set(PATH_SUFFIXES), under ^ set(PATH_SUFFIXES)


@pytest.mark.parametrize("value", ["NaN", "nan", "Infinity", "-inf", float("nan"), float("inf")])
@pytest.mark.parametrize("threshold", [None, 0.5])
def test_a_score_that_is_not_a_finite_number_is_refused_in_one_line(value, threshold):
    """JSON readers and float() take NaN and Infinity: a harness score so written is no result, with or without a
    threshold (NaN >= T is false: it was stored as wrong; inf >= T as right)."""
    from registry.data.formats.samples import as_correct

    with pytest.raises(InputError) as caught:
        as_correct(value, threshold=threshold, path="run.jsonl", sample_id="s1", what="evaluation.score")
    assert "not a finite number" in str(caught.value) and "run.jsonl" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_threshold_that_is_not_finite_is_refused(tmp_path):
    r = CliRunner().invoke(cli, ["--db", str(tmp_path / "r.duckdb"), "import", "--from", "helm", "x",
                                 "--threshold", "nan"])
    assert r.exit_code == 2 and "--threshold must be a finite number" in r.output
    assert not (tmp_path / "r.duckdb").exists()


@pytest.mark.parametrize("fmt", ["eee", "helm"])
def test_json_nested_past_pythons_limit_is_one_line_and_changes_nothing(tmp_path, fmt):
    deep = "[" * 100_000 + "]" * 100_000
    if fmt == "eee":
        folder = tmp_path / "eee"
        folder.mkdir()
        (folder / "a.json").write_text('{"schema_version": "0.3.0", "x": ' + deep + "}")
    else:
        folder = tmp_path / "helm" / "run"
        folder.mkdir(parents=True)
        for name in ("run_spec", "scenario", "scenario_state", "per_instance_stats", "stats"):
            (folder / f"{name}.json").write_text(deep)
        folder = folder.parent
    db = tmp_path / "r.duckdb"
    r = CliRunner().invoke(cli, ["--db", str(db), "import", "--from", fmt, str(folder)])
    lines = [ln for ln in r.output.splitlines() if ln.startswith("Error")]
    assert r.exit_code == 1 and len(lines) == 1 and "nests its JSON deeper" in lines[0], r.output
    assert "Traceback" not in r.output and not db.exists()
