"""Import: counts, idempotence, newer results, and every bad input giving one clear line and changing nothing."""
from __future__ import annotations

import gzip
import json
import shutil

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from registry import InputError, Registry
from registry.cli import cli
from registry.data.splits import quotas

from .conftest import N_QUESTIONS, any_snapshot, snapshot


def some_query_ids(small_data, n=3) -> list[str]:
    con = duckdb.connect()
    ids = [str(r[0]) for r in con.execute(
        f"SELECT question_id FROM read_csv('{small_data}/questions.csv.gz') ORDER BY 1 LIMIT {n}").fetchall()]
    con.close()
    return ids


def test_directory_import_counts(base_db, small_data):
    with Registry(base_db) as reg:
        s = reg.stats()
        models = reg.models()
    expected = duckdb.sql(f"SELECT count(*) FROM read_csv('{small_data}/evaluations.csv.gz')").fetchall()[0][0]
    assert (s.models, s.queries, s.evaluations) == (31, N_QUESTIONS, expected)
    assert s.text_vectors == N_QUESTIONS
    assert sum(s.splits.values()) == N_QUESTIONS
    gpt = next(m for m in models if m.name == "gpt-4o-2024-05-13")
    assert gpt.params_b is None and gpt.open_weights is False and gpt.family == "gpt-4o"
    assert 0.5 < gpt.accuracy < 0.95
    assert gpt.tags == {"instruction_tuned": "true"}  # a column we do not model is kept as a tag


def test_reimport_adds_nothing_and_embeds_nothing(any_db, small_data):
    before = any_snapshot(any_db)
    with Registry(any_db) as reg:
        again = reg.import_files(directory=str(small_data))
        assert again.already_imported
        # the same rows under other file names: the row-level check finds nothing new either
        files = {"evaluations": str(small_data / "evaluations.csv.gz")}
        r = reg.import_files(**files)
        assert r.already_imported or (r.evaluations_added == 0 and r.texts_embedded == 0)
    assert any_snapshot(any_db) == before


def test_changed_result_is_a_newer_evaluation(any_db, small_data, tmp_path):
    qid = some_query_ids(small_data, 1)[0]
    with Registry(any_db) as reg:
        old = next(m for m in reg.models() if m.name == "gemma-7b")
        cur = duckdb.sql(f"""SELECT correct FROM read_csv('{small_data}/evaluations.csv.gz')
                             WHERE model = 'gemma-7b' AND question_id = {qid}""").fetchall()[0][0]
        f = tmp_path / "change.csv"
        f.write_text(f"model,question_id,correct\ngemma-7b,{qid},{1 - cur}\n")
        r = reg.import_files(evaluations=str(f))
        assert r.evaluations_added == 1 and r.affected_models == ["gemma-7b"]
        new = next(m for m in reg.models() if m.name == "gemma-7b")
        s = reg.stats()
    assert new.evaluations == old.evaluations
    assert new.accuracy == pytest.approx(old.accuracy + (1 - 2 * cur) / old.evaluations, abs=1e-4)
    assert s.evaluation_rows == s.evaluations + 1  # the old row is kept, not overwritten


def test_unknown_model_in_evaluations_is_registered(any_db, small_data, tmp_path):
    qids = some_query_ids(small_data, 2)
    f = tmp_path / "new.jsonl"
    f.write_text("".join(json.dumps({"model": "brand-new", "query_id": q, "correct": True}) + "\n" for q in qids))
    with Registry(any_db) as reg:
        r = reg.import_files(evaluations=str(f))
        assert r.models_added == 1
        assert reg.show("brand-new").evaluations == 2


def _write(tmp_path, name, content: bytes | str):
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


def bad_inputs(tmp_path, qids):
    q0, q1 = qids[0], qids[1]
    H = "model,question_id,correct\n"          # the evaluations header
    good_gz = gzip.compress(f"{H}m,{q0},1\nm,{q1},0\n".encode() * 200)
    cases = {
        "missing column": ("evaluations", _write(tmp_path, "a.csv", f"model,question_id,correctness\nm,{q0},1\n"),
                           "a.csv: line 1: missing column 'correct'"),
        "misspelled column": ("evaluations", _write(tmp_path, "b.csv", f"modle,question_id,correct\nm,{q0},1\n"),
                              "b.csv: line 1: missing column 'model'"),
        "value outside 0/1": ("evaluations", _write(tmp_path, "c.csv", f"{H}m,{q0},1\nm,{q1},2\n"),
                              "c.csv: line 3: correct must be 0, 1, true or false, got '2'"),
        "unknown query id": ("evaluations", _write(tmp_path, "d.csv", f"{H}m,{q0},1\nm,99999999,1\n"),
                             "d.csv: line 3: unknown query id '99999999'"),
        "same pair twice": ("evaluations", _write(tmp_path, "e.csv", f"{H}m,{q0},1\nx,{q1},1\nm,{q0},0\n"),
                            f"e.csv: line 4: model 'm', query '{q0}' appears twice with different results "
                            f"(lines 2 and 4)"),
        "empty file": ("evaluations", _write(tmp_path, "f.csv", ""), "f.csv: file is empty"),
        "only a header": ("evaluations", _write(tmp_path, "g.csv", H),
                          "g.csv: no rows (only a header)"),
        "truncated gzip": ("evaluations", _write(tmp_path, "h.csv.gz", good_gz[: len(good_gz) // 2]),
                           "h.csv.gz: truncated or corrupt gzip file"),
        "invalid utf-8": ("evaluations", _write(tmp_path, "i.csv", H.encode() + b"m,1,1\n\xff\xfem,2,1\n"),
                          "i.csv: line 3: invalid UTF-8"),
        "empty model name": ("evaluations", _write(tmp_path, "j.csv", f"{H}m,{q0},1\n ,{q1},1\n"),
                             "j.csv: line 3: empty model name"),
        "NaN": ("evaluations", _write(tmp_path, "k.csv", f"{H}m,{q0},NaN\n"),
                "k.csv: line 2: correct must be 0, 1, true or false, got 'NaN'"),
        "NaN parameter count": ("models", _write(tmp_path, "l.csv", "model,params_b\na,7\nb,nan\n"),
                                "l.csv: line 3: params_b must be a non-negative finite number, got 'nan'"),
        "non-existent path": ("evaluations", tmp_path / "nope.csv", "nope.csv: no such file"),
        "directory": ("evaluations", tmp_path, f"{tmp_path.name}: is a directory, not a file"),
        "bad JSONL line": ("queries", _write(tmp_path, "m.jsonl", '{"id": "z1", "text": "hi"}\nnot json\n'),
                           "m.jsonl: line 2: not valid JSON"),
    }
    splits = f"question_id,split\n{q0},train\n{q1},holdout\n"
    cases["unknown split name"] = ("splits", _write(tmp_path, "o.csv", splits),
                                   "o.csv: line 3: split must be train, val or test, got 'holdout'")
    pq.write_table(pa.table({"model": ["m", "m"], "question_id": [q0, q1], "correct": ["yes", "no"]}),
                   tmp_path / "n.parquet")
    cases["parquet wrong column type"] = ("evaluations", tmp_path / "n.parquet",
                                          "n.parquet: column 'correct' has type VARCHAR, expected BOOLEAN")
    return cases


@pytest.fixture
def cases(tmp_path, small_data):
    return bad_inputs(tmp_path, some_query_ids(small_data, 2))


CASE_NAMES = ["missing column", "misspelled column", "value outside 0/1", "unknown query id", "same pair twice",
              "empty file", "only a header", "truncated gzip", "invalid utf-8", "empty model name", "NaN",
              "NaN parameter count", "non-existent path", "directory", "bad JSONL line", "parquet wrong column type",
              "unknown split name"]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_bad_input_is_one_line_and_changes_nothing(any_db, cases, case):
    kind, path, expected = cases[case]
    before = any_snapshot(any_db)
    with Registry(any_db) as reg:
        with pytest.raises(InputError) as err:
            reg.import_files(**{kind: str(path)})
    message = str(err.value)
    assert "\n" not in message
    assert expected in message, message
    assert any_snapshot(any_db) == before


def test_bad_input_through_the_cli(any_db, cases):
    kind, path, expected = cases["value outside 0/1"]
    before = any_snapshot(any_db)
    result = CliRunner().invoke(cli, ["--db", str(any_db), "import", f"--{kind}", str(path)])
    assert result.exit_code == 1
    assert result.output.strip().startswith("Error: ") and expected in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert any_snapshot(any_db) == before


def test_bad_file_in_a_directory_import_changes_nothing(any_db, small_data, tmp_path):
    """A good questions file beside a bad evaluations file: the whole import rolls back, queries included."""
    d = tmp_path / "dir"
    d.mkdir()
    (d / "questions.csv").write_text('question_id,question,options,category\n'
                                     'newq,"What is 2+2?","[""3"",""4""]",math\n')
    (d / "evaluations.csv").write_text("model,question_id,correct\nm,newq,maybe\n")
    before = any_snapshot(any_db)
    with Registry(any_db) as reg:
        with pytest.raises(InputError, match="evaluations.csv: line 2: correct must be"):
            reg.import_files(directory=str(d))
    assert any_snapshot(any_db) == before


def test_failure_after_the_evaluations_were_copied_changes_nothing(any_db, tmp_path):
    """The splits file is checked after the evaluations are appended (COPYed, on PostgreSQL): its bad line still
    rolls back the whole import, the new query, model and evaluations included."""
    d = tmp_path / "late"
    d.mkdir()
    (d / "questions.csv").write_text('question_id,question,category\nlateq,"What is 3+4?",math\n')
    (d / "evaluations.csv").write_text("model,question_id,correct\nlate-model,lateq,1\n")
    (d / "splits.csv").write_text("question_id,split\nlateq,holdout\n")
    before = any_snapshot(any_db)
    with Registry(any_db) as reg:
        with pytest.raises(InputError, match="splits.csv: line 2: split must be train, val or test"):
            reg.import_files(directory=str(d))
    assert any_snapshot(any_db) == before


def test_cli_read_commands_json(any_db):
    runner = CliRunner()
    stats = json.loads(runner.invoke(cli, ["--db", str(any_db), "stats", "--json"]).output)
    assert stats["models"] == 31 and stats["queries"] == N_QUESTIONS and stats["evaluations"] > 4000
    models = json.loads(runner.invoke(cli, ["--db", str(any_db), "models", "--json"]).output)
    assert len(models) == 31 and {"name", "evaluations", "accuracy"} <= set(models[0])
    shown = json.loads(runner.invoke(cli, ["--db", str(any_db), "show", "gemma-7b", "--json"]).output)
    assert shown["name"] == "gemma-7b" and shown["per_category"]
    missing = runner.invoke(cli, ["--db", str(any_db), "show", "no-such-model"])
    assert missing.exit_code == 1 and "unknown model 'no-such-model'" in missing.output


def test_identical_repeated_rows_collapse_into_one(any_db, small_data, tmp_path):
    q0, q1 = some_query_ids(small_data, 2)
    f = tmp_path / "rep.csv"
    f.write_text(f"model,question_id,correct\nrep-model,{q0},1\nrep-model,{q1},0\nrep-model,{q0},1\n")
    with Registry(any_db) as reg:
        r = reg.import_files(evaluations=str(f))
        assert r.evaluations_added == 2 and r.evaluations_read == 3
        assert reg.show("rep-model").evaluations == 2


def current_versions(path) -> dict[str, tuple]:
    """Each model's newest embedding version: name -> (n_evaluations, digest, vector)."""
    con = duckdb.connect(str(path), read_only=True)
    rows = con.execute("""SELECT m.name, v.n_evaluations, v.digest, v.vector FROM embedding_versions v
                          JOIN models m ON m.id = v.model_id
                          QUALIFY row_number() OVER (PARTITION BY v.model_id ORDER BY v.version DESC) = 1""")
    out = {name: (n, d, np.array(vec)) for name, n, d, vec in rows.fetchall()}
    con.close()
    return out


@pytest.mark.slow
def test_splits_imported_later_re_embed_without_the_test_queries(base_db, unsplit_db, small_data, tmp_path):
    """Held-out queries never reach the encoder: splits that arrive after the evaluations re-embed every model they
    touch, to the very vectors a registry that had the splits from the start holds."""
    late = tmp_path / "late.duckdb"
    shutil.copy(unsplit_db, late)
    before = current_versions(late)
    with Registry(late) as reg:
        r = reg.import_files(splits=str(small_data / "splits.csv"))
    assert r.splits_set == N_QUESTIONS
    assert len(r.onboarding) == 31 and {o["outcome"] for o in r.onboarding} == {"embedded"}
    got, want = current_versions(late), current_versions(base_db)
    assert set(got) == set(want) == set(before)
    con = duckdb.connect(str(base_db), read_only=True)   # one import of everything: its versions say why
    assert con.execute("SELECT DISTINCT reason FROM embedding_versions").fetchall() == [("new evaluations",)]
    con.close()
    with Registry(late) as reg:
        assert reg.history("gemma-7b").versions[-1].reason == "test split changed"
    for name, (n, d, vec) in got.items():
        assert n < before[name][0] and (n, d) == want[name][:2], name
        assert np.abs(vec - want[name][2]).max() < 1e-5, name


def test_draw_splits_per_category_seeded_kept_and_re_embedded(unsplit_db, small_data, tmp_path):
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    shutil.copy(unsplit_db, a)
    shutil.copy(unsplit_db, b)
    res = CliRunner().invoke(cli, ["--db", str(a), "evaluate"])       # without splits there is nothing to score
    assert res.exit_code == 1 and "registry draw-splits" in res.output and res.output.count("\n") == 1, res.output
    res = CliRunner().invoke(cli, ["--db", str(a), "draw-splits", "--val", "0.1", "--test", "0.2", "--seed", "3",
                                   "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    cats = duckdb.sql(f"""SELECT coalesce(category, '') AS c, count(*) AS n
                          FROM read_csv('{small_data}/questions.csv.gz') GROUP BY 1""").fetchall()
    assert r["kept"] == 0 and sum(r["drawn"].values()) == N_QUESTIONS
    assert r["drawn"]["test"] == round(0.2 * N_QUESTIONS) and r["drawn"]["val"] == round(0.1 * N_QUESTIONS)
    assert len(r["onboarding"]) == 31 and {o["outcome"] for o in r["onboarding"]} == {"embedded"}

    con = duckdb.connect(str(a), read_only=True)
    per_cat = dict(con.execute("""SELECT coalesce(q.category, ''), count(*) FILTER (WHERE s.split = 'test')
                                  FROM queries q JOIN query_splits s ON s.query_id = q.id GROUP BY 1""").fetchall())
    non_test = dict(con.execute("""SELECT m.name, count(*) FROM evaluations e JOIN models m ON m.id = e.model_id
                                   JOIN query_splits s ON s.query_id = e.query_id WHERE s.split <> 'test'
                                   GROUP BY 1""").fetchall())
    drawn = con.execute("SELECT query_id, split FROM query_splits ORDER BY 1").fetchall()
    con.close()
    assert set(per_cat) == {c for c, _ in cats}         # each category's share, rounded one way or the other
    assert all(int(0.2 * n) <= per_cat[c] <= int(0.2 * n) + 1 for c, n in cats), (per_cat, cats)
    assert {name: v[0] for name, v in current_versions(a).items()} == non_test

    with Registry(b) as reg:                      # the same seed through the API: the same splits
        reg.draw_splits(val=0.1, test=0.2, seed=3)
    con = duckdb.connect(str(b), read_only=True)
    assert con.execute("SELECT query_id, split FROM query_splits ORDER BY 1").fetchall() == drawn
    con.close()

    before = snapshot(a)                          # a second draw finds no query without a split: changes nothing
    with Registry(a) as reg:
        again = reg.draw_splits(val=0.3, test=0.3, seed=4)
    assert again.kept == N_QUESTIONS and sum(again.drawn.values()) == 0 and again.onboarding == []
    assert snapshot(a) == before


def test_draw_splits_gives_small_categories_their_share_across_the_draw():
    rng = np.random.default_rng(0)
    sizes = np.array([4] * 12 + [3] * 5)                  # 63 queries, no category big enough alone at 0.1
    q = quotas(sizes, 0.1, rng)
    assert q.sum() == 6 and q.max() == 1 and np.all(q <= sizes)
    both = q + quotas(sizes - q, 0.1 / 0.9, rng)
    assert np.all(both <= sizes)


@pytest.mark.parametrize("args", [["--test", "1.5"], ["--val", "-0.1"], ["--val", "0"],
                                  ["--val", "0.5", "--test", "0.5"]])
def test_draw_splits_bad_share_is_one_line_and_changes_nothing(unsplit_db, tmp_path, args):
    db = tmp_path / "r.duckdb"
    shutil.copy(unsplit_db, db)
    before = snapshot(db)
    res = CliRunner().invoke(cli, ["--db", str(db), "draw-splits", *args])
    assert res.exit_code == 1 and res.output.startswith("Error: ") and res.output.count("\n") == 1, res.output
    assert "share" in res.output
    assert snapshot(db) == before


def _evaluation_rows(path) -> list[tuple]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute("""SELECT m.name, q.external_id, e.correct, e.batch_id FROM evaluations e
                              JOIN models m ON m.id = e.model_id JOIN queries q ON q.id = e.query_id
                              ORDER BY ALL""").fetchall()
    finally:
        con.close()


@pytest.mark.parametrize("form", ["parquet bool", "parquet int", "csv"])
def test_bulk_path_appends_exactly_what_the_careful_path_does(db_copy, small_data, tmp_path, monkeypatch, form):
    """The bulk path (one INSERT ... SELECT from the file) against the careful one (stage, check, insert): the same
    rows, models, counts and jobs, for a file with new models, a changed result of a known model, a result it
    already has, and an identical repeat."""
    from registry.data import import_evaluations

    q = some_query_ids(small_data, 3)
    have = duckdb.sql(f"""SELECT correct FROM read_csv('{small_data}/evaluations.csv.gz')
                          WHERE model = 'gemma-7b' AND question_id = {q[0]}""").fetchall()[0][0]
    rows = [("bulk-a", q[0], 1), ("bulk-a", q[1], 0), ("bulk-b", q[2], 1), ("bulk-a", q[0], 1),
            ("gemma-7b", q[0], 1 - have), ("gemma-7b", q[1], None)]
    known = duckdb.sql(f"""SELECT correct FROM read_csv('{small_data}/evaluations.csv.gz')
                           WHERE model = 'gemma-7b' AND question_id = {q[1]}""").fetchall()[0][0]
    rows[-1] = ("gemma-7b", q[1], known)                               # unchanged: not appended again
    if form == "csv":
        f = tmp_path / "e.csv"
        f.write_text("model,question_id,correct\n" + "".join(f"{m}, {x} ,{c}\n" for m, x, c in rows))
    else:
        f = tmp_path / "e.parquet"
        correct = pa.array([bool(c) for *_, c in rows]) if form == "parquet bool" else pa.array(
            [c for *_, c in rows], pa.int8())
        pq.write_table(pa.table({"model": [m for m, *_ in rows], "question_id": [x for _, x, _ in rows],
                                 "correct": correct}), f)
    careful = tmp_path / "careful.duckdb"
    shutil.copy(db_copy, careful)
    taken = []
    original = import_evaluations.append_evaluations
    monkeypatch.setattr(import_evaluations, "append_evaluations",
                        lambda *a, **k: taken.append(original(*a, **k)) or taken[-1])
    with Registry(db_copy) as reg:
        bulk = reg.import_files(evaluations=str(f), onboard=False)
    monkeypatch.setattr(import_evaluations, "append_evaluations", lambda *a, **k: False)
    with Registry(careful) as reg:
        slow = reg.import_files(evaluations=str(f), onboard=False)
    assert taken == [True]
    assert (bulk.evaluations_read, bulk.evaluations_added, bulk.models_added, bulk.affected_models) == \
        (slow.evaluations_read, slow.evaluations_added, slow.models_added, slow.affected_models) == \
        (6, 4, 2, ["bulk-a", "bulk-b", "gemma-7b"])
    assert _evaluation_rows(db_copy) == _evaluation_rows(careful)
    jobs = "SELECT m.name, j.reason FROM onboarding_jobs j JOIN models m ON m.id = j.model_id ORDER BY ALL"
    assert duckdb.connect(str(db_copy), read_only=True).sql(jobs).fetchall() == \
        duckdb.connect(str(careful), read_only=True).sql(jobs).fetchall()
