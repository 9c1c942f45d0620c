"""Planned probes (issue 16, item 1) on the session's small real registry: `registry probe` and `fingerprint --plan`
list queries a model may be asked and write files that `register` and `fingerprint --evals` take back; the
likelihood reading and the greedy choice behave as their docstrings say; `evaluate --planned` compares the designs."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from registry import Registry
from registry.cli import cli
from registry.core.errors import InputError, NotFound
from registry.data import current_evaluations
from registry.embedding import encoders
from registry.embedding.dataset import dataset
from registry.evaluate.harness import embed_subsets
from registry.locus import probe_design

from .conftest import snapshot

DONOR = "gpt-4o-2024-05-13"     # whose real answers fill in the plan files


def answers_of(db, model: str) -> dict[str, int]:
    """A registered model's current answers: {question external id: 0/1}."""
    with Registry(db) as reg, reg.store.tx() as tx:
        mid = tx.sql("SELECT id FROM models WHERE name = ?", [model])[0][0]
        rows = current_evaluations.of_models(tx, [mid])
        ext = dict(tx.sql("SELECT id, external_id FROM queries"))
        return {ext[int(q)]: int(c) for q, c in zip(rows["query_id"], rows["correct"])}


def fill_csv(path, answers: dict[str, int]) -> int:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["correct"] = str(answers[r["question_id"]])
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return len(rows)


def test_probe_new_model_round_trip_through_register(db_copy, tmp_path):
    out = tmp_path / "probes.csv"
    with Registry(db_copy) as reg:
        p = reg.probe("newcomer", n=40, out=str(out))
        with reg.store.tx() as tx:
            split = dict(tx.sql("SELECT q.external_id, s.split FROM queries q "
                                "JOIN query_splits s ON s.query_id = q.id"))
    assert not p.registered and p.answered == 0
    assert (p.seed, p.planned, len(p.probes)) == (probe_design.SEED_SIZE, 40 - probe_design.SEED_SIZE, 40)
    assert [r.kind for r in p.probes] == ["seed"] * probe_design.SEED_SIZE + ["planned"] * (40 - probe_design.SEED_SIZE)
    ids = [r.question_id for r in p.probes]
    assert len(set(ids)) == 40 and all(split[i] != "test" for i in ids)
    assert any("not registered" in n for n in p.notes)
    with open(out, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["question_id"] for r in rows] == ids and all(r["correct"] == "" for r in rows)
    assert all(r["question"] for r in rows)                  # the text, for whoever asks the model
    fill_csv(out, answers_of(db_copy, DONOR))
    with Registry(db_copy) as reg:
        r = reg.register("newcomer", str(out))
        assert (r.evaluations_added, r.n_evaluations, r.outcome) == (40, 40, "embedded")
        # the next round: nothing it answered is proposed again, and no random seed is needed any more
        again = reg.probe("newcomer", n=16)
    assert again.registered and again.answered == 40 and (again.seed, again.planned) == (0, 16)
    assert not set(r.question_id for r in again.probes) & set(ids)


def test_a_bad_answer_in_a_plan_file_is_named_at_the_line_an_editor_shows(db_copy, tmp_path):
    """Plan files carry the question texts, many of several lines: an error names the line the row starts on in the
    file, not its record number."""
    out = tmp_path / "probes.csv"
    with Registry(db_copy) as reg:
        reg.probe("newcomer", n=40, out=str(out))
    fill_csv(out, answers_of(db_copy, DONOR))
    with open(out, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert sum(r["question"].count("\n") for r in rows[:30]) > 0          # the texts before row 30 span lines
    rows[30]["correct"] = "2"
    with open(out, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    starts = [i + 1 for i, text in enumerate(out.read_text(encoding="utf-8").splitlines())
              if text.startswith(f"{rows[30]['question_id']},2,")]
    assert len(starts) == 1 and starts[0] > 32
    before = snapshot(db_copy)
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "register", "newcomer", "--evals", str(out)])
    assert res.exit_code == 1 and f"probes.csv: line {starts[0]}: " in res.output, res.output
    assert snapshot(db_copy) == before


def test_unfilled_plan_file_is_refused_in_one_line(db_copy, tmp_path):
    out = tmp_path / "probes.csv"
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "probe", "newcomer", "-n", "4", "--out", str(out)])
    assert res.exit_code == 0, res.output
    before = snapshot(db_copy)
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "register", "newcomer", "--evals", str(out)])
    assert res.exit_code == 1 and "line 2" in res.output and "correct must be 0, 1, true or false" in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert snapshot(db_copy) == before


def test_probe_plans_against_the_answers_it_has(db_copy, tmp_path):
    """Two partly evaluated models with different answers on the same queries get different plans; a model that has
    answered every non-test query has nothing left to ask."""
    with Registry(db_copy) as reg:
        seed = reg.probe("strong", n=40, out=str(tmp_path / "s.csv"))
    fill_csv(tmp_path / "s.csv", answers_of(db_copy, DONOR))
    (tmp_path / "w.csv").write_bytes((tmp_path / "s.csv").read_bytes())
    fill_csv(tmp_path / "w.csv", answers_of(db_copy, "Llama-2-7b-hf"))
    with Registry(db_copy) as reg:
        reg.register("strong", str(tmp_path / "s.csv"))
        reg.register("weak", str(tmp_path / "w.csv"))
        strong, weak = reg.probe("strong", n=16), reg.probe("weak", n=16)
        with pytest.raises(InputError, match="nothing left to ask"):
            reg.probe(DONOR, n=8)
    asked = {r.question_id for r in seed.probes}
    for p in (strong, weak):
        assert p.answered == 40 and p.planned == 16 and not {r.question_id for r in p.probes} & asked
    assert [r.question_id for r in strong.probes] != [r.question_id for r in weak.probes]


def test_probe_errors_are_one_line(db_copy, tmp_path):
    run = lambda *a: CliRunner().invoke(cli, ["--db", str(db_copy), *a])       # noqa: E731
    for args, words in ((["probe", "m", "-n", "0"], "-n must be at least 1"),
                        (["probe", "m", "--out", str(tmp_path / "p.txt")], "must end in .csv or .jsonl"),
                        (["fingerprint", "--plan", "--candidates", DONOR], "at least 2 candidates"),
                        (["fingerprint", "--plan", "--candidates", f"{DONOR},nope"], "unknown model 'nope'"),
                        (["fingerprint", "--plan", "--evals", "x.csv"], "one of them"),
                        (["fingerprint", "--evals", "x.csv", "--out", "y.csv"], "go with --plan")):
        res = run(*args)
        assert res.exit_code == 1, (args, res.output)
        assert words in res.output and len(res.output.strip().splitlines()) == 1, res.output
    with Registry(db_copy) as reg:
        with pytest.raises(NotFound):
            reg.fingerprint_plan(8, ["nope", DONOR])
        with pytest.raises(InputError):
            reg.probe("m", n=-3)


def test_fingerprint_plan_separates_and_round_trips(db_copy, tmp_path):
    out = tmp_path / "plan.jsonl"
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "fingerprint", "--plan", "-n", "40", "--out", str(out),
                                   "--json"])
    assert res.exit_code == 0, res.output
    p = json.loads(res.stdout)
    assert len(p["probes"]) == 40 and len(p["candidates"]) == 31 and p["file"] == str(out)
    # the least separated pair is separated more often than the least separated pair of random queries
    assert p["separated"] > p["random_separated"]
    donor = answers_of(db_copy, DONOR)
    lines = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert all(r["correct"] is None for r in lines)
    out.write_text("".join(json.dumps({**r, "correct": donor[r["question_id"]]}) + "\n" for r in lines),
                   encoding="utf-8")
    with Registry(db_copy) as reg:
        f = reg.fingerprint(str(out))
    assert f.method == "answers" and f.match == DONOR and f.disagreement == 0.0


def test_fingerprint_plan_beats_random_queries_at_separating():
    """The greedy rule against random columns on a synthetic answer matrix where most columns separate nothing."""
    from registry.answers.probe_plans import separating

    rng = np.random.default_rng(0)
    K, N = 6, 400
    A = np.tile(rng.integers(0, 2, size=(1, N)), (K, 1))      # every candidate answers alike...
    A[:, :30] = rng.integers(0, 2, size=(K, 30))              # ...but on 30 columns
    seen = np.ones_like(A, dtype=bool)
    picks, sep = separating(A, seen, 20)
    assert set(picks) <= set(range(30))
    iu = np.triu_indices(K, 1)
    cols = rng.choice(N, 20, replace=False)
    rand = np.array([[np.sum(A[i, cols] != A[j, cols]) for j in range(K)] for i in range(K)])
    assert sep[iu].min() > rand[iu].min()


def test_greedy_updates_equal_plain_recomputation():
    def plain(G, w, cov, B, k):
        out = []
        for _ in range(k):
            gain = np.array([w[i] * (G[i] @ cov @ B @ cov @ G[i]) / (1 + w[i] * (G[i] @ cov @ G[i]))
                             for i in range(len(G))])
            gain[out] = -np.inf
            j = int(np.argmax(gain))
            out.append(j)
            kv = cov @ G[j]
            cov = cov - np.outer(kv, kv) / (1 / w[j] + G[j] @ kv)
        return out

    rng = np.random.default_rng(1)
    G, w = rng.standard_normal((200, 12)), rng.random(200) * 0.25
    X, R = rng.standard_normal((12, 12)), rng.standard_normal((50, 12))
    cov, B = X @ X.T / 12 + np.eye(12), R.T @ R
    assert probe_design._greedy(G, w, cov, B, 10) == plain(G, w, cov, B, 10)


@pytest.fixture(scope="module")
def small(tmp_path_factory, base_db):
    import shutil

    path = tmp_path_factory.mktemp("probes") / "r.duckdb"
    shutil.copy(base_db, path)
    with Registry(path) as reg, reg.store.tx() as tx:
        model, _ = encoders.load(tx, encoders.ensure_default(tx))
        return path, dataset(tx), model


def test_likelihood_reading_fits_the_answers(small):
    """Read from all of a model's non-test answers, the embedding predicts them better than the prior mean does, and
    the reading is deterministic; with no answers it is the prior."""
    _, data, model = small
    torch.set_num_threads(1)
    pred = probe_design.Predictor(model)
    q = pred.project(data.qvecs)
    nontest = np.concatenate([data.splits["train"], data.splits["val"]])
    m = data.models.index(DONOR)
    Z = embed_subsets(model, data, [nontest[data.correct[k, nontest] >= 0] for k in range(len(data.models)) if k != m])
    prior = probe_design.gaussian_prior(Z)                          # the other models, as the registry reads a new one
    rows = nontest[data.correct[m, nontest] >= 0]
    y = (data.correct[m, rows] == 1).astype(float)
    z, precision = probe_design.read(pred, q.take(rows), y, prior)

    def nll(zz):
        lg = pred.logits(zz, q.take(rows))
        return float(np.sum(np.logaddexp(0, lg) - y * lg))

    assert nll(z) < nll(prior.mean) - 1.0
    p = 1 / (1 + np.exp(-pred.logits(z, q.take(rows))))
    assert abs(p.mean() - y.mean()) < 0.1
    assert np.array_equal(z, probe_design.read(pred, q.take(rows), y, prior)[0])
    assert np.all(np.linalg.eigvalsh(precision - prior.precision) > -1e-6)      # answers only add information
    z0, _ = probe_design.read(pred, q.take(rows[:0]), y[:0], prior)
    assert np.allclose(z0, prior.mean)


def test_oracle_plans_ignore_the_answers_and_real_plans_read_them(small):
    """plan_rows' truth (the benches' upper reference for the planner, bench/planned_probes.py --oracle) linearises
    the posterior at the given embeddings, so what a model answered cannot move its plan; the real planner reads the
    answers, so flipping them moves it."""
    _, data, model = small
    torch.set_num_threads(1)
    pred = probe_design.Predictor(model)
    q = pred.project(data.qvecs)
    nontest = np.concatenate([data.splits["train"], data.splits["val"]])
    M = len(data.models)
    z_all = embed_subsets(model, data, [nontest[data.correct[k, nontest] >= 0] for k in range(M)]).astype(float)
    pool_rows = nontest[:400]
    pool = [pool_rows[data.correct[k, pool_rows] >= 0] for k in range(M)]
    seed = [np.random.default_rng(k).choice(pool[k], 16, replace=False) for k in range(M)]
    priors = [probe_design.gaussian_prior(np.delete(z_all, k, 0)) for k in range(M)]
    ref = pool_rows[::4]
    L = np.stack([pred.logits(z, q.take(ref)) for z in z_all])
    others = [np.delete(L, k, 0).max(0) for k in range(M)]
    answers = (data.correct == 1).astype(float)

    def plan(y, truth):
        return probe_design.plan_rows(pred, q, y, pool=pool, seed_rows=seed, sizes=[40], priors=priors, others=others,
                                      ref=ref, batch=8, truth=truth)[40]

    flipped = 1.0 - answers
    oracle, oracle_flipped = plan(answers, z_all), plan(flipped, z_all)
    real, real_flipped = plan(answers, None), plan(flipped, None)
    assert all(len(r) == 40 and len(set(r)) == 40 and set(r) <= set(pool[k]) for k, r in enumerate(oracle))
    assert all(np.array_equal(a, b) for a, b in zip(oracle, oracle_flipped))
    assert not all(np.array_equal(a, b) for a, b in zip(real, real_flipped))


@pytest.mark.slow   # plans every model's probes for five sizes: half a minute
def test_evaluate_planned_compares_designs_on_the_same_draws(db_copy):
    """With every answer asked (n above the pool), planned and random sets hold the same rows: the same figures."""
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "evaluate", "--sample-efficiency", "--planned", "--seeds",
                                   "2", "--no-baselines", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    pe = r["planned_efficiency"]
    assert set(pe) == {"32", "64", "128", "256", "512"} and pe["32"]["draws"] == 2
    for n in pe:
        for design in ("random", "planned"):
            assert set(pe[n][design]) == {"encoder", "likelihood"}
    # the random column read by the encoder is the sample-efficiency curve itself
    for n, v in r["sample_efficiency"].items():
        assert pe[n]["random"]["encoder"]["hit@1"] == v["mean"]
    for reading in ("encoder", "likelihood"):                   # ~130 answers per model: all of them, both ways
        for key, v in pe["512"]["planned"][reading].items():
            assert v == pytest.approx(pe["512"]["random"][reading][key], abs=1e-3)
    assert pe["32"]["planned"] == pe["32"]["random"]            # the seed set is the first 32 of the same draw
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "evaluate", "--planned"])
    assert res.exit_code == 1 and "--sample-efficiency" in res.output
