"""The policy routing serves, on a real registry copy: the cost term in any unit of price (the same routes and frontier
for prices x1 and x1e6), the frontier's cost of reaching 95% and 99% of the best model's accuracy, and the served
policy chosen on val among the predictor with interaction and the simple routers."""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from registry import Registry, RouteOptions
from registry.cli import cli


def _price(reg, path, scale: float) -> None:
    """Every model priced by its size (a real spread of prices), times scale."""
    rows = [(m.name, (m.params_b or 10.0) * scale) for m in reg.models()]
    path.write_text("model,cost\n" + "".join(f"{n},{c!r}\n" for n, c in rows))
    reg.import_files(models=str(path))


def _texts(reg, n=40) -> list[str]:
    with reg.store.tx() as tx:
        return [r[0] for r in tx.sql("SELECT text FROM queries ORDER BY id LIMIT ?", [n])]


def test_cost_weight_routes_the_same_in_any_unit_of_price(db_copy, tmp_path):
    """Prices per query and per million queries (x1e6) give the same routes at every cost weight and the same
    frontier; before, a weight of 0.05 moved nothing at one scale and everything at the other."""
    routes, fronts = {}, {}
    for scale in (1.0, 1e6):
        path = tmp_path / f"copy{scale:g}.duckdb"
        path.write_bytes(db_copy.read_bytes())
        with Registry(path) as reg:
            _price(reg, tmp_path / f"prices{scale:g}.csv", scale)
            texts = _texts(reg)
            routes[scale] = {w: [d.model for d in reg.route_batch(texts, RouteOptions(cost_weight=w, log=False))]
                             for w in (0.0, 0.05, 0.3, 1.0, 1e4)}
            fronts[scale] = reg.frontier(split="test", cost_by="cost")
    assert routes[1.0] == routes[1e6]
    # the weights move the choice: the sweep spans the trade-off at either scale
    assert routes[1.0][0.0] != routes[1.0][1e4]
    a, b = fronts[1.0], fronts[1e6]
    assert [(p.label, p.accuracy) for p in a.router] == [(p.label, p.accuracy) for p in b.router]
    assert [p.models_used for p in a.router] == [p.models_used for p in b.router]
    # from plain routing to the cheapest model everywhere
    assert a.router[-1].mean_cost == min(p.mean_cost for p in a.single)
    assert a.router[0].accuracy > a.router[-1].accuracy


def test_frontier_reports_the_cost_of_reaching_95_and_99_percent(db_copy, tmp_path):
    with Registry(db_copy) as reg:
        _price(reg, tmp_path / "prices.csv", 1e-4)
        f = reg.frontier(split="test", cost_by="cost")
    assert set(f.reach) == {"0.95", "0.99"}
    best = f.best_single
    for share, r in f.reach.items():
        assert r["target_accuracy"] == round(float(share) * best.accuracy, 4)
        for kind, points in (("router", f.router), ("single", f.single)):
            reaching = [p for p in points if p.accuracy >= float(share) * best.accuracy]
            got = r[kind]
            if not reaching:                    # (17 test queries here: the router may fall short)
                assert got is None and kind == "router"
                continue
            assert got["mean_cost"] == min(p.mean_cost for p in reaching)
            assert got["cost_ratio"] == pytest.approx(got["mean_cost"] / best.mean_cost, abs=1e-4)
    # the best model reaches 99% of itself: the cheapest single model reaching it costs at most as much
    assert f.reach["0.99"]["single"]["cost_ratio"] <= 1.0
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "route", "--frontier", "--cost-by", "cost", "--out",
                                 str(tmp_path / "f.png")])
    assert r.exit_code == 0, r.output
    assert "reaching 95% of" in r.output and "reaching 99% of" in r.output


def test_relative_cost_is_unit_free():
    from registry.routing.choice import relative_cost

    c = np.array([0.005, 0.00033, 0.00008, 7.0])
    elig = np.array([True, True, True, False])
    assert np.allclose(relative_cost(c, elig), relative_cost(c * 1e6, elig))
    assert relative_cost(c, elig)[:3].tolist() == pytest.approx([1.0, (0.00033 - 0.00008) / (0.005 - 0.00008), 0.0])
    assert relative_cost(np.array([2.0, 2.0]), np.array([True, True])).tolist() == [0.0, 0.0]


def test_evaluate_shows_progress_per_method_on_stderr_only(db_copy):
    import json

    r = CliRunner().invoke(cli, ["--db", str(db_copy), "evaluate", "--split", "test"])
    assert r.exit_code == 0, r.output
    for i, method in enumerate(("locus", "locus_interaction", "served", "best_single", "per_category", "knn", "mf",
                                "irt")):
        assert f"evaluate: {method} ({i + 1}/8, " in r.stderr
    assert "evaluate:" not in r.stdout
    j = CliRunner().invoke(cli, ["--db", str(db_copy), "evaluate", "--split", "test", "--json"])
    assert j.exit_code == 0 and "evaluate:" not in j.output and json.loads(j.stdout)["methods"]["knn"]


def _test_texts(reg) -> list[str]:
    with reg.store.tx() as tx:
        return [t for (t,) in tx.sql("""SELECT q.text FROM queries q JOIN query_splits s ON s.query_id = q.id
                                        WHERE s.split = 'test' ORDER BY q.id""")]


def _served_choices(db) -> tuple[dict, list]:
    with Registry(db) as reg:
        decisions = reg.route_batch(_test_texts(reg), RouteOptions(log=False))
    out = {}
    for d in decisions:
        out[d.model] = out.get(d.model, 0) + 1
    return out, decisions


@pytest.mark.slow
def test_the_served_policy_is_chosen_on_val_and_route_serves_what_evaluate_measured(db_copy, monkeypatch):
    """evaluate judges the predictor with interaction and the simple routers on val, reports which one routing
    serves (its `served` row, and every policy's val hit@1), and route serves exactly that one and says so."""
    import json

    from registry.routing import served

    r = json.loads(CliRunner().invoke(cli, ["--db", str(db_copy), "evaluate", "--json"]).stdout)
    val = r["served"]["val_hit"]
    assert set(val) == {"locus_interaction", "knn", "per_category", "per_source", "mf", "irt", "blend",
                        "best_single"}
    # among the others, a simple router is served only where it leads the predictor with interaction on val by
    # more than the margin; the best single model serves unless one of them beats it by its own margin
    rest = [n for n in val if n != "best_single"]
    best = max(rest, key=lambda n: (val[n], -served.CHOICES.index(n)))
    leader = best if val[best] - val["locus_interaction"] > r["served"]["margin"] else "locus_interaction"
    expected = r["served"]["policy"]
    assert best != "locus_interaction" and expected in (leader, "best_single")
    if expected == "best_single":       # (on 16 val questions nothing beats the best single model beyond the noise)
        assert val[leader] - val["best_single"] <= r["served"]["margin_single"]
    assert expected == r["methods"]["served"]["policy"]
    choices, decisions = _served_choices(db_copy)
    assert choices == r["choices"]
    assert all(d.policy.startswith(f"served policy {expected} (val hit@1: ") for d in decisions)
    # route fits on its own (models in id order) and reads the same val figures as evaluate (name order)
    figures = ", ".join(f"{n} {v:.4f}" for n, v in val.items())
    assert all(f"(val hit@1: {figures};" in d.policy for d in decisions), (figures, decisions[0].policy)
    out = CliRunner().invoke(cli, ["--db", str(db_copy), "route", _test_texts(Registry(db_copy))[0], "--no-log"])
    assert out.exit_code == 0 and f"served policy {expected}" in out.output, out.output
    text = CliRunner().invoke(cli, ["--db", str(db_copy), "evaluate"])
    assert f"served policy (routing as served, row `served`): {expected}" in text.stdout
    served_choices = choices

    # with a margin nothing can clear, the best single model is served, by evaluate and route alike
    monkeypatch.setattr(served, "MARGIN_SE", 1e6)
    r = json.loads(CliRunner().invoke(cli, ["--db", str(db_copy), "evaluate", "--json"]).stdout)
    assert r["served"]["policy"] == "best_single" and r["methods"]["served"]["n_chosen"] == 1
    choices, decisions = _served_choices(db_copy)
    assert choices == r["choices"] and len(choices) == 1 and decisions[0].policy.startswith("served policy best_single")
    assert (choices != served_choices) == (expected != "best_single")


def _irt_world(seed=0, models=12, queries=2000, dq=24):
    """Answers drawn from a two-dimensional IRT model read from the text vectors: which model is best depends on
    the query's direction, which neither its category (one for all) nor a flat predictor knows."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(queries, dq)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    a = q @ rng.normal(size=(dq, 2)) * 4
    theta = rng.normal(size=(models, 2))
    p = 1 / (1 + np.exp(-(theta @ a.T - (q @ rng.normal(size=dq)) * 2)))
    correct = (rng.random(p.shape) < p).astype(np.int8)
    correct[0, :40] = -1                                      # a missing answer or two
    idx = rng.permutation(queries)
    # val 500 queries: MF's or IRT's lead over the interaction (0.03-0.04) clears the paired margin there
    return q, correct, np.sort(idx[:1000]), np.sort(idx[1000:1500]), np.sort(idx[1500:])



def served_on_irt_world():
    """The IRT world with a flat predictor (each model's train accuracy everywhere), its interaction fitted and the
    served policy chosen: -> ((q, correct, tr, va, te), categories, flat logits, fitted, policy)."""
    from registry.locus import baselines as B
    from registry.locus import interaction
    from registry.routing import served

    world = q, correct, tr, va, te = _irt_world()
    cats = np.array(["all"] * len(q), dtype=object)
    flat = interaction.logit(np.tile(B.model_accuracy(correct[:, tr])[:, None], (1, len(q))))
    fitted = interaction.fit(flat, correct, q, cats, tr, va)
    return world, cats, flat, fitted, served.choose(fitted, correct, q, cats, None, train_idx=tr, val_idx=va)


def test_a_pair_model_is_served_where_it_wins_on_val_and_scores_the_same_after_a_carry():
    """With a flat predictor, the numpy IRT/MF pair model wins on val by more than the margin and is served; its
    scores are its own P(correct) on any query vectors; a carry onto reordered rows moves its rows along."""
    from registry.locus import baselines as B
    from registry.routing import served, served_scores

    (q, correct, tr, va, te), cats, flat, fitted, pol = served_on_irt_world()
    assert pol.name in ("mf", "irt", "blend") and pol.val[pol.name] - pol.val["locus_interaction"] > pol.margin
    assert max(pol.val["mf"], pol.val["irt"]) > max(pol.val["knn"], pol.val["locus_interaction"])
    pair = pol if pol.pair is not None else next(m for m in pol.members if m.pair is not None)
    assert pair.name == pair.pair.kind and set(pair.setting) == {"dim", "steps"} and pair.setting["steps"] > 0
    s = served_scores.scores(pol, fitted, flat[:, te], q[te], None)
    assert s.shape == (len(correct), len(te)) and np.all((s > 0) & (s < 1))
    # it routes well on test, far above the best single model
    assert B.hit_at_k(s, correct[:, te]) > B.hit_at_k(B.best_single_scores(correct, tr, te), correct[:, te]) + 0.05
    take = np.arange(len(correct))[::-1].copy()
    moved = served_scores.carried(pol, take)
    assert np.allclose(served_scores.scores(moved, fitted, flat[take][:, te], q[te], None), s[take])
    # deterministic: the same data, the same fit
    again = served.choose(fitted, correct, q, cats, None, train_idx=tr, val_idx=va)
    assert again.name == pol.name and np.array_equal(served_scores.scores(again, fitted, flat[:, te], q[te], None), s)
    # a blend is its members' mean
    if pol.members:
        parts = [served_scores.scores(m, fitted, flat[:, te], q[te], None) for m in pol.members]
        assert np.allclose(s, np.mean(parts, axis=0)) and "locus_interaction" in pol.setting["members"]
    assert served_scores.PairModel.logits(pair.pair, q[te]).shape == (len(correct), len(te))


def test_pair_models_recover_abilities_where_they_exist_and_judge_on_val():
    """A fit that is told to stop by its judge keeps the best-judged steps; MF and IRT both beat a coin on held-out
    answers of an IRT world (an untrained fit would not)."""
    from registry.routing import pairs, served

    q, correct, tr, va, te = _irt_world(seed=1)
    mean, basis = pairs.components(q[tr])
    red = lambda idx: (q[idx] - mean) @ basis  # noqa: E731
    for kind in ("mf", "irt"):
        m = pairs.fit(kind, red(tr), correct[:, tr], mean=mean, basis=basis, dim=4,
                      judge=lambda m: served.val_hit(m.logits(red(va), reduced=True), correct[:, va]))
        untrained = pairs.fit(kind, red(tr), correct[:, tr], mean=mean, basis=basis, dim=4, steps=0)
        p = 1 / (1 + np.exp(-m.logits(q[te])))
        obs = correct[:, te] >= 0
        acc = float(((p > 0.5) == (correct[:, te] == 1))[obs].mean())
        acc0 = float(((1 / (1 + np.exp(-untrained.logits(q[te]))) > 0.5) == (correct[:, te] == 1))[obs].mean())
        assert m.steps % pairs.CHECK == 0 and 0 < m.steps <= pairs.MAX_STEPS
        assert acc > 0.7 and acc > acc0 + 0.1, (kind, acc, acc0)


def test_pair_fits_do_not_depend_on_the_order_of_the_models():
    """Routing holds its models in id order, evaluate in name order: the same answers in another row order give
    the same fit, row for row (steps, val figure, logits), so both report the same val figures."""
    from registry.routing import pairs, served

    q, correct, tr, va, te = _irt_world(seed=2)
    take = np.random.default_rng(0).permutation(len(correct))
    first, moved = served._pair_candidates(correct, q, tr, va), served._pair_candidates(correct[take], q, tr, va)
    mean, basis = pairs.components(q[tr])
    for kind in ("mf", "irt"):
        assert first[kind][:2] == moved[kind][:2], kind
        assert np.allclose(first[kind][2][take], moved[kind][2], atol=1e-5), kind
        fits = [pairs.fit(kind, (q[tr] - mean) @ basis, c[:, tr], mean=mean, basis=basis, dim=4, steps=60)
                for c in (correct, correct[take])]
        assert np.allclose(fits[0].logits(q[te])[take], fits[1].logits(q[te]), atol=1e-4), kind


def test_the_gain_a_simple_router_needs_is_paired_standard_errors_of_its_val_difference():
    """The margin is MARGIN_SE standard errors of the query-by-query difference: two policies that agree on all but
    a few val queries need a small gain, two that disagree everywhere a large one."""
    from registry.routing import served

    n = 200
    correct = np.zeros((2, n), dtype=np.int8)
    correct[0, ::2] = 1                                   # model 0 right on the even queries, model 1 on the odd
    correct[1, 1::2] = 1
    always0 = np.vstack([np.ones(n), np.zeros(n)])
    few = always0.copy()
    few[:, 1:20:2] = [[0.0], [1.0]]                       # model 1 on ten odd queries: ten more right
    everywhere = always0[::-1].copy()                     # model 1 everywhere: as good, every query differs
    judged = {"locus_interaction": (served.val_hit(always0, correct), {}, always0),
              "knn": (served.val_hit(few, correct), {}, few),
              "mf": (served.val_hit(everywhere, correct), {}, everywhere)}
    assert judged["knn"][0] - judged["locus_interaction"][0] == pytest.approx(10 / n)
    diff = served.val_right(few, correct).astype(float) - served.val_right(always0, correct)
    expected = served.MARGIN_SE * diff.std(ddof=1) / np.sqrt(n)
    assert served.required_gain(judged, "knn", correct) == pytest.approx(expected)
    small, large = served.required_gain(judged, "knn", correct), served.required_gain(judged, "mf", correct)
    assert small < 10 / n < large
    # without val scores for the candidate: standard errors of a val hit@1
    judged["irt"] = (0.6, {}, None)
    assert served.required_gain(judged, "irt", correct) == pytest.approx(served.MARGIN_SE * np.sqrt(0.5 * 0.5 / n))
