"""What route chooses and prints: coverage of unscored choices, a Pareto frontier, fallback honouring
mark-unavailable, the chosen model in the table, known texts routed without MiniLM, a portfolio's scoring rule."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from registry import Registry, RouteOptions
from tests.helpers import run

Q = "What is the derivative of x^2 with respect to x?"


def known_text(db) -> str:
    """A query text the registry already holds: routed from its stored vector, without MiniLM."""
    with Registry(db) as reg, reg.store.tx() as tx:
        return tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]


def test_frontier_and_evaluate_report_coverage(db_copy):
    with Registry(db_copy) as reg:
        with reg.store.tx() as tx:   # make one model lack results for half the test queries
            victim = tx.sql("SELECT id FROM models WHERE name = 'Llama-2-70b-hf'")[0][0]
            tx.sql(f"""DELETE FROM evaluations WHERE model_id = {victim} AND query_id IN (
                         SELECT query_id FROM query_splits WHERE split = 'test' ORDER BY query_id
                         LIMIT (SELECT count(*) // 2 FROM query_splits WHERE split = 'test'))""")
            n, right = tx.sql(f"""SELECT count(*), sum(e.correct::INT) FROM evaluations e
                                   JOIN query_splits s ON s.query_id = e.query_id
                                   WHERE s.split = 'test' AND e.model_id = {victim}""")[0]
        f = reg.frontier(split="test")
        p = next(x for x in f.single if x.label == "Llama-2-70b-hf")
        assert p.scored == n < f.queries and p.coverage == round(n / f.queries, 4)
        assert p.scored_accuracy == pytest.approx(right / n)
        # evaluate's rule (issue 51): where it has no result another model with one answers, never counted wrong
        assert p.accuracy > right / f.queries and p.models_used > 1
        assert any("Llama-2-70b-hf has results for" in n for n in f.notes)
        report = reg.evaluate("test", baselines=False)
        locus = report.methods["locus"]
        assert 0 < locus["scored"] <= report.queries and "hit@1_scored" in locus and "coverage" in locus
    out = run(db_copy, "route", "--frontier", "--out", str(db_copy.parent / "f.png"))
    assert out.exit_code == 0 and "on its own results" in out.output and "Pareto frontier" in out.output


def test_fallback_skips_models_marked_unavailable(db_copy):
    with Registry(db_copy) as reg:
        chain = [link.model for link in reg.fallback("gpt-4o-2024-05-13").chain]
        reg.mark_unavailable([chain[0]])
        after = reg.fallback("gpt-4o-2024-05-13")
        assert chain[0] not in [link.model for link in after.chain] and after.unavailable == [chain[0]]
        every = reg.fallback_all()
        assert all(chain[0] not in [link.model for link in links] for links in every.chains.values())
        assert {m.name: m.available for m in reg.models()}[chain[0]] is False
        assert reg.show(chain[0]).available is False
    out = run(db_copy, "show", chain[0])
    assert "available: no" in out.output
    assert "skipped as unavailable" in run(db_copy, "fallback", "gpt-4o-2024-05-13").output


def test_min_prob_choice_is_in_the_table(db_copy):
    Q = known_text(db_copy)
    with Registry(db_copy) as reg:
        d = reg.route(Q, RouteOptions(log=False))
    sized = sorted((c for c in d.candidates if c.params_b is not None), key=lambda c: c.prob)
    out = run(db_copy, "route", Q, "--min-prob", f"{sized[0].prob:.6f}", "--cost-by", "params", "--top", "1")
    assert out.exit_code == 0, out.output
    chosen = out.output.splitlines()[0].split()[0]
    lines = out.output.splitlines()
    assert any(ln.startswith("*") and chosen in ln for ln in lines)
    header = next(ln for ln in lines if "candidate" in ln)
    assert header.split() == ["candidate", "P(correct)", "own", "P", "embedded", "from", "cost", "params_b", "status"]


def test_frontier_pareto_is_non_dominated(db_copy):
    with Registry(db_copy) as reg:
        f = reg.frontier(split="test")
    front = f.pareto
    assert front and all(a.mean_cost < b.mean_cost and a.accuracy < b.accuracy for a, b in zip(front, front[1:]))
    for p in f.router + f.single:     # every point is on the frontier or beaten by a point of it
        assert any(q.mean_cost <= p.mean_cost and q.accuracy >= p.accuracy for q in front)


@pytest.mark.slow
def test_known_text_routes_without_loading_minilm(db_copy):
    code = ("import sys; from registry import Registry; from registry.locus import text_encoder; "
            "r = Registry(sys.argv[1]); d = r.route(sys.argv[2]); r.close(); "
            "print(d.model, bool(text_encoder.loaded()))")     # MiniLM on either backend
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}

    def route(text):
        out = subprocess.run([sys.executable, "-c", code, str(db_copy), text], capture_output=True, text=True,
                             env=env, check=True)
        return out.stdout.split()[-1] == "True", out.stderr

    with Registry(db_copy) as reg, reg.store.tx() as tx:
        stored = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]
    assert route(stored)[0] is False                    # a registered question: its stored vector
    loaded, err = route("A brand new question about tides?")
    assert loaded is True and "Loading weights" not in err
    assert route("A brand new question about tides?")[0] is False   # routed once: its vector is kept


def test_a_portfolio_scores_a_partly_evaluated_model_by_evaluates_rule_where_it_has_no_answer():
    """Routing among a pool with a model that answered few test queries: where it has no answer, the query goes to
    the member with one (evaluate's rule; counted as wrong, a pool scored below its best member: share 1.46)."""
    from registry.routing.accuracy import SplitScores

    correct = np.array([[1, 0, 1, 1], [-1, -1, 1, -1]], dtype=np.int8)      # model 1 answered one query of four
    probs = np.array([[0.6, 0.6, 0.6, 0.6], [0.9, 0.9, 0.9, 0.9]])
    s = SplitScores("test", np.arange(4), ["a", "b"], probs, correct, np.array([True, True]))
    assert s.accuracy(["a"]) == 0.75 and s.accuracy(["b"]) == 0.25
    assert s.accuracy(["a", "b"]) == s.accuracy() == 0.75          # b where it answered, a elsewhere


def test_the_listed_candidates_are_a_stable_sorts_first_n_without_sorting_all():
    """`most_likely` picks the n highest by a partition: the same rows, in the same order (ties by row), as the first
    n of a stable sort, whatever the ties and wherever the n-th falls among them."""
    from registry.routing.choice import most_likely

    rng = np.random.default_rng(7)
    for _ in range(500):
        p = rng.integers(0, 4, size=int(rng.integers(1, 40))).astype(np.float32) / 3
        n = int(rng.integers(1, 45))
        assert most_likely(p, n).tolist() == np.argsort(-p, kind="stable")[:n].tolist()
