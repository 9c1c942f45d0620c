"""answer_index.errs_alike, the error correlation `similar` ranks by, against its definition computed cell by cell:
over the queries both models answered, each answer less the logistic of its question's difficulty plus the model's
ability (less the mean), the two surprises' correlation; in whole blocks and in gathered rows, with questions the
asking model left unanswered."""
from __future__ import annotations

import numpy as np
import pytest

from registry.embedding import answer_index


def index_of(answers: np.ndarray, model_ids: np.ndarray, query_ids: np.ndarray) -> answer_index.AnswerIndex:
    seen, right = answers >= 0, answers == 1
    return answer_index.AnswerIndex(
        key=(), query_ids=query_ids, query_right=right.sum(axis=0), query_answered=seen.sum(axis=0),
        model_ids=model_ids, model_right=right.sum(axis=1), model_answered=seen.sum(axis=1),
        seen=np.packbits(seen, axis=1), right=np.packbits(right, axis=1), sketch_queries=query_ids[:0],
        repeated=None)


def by_definition(scale, answers, y, model_ids, query_ids) -> dict[int, tuple[int, float, float | None]]:
    logit = lambda r, n: np.log((r + 1.0) / (n - r + 1.0))                      # noqa: E731
    lp = logit(scale.query_right, scale.query_answered)
    la = logit(scale.model_right, scale.model_answered)
    mine = y >= 0
    own = logit(float((y == 1).sum()), float(mine.sum()))
    out = {}
    for i, m in enumerate(model_ids):
        both = mine & (answers[i] >= 0)
        if not both.any():
            continue
        p = 1 / (1 + np.exp(-(lp[both] + la[scale.model_ids == m][0] - la.mean())))
        q = 1 / (1 + np.exp(-(lp[both] + own - la.mean())))
        sm, sy = answers[i][both] - p, y[both] - q
        den = np.sqrt((sm * sm).sum() * (sy * sy).sum())
        out[int(m)] = (int(both.sum()), float((answers[i][both] != y[both]).mean()),
                       None if den == 0 else float((sm * sy).sum() / den))
    return out


@pytest.mark.parametrize("n_models,n_queries", [(7, 40), (300, 1500)])
def test_errs_alike_is_the_correlation_of_surprises_over_shared_answers(n_models, n_queries):
    rng = np.random.default_rng(n_models)
    answers = np.where(rng.random((n_models, n_queries)) < 0.2, -1,
                       rng.random((n_models, n_queries)) < rng.random(n_models)[:, None]).astype(np.int8)
    answers[1] = -1                                                    # a model with no answer at all
    answers[2, :] = np.where(answers[2] >= 0, 1, -1)                   # one that never errs
    model_ids, query_ids = np.arange(10, 10 + n_models), np.arange(100, 100 + n_queries) * 3
    scale = index_of(answers, model_ids, query_ids)
    y = answers[0].copy()
    expected = by_definition(scale, answers[1:], y, model_ids[1:], query_ids)
    rows = np.arange(1, n_models)
    gathered = answer_index.errs_alike(answers, rows, y, scale, query_ids, model_ids[rows])
    whole = answer_index.errs_alike(answers[1:], None, y, scale, query_ids, model_ids[1:],
                                    difficulty=scale.difficulty(query_ids))          # (the caller's kept copy)
    assert int(model_ids[1]) not in gathered                          # (it shares nothing)
    for got in (gathered, whole):
        assert set(got) == set(expected)
        for m, (shared, rate, corr) in expected.items():
            assert got[m][:2] == (shared, pytest.approx(rate))
            assert (got[m][2] is None) == (corr is None)
            if corr is not None:
                assert got[m][2] == pytest.approx(corr, abs=1e-5)
    # the questions y left out are out of every sum: the same as asking over the answered columns alone
    cols = np.flatnonzero(y >= 0)
    alone = answer_index.errs_alike(answers[1:, cols], None, y[cols], scale, query_ids[cols], model_ids[1:])
    assert alone.keys() == whole.keys()
    for m in alone:
        assert alone[m][:2] == whole[m][:2]
        assert (alone[m][2] is None) == (whole[m][2] is None)
        assert alone[m][2] is None or alone[m][2] == pytest.approx(whole[m][2], abs=1e-6)
