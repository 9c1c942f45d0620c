"""Registration: a name never changes its model silently, counts say what they count, hints name what register
takes, and bad or self-contradicting results files are one line naming file and line (CLI and HTTP alike)."""
from __future__ import annotations

import json

import pytest

from registry import Registry
from registry.core.errors import InputError
from tests.helpers import results_of, run, run_json, write_rows

from .conftest import snapshot

Q = "What is the derivative of x^2 with respect to x?"


def known_text(db) -> str:
    """A query text the registry already holds: routed from its stored vector, without MiniLM."""
    with Registry(db) as reg, reg.store.tx() as tx:
        return tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]


def test_register_existing_name_needs_update(db_copy, small_data, tmp_path):
    mine = results_of(small_data, "Yi-6B")
    f = write_rows(tmp_path / "yi.csv", mine)
    before = snapshot(db_copy)
    out = run(db_copy, "register", "gpt-4o-2024-05-13", "--evals", str(f), "--family", "yi", "--params-b", "6")
    assert out.exit_code == 1 and "already registered with family='gpt-4o'" in out.output and "--update" in out.output
    assert snapshot(db_copy) == before
    out = run(db_copy, "register", "gpt-4o-2024-05-13", "--evals", str(f))     # results that differ: refused too
    assert out.exit_code == 1 and "differ from the ones" in out.output and "--update" in out.output
    assert snapshot(db_copy) == before
    out = run(db_copy, "register", "gpt-4o-2024-05-13", "--evals", str(f), "--family", "yi", "--update", "--json")
    assert out.exit_code == 0, out.output
    r = json.loads(out.stdout)
    assert r["updated"] == {"family": ["gpt-4o", "yi"]} and r["results_changed"] > 0
    # adding results to a model that lacks them needs no --update
    with Registry(db_copy) as reg:
        reg.register("fresh-model", str(write_rows(tmp_path / "a.csv", mine[:60])))
        r = reg.register("fresh-model", str(write_rows(tmp_path / "b.csv", mine[60:])))
        assert r.evaluations_added == len(mine) - 60 and r.updated == {} and r.results_changed == 0


def test_register_and_history_name_what_the_counts_are(db_copy, small_data, tmp_path):
    rows = results_of(small_data, "Yi-6B")
    out = run(db_copy, "register", "yi-again", "--evals", str(write_rows(tmp_path / "y.csv", rows)))
    assert out.exit_code == 0, out.output
    with Registry(db_copy) as reg:
        r = reg.history("yi-again").versions[-1]
        held = reg.register("yi-again", str(tmp_path / "y.csv")).held_out
    assert f"{r.n_evaluations} used for the embedding, {held} held out as test" in out.output
    assert r.n_evaluations + held == len(rows) and held > 0
    assert "used for embedding" in run(db_copy, "history", "yi-again").output


def test_register_unknown_query_hint_names_what_register_takes(db_copy, tmp_path):
    f = write_rows(tmp_path / "u.csv", [("no-such-question", 1)])
    out = run(db_copy, "register", "m", "--evals", str(f))
    assert out.exit_code == 1 and "unknown query id 'no-such-question'" in out.output
    assert "`question` column" in out.output and "registry import --queries" in out.output


def test_a_broken_jsonl_file_is_one_line_naming_its_line_everywhere(db_copy, tmp_path):
    f = tmp_path / "broken.jsonl"
    f.write_text('{"question_id": "70", "correct": 1}\n{"question_id": "71", "correct": 0\n')
    before = snapshot(db_copy)
    for args in (["register", "m", "--evals", str(f)], ["import", "--evaluations", str(f)],
                 ["similar", "--evals", str(f)]):
        out = run(db_copy, *args)
        assert out.exit_code == 1, out.output
        assert "Traceback" not in out.output and len(out.output.strip().splitlines()) == 1, out.output
        assert "broken.jsonl: line 2: not valid JSON" in out.output, out.output
    assert snapshot(db_copy) == before
    spaced = tmp_path / "spaced.jsonl"                     # blank lines hold no record: the line is still the file's
    spaced.write_text('{"question_id": "70", "correct": 1}\n\n\n{"question_id": "71", "correct": 2}\n')
    out = run(db_copy, "register", "m", "--evals", str(spaced))
    assert out.exit_code == 1 and "spaced.jsonl: line 4: " in out.output, out.output
    spaced.write_text('{"question_id": "70", "correct": 1}\n\n{"question_id": "71", "correct": 0\n')
    out = run(db_copy, "register", "m", "--evals", str(spaced))
    assert out.exit_code == 1 and "spaced.jsonl: line 3: not valid JSON" in out.output, out.output
    assert snapshot(db_copy) == before


def test_a_file_that_contradicts_itself_is_refused_even_where_one_side_matches(db_copy, small_data, tmp_path):
    model = "gpt-4o-2024-05-13"
    qid, stored = results_of(small_data, model)[0]
    f = write_rows(tmp_path / "c.csv", [(model, qid, stored), (model, qid, 1 - stored)],
                   header="model,question_id,correct")
    before = snapshot(db_copy)
    out = run(db_copy, "import", "--evaluations", str(f))
    assert out.exit_code == 1 and "appears twice with different results (lines 2 and 3)" in out.output, out.output
    g = write_rows(tmp_path / "g.csv", [(qid, 1 - stored), (qid, stored)])
    out = run(db_copy, "register", model, "--evals", str(g), "--update")
    assert out.exit_code == 1 and "appears twice with different results" in out.output, out.output
    assert snapshot(db_copy) == before


def test_a_new_tag_on_a_registered_model_is_a_change_like_any_other(db_copy, small_data, tmp_path):
    model = "gpt-4o-2024-05-13"
    f = write_rows(tmp_path / "same.csv", results_of(small_data, model)[:40])     # results it already has
    out = run(db_copy, "register", model, "--evals", str(f), "--tag", "team=eval")
    assert out.exit_code == 1 and "tags.team=None" in out.output and "--update" in out.output, out.output
    out = run(db_copy, "register", model, "--evals", str(f), "--tag", "team=eval", "--update", "--json")
    assert out.exit_code == 0 and json.loads(out.stdout)["updated"] == {"tags.team": [None, "eval"]}, out.output
    with Registry(db_copy) as reg:
        assert reg.show(model).tags["team"] == "eval"


def test_a_server_registration_contradicting_itself_names_its_lines(db_copy, small_data, tmp_path):
    """POST /models' rows (registration.stage_group, the writer's path) refuse differing repeats the way a file does,
    naming the lines, for a model with results and for a new one (it said "no such file" before)."""
    from registry.answers import registration

    model = "gpt-4o-2024-05-13"
    qid, stored = results_of(small_data, model)[0]
    f = tmp_path / "rows.jsonl"
    f.write_text(json.dumps({"question_id": qid, "correct": 1 - stored}) + "\n"
                 + json.dumps({"question_id": qid, "correct": stored}) + "\n")
    assert registration.plain_rows(f) is not None                      # the in-memory path, not the file one
    before = snapshot(db_copy)
    for name in (model, "brand-new"):
        with pytest.raises(InputError, match=r"rows\.jsonl: line 2: .*appears twice with different results "
                                             r"\(lines 1 and 2\)"):
            with Registry(db_copy) as reg, reg.store.tx() as tx:
                registration.stage_group(tx, [(name, str(f), {}, True)])
    assert snapshot(db_copy) == before


@pytest.mark.slow
def test_an_unchanged_re_register_gives_its_versions_stability_in_text_and_json(db_copy, small_data, tmp_path):
    f = write_rows(tmp_path / "yi.csv", results_of(small_data, "Yi-6B"))
    first = run(db_copy, "register", "yi-copy", "--evals", str(f), "--json")
    assert first.exit_code == 0, first.output
    embedded = json.loads(first.stdout)
    assert embedded["outcome"] == "embedded" and embedded["stability"] is not None
    again = run(db_copy, "register", "yi-copy", "--evals", str(f), "--json")
    assert again.exit_code == 0, again.output
    unchanged = json.loads(again.stdout)
    assert (unchanged["outcome"], unchanged["version"]) == ("unchanged", embedded["version"])
    assert unchanged["stability"] == embedded["stability"]                     # not null: the same figure
    text = run(db_copy, "register", "yi-copy", "--evals", str(f))
    assert f"(unchanged, stability {embedded['stability']:.3f} (spread over random halves))" in text.output
    history = run_json(db_copy, "history", "yi-copy")
    assert history["versions"][-1]["stability"] == round(embedded["stability"], 4)
