"""Probation: a model embedded from little evidence is on probation (configurable minimum), never takes over
routing, is neither a substitute nor a portfolio member, and an unembedded model is told what would embed it."""
from __future__ import annotations

import json

import numpy as np

from registry import Registry, RouteOptions
from tests.helpers import invented, results_of, run, write_rows

Q = "What is the derivative of x^2 with respect to x?"


def known_text(db) -> str:
    """A query text the registry already holds: routed from its stored vector, without MiniLM."""
    with Registry(db) as reg, reg.store.tx() as tx:
        return tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]


def test_a_low_evidence_model_is_on_probation_and_never_takes_over(db_copy, small_data, tmp_path):
    with Registry(db_copy) as reg:
        before = reg.evaluate("test", baselines=False)
        r = reg.register("invented-strong", str(invented(small_data, tmp_path)))
        assert r.status == "probation" and r.version is not None and "on probation" in r.warning
        info = {m.name: m for m in reg.models()}
        assert info["invented-strong"].status == "probation"
        assert info["gpt-4o-2024-05-13"].status == "established"
        assert reg.show("invented-strong").status == "probation"
        with reg.store.tx() as tx:
            texts = [t for (t,) in tx.sql("SELECT text FROM queries ORDER BY id LIMIT 40")]
        decisions = reg.route_batch(texts, RouteOptions(log=False))
        assert all(d.model != "invented-strong" for d in decisions)
        cand = next(c for c in decisions[0].candidates if c.model == "invented-strong")
        assert cand.probation and cand.embedded_from < 64
        # its own prediction is pulled toward the pool's: its evidence is thin
        pool = np.mean([c.raw_prob for c in decisions[0].candidates if not c.probation])
        assert abs(cand.prob - pool) < abs(cand.raw_prob - pool)
        assert "probation" in decisions[0].note
        # asked for explicitly, it may be chosen
        asked = reg.route_batch(texts, RouteOptions(log=False, include_probation=True))
        assert any(d.model == "invented-strong" for d in asked)
        after = reg.evaluate("test", baselines=False)
    assert after.methods["locus"]["hit@1"] == before.methods["locus"]["hit@1"]
    assert "invented-strong" in after.probation and "invented-strong" not in after.choices
    out = run(db_copy, "models")
    line = next(ln for ln in out.output.splitlines() if ln.startswith("invented-strong"))
    assert "probation" in line
    out = run(db_copy, "evaluate", "--no-baselines")
    assert "invented-strong: on probation" in out.output and "routing chooses:" in out.output


def test_the_probation_minimum_is_configurable(db_copy, small_data, tmp_path):
    Q = known_text(db_copy)
    with Registry(db_copy, probation_min=10) as reg:
        reg.register("invented-strong", str(invented(small_data, tmp_path)))
        assert {m.name: m.status for m in reg.models()}["invented-strong"] == "established"
    r = run(db_copy, "--probation-min", "1000", "route", Q)
    assert r.exit_code == 1 and "every model is on probation" in r.output and "--probation-min" in r.output
    assert run(db_copy, "--probation-min", "1000", "route", Q, "--include-probation").exit_code == 0


def test_models_on_probation_are_neither_substitutes_nor_portfolio_members(db_copy, small_data, tmp_path):
    """Routing never chooses a model known from 60 answers; a fallback chain or a portfolio should not either,
    unless asked (--include-probation)."""
    with Registry(db_copy) as reg:
        pool_before = reg.portfolio(target=0.99).pool_accuracy
    # (made-up answers: a copy of a registered model's would be recorded as its alias, one model with it)
    few = invented(small_data, tmp_path, n=60)
    assert run(db_copy, "register", "g-few", "--evals", str(few)).exit_code == 0
    with Registry(db_copy) as reg:                      # the pool routing is scored on is what routing may choose
        assert reg.portfolio(target=0.99).pool_accuracy == pool_before
    out = json.loads(run(db_copy, "fallback", "--all", "-k", "5", "--json").output)
    assert out["probation"] == ["g-few"] and "g-few" in out["chains"]          # it has substitutes of its own
    assert not any(link["model"] == "g-few" for links in out["chains"].values() for link in links)
    allowed = json.loads(run(db_copy, "fallback", "--all", "-k", "5", "--include-probation", "--json").output)
    assert allowed["probation"] == [] and any(link["model"] == "g-few" for links in allowed["chains"].values()
                                              for link in links)
    one = run(db_copy, "fallback", "gpt-4o-2024-05-13", "-k", "30")
    assert one.exit_code == 0 and "g-few" not in one.output.split("skipped")[0] and "on probation" in one.output
    with Registry(db_copy) as reg:
        n = len(reg.models())
        p = reg.portfolio(k=n - 1)                                              # every established model
        assert "g-few" not in p.models and "probation" in p.note
        assert any("g-few" in cl for cl in p.clusters.values())                 # still covered
        assert "g-few" in reg.portfolio(k=n, include_probation=True, fill=True).models
        assert "g-few" in reg.portfolio(k=3, require=["g-few"]).models          # required wins
    plan = json.loads(run(db_copy, "fingerprint", "--plan", "-n", "8", "--json").output)
    assert plan["left_out"] == ["g-few"] and "g-few" not in plan["candidates"]
    named = json.loads(run(db_copy, "fingerprint", "--plan", "-n", "8", "--candidates", "g-few,gpt-4o-2024-05-13",
                           "--json").output)
    assert named["candidates"] == ["g-few", "gpt-4o-2024-05-13"] and named["left_out"] == []
    # similar answers for it, and of it, but says how surely it is placed
    own = run(db_copy, "similar", "g-few")
    assert own.exit_code == 0 and "evaluations (on probation below 64)" in own.output, own.output
    out = json.loads(run(db_copy, "similar", "gpt-4o-2024-05-13", "-k", "40", "--json").output)
    few = [x for x in out["neighbours"] if x["model"] == "g-few"]
    assert few and few[0]["embedded_from"] < 60 and "on probation" in out["note"] and "g-few" in out["note"]
    assert all(x["embedded_from"] >= 64 for x in out["neighbours"] if x["model"] != "g-few")


def test_an_unembedded_model_is_told_what_would_embed_it(db_copy, small_data, tmp_path):
    f = write_rows(tmp_path / "three.csv", results_of(small_data, "gpt-4o-2024-05-13")[:3])
    assert run(db_copy, "register", "three", "--evals", str(f)).exit_code == 0
    out = run(db_copy, "similar", "three")
    assert out.exit_code == 1 and "evaluations outside the test split, and at least 32 are needed" in out.output
    assert "registry onboard" not in out.output, out.output


def test_probation_left_out_of_a_portfolio_is_said_when_k_is_too_large(db_copy, small_data, tmp_path):
    # (made-up answers: a copy of a registered model's would be recorded as its alias, one model with it)
    few = invented(small_data, tmp_path, n=60)
    assert run(db_copy, "register", "g-few", "--evals", str(few)).exit_code == 0
    with Registry(db_copy) as reg:
        n = len(reg.models())
    out = run(db_copy, "portfolio", "-k", str(n))
    assert out.exit_code == 1 and "1 on probation" in out.output and "--include-probation" in out.output, out.output
    assert run(db_copy, "portfolio", "-k", str(n), "--include-probation").exit_code == 0
