"""`registry evaluate --held-out K` (issue 15) and the IRT baseline, on the session's small real registry with a tiny
training config: nothing written, hidden answers never reach any method, every method reads the drawn rows, the
report's figures recompute from the raw rows, and IRT places a new model with its query side frozen."""
from __future__ import annotations

import json
import shutil
from dataclasses import replace

import duckdb
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from sklearn.metrics import roc_auc_score

from registry import Registry
from registry.cli import cli
from registry.core.errors import InputError
from registry.embedding.dataset import dataset
from registry.evaluate import heldout
from registry.evaluate import pair_baselines as P

from .conftest import snapshot

TINY = ["--steps", "2", "--epochs", "1"]


@pytest.fixture(scope="module")
def small(tmp_path_factory, base_db):
    """(registry file, its dataset) for the module: read-only use."""
    path = tmp_path_factory.mktemp("heldout") / "r.duckdb"
    shutil.copy(base_db, path)
    with Registry(path) as reg, reg.store.tx() as tx:
        return path, dataset(tx)


@pytest.fixture(scope="module")
def seed_run(small):
    """One held-out seed on the small data: (data, report of the seed, probs, held, drawn rows)."""
    _, data = small
    cfg = heldout.train_config(max_steps=2, epochs=1)
    return (data, *heldout.run_seed(data, 3, 31, seed=1, cfg=cfg))


@pytest.mark.slow   # trains an encoder / draws a t-SNE map: seconds, not the inner loop
def test_held_out_cli_json_and_table_write_nothing(db_copy):
    before = snapshot(db_copy)
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "evaluate", "--held-out", "3", "--n", "31", "--seeds", "2",
                                   *TINY, "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert (r["held_out"], r["n"], r["seeds"], r["models"]) == (3, 31, [0, 1], 31)
    assert r["train_config"]["max_steps"] == 2 and r["train_config"]["teacher_epochs"] == 1
    assert r["train_config"]["refit_epochs"] == heldout.TRAIN_SHORT["refit_epochs"]
    assert len(r["per_seed"]) == 2 and all(len(s["held_out"]) == 3 for s in r["per_seed"])
    assert r["per_seed"][0]["held_out"] != r["per_seed"][1]["held_out"]      # the seed chooses them
    keys = {"hit@1", "auc", "held_out_auc", "held_out_auc_within", "held_out_brier", "held_out_acc_error"}
    for s in r["per_seed"]:
        assert set(s["methods"]) == set(heldout.METHODS)
        assert all(keys <= set(v) for v in s["methods"].values())
        assert s["methods"]["irt"]["dim"] in (1, 4, 16, 64) and s["methods"]["mf"]["dim"] in (16, 32, 64, 128)
    for m in heldout.METHODS:                                                  # the mean is over the seeds
        for k in keys:
            vals = [s["methods"][m][k] for s in r["per_seed"]]
            if None not in vals:
                assert abs(r["mean"][m][k] - np.mean(vals)) < 1e-4, (m, k)
    assert any("probation" in n for n in r["notes"]) and any("frozen" in n for n in r["notes"])
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "evaluate", "--held-out", "2", "--n", "20", "--seeds", "1",
                                   *TINY])
    assert res.exit_code == 0, res.output
    assert "held-out AUC" in res.output and "mean over 1 seeds" in res.output and "max_steps=2" in res.output
    assert snapshot(db_copy) == before                                         # trained in memory, nothing stored


def test_held_out_refuses_what_it_cannot_do(db_copy):
    run = lambda *a: CliRunner().invoke(cli, ["--db", str(db_copy), "evaluate", *a])  # noqa: E731
    for args, words in ((["--held-out", "3", "--split", "val"], "test split"),
                        (["--held-out", "30"], "leaves 1 model"),
                        (["--held-out", "3", "--n", "100000"], "train results"),
                        (["--held-out", "0"], "at least 1"),
                        (["--steps", "2"], "--held-out")):
        res = run(*args)
        assert res.exit_code != 0 and words in res.output and "Traceback" not in res.output, (args, res.output)
    with Registry(db_copy) as reg, pytest.raises(InputError):
        reg.evaluate(held_out=2, sample_efficiency=True)


@pytest.mark.slow     # trains or starts a process: seconds, the full suite runs it
def test_hidden_answers_never_reach_a_method_and_every_method_reads_the_drawn_rows(small, seed_run):
    data, report, probs, held, rows = seed_run
    tr, va, te = (data.splits[s] for s in ("train", "val", "test"))
    for m in np.flatnonzero(held):                                            # n from the train split, observed
        assert len(rows[m]) == 31 and set(rows[m]) <= set(tr) and (data.correct[m, rows[m]] >= 0).all()
    cfg = heldout.train_config(max_steps=2, epochs=1)

    # every answer no method may see, flipped: the test answers of all models, and the held-out models' other ones
    hidden = np.zeros_like(data.correct, dtype=bool)
    hidden[:, te] = True
    for m in np.flatnonzero(held):
        hidden[m, np.concatenate([tr, va])] = True
        hidden[m, rows[m]] = False
    flipped = data.correct.copy()
    flipped[hidden & (flipped >= 0)] = 1 - flipped[hidden & (flipped >= 0)]
    rep2, probs2, held2, rows2 = heldout.run_seed(replace(data, correct=flipped), 3, 31, seed=1, cfg=cfg)
    assert (held2 == held).all() and all((rows2[m] == rows[m]).all() for m in rows)
    assert rep2.visible_digest == report.visible_digest
    for m in heldout.METHODS:
        assert np.array_equal(probs2[m], probs[m]), m

    # the drawn rows flipped: every method's prediction for the held-out models moves
    drawn = data.correct.copy()
    for m in rows:
        drawn[m, rows[m]] = 1 - drawn[m, rows[m]]
    _, probs3, _, _ = heldout.run_seed(replace(data, correct=drawn), 3, 31, seed=1, cfg=cfg)
    for m in heldout.METHODS:
        assert not np.allclose(probs3[m][held], probs[m][held]), m


@pytest.mark.slow
def test_report_recomputes_from_the_raw_rows(small, seed_run):
    path, _ = small
    data, report, probs, held, rows = seed_run
    te = data.splits["test"]
    con = duckdb.connect(str(path), read_only=True)
    raw = {(m, q): c for m, q, c in con.execute("""
        SELECT m.name, e.query_id, arg_max(e.correct, e.batch_id)::INT FROM evaluations e
        JOIN models m ON m.id = e.model_id GROUP BY ALL""").fetchall()}
    con.close()
    names = [data.models[m] for m in np.flatnonzero(held)]
    assert report.held_out == names
    # best single: a held-out model's P(correct) is its accuracy on its drawn rows, read straight from the table
    for m in np.flatnonzero(held):
        acc = np.mean([raw[(data.models[m], int(data.query_ids[q]))] for q in rows[m]])
        assert np.allclose(probs["best_single"][m], acc)
    # every metric of LOCUS, routing as served and best single from the raw test answers and the returned scores
    strongest = int(np.argmax(probs["best_single"][:, 0]))
    for method in ("locus", "locus_interaction", "served", "best_single"):
        p = probs[method]
        truth = np.array([[raw.get((name, int(data.query_ids[q])), -1) for q in te] for name in data.models])
        obs = truth >= 0
        got = report.methods[method]
        chosen = p.argmax(0)                                                 # first of equals, as topk_models
        assert got["hit@1"] == round(float(np.mean(truth[chosen, np.arange(len(te))] == 1)), 4)
        assert got["auc"] == round(roc_auc_score(truth[obs], p[obs]), 4)
        h = held[:, None] & obs
        assert got["held_out_auc"] == round(roc_auc_score(truth[h], p[h]), 4)
        assert got["held_out_brier"] == round(float(np.mean((p[h] - truth[h]) ** 2)), 4)
        err = [abs(p[m][obs[m]].mean() - truth[m][obs[m]].mean()) for m in np.flatnonzero(held)]
        assert abs(got["held_out_acc_error"] - np.mean(err)) < 1e-4
        assert got["routed_to_held_out"] == round(float(held[chosen].mean()), 4)
        assert got["n_chosen"] == len(set(chosen.tolist()))
        assert got["differs_from_strongest"] == round(float(np.mean(chosen != strongest)), 4)
        dis = [j for j in range(len(te)) if 1 in truth[:, j] and 0 in truth[:, j]]
        assert got["hit@1_disagree"] == round(float(np.mean([truth[chosen[j], j] == 1 for j in dis])), 4)


def test_irt_places_a_new_model_with_the_query_side_frozen(small):
    _, data = small
    tr, va, te = (data.splits[s] for s in ("train", "val", "test"))
    known = np.arange(len(data.models)) != 5
    irt, info = P.train_pairs(P.IRT, data.qvecs, data.correct[known], tr, va, 4, seed=0, epochs=3)
    before = {k: v.clone() for k, v in irt.state_dict().items()}
    rows = tr[data.correct[5, tr] >= 0]
    y = (data.correct[5, rows] == 1).astype(np.float64)
    theta = P.fit_theta(irt, data.qvecs, [(rows, y), (rows, 1 - y), (rows, np.ones_like(y))])
    assert all(torch.equal(before[k], v) for k, v in irt.state_dict().items())   # a, b and known thetas untouched

    # the fit is the maximum of the posterior under the frozen a(q), b(q): its gradient vanishes
    known_t = irt.theta.weight.detach().double().numpy()
    mu, var = known_t.mean(0), known_t.var(0) + 1e-6
    with torch.no_grad():
        q = torch.from_numpy(data.qvecs[rows])
        A, b = irt.a(q).double().numpy(), irt.b(q)[:, 0].double().numpy()
    for th, yy in zip(theta.astype(np.float64), (y, 1 - y)):
        p = 1 / (1 + np.exp(-(A @ th - b)))
        grad = A.T @ (yy - p) - (th - mu) / var
        assert np.abs(grad).max() < 1e-3 * max(1.0, np.abs(A.T @ yy).max()), grad
    # more right answers, a higher predicted accuracy; and P(correct) is the model's formula with the new theta
    p_all = P.irt_theta_probs(irt, theta, data.qvecs, te)
    assert p_all[2].mean() > p_all[0].mean() and p_all[2].mean() > p_all[1].mean()
    with torch.no_grad():
        qt = torch.from_numpy(data.qvecs[te])
        manual = torch.sigmoid(torch.from_numpy(theta) @ irt.a(qt).T - irt.b(qt)[:, 0][None]).numpy()
    assert np.allclose(p_all, manual, atol=1e-6)


@pytest.mark.slow   # trains an encoder
def test_held_out_planned_gives_every_method_the_planned_rows(small):
    """--planned: each held-out model asked SEED_SIZE of its drawn rows, then planned train rows up to n (none
    twice); every method scored again on those rows, the encoder not retrained; the CLI shows both tables."""
    from registry.locus import probe_design

    _, data = small
    cfg = heldout.train_config(max_steps=2, epochs=1)
    n = probe_design.SEED_SIZE + 12
    out, _, held, rows = heldout.run_seed(data, 3, n, seed=1, cfg=cfg, planned=True)
    assert set(out.planned) == set(heldout.METHODS) and out.planned != out.methods
    trained = heldout._train(heldout.visible(data, held, rows), held, replace(cfg, seed=1), None)[0]
    planned = heldout.planned_rows(data, held, rows, trained, 1)
    tr = set(data.splits["train"].tolist())
    for m, r in planned.items():
        assert len(r) == len(set(r.tolist())) == n and set(r.tolist()) <= tr
        assert len(set(r.tolist()) & set(rows[m].tolist())) >= probe_design.SEED_SIZE     # the seed is of the draw
        assert (data.correct[m, r] >= 0).all()
    assert set(planned) == set(np.flatnonzero(held).tolist())
