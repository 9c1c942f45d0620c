"""Onboarding and the embedding history: one version per change, reproducible, crash-safe, queryable as of a time."""
from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time

import duckdb
import numpy as np
import pytest
from click.testing import CliRunner

from registry import Registry
from registry.cli import cli


def versions(path) -> dict[str, int]:
    from registry.core.store import Store
    store = Store(path)
    try:
        with store.tx() as tx:
            return dict(tx.sql("""SELECT m.name, count(v.id) FROM models m
                                  LEFT JOIN embedding_versions v ON v.model_id = m.id GROUP BY m.name"""))
    finally:
        store.close()


def model_results(small_data, model: str, n: int | None = None) -> list[tuple[str, int]]:
    rows = duckdb.sql(f"""SELECT question_id::VARCHAR, correct FROM read_csv('{small_data}/evaluations.csv.gz')
                          WHERE model = '{model}' ORDER BY question_id""").fetchall()
    return rows[:n] if n else rows


def write_evals(path, rows, model: str | None = None):
    header = "model,question_id,correct\n" if model else "question_id,correct\n"
    path.write_text(header + "".join((f"{model}," if model else "") + f"{q},{c}\n" for q, c in rows))
    return path


def test_import_gives_one_version_per_model_and_reimport_none(any_db, small_data):
    counts = versions(any_db)
    assert len(counts) == 31 and set(counts.values()) == {1}
    with Registry(any_db) as reg:
        reg.import_files(directory=str(small_data))
        assert reg.import_files(evaluations=str(small_data / "evaluations.csv.gz")).onboarding == []
    assert versions(any_db) == counts


@pytest.mark.slow
def test_new_evaluations_give_exactly_one_new_version_for_that_model(db_copy, tmp_path):
    qs = tmp_path / "q.csv"
    qs.write_text("question_id,question,category\n" + "".join(
        f"new{i},What is {i} plus {i * 3}? Answer with a number.,math\n" for i in range(100)))
    ev = write_evals(tmp_path / "e.csv", [(f"new{i}", i % 3 == 0) for i in range(100)], model="gemma-7b")
    ev.write_text(ev.read_text().replace("True", "1").replace("False", "0"))
    before = versions(db_copy)
    with Registry(db_copy) as reg:
        r = reg.import_files(queries=str(qs), evaluations=str(ev))
        assert r.evaluations_added == 100 and r.texts_embedded == 100
        assert [o["model"] for o in r.onboarding if o["outcome"] == "embedded"] == ["gemma-7b"]
        h = reg.history("gemma-7b")
    after = versions(db_copy)
    assert after["gemma-7b"] == before["gemma-7b"] + 1
    assert {m: n for m, n in after.items() if m != "gemma-7b"} == {m: n for m, n in before.items() if m != "gemma-7b"}
    assert h.versions[-1].n_evaluations == h.versions[0].n_evaluations + 100
    assert h.versions[-1].reason == "new evaluations" and h.versions[-1].distance_moved > 0


def test_every_version_is_reproducible_from_its_digest(any_db):
    with Registry(any_db) as reg:
        for name in ("gemma-7b", "gpt-4o-2024-05-13", "Llama-2-7b-hf"):
            stored, recomputed, digest_ok = reg.recompute_version(name, 1)
            assert digest_ok
            np.testing.assert_allclose(recomputed, stored, atol=1e-6)


def test_stability_follows_the_version_and_a_missing_one_is_made_later(any_db, small_data, tmp_path):
    """onboard(stability=False) stands for a crash between the version and its estimate: the version is there and
    indexed; the estimate is made by the next run, once, and equals the distance between the two halves."""
    from registry.embedding import embed, encoders

    rows = model_results(small_data, "gemma-7b")
    with Registry(any_db) as reg:
        out = reg.import_files(evaluations=str(write_evals(tmp_path / "more.csv", rows, model="newcomer")),
                               onboard=False)
        assert out.evaluations_added == len(rows)
        (o,) = reg.onboard(stability=False)
        assert o.outcome == "embedded" and o.stability is None
        assert reg.history("newcomer").versions[-1].stability is None
        assert reg.similar("newcomer", k=1)                       # indexed without waiting for the estimate
        estimates = reg.estimate_stability()
        assert list(estimates) == [o.version_id] and estimates[o.version_id] > 0
        assert reg.history("newcomer").versions[-1].stability == round(estimates[o.version_id], 4)
        assert reg.estimate_stability() == {}
        with reg.store.tx() as tx:                                 # the same number from the halves by hand
            model, meta = encoders.load(tx, encoders.active_id(tx))
            mid = tx.sql("SELECT id FROM models WHERE name = 'newcomer'")[0][0]
            s = embed.evaluation_sets(tx, [mid], 10 ** 9, meta.get("embed_max_set"))[mid]
            za, zb = (embed.compute(tx, model, [embed.EvalSet(mid, s.query_ids[h], s.y[h], "")])[0]
                      for h in embed.halves(s))
        assert abs(embed.stability(za, zb, s.n) - estimates[o.version_id]) < 1e-5


def test_register_embeds_and_reports_neighbours(any_db, small_data, tmp_path):
    f = write_evals(tmp_path / "twin.csv", model_results(small_data, "Llama-2-7b-hf"))
    out = CliRunner().invoke(cli, ["--db", str(any_db), "register", "llama-twin", "--evals", str(f),
                                   "--family", "llama-2", "--params-b", "7", "--tag", "origin=test", "--json"])
    assert out.exit_code == 0, out.output
    r = json.loads(out.stdout)
    assert r["model"] == "llama-twin" and r["version"] == 1 and r["outcome"] == "embedded"
    assert r["neighbours"][0]["model"] == "Llama-2-7b-hf"       # its very answers: the same model
    assert r["neighbours"][0]["disagreement"] == 0.0
    assert r["warning"] and "probably the same model" in r["warning"]
    hist = json.loads(CliRunner().invoke(cli, ["--db", str(any_db), "history", "llama-twin", "--json"]).output)
    assert [v["version"] for v in hist["versions"]] == [1]
    assert {"version", "encoder", "n_evaluations", "created", "reason"} <= set(hist["versions"][0])
    with Registry(any_db) as reg:
        shown = reg.show("llama-twin")
    assert shown.params_b == 7 and shown.family == "llama-2" and shown.tags == {"origin": "test"}


def test_too_few_evaluations_registers_without_embedding(any_db, small_data, tmp_path):
    f = write_evals(tmp_path / "few.csv", model_results(small_data, "gemma-7b", 10))
    with Registry(any_db) as reg:
        r = reg.register("tiny-sample", str(f))
        assert r.outcome == "too few evaluations" and r.version is None
        assert r.evaluations_added == 10 and r.n_evaluations <= 10  # test-split results are never embedded
        assert reg.history("tiny-sample").versions == []
        assert reg.show("tiny-sample").evaluations == 10


def test_pending_jobs_survive_and_the_next_writing_command_finishes_them(any_db, small_data, tmp_path):
    f = write_evals(tmp_path / "later.csv", model_results(small_data, "gemma-7b"), model="pending-model")
    with Registry(any_db) as reg:
        reg.import_files(evaluations=str(f), onboard=False)   # as if the process died right after the import
        assert reg.history("pending-model").versions == []
    with Registry(any_db) as reg:
        reg.import_files(directory=str(small_data))           # any writing command finishes pending jobs first
        assert len(reg.history("pending-model").versions) == 1


def test_as_of_answers_as_the_registry_stood_then(any_db, small_data, tmp_path):
    weak = model_results(small_data, "Llama-2-7b-hf")
    strong = dict(model_results(small_data, "gpt-4o-2024-05-13"))
    with Registry(any_db) as reg:
        reg.register("shifter", str(write_evals(tmp_path / "a.csv", weak)))
        then = reg.history("shifter").versions[-1].created
        before = [n.model for n in reg.similar("shifter", k=3)]
        time.sleep(0.05)
        changed = [(q, strong[q]) for q, _ in weak if q in strong]
        reg.register("shifter", str(write_evals(tmp_path / "b.csv", changed)), update=True)  # new results
        assert len(reg.history("shifter").versions) == 2
        now = [n.model for n in reg.similar("shifter", k=3)]
        as_of = [n.model for n in reg.similar("shifter", k=3, as_of=then)]
    assert before[0] == "Llama-2-7b-hf"
    assert now[0] == "gpt-4o-2024-05-13"
    assert as_of == before and now != before


@pytest.mark.slow
def test_activating_another_encoder_reembeds_everything_and_keeps_old_versions(any_db):
    with Registry(any_db) as reg:
        old = reg.encoders()
        new_id = reg.train(seed=1, max_steps=2, name="tiny-test-encoder")
        outcomes = reg.activate_encoder(new_id)
        assert sum(o.outcome == "embedded" for o in outcomes) == 31
        h = reg.history("gemma-7b")
        assert [v.encoder_id for v in h.versions] == [old[0].id, new_id]
        assert h.versions[1].reason == "new encoder"
        assert h.versions[1].distance_moved is None    # never compared across encoders
        assert all(n.model != "gemma-7b" for n in reg.similar("gemma-7b", k=30))
        assert len(reg.similar("gemma-7b", k=30)) == 30  # the new index holds the 31 new vectors only
    assert set(versions(any_db).values()) == {2}


CHILD = """
import sys
import torch  # loaded before 'go', so the kill lands in the import or the onboarding
from registry import Registry
reg = Registry(sys.argv[1])
print("go", flush=True)
reg.import_files(evaluations=sys.argv[2])
print("done", flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_import_and_onboarding(db_copy, small_data, tmp_path):
    rng = random.Random(11)
    base = model_results(small_data, "gemma-7b")
    done = 0
    for i in range(20):
        f = write_evals(tmp_path / f"crash{i}.csv", [(q, (c + i) % 2) for q, c in base], model=f"crash-{i % 5}")
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(db_copy), str(f)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "go"
        time.sleep(rng.uniform(0.0, 1.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        con = duckdb.connect(str(db_copy))   # opens after every kill
        dup = con.execute("SELECT count(*) FROM (SELECT model_id, version FROM embedding_versions "
                          "GROUP BY ALL HAVING count(*) > 1)").fetchall()[0][0]
        bad = con.execute("SELECT count(*) FROM embedding_versions WHERE len(vector) <> 128 "
                          "OR list_has_any(list_transform(vector, lambda x: isnan(x)), [true])").fetchall()[0][0]
        con.close()
        assert dup == 0 and bad == 0
    with Registry(db_copy) as reg:
        reg.onboard()
        for i in range(20):      # then every file once more, unkilled: all five models must end up consistent
            reg.register(f"crash-{i % 5}", str(tmp_path / f"crash{i}.csv"), update=True)
        for i in range(5):
            name = f"crash-{i}"
            if any(m.name == name for m in reg.models()):
                stored, recomputed, digest_ok = reg.recompute_version(name, reg.history(name).versions[-1].version)
                assert digest_ok   # the newest version covers the model's current evaluations
                done += 1
        with reg.store.tx() as tx:
            assert tx.sql("SELECT count(*) FROM onboarding_jobs WHERE id NOT IN "
                          "(SELECT job_id FROM onboarding_results)")[0][0] == 0
    assert done == 5


@pytest.mark.slow
@pytest.mark.parametrize("sample", [2048, 64])
def test_streamed_onboarding_matches_the_per_model_forward_pass(small_data, tmp_path, monkeypatch, sample):
    """Onboarding streams models through in chunks of evaluations and gathers each batch's rows from the shared
    query projections, the stability halves in the same pass (halves of the whole set, or, past STABILITY_SAMPLE
    evaluations, of a sample of that many, their distance scaled by sqrt(sample / n)). Every stored vector must
    still be what the plain per-model path gives: the model's own non-test evaluations (read here with SQL), their
    query vectors through `LocusModel.embed`, one set alone; and what the old batching gave (all sets padded to a
    multiple of 64, masked, one batch). Digests and stability estimates too."""
    import hashlib

    import torch

    from registry.embedding import embed, encoders, onboarding

    chunks = []
    streamed = onboarding.chunked_sets

    def spy(*args, **kwargs):
        for found in streamed(*args, **kwargs):
            chunks.append(len(found))
            yield found
    monkeypatch.setattr(embed, "CHUNK_ROWS", 400)          # about 3 of the slice's models per chunk
    monkeypatch.setattr(onboarding, "chunked_sets", spy)
    monkeypatch.setattr(embed, "STABILITY_SAMPLE", sample)
    db = tmp_path / "streamed.duckdb"
    with Registry(db) as reg:
        reg.import_files(directory=str(small_data))
        with reg.store.tx() as tx:
            model, _ = encoders.load(tx, encoders.active_id(tx))
    assert len(chunks) >= 10 and sum(chunks) == 31          # one pass, streamed in many chunks
    con = duckdb.connect(str(db), read_only=True)
    stored = con.execute("""SELECT m.name, v.vector, v.digest, v.n_evaluations, s.stability FROM embedding_versions v
                            JOIN models m ON m.id = v.model_id JOIN version_stability s ON s.version_id = v.id
                            ORDER BY m.name""").fetchall()
    sets = {}
    for name, *_ in stored:
        rows = con.execute("""SELECT q.external_id, e.correct::INT, t.vector FROM evaluations e
                              JOIN models m ON m.id = e.model_id JOIN queries q ON q.id = e.query_id
                              JOIN query_splits s ON s.query_id = q.id
                              JOIN text_vectors t ON t.content_hash = q.content_hash
                              WHERE m.name = ? AND s.split <> 'test' ORDER BY q.external_id""", [name]).fetchall()
        sets[name] = (np.array([r[2] for r in rows], dtype=np.float32), np.array([r[1] for r in rows], np.float32),
                      hashlib.sha256(",".join(f"{r[0]}:{r[1]}" for r in rows).encode()).hexdigest())
    con.close()

    def alone(q, y):
        with torch.no_grad():
            return model.embed(torch.from_numpy(q)[None], torch.from_numpy(y)[None],
                               torch.ones(1, len(y), dtype=torch.bool))[0].numpy()

    width = -(-max(len(y) for _, y, _ in sets.values()) // 64) * 64
    q_pad = np.zeros((len(sets), width, model.cfg.d_query), np.float32)
    y_pad, m_pad = np.zeros((len(sets), width), np.float32), np.zeros((len(sets), width), bool)
    for i, (q, y, _) in enumerate(sets.values()):
        q_pad[i, :len(y)], y_pad[i, :len(y)], m_pad[i, :len(y)] = q, y, True
    with torch.no_grad():
        old_batch = model.embed(torch.from_numpy(q_pad), torch.from_numpy(y_pad), torch.from_numpy(m_pad)).numpy()
    for i, (name, vector, dig, n, stability) in enumerate(stored):
        q, y, ref_digest = sets[name]
        assert (dig, n) == (ref_digest, len(y)), name
        np.testing.assert_allclose(np.asarray(vector, np.float32), alone(q, y), atol=1e-6, err_msg=name)
        np.testing.assert_allclose(np.asarray(vector, np.float32), old_batch[i], atol=1e-6, err_msg=name)
        m = min(len(y), sample)
        a, b = np.split(np.random.default_rng(int(dig[:16], 16)).permutation(len(y))[:m], [m // 2])
        expected = float(np.linalg.norm(alone(q[a], y[a]) - alone(q[b], y[b]))) * (m / len(y)) ** 0.5
        assert abs(stability - expected) < 1e-5, name


def test_long_sets_embed_unpadded_and_as_alone(base_db):
    """Sets of LONG_SET rows or more go alone, unpadded and unmasked, drawn as row numbers into a shared table, on
    one lane or several at once (bulk work, a thread each): each z still equals that set's plain forward pass
    alone."""
    import torch

    from registry.data import query_cache
    from registry.embedding import embed, encoders

    with Registry(base_db) as reg, reg.store.tx() as tx:
        model, _ = encoders.load(tx, encoders.active_id(tx))
        ids = tx.duck.execute("SELECT id FROM queries ORDER BY id").fetchnumpy()["id"]
        row_of, qmat = query_cache.query_vectors(tx, ids)
    rng = np.random.default_rng(3)
    lengths = [embed.LONG_SET + 40, embed.LONG_SET + 40, embed.LONG_SET + 200, 300, 90]
    sets = [(rng.integers(0, len(qmat), n), (rng.random(n) < 0.6).astype(np.float32)) for n in lengths]
    threads = torch.get_num_threads()
    for lanes in (1, 2, 3):
        z = embed.embed_sets(model, sets, table=qmat, lanes=lanes)
        assert torch.get_num_threads() == threads                    # (lanes run on one thread each, then back)
        for (rows, y), got in zip(sets, z):
            with torch.no_grad():
                want = model.embed(torch.from_numpy(qmat[rows])[None], torch.from_numpy(y)[None],
                                   torch.ones(1, len(y), dtype=torch.bool))[0].numpy()
            np.testing.assert_allclose(got, want, atol=2e-6)
