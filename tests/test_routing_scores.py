"""One rule, one figure: `route --frontier`, the portfolio (CLI, HTTP, web page) and
`evaluate` score a routing choice by one rule (each query's choice among the models with a result for it) and show
routing as served as "routing accuracy"; the best single model is one of the served policy's candidates. Real
registry copies, real migrations, the CLI through click; each test failed before the change."""
from __future__ import annotations

import json

import numpy as np
import pytest

from registry import Registry, RouteOptions
from tests.helpers import run


def _price_everyone(reg, path) -> None:
    """Every model priced by its size: the frontier's pool is then every model routing may choose."""
    rows = [(m.name, m.params_b or 10.0) for m in reg.models()]
    path.write_text("model,cost\n" + "".join(f"{n},{c!r}\n" for n, c in rows))
    reg.import_files(models=str(path))


def _test_texts(reg) -> list[str]:
    with reg.store.tx() as tx:
        return [t for (t,) in tx.sql("""SELECT q.text FROM queries q JOIN query_splits s ON s.query_id = q.id
                                        WHERE s.split = 'test' ORDER BY q.id""")]


# --- item 2: the frontier scores every choice by evaluate's rule ------------------------------------------------
def test_the_frontier_scores_choices_without_a_result_as_evaluate_does(db_copy, tmp_path):
    """The model routing prefers most loses its test results: evaluate scores routing among the models with a
    result; the frontier counted those choices as wrong and fell below the best single model at cost weight 0."""
    with Registry(db_copy) as reg:
        _price_everyone(reg, tmp_path / "prices.csv")
        chosen = [d.model for d in reg.route_batch(_test_texts(reg), RouteOptions(log=False))]
        favourite = max(set(chosen), key=chosen.count)
        with reg.store.tx() as tx:      # its results on every other test query go
            tx.sql("""DELETE FROM evaluations WHERE model_id = (SELECT id FROM models WHERE name = ?)
                      AND query_id IN (SELECT query_id FROM query_splits WHERE split = 'test' AND query_id % 2 = 0)""",
                   [favourite])
        served = reg.evaluate("test", baselines=False).methods["served"]["hit@1"]
        f = reg.frontier(split="test", cost_by="cost")
    zero = f.router[0]
    assert zero.cost_weight == 0.0 and zero.coverage < 1          # its first choice lacks results, as set up
    assert round(zero.accuracy, 4) == served                      # one rule, one figure
    assert zero.accuracy >= zero.scored_accuracy * zero.scored / f.queries    # gaps re-chosen, never counted wrong
    fav = next(p for p in f.single if p.label == favourite)
    assert 0 < fav.scored < f.queries and any(f"{favourite} has results for {fav.scored} of" in n for n in f.notes)
    assert any("the router's first choice has no result for" in n for n in f.notes)


def test_route_frontier_and_file_write_only_where_out_says_and_in_its_format(db_copy, tmp_path, monkeypatch):
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    r = run(db_copy, "route", "--frontier")
    assert r.exit_code == 0, r.output
    assert list(work.iterdir()) == [] and "plot: none drawn" in r.output     # no frontier.png left behind
    r = run(db_copy, "route", "--frontier", "--out", "f.txt")
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1 and ".png" in r.output, r.output
    assert list(work.iterdir()) == []
    with Registry(db_copy) as reg:
        texts = _test_texts(reg)[:5]
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    r = run(db_copy, "route", "--file", str(q), "--out", "r.txt", "--no-log")
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, r.output
    assert "r.txt" in r.output and ".jsonl or .csv" in r.output and list(work.iterdir()) == []
    r = run(db_copy, "route", "--file", str(q), "--out", "r.csv", "--no-log")
    assert r.exit_code == 0, r.output
    assert r.stderr == ""                                             # no stray progress label
    raw = (work / "r.csv").read_bytes()
    assert b"\r" not in raw and raw.count(b"\n") == len(texts) + 1
    assert raw.splitlines()[0] == b"id,model,fallback,prob,encoder"
    assert run(db_copy, "route", texts[0], "--out", "x.jsonl").exit_code == 2   # --out goes with --file/--frontier


# --- item 3: routing accuracy is routing as served, one figure, one default k ------------------------------------
def test_routing_accuracy_is_routing_as_served_on_every_page_and_command(db_copy):
    from fastapi.testclient import TestClient

    from registry.answers import portfolio
    from registry.serve.app import create_app

    with Registry(db_copy) as reg:
        served = reg.evaluate("test", baselines=False).methods["served"]["hit@1"]
        p = reg.portfolio(target=0.99)
        f = reg.frontier(split="test", cost_by="params")
    assert p.pool_accuracy == served
    out = run(db_copy, "portfolio", "--target", "0.99")
    assert out.exit_code == 0 and f"of the pool's {served:.4f}" in out.output, out.output
    assert portfolio.DEFAULT_K == 5
    with TestClient(create_app(str(db_copy))) as c:
        page = c.get("/ui/portfolio").text
        assert f'value="{portfolio.DEFAULT_K}"' in page                   # the CLI's and HTTP's default k
        assert f"the whole pool's {served:.4f}" in page and "routing accuracy" in page
        assert c.get("/portfolio").json()["k"] == len(json.loads(run(db_copy, "portfolio", "--json").output)
                                                      ["models"])
    bare = json.loads(run(db_copy, "portfolio", "--json").output)
    assert bare["method"] == "routing" and bare["k"] <= portfolio.DEFAULT_K
    assert f.router and f.best_single is not None


# --- item 5: the best single model is a candidate of the served policy -------------------------------------------
def _one_strong_model(seed=0, models=8, queries=1500, dq=16):
    """One model right 96% of the time, the others far below it and unrelated to the query: nothing routes better
    than always choosing it, and every router ties it on val."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(queries, dq)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    rate = np.r_[0.96, rng.uniform(0.4, 0.7, models - 1)]
    correct = (rng.random((models, queries)) < rate[:, None]).astype(np.int8)
    idx = rng.permutation(queries)
    return q, correct, np.sort(idx[:900]), np.sort(idx[900:1200]), np.sort(idx[1200:])


def test_the_best_single_model_serves_where_no_other_policy_beats_it_on_val():
    from registry.locus import baselines as B
    from registry.locus import interaction
    from registry.routing import served, served_scores

    q, correct, tr, va, te = _one_strong_model()
    cats = np.array([f"c{i % 3}" for i in range(len(q))], dtype=object)
    flat = interaction.logit(np.tile(B.model_accuracy(correct[:, tr])[:, None], (1, len(q))))
    fitted = interaction.fit(flat, correct, q, cats, tr, va)
    pol = served.choose(fitted, correct, q, cats, None, train_idx=tr, val_idx=va)
    assert pol.name == "best_single" and "best_single" in pol.val
    assert not any(v - pol.val["best_single"] > pol.margin_single for n, v in pol.val.items() if n != "best_single")
    assert "served policy best_single (val hit@1: " in pol.describe()
    s = served_scores.scores(pol, fitted, flat[:, te], q[te], None)
    assert s.shape == (len(correct), len(te)) and np.all(np.argmax(s, axis=0) == 0)     # the strong model
    # its P-like score: the train accuracy that chose it on val, as evaluate's best single model ranks models
    assert np.allclose(s[:, 0], served.accuracy(correct[:, tr]))
    assert np.argmax(s[:, 0]) == np.argmax(B.best_single_scores(correct, tr, te)[:, 0])
    moved = served_scores.carried(pol, np.arange(len(correct))[::-1].copy())
    assert np.allclose(served_scores.scores(moved, fitted, flat[::-1][:, te], q[te], None), s[::-1])
    assert "best_single" not in _blend(pol)


def _blend(pol) -> list[str]:
    return list(pol.setting.get("members", []))


def test_a_policy_that_beats_the_best_single_model_beyond_its_margin_still_serves():
    """Where a pair model wins on val by more than its margin over the best single model too, the rule among the
    others stands (test_served_policy's IRT world)."""
    from .test_served_policy import served_on_irt_world

    pol = served_on_irt_world()[-1]
    assert pol.name in ("mf", "irt", "blend") and pol.val[pol.name] - pol.val["best_single"] > pol.margin_single


@pytest.mark.slow
def test_route_and_evaluate_serve_the_best_single_model_where_it_leads(db_copy, small_data, tmp_path):
    """A registry whose strongest model is right on 96% of its questions: evaluate and route serve it, and say so."""
    import duckdb

    strong = "gpt-4o-2024-05-13"
    con = duckdb.connect()
    rows = con.execute(f"""SELECT question_id::VARCHAR, correct::INT FROM read_csv('{small_data}/evaluations.csv.gz')
                           WHERE model = ? ORDER BY question_id""", [strong]).fetchall()
    con.close()
    f = tmp_path / "strong.csv"
    f.write_text("question_id,correct\n" + "".join(f"{qid},{int(i % 25 != 0)}\n" for i, (qid, _) in enumerate(rows)))
    assert run(db_copy, "register", strong, "--evals", str(f), "--update").exit_code == 0
    report = json.loads(run(db_copy, "evaluate", "--split", "test", "--json").stdout)
    assert report["served"]["policy"] == "best_single" == report["methods"]["served"]["policy"]
    assert report["methods"]["served"]["hit@1"] >= report["methods"]["best_single"]["hit@1"]
    with Registry(db_copy) as reg:
        text = _test_texts(reg)[0]
    out = run(db_copy, "route", text, "--no-log")
    assert out.exit_code == 0 and out.stdout.startswith(strong) and "served policy best_single" in out.stdout
    text_report = run(db_copy, "evaluate", "--split", "test", "--no-baselines")
    assert f"routing accuracy (as served, row `served`): {report['methods']['served']['hit@1']:.4f}" \
        in text_report.stdout
