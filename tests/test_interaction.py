"""Routing that uses the model-by-question interaction (locus/interaction.py), on tiny synthetic data where the
truth is planted, then on the session's real registry: what `registry evaluate` measures is what `registry route`
serves, the report says what routing used, and `registry draw-splits --by category` holds whole categories out."""
from __future__ import annotations

import json

import duckdb
import numpy as np
import pytest
from click.testing import CliRunner

from registry import Registry, RouteOptions
from registry.cli import cli
from registry.locus import baselines as B
from registry.locus import interaction as I
from registry.routing.served_scores import Served


def world(n=3000, models=4, cats=3, planted=True, seed=0, local=False):
    """Queries in `cats` clusters of a 16-d space; the predictor knows each model's strength and each question's
    difficulty, the truth adds a per-(model, category) term (planted) and, with `local`, a sub-region of query space
    where model 1 is far better (what only neighbours can see)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((cats, 16)) * 3
    cat = rng.integers(0, cats, n)
    q = centres[cat] + rng.standard_normal((n, 16))
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    strength = np.linspace(0.6, 0.0, models)[:, None]
    difficulty = rng.standard_normal(n)[None] * 0.8
    pred = strength + difficulty                                            # [M,N] the predictor's logits
    b_true = rng.choice([-1.2, 1.2], size=(models, cats)) if planted else np.zeros((models, cats))
    truth = pred + b_true[:, cat]
    if local:
        region = q[:, 0] > np.quantile(q[:, 0], 0.7)
        truth[1, region] += 3.0
    correct = (rng.random(truth.shape) < I.sigmoid(truth)).astype(np.int8)
    order = rng.permutation(n)
    splits = {"train": np.sort(order[:int(0.7 * n)]), "val": np.sort(order[int(0.7 * n):int(0.85 * n)]),
              "test": np.sort(order[int(0.85 * n):])}
    names = np.array([f"c{c}" for c in cat], dtype=object)
    return pred, correct, q, names, cat, b_true, splits


def test_category_offsets_recover_a_planted_interaction_and_shrink_without_answers():
    pred, correct, q, names, cat, b_true, sp = world()
    b = I.category_offsets(pred, correct, cat, 3, l2=1.0)
    assert np.abs(b - b_true).max() < 0.35, (b, b_true)
    sparse = correct.copy()
    sparse[0, 20:] = -1                                   # model 0 known from 20 answers only
    b2 = I.category_offsets(pred, sparse, cat, 3)
    assert np.abs(b2[0]).max() < 0.5 * np.abs(b[0]).max() # pulled toward 0 by the prior
    assert np.allclose(b2[1:], I.category_offsets(pred[1:], correct[1:], cat, 3))   # each model on its own


def test_fit_uses_the_interaction_where_there_is_one_and_routes_better():
    pred, correct, q, names, cat, b_true, sp = world()
    fitted = I.fit(pred, correct, q, list(names), sp["train"], sp["val"])
    assert fitted.a > 0 and fitted.selection["val_hit"]["chosen"] > fitted.selection["val_hit"]["predictor"]
    te = sp["test"]
    routed = fitted.scores(pred[:, te], q[te], fitted.category_index(names[te]))
    assert B.hit_at_k(routed, correct[:, te]) > B.hit_at_k(pred[:, te], correct[:, te]) + 0.05
    assert len(np.unique(routed.argmax(0))) > len(np.unique(pred[:, te].argmax(0)))


def test_without_an_interaction_validation_keeps_the_predictor_within_its_noise():
    pred, correct, q, names, cat, _, sp = world(planted=False, seed=3)
    fitted = I.fit(pred, correct, q, list(names), sp["train"], sp["val"])
    p, n = fitted.selection["val_hit"]["predictor"], len(sp["val"])
    # the weights are the settings' mean weighted by their val hit@1 in standard errors, not the argmax
    assert fitted.selection["val_hit"]["chosen"] >= p - np.sqrt(p * (1 - p) / n)
    assert np.abs(fitted.offsets).max() < 0.3
    none = I.Interaction(0.0, 10, 0.0, fitted.categories, fitted.rows, fitted.offsets, fitted.ref_vecs,
                         fitted.ref_cat, fitted.resid, fitted.seen)
    te = sp["test"]
    assert np.array_equal(none.scores(pred[:, te], q[te], none.category_index(names[te])), pred[:, te])


def test_nearest_query_residual_finds_a_local_strength_categories_miss():
    pred, correct, q, names, cat, _, sp = world(planted=False, local=True, seed=5)
    fitted = I.fit(pred, correct, q, list(names), sp["train"], sp["val"])
    assert fitted.w > 0
    te = sp["test"]
    routed = fitted.scores(pred[:, te], q[te], fitted.category_index(names[te]))
    assert B.hit_at_k(routed, correct[:, te]) > B.hit_at_k(pred[:, te], correct[:, te]) + 0.03


def test_a_text_without_a_known_category_takes_its_neighbours_categories():
    pred, correct, q, names, cat, _, sp = world()
    fitted = I.fit(pred, correct, q, list(names), sp["train"], sp["val"])
    te = sp["test"]
    labelled = fitted.scores(pred[:, te], q[te], fitted.category_index(names[te]))
    unknown = fitted.scores(pred[:, te], q[te], fitted.category_index([None] * len(te)))
    unseen = fitted.scores(pred[:, te], q[te], fitted.category_index(["never seen"] * len(te)))
    assert np.array_equal(unknown, unseen)
    # the clusters are well apart: the neighbours' categories are the query's own, so the choices agree
    assert (labelled.argmax(0) == unknown.argmax(0)).mean() > 0.95
    mix = I.category_mix(np.array([-1]), I.neighbours(fitted.ref_vecs, q[te[:1]], I.CAT_K), fitted.ref_cat, 3)
    assert mix.sum() == pytest.approx(1.0) and mix.argmax() == cat[te[0]]


def test_neighbours_are_the_most_similar_first():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((50, 8)).astype(np.float32)
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    nn = I.neighbours(ref, ref[:3], 5)
    assert (nn[:, 0] == np.arange(3)).all()
    sims = ref[:3] @ ref.T
    assert np.array_equal(nn, np.argsort(-sims, axis=1, kind="stable")[:, :5])


# --- the real registry ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_evaluate_reports_what_routing_uses_and_route_serves_what_evaluate_measured(db_copy):
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "evaluate", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    m = r["methods"]
    for name in ("locus", "locus_interaction", "knn", "mf", "irt", "per_category", "best_single"):
        assert {"n_chosen", "differs_from_strongest", "hit@1_disagree"} <= set(m[name]), name
    assert m["best_single"]["differs_from_strongest"] == 0.0 and m["best_single"]["n_chosen"] == 1
    assert {"a", "k", "w"} <= set(m["locus_interaction"]) and "val_hit" in r["interaction"]

    with Registry(db_copy) as reg:
        with reg.store.tx() as tx:
            rows = tx.sql("""SELECT q.text, q.id FROM queries q JOIN query_splits s ON s.query_id = q.id
                             WHERE s.split = 'test' ORDER BY q.id""")
            c = np.array([row for (row,) in tx.sql("""
                SELECT list(coalesce(e.c, -1) ORDER BY s.query_id) FROM models m CROSS JOIN query_splits s
                LEFT JOIN (SELECT model_id, query_id, arg_max(correct, batch_id)::INT AS c FROM evaluations
                           GROUP BY ALL) e ON e.model_id = m.id AND e.query_id = s.query_id
                WHERE s.split = 'test' GROUP BY m.id""")], dtype=np.int8)
        decisions = reg.route_batch([t for t, _ in rows], RouteOptions(log=False))
    served = {}
    for d in decisions:
        served[d.model] = served.get(d.model, 0) + 1
    assert served == r["choices"]                       # the router as served is the one measured
    dis = B.disagreement(c)
    assert r["disagree"] == int(dis.sum()) and 0 < r["disagree"] < len(rows)


@pytest.mark.slow
def test_draw_splits_by_category_holds_whole_categories_out(db_copy):
    con = duckdb.connect(str(db_copy), read_only=True)
    cats = [c for (c,) in con.execute("SELECT category FROM queries GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT 2")
            .fetchall()]
    versions_before = con.execute("SELECT count(*) FROM embedding_versions").fetchone()[0]
    con.close()
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "draw-splits", "--by", "category", "--test-categories",
                                   ",".join(cats), "--seed", "3", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["by"] == "category" and out["test_categories"] == sorted(cats) and out["changed"] > 0
    con = duckdb.connect(str(db_copy), read_only=True)
    rows = con.execute("""SELECT coalesce(q.category, ''), s.split, count(*) FROM queries q
                          LEFT JOIN query_splits s ON s.query_id = q.id GROUP BY ALL""").fetchall()
    by_cat: dict[str, dict[str, int]] = {}
    for c, s, n in rows:
        by_cat.setdefault(c, {})[s] = n
    for c, splits in by_cat.items():
        if c in cats:
            assert set(splits) == {"test"}, (c, splits)          # the whole category, and only as test
        else:
            assert "test" not in splits and None not in splits, (c, splits)
    n_val = sum(s.get("val", 0) for c, s in by_cat.items() if c not in cats)
    n_rest = sum(sum(s.values()) for c, s in by_cat.items() if c not in cats)
    assert abs(n_val - round(0.1 * n_rest)) <= 1
    assert out["drawn"] == {"train": n_rest - n_val, "val": n_val, "test": sum(by_cat[c]["test"] for c in cats)}
    # held-out queries never reach the encoder: every model was re-embedded without them
    leaked = con.execute("""SELECT count(*) FROM embedding_versions v WHERE v.id IN (
                              SELECT max(id) FROM embedding_versions GROUP BY model_id) AND v.n_evaluations > (
                              SELECT count(DISTINCT e.query_id) FROM evaluations e JOIN query_splits s
                              ON s.query_id = e.query_id WHERE e.model_id = v.model_id AND s.split <> 'test')""")
    assert leaked.fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM embedding_versions").fetchone()[0] > versions_before
    con.close()
    # the report on that split: routing on categories the training never saw (their offsets come from neighbours)
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "evaluate", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert sorted(r["per_category"]) == sorted(cats) and "locus_interaction" in r["methods"]


@pytest.mark.parametrize("args, words", [
    (["--by", "category", "--test-categories", "no such thing"], "unknown category 'no such thing'"),
    (["--by", "category"], "needs the categories to hold out"),
    (["--by", "category", "--test-categories", "math", "--test", "0.2"], "takes no --test share"),
    (["--test-categories", "math"], "goes with --by category"),
])
def test_draw_splits_by_category_bad_input_is_one_line(db_copy, args, words):
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "draw-splits", *args])
    assert res.exit_code != 0 and words in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_draw_splits_cannot_hold_out_every_category(db_copy):
    con = duckdb.connect(str(db_copy), read_only=True)
    cats = [c for (c,) in con.execute("SELECT DISTINCT category FROM queries WHERE category IS NOT NULL")
            .fetchall()]
    none = con.execute("SELECT count(*) FROM queries WHERE category IS NULL").fetchone()[0]
    con.close()
    assert none == 0
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "draw-splits", "--by", "category", "--test-categories",
                                   ",".join(cats)])
    assert res.exit_code != 0 and "leaves nothing to train on" in res.output


def test_only_the_strongest_eligible_models_get_the_terms(monkeypatch):
    pred, correct, q, names, cat, b_true, sp = world(models=6)
    eligible = np.array([True, True, False, True, True, True])
    monkeypatch.setattr(I, "MAX_MODELS", 3)
    rows = I.contenders(correct, sp["train"], sp["val"], eligible)
    ref = np.concatenate([sp["train"], sp["val"]])
    acc = (correct[:, ref] == 1).mean(1)
    assert list(rows) == sorted(np.argsort(-np.where(eligible, acc, -1))[:3].tolist())
    fitted = I.fit(pred[rows], correct, q, list(names), sp["train"], sp["val"], rows=rows)
    te = sp["test"]
    routed = fitted.scores(pred[:, te], q[te], fitted.category_index(names[te]))
    others = np.setdiff1d(np.arange(6), rows)
    assert np.array_equal(routed[others], pred[others][:, te])          # the rest keep the predictor's logit
    assert not np.allclose(routed[rows], pred[rows][:, te])


def test_with_no_model_to_route_to_the_terms_are_empty():
    pred, correct, q, names, cat, _, sp = world()
    fitted = I.fit(pred[:0], correct, q, list(names), sp["train"], sp["val"], rows=np.array([], dtype=np.int64))
    te = sp["test"]
    assert len(fitted.rows) == 0 and fitted.selection["models"] == 0
    assert np.array_equal(fitted.scores(pred[:, te], q[te], fitted.category_index(names[te])), pred[:, te])


def test_served_scores_from_remembered_neighbours_equal_a_fresh_search():
    """A served text's nearest reference queries are kept by content hash: scores from the kept ones, in any batch
    and with or without a known category, are the scores of a fresh search."""
    pred, correct, q, names, cat, _, sp = world(planted=False, local=True, seed=5)
    fitted = I.fit(pred, correct, q, list(names), sp["train"], sp["val"])
    assert fitted.w > 0 and fitted.k > 1
    te = sp["test"][:40]
    hashes = [f"h{i}" for i in te]
    served = Served(fitted, {h: names[i] for h, i in zip(hashes[:20], te[:20])})   # half with a category
    cats = fitted.category_index([names[i] if j < 20 else None for j, i in enumerate(te)])
    fresh = fitted.scores(pred[:, te], q[te], cats)
    first = served.scores(pred[:, te], q[te], hashes)                     # searched, then kept
    assert len(served.nearest) == 40
    again = served.scores(pred[:, te[::-1]], q[te[::-1]], hashes[::-1])   # every one kept, another order
    assert np.array_equal(first, fresh) and np.array_equal(again, fresh[:, ::-1])
    # a kept row is what is used: a wrong one changes the answer (the test could fail)
    served.nearest[hashes[25]] = served.nearest[hashes[0]]
    assert not np.array_equal(served.scores(pred[:, te], q[te], hashes)[:, 25], fresh[:, 25])


def test_the_smoothed_setting_follows_a_clear_leader_and_averages_what_val_cannot_tell_apart():
    grid = [(a, k, w) for a in I.GRID_A for k in I.GRID_K for w in I.GRID_W
            if not (w == 0 and k != I.GRID_K[0])]
    lead = (1.5, 100, 0.5)
    clear = {s: 0.80 if s == lead else 0.70 for s in grid}
    assert I.smoothed_setting(clear, n_val=5000) == lead      # 0.1 is 17 SE: the leader alone
    even = {s: 0.70 for s in grid}
    a, k, w = I.smoothed_setting(even, n_val=100)
    assert a == pytest.approx(np.mean(I.GRID_A)) and k == 50   # every setting alike: the grid's middle
    assert w == pytest.approx(np.mean([s[2] for s in grid]), abs=1e-4)
    # the same small lead on a small val split moves the choice only part of the way to it
    near = {s: 0.71 if s == lead else 0.70 for s in grid}
    a_small, _, _ = I.smoothed_setting(near, n_val=100)
    assert np.mean(I.GRID_A) < a_small < 1.5
