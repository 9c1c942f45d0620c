"""Every Eval Ever in and out: EEE's own fixture imports; a registry exported to EEE (files that validate against both
of EEE's schemas) and imported into an empty registry is the same registry (models and their metadata, queries with
their text, source, category, gold answer and split, every current evaluation); Inspect and lm-eval logs come back
from EEE as their direct import put them in; malformed EEE files are one line each and change nothing."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

from registry import Registry
from registry.cli import cli
from registry.data.formats import eee_schema, eee_write
from tests.conftest import EEE, snapshot
from tests.helpers import run

DEMO = EEE / "fixtures" / "skill_reference_conversion" / "data"

TABLES = {
    "models": "SELECT name, family, provider, params_b, cost, open_weights, tags::VARCHAR FROM models",
    "queries": "SELECT external_id, source, category, text, content_hash FROM queries",
    "answers": "SELECT q.external_id, a.answer, a.grading FROM query_answers a JOIN queries q ON q.id = a.query_id",
    "splits": "SELECT q.external_id, s.split FROM query_splits s JOIN queries q ON q.id = s.query_id",
    "evaluations": """SELECT m.name, q.external_id, arg_max(e.correct, e.batch_id) FROM evaluations e
                      JOIN models m ON m.id = e.model_id JOIN queries q ON q.id = e.query_id GROUP BY ALL""",
}


def rows(db, models=None) -> dict[str, set]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {k: set(con.execute(sql).fetchall()) for k, sql in TABLES.items()}
    finally:
        con.close()
    if models is not None:
        out["models"] = {r for r in out["models"] if r[0] in models}
        out["evaluations"] = {r for r in out["evaluations"] if r[0] in models}
    return out


def export(db, out, *args) -> dict:
    r = run(db, "export", "--to", "eee", str(out), *args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def every_line_valid(directory: Path) -> int:
    """Every aggregate and every sample line checked with jsonschema, one by one: -> the number of lines."""
    lines = 0
    for agg in directory.rglob("*.json"):
        assert eee_schema.first_error("aggregate", json.loads(agg.read_text())) is None, agg
    for samples in directory.rglob("*_samples.jsonl"):
        for line in samples.read_text().splitlines():
            lines += 1
            assert eee_schema.first_error("sample", json.loads(line)) is None, line[:200]
    return lines


@pytest.fixture(scope="module")
def exported(base_db, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("eee") / "out"
    done = export(base_db, out)
    assert done["validated"]["errors"] == 0 and done["validated"]["aggregates"] == 31
    return out


@pytest.mark.slow
def test_export_validates_and_round_trips_into_an_empty_registry(base_db, exported, tmp_path):
    files = sorted(exported.rglob("*"))
    assert len([f for f in files if f.name.endswith("_samples.jsonl")]) == 31
    # EEE's datastore layout: data/<benchmark>/<developer>/<model>/<uuid>.json beside <uuid>_samples.jsonl
    agg = next(f for f in files if f.suffix == ".json" and "Meta-Llama-3_1-70B-Instruct" in str(f))
    assert agg.relative_to(exported).parts[:4] == ("data", "locus-registry", "Meta", "Meta-Llama-3_1-70B-Instruct")
    record = json.loads(agg.read_text())
    assert record["model_info"]["id"] == "Meta-Llama-3_1-70B-Instruct"
    assert record["detailed_evaluation_results"]["checksum"] == eee_write.eee_read.digest(
        agg.with_name(agg.stem + "_samples.jsonl"))
    n = every_line_valid(exported)
    assert n == sum(len(v) for v in [rows(base_db)["evaluations"]])
    line = json.loads(agg.with_name(agg.stem + "_samples.jsonl").read_text().splitlines()[0])
    assert line["input"]["choices"] and line["input"]["reference"][0] in "ABCDEFGHIJ"
    assert line["metadata"]["registry.batch"] == "1" and "registry.batch_time" in line["metadata"]
    # into an empty registry: the same registry, row for row
    back = tmp_path / "back.duckdb"
    r = run(back, "import", str(exported))
    assert r.exit_code == 0 and f"{exported}: recognised as eee" in r.output, r.output
    a, b = rows(base_db), rows(back)
    assert {k: len(a[k] ^ b[k]) for k in TABLES} == {k: 0 for k in TABLES}
    assert len(b["evaluations"]) == len(a["evaluations"]) > 4000
    # each file read is recorded with its digest and evaluation names
    con = duckdb.connect(str(back), read_only=True)
    files = json.loads(con.execute("SELECT files FROM import_batches ORDER BY id DESC LIMIT 1").fetchall()[0][0])
    con.close()
    assert len({p["file"] for p in files["read"]}) == 31 and all(len(p["samples_sha256"]) == 64 for p in files["read"])
    # a second import adds nothing
    before = snapshot(back)
    r = run(back, "import", "--from", "eee", str(exported))
    assert r.exit_code == 0 and "0 new queries, 0 evaluations added" in r.output, r.output
    assert snapshot(back) == before


@pytest.mark.slow
def test_the_export_imported_into_the_registry_it_came_from_adds_nothing(db_copy, exported):
    before = snapshot(db_copy)
    r = run(db_copy, "import", str(exported), "--json")
    assert r.exit_code == 0, r.output
    done = json.loads(r.stdout)
    assert done["queries_added"] == 0 and done["evaluations_added"] == 0 and done["detected"] is True
    assert all(m["matched"] == m["samples"] for m in done["models"])
    assert snapshot(db_copy) == before


def test_export_of_some_models_and_one_source(base_db, tmp_path):
    out = tmp_path / "some"
    one = duckdb.connect(str(base_db), read_only=True).execute(
        "SELECT source, count(*) FROM queries GROUP BY 1 ORDER BY 2 DESC LIMIT 1").fetchall()[0]
    done = export(base_db, out, "--model", "gpt-4o-2024-05-13", "--model", "Llama-2-7b-hf", "--source", one[0])
    assert [m["model"] for m in done["models"]] == ["gpt-4o-2024-05-13", "Llama-2-7b-hf"]
    assert done["queries"] == one[1] and 0 < done["evaluations"] <= 2 * one[1]
    every_line_valid(out)
    r = CliRunner().invoke(cli, ["--db", str(base_db), "export", "--to", "eee", str(tmp_path / "x"), "--model", "nope"])
    assert r.exit_code == 1 and "unknown model 'nope'" in r.output


def test_split_text_gives_the_stored_text_back():
    from registry.locus.text_encoder import query_text

    for q, opts in [("Q?", ["a", "b"]), ("Q with (A) inside\n(A) x", ["y", "z"]), ("no options", None),
                    ("Q", ["line\nbreak", "(B) odd"])]:
        text = query_text(q, opts)
        question, choices = eee_write.split_text(text)
        assert query_text(question, choices) == text


@pytest.mark.slow
def test_the_eee_fixture_imports(tmp_path):
    db = tmp_path / "demo.duckdb"
    r = run(db, "import", str(DEMO), "--json")
    assert r.exit_code == 0, r.output
    done = json.loads(r.output[r.output.index("{"):])
    assert done["harness"] == "eee" and done["detected"] is True
    assert [m["model"] for m in done["models"]] == ["demo-org/demo-model"]
    assert done["queries_added"] == 1 and done["evaluations_added"] == 1
    got = rows(db)
    assert {q[:4] for q in got["queries"]} == {("demo-source.demo_bench/demo_0001", "demo-source.demo_bench",
                                                "arithmetic", "What is 2 + 2?")}
    assert got["answers"] == {("demo-source.demo_bench/demo_0001", "4", "number")}     # (graded as a number)
    assert got["evaluations"] == {("demo-org/demo-model", "demo-source.demo_bench/demo_0001", True)}
    con = duckdb.connect(str(db), read_only=True)
    files = json.loads(con.execute("SELECT files FROM import_batches").fetchall()[0][0])
    assert files["read"][0]["evaluation"] == "demo-source.demo_bench"
    assert files["read"][0]["samples_sha256"] == "6bbefcb149f63071c5d7abeb4c57f23f9a0e517dbc11f7ca4728c8b1c63e6cd8"
    assert con.execute("SELECT provider FROM models").fetchall() == [("demo-org",)]


# --- malformed files ----------------------------------------------------------------------------------------------

def _pair(exported: Path, tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A copy of one model's aggregate and samples file under tmp_path/name."""
    agg = sorted(exported.rglob("*.json"))[0]
    folder = tmp_path / name
    folder.mkdir()
    a, s = folder / agg.name, folder / (agg.stem + "_samples.jsonl")
    shutil.copy(agg, a)
    shutil.copy(agg.with_name(agg.stem + "_samples.jsonl"), s)
    return a, s


def _rewrite_samples(a: Path, s: Path, change) -> None:
    lines = s.read_text().splitlines()
    lines = change(lines)
    s.write_text("".join(line + "\n" for line in lines))
    record = json.loads(a.read_text())
    record["detailed_evaluation_results"]["checksum"] = eee_write.eee_read.digest(s)
    a.write_text(json.dumps(record))


def _line(lines, i, change):
    row = json.loads(lines[i])
    change(row)
    lines[i] = json.dumps(row)
    return lines


@pytest.mark.slow
def test_malformed_eee_files_are_one_line_and_change_nothing(db_copy, exported, tmp_path):
    cases = []
    a, s = _pair(exported, tmp_path, "bad_json")
    a.write_text(a.read_text()[:-20])
    cases.append((a, "not valid JSON"))
    a, s = _pair(exported, tmp_path, "bad_line")
    _rewrite_samples(a, s, lambda ls: ls[:5] + ["{not json"] + ls[5:])
    cases.append((s, "_samples.jsonl: line 6: not valid JSON"))
    a, s = _pair(exported, tmp_path, "no_score")
    _rewrite_samples(a, s, lambda ls: _line(ls, 2, lambda r: r.update(evaluation={})))
    cases.append((s, "no score (evaluation.is_correct or evaluation.score)"))
    a, s = _pair(exported, tmp_path, "version")
    a.write_text(a.read_text().replace('"schema_version": "0.3.0"', '"schema_version": "0.2.2"', 1))
    cases.append((a, "schema version '0.2.2': this registry reads Every Eval Ever 0.3.x"))
    a, s = _pair(exported, tmp_path, "orphan")
    a.unlink()
    cases.append((s, "a samples file without its aggregate"))
    a, s = _pair(exported, tmp_path, "no_samples")
    s.unlink()
    cases.append((a, "no samples file beside it"))
    a, s = _pair(exported, tmp_path, "other_model")
    _rewrite_samples(a, s, lambda ls: _line(ls, 3, lambda r: r.update(model_id="someone/else")))
    cases.append((s, "_samples.jsonl: line 4: sample"))
    a, s = _pair(exported, tmp_path, "checksum")
    s.write_text(s.read_text().replace('"is_correct":true', '"is_correct":false', 1))
    cases.append((a, "is not the aggregate's checksum"))
    a, s = _pair(exported, tmp_path, "schema")
    record = json.loads(a.read_text())
    del record["model_info"]["id"]
    a.write_text(json.dumps(record))
    cases.append((a, "not a valid Every Eval Ever aggregate: model_info: 'id' is a required property"))
    a, s = _pair(exported, tmp_path, "score")
    _rewrite_samples(a, s, lambda ls: _line(ls, 0, lambda r: r["evaluation"].update(is_correct=None, score=0.7)))
    cases.append((a, "evaluation.score 0.7 is not 0 or 1 (give --threshold"))
    before = snapshot(db_copy)
    for path, message in cases:
        r = CliRunner().invoke(cli, ["--db", str(db_copy), "import", "--from", "eee", str(path)])
        assert r.exit_code == 1, (path, r.output)
        errors = [ln for ln in r.output.strip().splitlines() if ln.startswith("Error")]
        assert len(errors) == 1 and message in errors[0], (message, r.output)
        assert path.parent.name in errors[0]
        assert snapshot(db_copy) == before
    # the non-binary score imports with a threshold (the line's is_correct gone, its score decides)
    r = run(db_copy, "import", "--from", "eee", str(tmp_path / "score"), "--threshold", "0.5", "--model", "m2",
                "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["models"][0]["evaluations_added"] > 100


# --- Inspect and lm-eval logs, through EEE ------------------------------------------------------------------------

@pytest.mark.slow
def test_inspect_and_lm_eval_logs_come_back_from_eee_as_imported(small_data, tmp_path):
    from tests import test_harness_import as h

    qs = h.questions_and_llama(small_data)
    h.ANSWERS["eee-twin"] = h.answers_of(qs, like_llama=True)
    h.ANSWERS["eee-coin"] = h.answers_of(qs, like_llama=False)
    logs = [h.inspect_log(qs, m, tmp_path / "inspect" / m) for m in ("eee-twin", "eee-coin")]
    h.lm_eval_run(qs, "eee-lm", h.answers_of(qs, like_llama=True), tmp_path / "lm")
    direct = tmp_path / "direct.duckdb"
    assert run(direct, "import", "--from", "inspect", *logs).exit_code == 0
    r = run(direct, "import", str(tmp_path / "lm" / "out"))            # recognised: lm-eval
    assert r.exit_code == 0 and "recognised as lm-eval" in r.output, r.output
    out = tmp_path / "eee"
    done = export(direct, out)
    assert sorted(m["model"] for m in done["models"]) == ["eee-lm", "replay/eee-coin", "replay/eee-twin"]
    assert every_line_valid(out) == done["evaluations"] == 3 * h.N
    back = tmp_path / "back.duckdb"
    assert run(back, "import", "--from", "eee", str(out)).exit_code == 0
    a, b = rows(direct), rows(back)
    assert {k: len(a[k] ^ b[k]) for k in TABLES} == {k: 0 for k in TABLES}
    assert len(b["evaluations"]) == 3 * h.N and len(b["models"]) == 3


def test_asked_answers_go_out_with_their_endpoint_template_time_and_reply(db_copy, tmp_path):
    from registry.asking import prompt
    from tests.http_tools import ChatUpstream

    u = ChatUpstream(lambda text: "**B**")
    try:
        with Registry(db_copy) as reg:
            asked = reg.ask("asked-model", base_url=u.url, upstream_model="m1", n=20, plan="random",
                            keep_responses=True)
        assert asked.answered == 20
    finally:
        u.close()
    out = tmp_path / "asked"
    done = export(db_copy, out, "--model", "asked-model")
    assert done["evaluations"] == 20
    lines = [json.loads(x) for x in Path(done["models"][0]["samples"]).read_text().splitlines()]
    for line in lines:
        meta = line["metadata"]
        assert (meta["registry.asked_endpoint"], meta["registry.asked_model"]) == (u.url, "m1")
        assert meta["registry.asked_template"] == prompt.TEMPLATE_VERSION and meta["registry.asked_at"][:2] == "20"
        assert meta["registry.batch"] == str(asked.batch_id)
        assert line["output"]["raw"] == ["**B**"] and line["answer_attribution"][0]["extracted_value"] == "B"
        assert line["evaluation"]["is_correct"] == (line["input"]["reference"] == ["B"])
    every_line_valid(out)
    back = tmp_path / "back.duckdb"
    assert run(back, "import", str(out)).exit_code == 0
    a, b = rows(db_copy, {"asked-model"}), rows(back)
    assert a["evaluations"] == b["evaluations"] and len(b["evaluations"]) == 20
    assert a["models"] == b["models"]


@pytest.mark.slow
def test_on_postgresql_export_and_import_give_the_same_registry(pg_server, pg_base, exported, base_db, tmp_path):
    # out of a PostgreSQL registry, back into DuckDB
    source = pg_server.create_db("eee_source", template=pg_base)
    out = tmp_path / "from_pg"
    export(source, out)
    back = tmp_path / "back.duckdb"
    assert run(back, "import", "--from", "eee", str(out)).exit_code == 0
    a, b = rows(base_db), rows(back)
    assert {k: len(a[k] ^ b[k]) for k in TABLES} == {k: 0 for k in TABLES}
    # into an empty PostgreSQL registry, and out of it again
    target = pg_server.create_db("eee_target")
    r = run(target, "import", str(exported))
    assert r.exit_code == 0, r.output
    again = tmp_path / "again"
    export(target, again)
    back2 = tmp_path / "back2.duckdb"
    assert run(back2, "import", str(again)).exit_code == 0
    b2 = rows(back2)
    assert {k: len(a[k] ^ b2[k]) for k in TABLES} == {k: 0 for k in TABLES}


@pytest.mark.slow
def test_an_export_that_did_not_finish_is_refused_on_import(exported, tmp_path):
    """The manifest is written last: a copy of an export without it (interrupted between two models), or with an
    aggregate it does not list (left by an earlier, unfinished export), is one line on import, nothing imported."""
    manifest = json.loads((exported / "registry-export.manifest").read_text())
    assert manifest["complete"] and len(manifest["models"]) == 31
    cut = tmp_path / "cut"
    shutil.copytree(exported, cut)
    (cut / "registry-export.manifest").unlink()
    stray = tmp_path / "stray"
    shutil.copytree(exported, stray)
    listed = json.loads((stray / "registry-export.manifest").read_text())
    listed["models"].pop(next(iter(listed["models"])))
    (stray / "registry-export.manifest").write_text(json.dumps(listed))
    for folder, why in ((cut, "did not finish"), (stray, "not in its export's registry-export.manifest")):
        back = tmp_path / f"{folder.name}.duckdb"
        r = run(back, "import", "--from", "eee", str(folder))
        lines = [ln for ln in r.output.splitlines() if ln.startswith("Error")]
        assert r.exit_code == 1 and len(lines) == 1 and why in lines[0], r.output
        assert not back.exists()
