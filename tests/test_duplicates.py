"""A model registered twice under two names: the registry records the alias (its answers' verdict or its user's
word), the fingerprint calibrates on the pairs it believes distinct, so one duplicate blinds neither the fingerprint
nor the duplicate warning; and `similar` ranks by the shared answers where there are any."""
from __future__ import annotations

import duckdb
import pytest

from registry import Registry
from registry.core.errors import NotFound
from tests.helpers import run


def non_test_results(small_data, model: str) -> list[tuple[str, int]]:
    con = duckdb.connect()
    rows = con.execute(f"""SELECT e.question_id::VARCHAR, e.correct::INT
                           FROM read_csv('{small_data}/evaluations.csv.gz') e
                           JOIN read_csv('{small_data}/splits.csv') s ON s.question_id = e.question_id
                           WHERE e.model = ? AND s.split <> 'test' ORDER BY e.question_id""", [model]).fetchall()
    con.close()
    return rows


def write_rows(path, rows):
    path.write_text("question_id,correct\n" + "".join(f"{q},{c}\n" for q, c in rows))
    return str(path)


@pytest.mark.slow
def test_a_duplicate_is_recorded_as_an_alias_and_blinds_neither_fingerprint_nor_warning(db_copy, small_data,
                                                                                          tmp_path):
    with Registry(db_copy) as reg:
        clean = reg.calibration().answers
        assert clean.p_min and clean.p_min > 0
        twin = non_test_results(small_data, "Yi-34B")
        assert len(twin) >= 100            # enough to calibrate with: the pair (twin, Yi-34B) counts
        r = reg.register("my-new-model", write_rows(tmp_path / "twin.csv", twin))
        assert "answers like Yi-34B" in r.warning and r.alias_of == "Yi-34B"
        # the closest distinct pair is still the clean registry's, not the duplicate at 0% disagreement
        after = reg.calibration().answers
        assert (after.p_min, after.closest_pair) == (clean.p_min, clean.closest_pair)
        assert reg.calibration().answer_thresholds == clean.thresholds()
        # a later duplicate is still told so
        later = reg.register("api-model", write_rows(tmp_path / "qwen.csv",
                                                     non_test_results(small_data, "Qwen1.5-72B-Chat")))
        assert later.warning and "answers like Qwen1.5-72B-Chat" in later.warning
        # and a rerun of a registered model is named "same"
        f = reg.fingerprint(write_rows(tmp_path / "mistral.csv",
                                       non_test_results(small_data, "Mistral-7B-Instruct-v0.2")))
        assert f.verdict == "same" and f.match == "Mistral-7B-Instruct-v0.2"
        # shown where the model is
        d = reg.show("my-new-model")
        assert (d.alias_of, d.alias_source) == ("Yi-34B", "registration")
        assert reg.show("Yi-34B").aliases == ["my-new-model"]
        assert {m.name: m.alias_of for m in reg.models()}["my-new-model"] == "Yi-34B"
        near = reg.similar("my-new-model", k=3)
        assert near[0].model == "Yi-34B" and near[0].alias and not any(x.alias for x in near[1:])
    assert "alias of: Yi-34B" in run(db_copy, "show", "my-new-model").output
    assert "aliases: my-new-model" in run(db_copy, "show", "Yi-34B").output
    listing = run(db_copy, "models").output
    assert "alias of" in listing.splitlines()[0]
    assert "(alias)" in run(db_copy, "similar", "my-new-model", "-k", "2").output


def test_a_duplicate_registered_before_any_alias_was_recorded_does_not_set_the_bar(db_copy, small_data, tmp_path):
    """A duplicate brought in by `import` (no verdict, no alias row) is still no distinct pair: its pair reads
    "same" against the pairs of the other models."""
    with Registry(db_copy) as reg:
        clean = reg.calibration().answers
        path = tmp_path / "dup.csv"
        path.write_text("model,question_id,correct\n" + "".join(
            f"imported-twin,{q},{c}\n" for q, c in non_test_results(small_data, "Yi-34B")))
        reg.import_files(evaluations=str(path))
        assert reg.show("imported-twin").alias_of is None
        after = reg.calibration().answers
        assert (after.p_min, after.closest_pair) == (clean.p_min, clean.closest_pair)


def test_the_users_word_records_an_alias_and_a_wrong_one_changes_nothing(db_copy, small_data, tmp_path):
    rows = non_test_results(small_data, "Meta-Llama-3_1-8B-Instruct")
    quantized = [(q, 1 - c if i % 8 == 0 else c) for i, (q, c) in enumerate(rows)]   # disagrees on 1 in 8
    path = write_rows(tmp_path / "q.csv", quantized)
    out = run(db_copy, "register", "llama-q4", "--evals", path, "--alias-of", "no-such-model")
    assert out.exit_code == 1 and "no-such-model" in out.output
    with Registry(db_copy) as reg:
        with pytest.raises(NotFound):
            reg.show("llama-q4")
    out = run(db_copy, "register", "llama-q4", "--evals", path, "--alias-of", "Meta-Llama-3_1-8B-Instruct")
    assert out.exit_code == 0 and "alias of: Meta-Llama-3_1-8B-Instruct" in out.output
    with Registry(db_copy) as reg:
        d = reg.show("llama-q4")
        assert (d.alias_of, d.alias_source) == ("Meta-Llama-3_1-8B-Instruct", "user")
        assert "llama-q4" not in reg.calibration().answers.closest_pair
    from fastapi.testclient import TestClient

    from registry.serve.app import create_app

    with TestClient(create_app(str(db_copy))) as c:           # the web pages say it both ways
        alias_page = c.get("/ui/models/llama-q4").text
        assert 'id="alias-of"' in alias_page and "as its owner said" in alias_page
        target_page = c.get("/ui/models/Meta-Llama-3_1-8B-Instruct").text
        assert 'id="aliases"' in target_page and 'also registered as <a href="/ui/models/llama-q4"' in target_page


def test_similar_ranks_an_exact_copy_first_by_its_shared_answers(db_copy, small_data, tmp_path):
    rows = non_test_results(small_data, "Meta-Llama-3_1-70B-Instruct")[:40]    # a few: its embedding is unsure
    with Registry(db_copy) as reg:
        # a file's results, then the model registered from them: the same ranking, by the same evidence
        by_file = reg.similar(evals=write_rows(tmp_path / "f.csv", rows), k=5)
        assert by_file[0].model == "Meta-Llama-3_1-70B-Instruct" and by_file[0].placed_by in ("answers", "both")
        reg.register("copy-70b", write_rows(tmp_path / "c.csv", rows))
        near = reg.similar("copy-70b", k=5)
        assert near[0].model == "Meta-Llama-3_1-70B-Instruct" and near[0].disagreement == 0
        assert near[0].placed_by in ("answers", "both")
        assert [x.combined for x in near] == sorted(x.combined for x in near)
    out = run(db_copy, "similar", "copy-70b", "-k", "3")
    assert out.exit_code == 0 and "placed by" in out.output.splitlines()[0]
