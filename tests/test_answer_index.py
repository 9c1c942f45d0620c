"""The answer index (embedding/answer_index.py): its totals are the current answers' own (re-answered questions
and aliases as current_evaluations.current counts them), an update after a registration equals a rebuild, a copy
saved beside the file is read back by the next process, and `similar` over its candidates (the nearest by
embedding and by sketch) gives the answer the whole pool gives, in the library and from a server's memory."""
from __future__ import annotations

import numpy as np
import pytest

from registry import Registry
from registry.answers import catalog, neighbours
from registry.data import current_evaluations
from registry.embedding import answer_index, answer_store
from registry.serve.answerbook import AnswerBook
from tests.helpers import results_of, write_rows

pytestmark = pytest.mark.slow      # (registrations and a whole pool's `similar`: seconds)

MODEL = "gpt-4o-2024-05-13"


def totals_by_sql(tx) -> tuple[dict, dict]:
    """Each question's and each model's (right, answered) over current_evaluations.current(distinct=True)."""
    src = current_evaluations.current(distinct=True)
    q = {int(a): (int(r), int(n)) for a, r, n in tx.sql(f"SELECT query_id, sum(correct::INT), count(*) FROM {src} e "
                                                         "GROUP BY 1")}
    m = {int(a): (int(r), int(n)) for a, r, n in tx.sql(f"SELECT model_id, sum(correct::INT), count(*) FROM {src} e "
                                                         "GROUP BY 1")}
    return q, m


def as_dicts(ix: answer_index.AnswerIndex) -> tuple[dict, dict]:
    return ({int(a): (int(r), int(n)) for a, r, n in zip(ix.query_ids, ix.query_right, ix.query_answered)},
            {int(a): (int(r), int(n)) for a, r, n in zip(ix.model_ids, ix.model_right, ix.model_answered)})


def test_totals_are_the_current_answers_and_an_update_is_a_rebuild(db_copy, small_data, tmp_path):
    rows = results_of(small_data, MODEL)
    with Registry(db_copy) as reg:
        with reg.store.tx() as tx:
            first = answer_store.get(tx)
            assert as_dicts(first) == totals_by_sql(tx) and first.repeated is not None and not len(first.repeated)
        # a model answering again (its newest answer counts) and a new one: the update reads only their rows
        flipped = [(q, 1 - c) for q, c in rows[:40]]
        reg.register(MODEL, str(write_rows(tmp_path / "again.csv", flipped)), update=True)
        reg.register("newcomer", str(write_rows(tmp_path / "new.csv", [(q, c) for q, c in rows[::3]])))
        with reg.store.tx() as tx:
            updated = answer_store.get(tx)
            rebuilt = answer_store.build(tx, answer_store.key_of(tx))
            assert updated.key == rebuilt.key != first.key
            assert as_dicts(updated) == as_dicts(rebuilt) == totals_by_sql(tx)
            assert np.array_equal(updated.seen, rebuilt.seen) and np.array_equal(updated.right, rebuilt.right)
            assert np.array_equal(updated.sketch, rebuilt.sketch)
            again = tx.sql("SELECT id FROM models WHERE name = ?", [MODEL])[0][0]
            assert updated.repeated.tolist() == rebuilt.repeated.tolist() == [again]
            # a model's count and accuracy: summed as its rows stand where it answered each question once, by the
            # rule where it answered again; either way the rule's own figures
            fast, by_rule = current_evaluations.per_model(tx), current_evaluations.per_model_grouped(tx, None)
            assert fast.keys() == by_rule.keys() and fast[again][0] == len(rows)
            assert all(fast[m][0] == by_rule[m][0] and fast[m][1] == pytest.approx(by_rule[m][1]) for m in fast)
            plain = tx.sql("SELECT count(*) FROM evaluations WHERE model_id = ?", [again])[0][0]
            assert plain == len(rows) + 40 and current_evaluations.per_model(tx, [again]) == {again: by_rule[again]}
        # `stats` counts from the index where it is current (the aliases' few rows read): the count over every row
        reg.register("renamed", str(write_rows(tmp_path / "alias.csv", rows[:80])), alias_of=MODEL)
        with reg.store.tx() as tx:
            updated = answer_store.get(tx)
            assert answer_store.current_or_none(tx) is updated
            assert catalog.stats(tx, str(db_copy)).evaluations == current_evaluations.count(tx)
    # the next process starts from the copy saved beside the file
    saved = answer_store.load(answer_store.sidecar_path(str(db_copy)))
    assert saved is not None and saved.key == updated.key and as_dicts(saved) == as_dicts(updated)


def test_similar_over_candidates_keeps_the_whole_pools_answer(db_copy, small_data, tmp_path, monkeypatch):
    """With candidates on (a pool of 31 against 10 + 10 of them), most of every model's top 3 is the one the whole
    pool gives (31 real models err alike about evenly: the hard case; bench/similar_recall.py measures 10,000), a
    model's relabelled copy finds it first, and a server's memory (the answer book) gives the same rates as the
    index's packed answers."""
    rows = results_of(small_data, MODEL)
    with Registry(db_copy) as reg:
        reg.register("copy", str(write_rows(tmp_path / "copy.csv", [(q, c) for q, c in rows[1::2]])))
        names = [m.name for m in reg.models() if m.name != "copy"]
        exact = {n: [x.model for x in reg.similar(n, k=3)] for n in names}
        monkeypatch.setattr(neighbours, "CANDIDATES", 10)
        kept = sum(len(set(exact[n]) & {x.model for x in reg.similar(n, k=3)}) for n in names)
        assert kept / (3 * len(names)) >= 0.8, kept
        monkeypatch.setattr(neighbours, "CANDIDATES", 2)
        assert reg.similar("copy", k=1)[0].model == MODEL
        book = AnswerBook()
        with reg.store.tx() as tx:
            book.sync(tx)
            scale = answer_store.get(tx)
            own = book.id_of(MODEL)
            rows = current_evaluations.of_models(tx, [own])
            others = [m for m in book.model_ids.tolist() if m != own][:10]
            # the index's packed answers are the registry's current ones
            theirs = current_evaluations.of_models(tx, others[:1])
            assert scale.answers(others[:1], theirs["query_id"])[0].tolist() == theirs["correct"].tolist()
        by_index = scale.agreement(rows["query_id"], rows["correct"], others)
        from_memory = book.agreement(own, others, scale)
        assert set(by_index) == set(from_memory) == set(others)
        for m in others:
            assert by_index[m][:2] == pytest.approx(from_memory[m][:2])
            assert by_index[m][2] == pytest.approx(from_memory[m][2], abs=1e-6)    # (float32 sums; shown to 4)
