"""The baselines choose among the models that could answer, and the probation minimum follows the registry's data:
a partly evaluated model must not drag `evaluate`'s methods down, and a registry built from a small benchmark must
route without flags. Real registry copies (the suite's 160-question slice), the CLI through click."""
from __future__ import annotations

import numpy as np
import pytest

from registry import Registry, RouteOptions
from registry.locus import baselines as B
from registry.locus import evidence
from tests.helpers import run


def train_queries(reg) -> list[str]:
    with reg.store.tx() as tx:
        return [q for (q,) in tx.sql("""SELECT q.external_id FROM queries q JOIN query_splits s ON s.query_id = q.id
                                        WHERE s.split = 'train' ORDER BY q.id""")]


def write_results(path, rows):
    path.write_text("question_id,correct\n" + "".join(f"{q},{c}\n" for q, c in rows))
    return str(path)


# --- a model with results for part of the queries --------------------------------------------------------------
def test_a_choice_falls_among_the_models_with_a_result():
    scores = np.array([[0.9, 0.9, 0.9], [0.5, 0.1, 0.2], [0.4, 0.3, 0.1]])
    correct = np.array([[-1, 1, -1], [1, 0, -1], [0, 1, -1]], dtype=np.int8)
    masked = B.among_answered(scores, correct)
    assert B.topk_models(masked, 1)[0].tolist() == [1, 0, 0]    # the last query: nobody has one, scores kept
    assert B.hit_at_k(masked, correct, 1) == 2 / 3 and B.hit_at_k(scores, correct, 1) == 1 / 3


@pytest.mark.slow
def test_a_partly_evaluated_model_does_not_drag_the_baselines(db_copy, tmp_path):
    """A model right on every train query it answered, and without a test result: each method would choose it on
    the test split, where it cannot be scored. Chosen among the models that could answer, the baselines that fit
    nothing (best single on train, per category, KNN: their settings are chosen on val, where it has no result)
    give exactly the figures they gave without it, and every test query is scored."""
    with Registry(db_copy) as reg:
        before = reg.evaluate("test")
        reg.register("partial-strong", write_results(tmp_path / "p.csv", [(q, 1) for q in train_queries(reg)]))
        after = reg.evaluate("test")
    assert after.methods["best_single"]["model"] == "partial-strong"     # what best single routes to where it can
    for m in ("best_single", "per_category", "knn"):
        for k in ("hit@1", "hit@3", "hit@5"):
            assert after.methods[m][k] == before.methods[m][k], (m, k)
    for m, v in after.methods.items():
        if "scored" in v:
            assert v["scored"] == after.queries, m
    for cat, v in after.per_category.items():
        assert v["per_category"] == before.per_category[cat]["per_category"], cat
    assert any("among the models with a result" in n and "partial-strong" in n for n in after.notes)
    out = run(db_copy, "evaluate", "--no-baselines")
    assert out.exit_code == 0 and "note: every method chooses, for each query, among the models" in out.output


# --- the probation minimum follows the registry's data -----------------------------------------------------------
def test_the_data_driven_minimum(monkeypatch):
    monkeypatch.delenv("REGISTRY_PROBATION_MIN", raising=False)
    assert evidence.from_counts([]) == evidence.PROBATION_MIN
    assert evidence.from_counts([10829] * 31) == 500                           # the full benchmark: 500, as ever
    assert evidence.from_counts([270] * 31) == 135                             # a 300-question slice
    assert evidence.from_counts([270] * 31 + [20] * 40) == 135                 # small models do not lower the bar
    assert evidence.from_counts([12000] * 31 + [64] * 200) == 500               # nor do many of them
    assert evidence.from_counts([12000] * 5 + [64] * 200) == 500
    assert evidence.probation_min(None, counts=[270] * 31) == 135 and evidence.probation_min(7, counts=[270]) == 7
    monkeypatch.setenv("REGISTRY_PROBATION_MIN", "9")
    assert evidence.probation_min(None, counts=[270] * 31) == 9


def test_a_small_registry_routes_without_flags(db_copy, tmp_path, monkeypatch):
    monkeypatch.delenv("REGISTRY_PROBATION_MIN", raising=False)
    with Registry(db_copy, min_evaluations=16) as reg:       # (a model from 20 results is embedded)
        with reg.store.tx() as tx:
            text = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]
            behind = [n for (n,) in tx.sql("SELECT max(n_evaluations) FROM embedding_versions GROUP BY model_id")]
        expected = min(500, int(np.median(sorted(behind)[::-1][:(len(behind) + 1) // 2]) // 2))
        assert max(behind) < 500 and reg.probation_min == expected
        assert reg.route(text, RouteOptions(log=False)).model
        assert all(m.status == "established" for m in reg.models())
        small = reg.register("twenty", write_results(tmp_path / "t.csv", [(q, 1) for q in train_queries(reg)[:20]]))
        assert small.status == "probation" and reg.show("twenty").status == "probation"
        d = reg.route(text, RouteOptions(log=False))
        assert d.model != "twenty" and next(c for c in d.candidates if c.model == "twenty").probation
        assert reg.evaluate("test", baselines=False).probation == {"twenty": 20}
    out = run(db_copy, "route", text)
    assert out.exit_code == 0 and "probation" not in out.output.split("\n")[0]
    # the flag and the variable still set it
    assert "every model is on probation" in run(db_copy, "--probation-min", "1000", "route", text).output
    monkeypatch.setenv("REGISTRY_PROBATION_MIN", "1000")
    assert "every model is on probation" in run(db_copy, "route", text).output
