"""Two servers on one PostgreSQL database (issue 14, bar 3): both take writes and both answer reads. Concurrent
registrations of the same model through both give each new evaluation set its own version, numbered 1..n with no
gap and no duplicate (onboarding holds the model's lock); a version written through one is in the other's snapshot
and answer book within a second (the follower's generation check). Two `Serving`s in one process, each with its own
Registry (its own connections and caches), as two `registry serve` processes would be; `bench/replicas.py` runs
the real processes under load."""
from __future__ import annotations

import json
import random
import threading
import time

import pytest

from registry import Registry
from registry.serve.serving import Serving

from .conftest import _pg_names

pytestmark = pytest.mark.slow     # PostgreSQL: the full suite runs it, the fast tier stays on DuckDB


def _rows_file(tmp_path, name: str, qids: list[str], seed: int) -> str:
    rnd = random.Random(seed)
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps({"question_id": q, "correct": int(rnd.random() < 0.5)}) + "\n" for q in qids))
    return str(path)


def _two(pg_server, pg_base):
    url = pg_server.create_db(f"t{next(_pg_names)}", template=pg_base)
    regs = [Registry(url), Registry(url)]
    servings = [Serving(r) for r in regs]
    for s in servings:
        s.writer.refit_every_s = 1e9          # no interaction fits in the background of a short test
    return regs, servings


def _embeddable_qids(reg: Registry) -> list[str]:
    """The registry's query ids outside the test split (what a registration's embedding reads), in id order."""
    with reg.store.tx() as tx:
        return [r[0] for r in tx.sql("""SELECT q.external_id FROM queries q LEFT JOIN query_splits s
                                        ON s.query_id = q.id WHERE coalesce(s.split, '') <> 'test' ORDER BY q.id""")]


def _close(regs, servings) -> None:
    for s in servings:
        s.close()
    for r in regs:
        r.close()


def test_concurrent_registrations_of_one_model_through_two_replicas(pg_server, pg_base, tmp_path):
    regs, servings = _two(pg_server, pg_base)
    try:
        qids = _embeddable_qids(regs[0])
        first = servings[0].register("twin", _rows_file(tmp_path, "twin-0", qids[:64], 0), {"params_b": 7})
        assert first.version == 1
        errors, answers, sent = [], [], {"twin": set(qids[:64])}
        rounds = 4
        size = min(32, (len(qids) - 64) // (2 * rounds))
        assert size >= 8
        go = threading.Barrier(2)

        def writes(side: int) -> None:
            for k in range(rounds):       # each round: new questions for the shared model, from both at once
                part = qids[64 + (2 * k + side) * size: 64 + (2 * k + side + 1) * size]
                go.wait(timeout=60)
                try:
                    answers.append(servings[side].register("twin", _rows_file(tmp_path, f"twin-{side}-{k}", part,
                                                                              k), {"params_b": 7}))
                except Exception as exc:              # any refusal or conflict is a failure of the bar
                    errors.append(repr(exc))
                sent["twin"] |= set(part)

        threads = [threading.Thread(target=writes, args=(side,)) for side in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert errors == []
        with regs[1].store.tx() as tx:
            versions = [r[0] for r in tx.sql("""SELECT v.version FROM embedding_versions v JOIN models m
                                                ON m.id = v.model_id WHERE m.name = 'twin' ORDER BY v.version""")]
            have = {r[0] for r in tx.sql("""SELECT q.external_id FROM evaluations e JOIN models m ON m.id = e.model_id
                                            JOIN queries q ON q.id = e.query_id WHERE m.name = 'twin'""")}
            newest_n = tx.sql("""SELECT v.n_evaluations FROM embedding_versions v JOIN models m ON m.id = v.model_id
                                 WHERE m.name = 'twin' ORDER BY v.version DESC LIMIT 1""")[0][0]
            pending = tx.sql("""SELECT count(*) FROM onboarding_jobs j LEFT JOIN onboarding_results r
                                ON r.job_id = j.id WHERE r.job_id IS NULL""")[0][0]
        # one version per new evaluation set at most (two sets that commit before one onboarding share one)
        assert versions == list(range(1, len(versions) + 1)) and 2 <= len(versions) <= 1 + 2 * rounds
        assert have == sent["twin"] and newest_n == len(sent["twin"])       # the newest version embeds them all
        assert pending == 0
        # every answer names a version that exists, and each replica now serves the newest
        assert {a.version for a in answers} <= set(versions)
        deadline = time.time() + 1.0
        while time.time() < deadline and any(_version_of(s, "twin") != versions[-1] for s in servings):
            time.sleep(0.05)
        assert [_version_of(s, "twin") for s in servings] == [versions[-1]] * 2
    finally:
        _close(regs, servings)


def _version_of(serving: Serving, name: str) -> int | None:
    st = serving.snapshots.current.routing
    return int(st.versions[st.names.index(name)]) if name in st.names else None


def test_a_write_through_one_replica_is_served_by_the_other_within_a_second(pg_server, pg_base, tmp_path):
    regs, servings = _two(pg_server, pg_base)
    try:
        with regs[0].store.tx() as tx:
            qids = [r[0] for r in tx.sql("SELECT external_id FROM queries ORDER BY id")]
        lags = []
        for i in range(3):
            name = f"elsewhere-{i}"
            r = servings[0].register(name, _rows_file(tmp_path, name, qids[i * 50: i * 50 + 80], i), {"params_b": 3})
            acked = time.perf_counter()
            assert r.version == 1 and _version_of(servings[0], name) == 1
            while _version_of(servings[1], name) != 1 and time.perf_counter() - acked < 5:
                time.sleep(0.01)
            lags.append(time.perf_counter() - acked)
            while servings[1].writer.book.id_of(name) is None and time.perf_counter() - acked < 5:
                time.sleep(0.01)
            assert time.perf_counter() - acked <= 1.0          # its answers too (the book, just after the snapshot)
        assert max(lags) <= 1.0, lags
        # availability written through the other replica is served here too
        servings[1].write(lambda: regs[1].mark_unavailable(["elsewhere-0"]))
        deadline = time.time() + 1.0
        while "elsewhere-0" not in servings[0].snapshots.current.routing.down and time.time() < deadline:
            time.sleep(0.01)
        assert "elsewhere-0" in servings[0].snapshots.current.routing.down
        # (the follower counts a follow once its answer book is synced too, just after it swaps the snapshot in)
        while servings[0].writer.stats()["follows"] < 1 and time.time() < deadline + 1.0:
            time.sleep(0.01)
        assert servings[0].writer.stats()["follows"] >= 1
    finally:
        _close(regs, servings)


def test_an_onboarding_waits_for_the_other_process_and_does_not_redo_its_job(pg_server, pg_base, tmp_path):
    """Deterministic: replica A's onboarding transaction is held open after it numbered the version; B's onboarding
    of the same pending job waits for A's lock, then finds the job done and reports A's version (without the lock B
    would number the same version and fail on the unique constraint, or write the job's result twice)."""
    from registry.answers import registration
    from registry.embedding import onboarding

    url = pg_server.create_db(f"t{next(_pg_names)}", template=pg_base)
    with Registry(url) as a, Registry(url) as b:
        with a.store.tx() as tx:
            qids = [r[0] for r in tx.sql("SELECT external_id FROM queries ORDER BY id")]
        a.register("twin", _rows_file(tmp_path, "twin", qids[:64], 0), params_b=7)
        with a.store.tx() as tx:
            registration.stage(tx, "twin", _rows_file(tmp_path, "more", qids[64:96], 1), {"params_b": 7})
        out_b, errors = [], []

        def onboard_b() -> None:
            try:
                out_b.extend(b.onboard())
            except Exception as exc:
                errors.append(repr(exc))

        with a.store.tx() as tx:
            out_a = onboarding.run_pending(tx, a.min_evaluations)
            waiting = threading.Thread(target=onboard_b)
            waiting.start()
            waiting.join(timeout=1.0)
            assert waiting.is_alive()                 # B waits for A's transaction
        waiting.join(timeout=60)
        assert errors == []
        assert [(o.model, o.outcome, o.version) for o in out_a] == [("twin", "embedded", 2)]
        assert [(o.model, o.outcome, o.version) for o in out_b] == [("twin", "embedded", 2)]
        with b.store.tx() as tx:
            assert [r[0] for r in tx.sql("""SELECT v.version FROM embedding_versions v JOIN models m
                                            ON m.id = v.model_id WHERE m.name = 'twin' ORDER BY 1""")] == [1, 2]
            assert tx.sql("""SELECT count(*) FROM onboarding_jobs j LEFT JOIN onboarding_results r ON r.job_id = j.id
                             WHERE r.job_id IS NULL""")[0][0] == 0


def test_the_same_new_model_registered_through_both_replicas_at_once(pg_server, pg_base, tmp_path):
    """Deterministic: another process's transaction creates model 'newcomer' and is held open while this replica's
    writer stages a registration of the same new name; that waits on the unique name, meets a unique violation
    when the other commits, and is staged once more, as an addition: both acknowledged, versions 1 and 2."""
    from registry.answers import registration

    regs, servings = _two(pg_server, pg_base)
    try:
        qids = _embeddable_qids(regs[0])
        out, errors = [], []

        def through_b() -> None:
            try:
                out.append(servings[1].register("newcomer", _rows_file(tmp_path, "b", qids[64:96], 1),
                                                {"params_b": 7}))
            except Exception as exc:
                errors.append(repr(exc))

        with Registry(regs[0].path) as other, other.store.tx() as tx:
            registration.stage(tx, "newcomer", _rows_file(tmp_path, "a", qids[:64], 0), {"params_b": 7})
            waiting = threading.Thread(target=through_b)
            waiting.start()
            waiting.join(timeout=1.5)
            assert waiting.is_alive()              # B's staging waits for the other transaction's model row
        waiting.join(timeout=60)
        assert errors == []
        assert out[0].evaluations_added == 32
        with regs[1].store.tx() as tx:
            versions = [r[0] for r in tx.sql("""SELECT v.version FROM embedding_versions v JOIN models m
                                                ON m.id = v.model_id WHERE m.name = 'newcomer' ORDER BY 1""")]
            n = tx.sql("""SELECT count(*) FROM evaluations e JOIN models m ON m.id = e.model_id
                          WHERE m.name = 'newcomer'""")[0][0]
        assert n == 96 and versions == list(range(1, len(versions) + 1)) and versions
    finally:
        _close(regs, servings)
