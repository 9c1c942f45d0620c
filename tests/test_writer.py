"""The server's writer (issue 13, item 2): registrations staged together in one transaction leave the same rows as
one at a time; a bad registration in a group is refused alone, with its own one-line error, and the others commit."""
from __future__ import annotations

import json
import random
import shutil
import threading
import time

import numpy as np
import pytest

from registry import Registry
from registry.answers import registration
from registry.core.errors import InputError
from registry.embedding import evidence
from registry.serve.serving import Serving


def _rows_file(tmp_path, name: str, qids: list[str], seed: int, extra: dict | None = None) -> str:
    rnd = random.Random(seed)
    path = tmp_path / f"{name}.jsonl"
    with open(path, "w") as f:
        for q in qids:
            f.write(json.dumps({"question_id": q, "correct": int(rnd.random() < 0.5), **(extra or {})}) + "\n")
    return str(path)


def _evaluations(reg: Registry, names: list[str]) -> dict[str, set]:
    with reg.store.tx() as tx:
        out: dict[str, set] = {n: set() for n in names}
        for name, qid, c in tx.sql("""SELECT m.name, q.external_id, e.correct FROM evaluations e
                                      JOIN models m ON m.id = e.model_id JOIN queries q ON q.id = e.query_id
                                      WHERE m.name IN (SELECT unnest(?))""", [names]):
            out[name].add((qid, bool(c)))
        return out


def _qids(reg: Registry) -> list[str]:
    with reg.store.tx() as tx:
        return [r[0] for r in tx.sql("SELECT external_id FROM queries ORDER BY id")]


def test_a_group_leaves_the_rows_one_at_a_time_would(db_copy, tmp_path):
    other = tmp_path / "one-at-a-time.duckdb"
    shutil.copy(db_copy, other)
    with Registry(db_copy) as reg:
        qids = _qids(reg)
        jobs = [(f"grouped-{i}", _rows_file(tmp_path, f"g{i}", qids[i * 10: i * 10 + 60], i), {"params_b": 7 + i},
                 False) for i in range(3)]
        # an existing model gets more results in the same group (update: one of them changes a stored result)
        with reg.store.tx() as tx:
            existing = tx.sql("""SELECT m.name FROM models m JOIN evaluations e ON e.model_id = m.id
                                 GROUP BY m.name ORDER BY m.name LIMIT 1""")[0][0]
        jobs.append((existing, _rows_file(tmp_path, "more", qids[:40], 9), {}, True))
        with reg.store.tx() as tx:
            grouped = registration.stage_group(tx, jobs)
        got = _evaluations(reg, [j[0] for j in jobs])
        with reg.store.tx() as tx:      # one import batch for the group, not one per registration
            batches = {r[0] for r in tx.sql("""SELECT DISTINCT e.batch_id FROM evaluations e JOIN models m
                                               ON m.id = e.model_id WHERE m.name LIKE 'grouped-%'""")}
            params = dict(tx.sql("SELECT name, params_b FROM models WHERE name LIKE 'grouped-%'"))
    assert len(batches) == 1 and params == {"grouped-0": 7, "grouped-1": 8, "grouped-2": 9}
    with Registry(other) as reg:
        with reg.store.tx() as tx:
            alone = [registration.stage(tx, *j) for j in jobs]
        want = _evaluations(reg, [j[0] for j in jobs])
    assert got == want
    assert [(s.name, s.evaluations_added, s.results_changed) for s in grouped] == \
        [(s.name, s.evaluations_added, s.results_changed) for s in alone]
    assert all(s.evaluations_added == 60 for s in grouped[:3])


def test_a_bad_registration_in_a_group_is_refused_alone(any_db, tmp_path):
    with Registry(any_db) as reg:
        qids = _qids(reg)
        serving = Serving(reg)
        serving.writer.refit_every_s = 1e9  # no refit of routing's terms in between (its job would count below)
        files = {f"writer-{i}": _rows_file(tmp_path, f"w{i}", qids[i: i + 60], i) for i in range(6)}
        bad = tmp_path / "bad.jsonl"
        bad.write_text("".join(json.dumps({"question_id": q, "correct": 1}) + "\n" for q in qids[:59])
                       + json.dumps({"question_id": "no-such-question", "correct": 1}) + "\n")
        files["writer-bad"] = str(bad)
        results, errors = {}, {}
        start = threading.Barrier(len(files))

        def register(name: str, path: str) -> None:
            start.wait()
            try:
                results[name] = serving.register(name, path)
            except InputError as exc:
                errors[name] = str(exc)

        threads = [threading.Thread(target=register, args=item) for item in files.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = serving.stats()["writer"]
        serving.close()
        assert set(errors) == {"writer-bad"} and "no-such-question" in errors["writer-bad"]
        assert str(bad) in errors["writer-bad"] and "\n" not in errors["writer-bad"]
        assert all(results[n].version is not None and results[n].evaluations_added == 60 for n in results)
        assert len(results) == 6 and stats["jobs"] == 6
        with reg.store.tx() as tx:
            assert not tx.sql("SELECT 1 FROM models WHERE name = 'writer-bad'")
        snap = serving.snapshots.current.routing
        assert all(n in snap.names for n in results)      # answered only once readers see the model
        # the group's transaction that held the bad one rolled back: neither the snapshot nor the answer book (read
        # in that transaction, applied only after a commit) ever took any of its rows
        book = set(serving.writer.book.names.values())
        assert set(results) <= book and "writer-bad" not in book and "writer-bad" not in snap.names


@pytest.mark.parametrize("content", ['{"question_id": "q", "correct": 1, "text": "why?"}\n', "not json\n", ""])
def test_only_plain_small_jsonl_is_staged_together(tmp_path, content):
    path = tmp_path / "e.jsonl"
    path.write_text(content)
    assert registration.plain_rows(str(path)) is None
    path.write_text('{"question_id": "q", "correct": 1}\n')
    assert registration.plain_rows(str(path)) == [{"question_id": "q", "correct": 1}]


def test_interaction_is_carried_over_then_refitted_when_idle(db_copy, tmp_path):
    from registry.routing import fit as routing_fit

    with Registry(db_copy) as reg:
        qids = _qids(reg)
        serving = Serving(reg)
        before = serving.snapshots.current.routing
        assert before.interaction is not None and before.interaction_fitted      # the test data has train and val
        serving.writer.refit_every_s = 1e9  # the refitter waits: the writer answers from the carried-over fit
        r = serving.register("carried", _rows_file(tmp_path, "c", qids[:60], 1))
        now = serving.snapshots.current.routing
        assert r.version is not None and "carried" in now.names and not now.interaction_fitted
        new, old = now.names.index("carried"), {n: i for i, n in enumerate(before.names)}
        f0, f1 = before.interaction.fitted, now.interaction.fitted
        assert now.interaction.nearest is before.interaction.nearest     # same reference queries: the found ones stay
        at0, at1 = ({int(m): r for r, m in enumerate(f.rows.tolist())} for f in (f0, f1))   # model -> its terms' row
        assert new not in at1                                                    # no terms for the new model
        assert len(at0) == len(at1) > 0
        for name, i in old.items():                                              # the others keep theirs
            j = now.names.index(name)
            assert (i in at0) == (j in at1)
            if i in at0:
                assert (f1.resid[at1[j]] == f0.resid[at0[i]]).all()
                assert (f1.offsets[at1[j]] == f0.offsets[at0[i]]).all()
        serving.writer.refit()              # what the refitter thread does, at most every REFIT_S
        fitted = serving.snapshots.current.routing
        assert fitted.interaction_fitted and fitted.interaction is not None
        with reg.store.tx() as tx:       # the same terms a library call fits for these versions
            lib = routing_fit.keep(tx, reg.probation_min)
        assert (lib.interaction.fitted.resid == fitted.interaction.fitted.resid).all()
        serving.close()


def test_the_served_report_says_what_the_plain_one_does(db_copy, tmp_path):
    """A served registration's report comes from memory (the snapshot and the answer book): the same neighbours,
    disagreements, held-out count and warnings as the report read from the file, for a copy of a registered model
    (the duplicate warning) and for a new one, both on probation (an established model's report is the plain one:
    it reads error correlations)."""
    from registry.embedding.onboarding import JobOutcome

    with Registry(db_copy, probation_min=500) as reg:
        qids = _qids(reg)
        with reg.store.tx() as tx:
            donor = tx.sql("SELECT name FROM models ORDER BY name LIMIT 1")[0][0]
            rows = tx.sql("""SELECT q.external_id, e.correct::INT FROM evaluations e JOIN models m ON m.id = e.model_id
                             JOIN queries q ON q.id = e.query_id WHERE m.name = ? ORDER BY q.id LIMIT 300""", [donor])
        copy = tmp_path / "copy.jsonl"
        copy.write_text("".join(json.dumps({"question_id": q, "correct": c}) + "\n" for q, c in rows))
        serving = Serving(reg)
        serving.writer.refit_every_s = 1e9
        try:
            served = [serving.register("copy-of-donor", str(copy), {}),
                      serving.register("fresh", _rows_file(tmp_path, "fresh", qids[:300], 3), {"params_b": 3})]
        finally:
            serving.close()
        book = serving.writer.book       # both were answered from it (report_served reads the file only without)
        assert all(book.id_of(r.model) is not None for r in served)
        with reg.store.tx() as tx:
            plain = [registration.report(tx, registration.Staged(r.model, r.updated, r.evaluations_added,
                                                                 r.queries_added, r.results_changed),
                                         JobOutcome(r.model, r.outcome, r.version, r.n_evaluations, r.stability),
                                         5, evidence.minimum(tx, reg.probation_setting))
                     for r in served]
    assert served == plain
    assert donor in served[0].warning and "same model" in served[0].warning
    assert served[0].neighbours[0].model == donor and served[0].neighbours[0].disagreement == 0.0
    assert served[1].neighbours and "answers like" not in (served[1].warning or "")
    assert served[1].held_out > 0                  # qids[:300] holds test queries: counted from memory too


def test_a_snapshot_from_new_versions_is_the_one_a_full_read_gives(db_copy, tmp_path):
    """After registrations that only add versions (new models, an existing model's changed results, one too small to
    embed), the writer's snapshot takes just the new versions (Snapshots.add_versions): the same routing state a
    full read of the file builds."""
    from registry.serve import snapshot

    def same(a, b):
        assert a.names == b.names and a.known == b.known and a.down == b.down
        for f in ("model_ids", "versions", "version_ids", "z", "cost", "params_b"):
            assert np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True), f
        for f in ("n", "stability", "probation", "weight"):
            assert np.array_equal(getattr(a.evidence, f), getattr(b.evidence, f), equal_nan=True), f
        assert a.interaction_fitted == b.interaction_fitted
        fa, fb = a.interaction.fitted, b.interaction.fitted
        assert np.array_equal(fa.rows, fb.rows) and np.array_equal(fa.offsets, fb.offsets)
        q = np.random.default_rng(0).standard_normal((3, a.model.cfg.d_query)).astype(np.float32)
        assert np.allclose(a.score(q), b.score(q))

    with Registry(db_copy) as reg:
        qids = _qids(reg)
        with reg.store.tx() as tx:
            existing = tx.sql("SELECT name FROM models ORDER BY name LIMIT 1")[0][0]
            flipped = tx.sql("""SELECT q.external_id, NOT e.correct FROM evaluations e
                                JOIN models m ON m.id = e.model_id JOIN queries q ON q.id = e.query_id
                                WHERE m.name = ? ORDER BY q.id LIMIT 5""",
                             [existing])
        more = tmp_path / "more.jsonl"
        more.write_text("".join(json.dumps({"question_id": q, "correct": int(c)}) + "\n" for q, c in flipped))
        serving = Serving(reg)
        serving.writer.refit_every_s = 1e9
        try:
            start = threading.Barrier(4)

            def register(name, path, metadata, update=False):
                start.wait()
                serving.register(name, path, metadata, update=update)

            jobs = [("inc-a", _rows_file(tmp_path, "a", qids[:60], 1), {"cost": 2.5}),
                    ("inc-b", _rows_file(tmp_path, "b", qids[30:100], 2), {"params_b": 70}),
                    ("inc-tiny", _rows_file(tmp_path, "t", qids[:3], 3), {}),
                    (existing, str(more), {}, True)]
            threads = [threading.Thread(target=register, args=j) for j in jobs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            served = serving.snapshots.current
            stats = serving.writer.stats()
            assert stats["jobs"] == 4 and stats["version_refreshes"] >= 1     # (not a full read)
        finally:
            serving.close()
        assert "inc-a" in served.routing.names and "inc-tiny" not in served.routing.names
        full = snapshot.build(reg, 0, refit=False)
        same(served.routing, full.routing)
        assert served.pool.names == full.pool.names and np.array_equal(served.pool.vectors, full.pool.vectors)


def test_the_answer_book_follows_new_models_and_changed_results_and_old_views_stay(db_copy, tmp_path):
    """The answer book after new models (written into spare rows) and after a changed result of an existing model
    (a new buffer): every row equals the model's current answers in the file, and a view taken before is unchanged."""
    from registry.data import current_evaluations
    from registry.serve.answerbook import AnswerBook

    with Registry(db_copy) as reg:
        qids = _qids(reg)
        book = AnswerBook()
        with reg.store.tx() as tx:
            book.sync(tx)
        before = book.view()[0].copy()
        first_view = book.view()[0]
        for i in range(2):
            with reg.store.tx() as tx:
                registration.stage(tx, f"book-{i}", _rows_file(tmp_path, f"b{i}", qids[i * 7: i * 7 + 40], i), {})
            with reg.store.tx() as tx:
                book.sync(tx)
        assert np.array_equal(first_view, before)                # spare rows only: the old view reads the same
        with reg.store.tx() as tx:
            existing, qid, c = tx.sql("""SELECT m.name, q.external_id, e.correct FROM evaluations e
                                         JOIN models m ON m.id = e.model_id JOIN queries q ON q.id = e.query_id
                                         ORDER BY m.name, q.id LIMIT 1""")[0]
        flipped = tmp_path / "flip.jsonl"
        flipped.write_text(json.dumps({"question_id": qid, "correct": int(not c)}) + "\n")
        with reg.store.tx() as tx:
            registration.stage(tx, existing, str(flipped), {}, update=True)
        view = book.view()[0]
        kept = view.copy()
        with reg.store.tx() as tx:
            book.sync(tx)
            ids = [int(m) for (m,) in tx.sql("SELECT id FROM models")]
            rows = current_evaluations.of_models(tx, ids)
        assert np.array_equal(view, kept)                        # a changed row: a new buffer, the old view stays
        correct, row, _, _, _, answered = book.view()
        want = np.full(correct.shape, -1, dtype=np.int8)
        for m, q, y in zip(rows["model_id"].tolist(), rows["query_id"].tolist(), rows["correct"].tolist()):
            want[row[m], book.col[q]] = y
        assert np.array_equal(correct, want)
        assert np.array_equal(answered, (want >= 0).sum(axis=1))


def test_an_embedding_computed_ahead_is_taken_only_for_the_set_it_was_computed_from(db_copy, tmp_path):
    """onboarding.prepare computes, from a new model's rows alone, the vector and stability halves onboarding would;
    run_pending takes a Prepared only when the digest of the set it reads matches (a marked vector shows which)."""
    from registry.data import import_run
    from registry.embedding import onboarding

    with Registry(db_copy) as reg:
        qids = _qids(reg)
        names = ["ahead-a", "ahead-b", "ahead-c"]
        paths = [_rows_file(tmp_path, n, qids[50 * i: 50 * i + 90], i) for i, n in enumerate(names)]
        with reg.store.tx() as tx:
            ready = {n: onboarding.prepare(tx, [r["question_id"] for r in registration.plain_rows(p)],
                                           [bool(r["correct"]) for r in registration.plain_rows(p)])
                     for n, p in zip(names, paths)}
        assert all(ready.values())
        # a: as computed; b: marked, with its true digest (taken: the marked vector is stored); c: marked, with a
        # digest of other rows (refused: computed again)
        mark = np.full_like(ready["ahead-b"].z, 0.5)
        given = {"ahead-a": ready["ahead-a"],
                 "ahead-b": onboarding.Prepared(ready["ahead-b"].encoder_id, ready["ahead-b"].digest, mark,
                                                (mark, mark + 0.25)),
                 "ahead-c": onboarding.Prepared(ready["ahead-c"].encoder_id, ready["ahead-a"].digest, mark,
                                                (mark, mark))}
        with reg.store.tx() as tx:
            for n, p in zip(names, paths):
                import_run.run_model_import(tx, n, p)
        with reg.store.tx() as tx:
            out = {o.model: o for o in onboarding.run_pending(tx, stability=True, prepared=given)}
        with reg.store.tx() as tx:
            stored = {n: (np.asarray(v, dtype=np.float32), vid) for n, v, vid in tx.sql(
                """SELECT m.name, v.vector, v.id FROM embedding_versions v JOIN models m ON m.id = v.model_id
                   WHERE m.name LIKE 'ahead-%'""")}
        recomputed = {}
        with reg.store.tx() as tx:
            for n in names:
                _, recomputed[n], same_digest = onboarding.recompute(tx, stored[n][1])
                assert same_digest
    assert [out[n].prepared for n in names] == [True, True, False]
    assert np.abs(stored["ahead-a"][0] - recomputed["ahead-a"]).max() < 1e-5     # prepared = what onboarding computes
    assert np.abs(stored["ahead-a"][0] - ready["ahead-a"].z).max() == 0
    assert np.array_equal(stored["ahead-b"][0], mark)
    assert out["ahead-b"].stability == pytest.approx(float(np.linalg.norm(np.full_like(mark, -0.25))), rel=1e-6)
    assert np.abs(stored["ahead-c"][0] - recomputed["ahead-c"]).max() < 1e-5
    with Registry(db_copy) as reg, reg.store.tx() as tx:      # unknown query, a question twice: nothing to prepare
        assert onboarding.prepare(tx, qids[:40] + ["no-such-question"], [True] * 41) is None
        assert onboarding.prepare(tx, qids[:40] + qids[:1], [True] * 41) is None


def test_a_served_registration_of_a_new_model_is_embedded_by_its_request(db_copy, tmp_path):
    """Through the writer, a new model's embedding is computed in the request's thread and taken by the writer
    (stats), and the stored version is the one onboarding recomputes; an update is embedded by the writer."""
    from registry.embedding import onboarding

    with Registry(db_copy) as reg:
        qids = _qids(reg)
        serving = Serving(reg)
        serving.writer.refit_every_s = 1e9
        try:
            fresh = serving.register("ahead-served", _rows_file(tmp_path, "served", qids[:120], 5), {})
            more = serving.register("ahead-served", _rows_file(tmp_path, "more", qids[150:210], 6), {}, update=True)
            stats = serving.writer.stats()
        finally:
            serving.close()
        with reg.store.tx() as tx:
            rows = tx.sql("""SELECT v.id, v.version FROM embedding_versions v JOIN models m ON m.id = v.model_id
                             WHERE m.name = 'ahead-served' ORDER BY v.version""")
            checks = [onboarding.recompute(tx, vid) for vid, _ in rows]
    assert (fresh.version, more.version) == (1, 2)
    assert stats["prepared"] == 1
    assert all(same and np.abs(stored - again).max() < 1e-5 for stored, again, same in checks)


def test_the_writer_waits_for_an_embedding_its_request_is_still_computing(monkeypatch):
    """A request queues its job first and computes the embedding while the job waits: a writer that reaches the
    job sooner takes the embedding once it is done, and one that never comes (at most PREPARED_WAIT_S) is left to
    the writer's own onboarding."""
    from concurrent.futures import Future

    from registry.serve import group_commit

    late, never = Future(), Future()
    jobs = [group_commit.Job("register", ("late", "x.jsonl", {}, False), prepared=late),
            group_commit.Job("register", ("never", "y.jsonl", {}, False), prepared=never),
            group_commit.Job("register", ("update", "z.jsonl", {}, True))]
    threading.Timer(0.2, late.set_result, ["the embedding"]).start()
    monkeypatch.setattr(group_commit, "PREPARED_WAIT_S", 0.5)
    never_again = group_commit.Job("register", ("never-2", "w.jsonl", {}, False), prepared=Future())
    t0 = time.monotonic()
    assert group_commit._prepared(jobs + [never_again]) == {"late": "the embedding"}
    assert time.monotonic() - t0 < 0.9         # one deadline for the cycle, not one per job
    none_computed = Future()
    none_computed.set_result(None)          # (an unknown query: nothing could be prepared)
    assert group_commit._prepared([group_commit.Job("register", ("n", "n.jsonl", {}, False),
                                                    prepared=none_computed)]) == {}


@pytest.mark.slow       # (MiniLM embeds the new question)
def test_a_served_registration_that_brings_new_questions_commits_in_its_one_transaction(db_copy, tmp_path):
    """Rows with a question text the registry lacks add a query in the cycle's transaction; the onboarding in that
    same transaction must see it (the query metadata it caches is read afresh there), not fall back to staging the
    group again."""
    with Registry(db_copy) as reg:
        qids = _qids(reg)
        serving = Serving(reg)
        serving.writer.refit_every_s = 1e9
        serving.register("warm-writer", _rows_file(tmp_path, "warm", qids[:60], 1))    # the metadata cached
        path = tmp_path / "with-question.jsonl"
        rows = [{"question_id": q, "correct": i % 2} for i, q in enumerate(qids[100:159])]
        rows.append({"question_id": "brand-new-q", "correct": 1, "question": "What is a brand new question?"})
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out = serving.register("asks-new-question", str(path))
        stats = serving.stats()["writer"]
        serving.close()
        assert out.queries_added == 1 and out.version is not None and out.evaluations_added == 60
        assert stats["one_transaction_refused"] == 0
        with reg.store.tx() as tx:
            assert tx.sql("SELECT count(*) FROM queries WHERE external_id = 'brand-new-q'")[0][0] == 1


def test_a_transaction_reads_afresh_what_it_invalidated_and_every_after_commit_hook_runs(tmp_path):
    with Registry(tmp_path / "r.duckdb") as reg:
        store = reg.store
        with store.tx() as tx:
            assert tx.cached("answer", lambda: 1) == 1
        with store.tx() as tx:
            assert tx.cached("answer", lambda: 2) == 1          # kept from the committed read
            tx.invalidate("answer")
            assert tx.cached("answer", lambda: 3) == 3          # this transaction changed it: read afresh
            assert tx.cached("answer", lambda: 5) == 3          # once, until it changes it again
            tx.invalidate("answer")
            assert tx.cached("answer", lambda: 6) == 6
        with store.tx() as tx:
            assert tx.cached("answer", lambda: 4) == 4          # dropped when that committed (its own read too)
        ran = []
        with pytest.raises(ZeroDivisionError):
            with store.tx() as tx:
                tx.after_commit(lambda: 1 / 0)
                tx.after_commit(lambda: ran.append("second"))
        assert ran == ["second"]
