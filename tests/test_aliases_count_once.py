"""Aliases as one model: a renamed copy of a model registered beside it (recorded as its alias by the registration's
same-model test) changes no figure that pools models (evaluate, routing, portfolio, fallback, "errs alike") and is
never chosen; the Every Eval Ever round trip keeps which name is the alias."""
from __future__ import annotations

import json

import pytest

from registry import Registry, RouteOptions
from tests.helpers import results_of, run, run_json, write_rows

MODEL = "gpt-4o-2024-05-13"


def figures(db, texts: list[str]) -> dict:
    """Every figure that pools the registry's models, as the command line and the library give them."""
    ev = run_json(db, "evaluate", "--split", "test")
    ev.pop("seconds", None)
    with Registry(db) as reg:
        others = [m.name for m in reg.models() if m.name not in (MODEL, f"{MODEL}-copy")][:2]
        return {"evaluate": ev, "portfolio": run_json(db, "portfolio"),
                "fallback": run_json(db, "fallback", others[0]),
                "similar": run_json(db, "similar", others[0]),
                "routes": [d.model for d in reg.route_batch(texts, RouteOptions(log=False))],
                "cheap": [d.model for d in reg.route_batch(texts, RouteOptions(log=False, cost_weight=0.5))]}


def strip_seconds(x):
    """An answer without its timings (the only thing allowed to differ between two runs)."""
    if isinstance(x, dict):
        return {k: strip_seconds(v) for k, v in x.items() if "seconds" not in k and not k.endswith("_s")}
    if isinstance(x, list):
        return [strip_seconds(v) for v in x]
    return x


@pytest.mark.slow
def test_a_renamed_copy_changes_no_figure_and_is_never_chosen(db_copy, small_data, tmp_path):
    with Registry(db_copy) as reg, reg.store.tx() as tx:
        texts = [t for (t,) in tx.sql("""SELECT q.text FROM queries q JOIN query_splits s ON s.query_id = q.id
                                         WHERE s.split = 'test' ORDER BY q.id LIMIT 60""")]
        tx.sql("UPDATE models SET cost = 10.0")              # every model priced: cost-aware routing ranks by it
    before = figures(db_copy, texts)
    copy = write_rows(tmp_path / "copy.csv", results_of(small_data, MODEL))
    out = run(db_copy, "register", f"{MODEL}-copy", "--evals", copy, "--cost", "0.01", "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["alias_of"] == MODEL                       # the same-model test named it
    after = figures(db_copy, texts)
    assert strip_seconds(after) == strip_seconds(before)
    assert f"{MODEL}-copy" not in json.dumps(after)                          # never chosen, never a candidate
    with Registry(db_copy) as reg:
        assert f"{MODEL}-copy" in {m.name for m in reg.models()}             # (still a registered name)
        assert f"{MODEL}-copy" not in reg.fingerprint_plan(n=8).candidates   # one candidate, not a pair


@pytest.mark.slow
def test_the_every_eval_ever_round_trip_keeps_which_name_is_the_alias(db_copy, small_data, tmp_path):
    copy = write_rows(tmp_path / "copy.csv", results_of(small_data, MODEL))
    assert run(db_copy, "register", f"{MODEL}-copy", "--evals", copy, "--alias-of", MODEL).exit_code == 0
    out = tmp_path / "eee"
    assert run(db_copy, "export", "--to", "eee", str(out), "--model", MODEL, "--model", f"{MODEL}-copy").exit_code == 0
    fresh = tmp_path / "fresh.duckdb"
    res = run(fresh, "import", "--from", "eee", str(out))
    assert res.exit_code == 0, res.output
    with Registry(fresh) as reg, reg.store.tx() as tx:
        from registry.answers import catalog
        assert catalog.aliases(tx).get(f"{MODEL}-copy", (None,))[0] == MODEL
        assert MODEL not in catalog.aliases(tx)


@pytest.mark.slow
def test_a_copy_registered_through_the_server_is_no_contender_once_answered(db_copy, small_data):
    """The server takes a registration's version into routing at once; when the answers say it is a copy, the alias
    is recorded and routing rebuilt without it before the registration answers: no route lists it after."""
    from fastapi.testclient import TestClient

    from registry.serve.app import create_app

    auth = {"Authorization": "Bearer t0ken"}
    rows = [{"question_id": q, "correct": c} for q, c in results_of(small_data, MODEL)]
    with Registry(db_copy) as reg, reg.store.tx() as tx:
        text = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]
    with TestClient(create_app(str(db_copy), token="t0ken")) as c:
        before = c.post("/route", json={"text": text}).json()
        r = c.post("/models", json={"name": "served-copy", "evaluations": rows}, headers=auth)
        assert r.status_code == 200 and r.json()["alias_of"] == MODEL, r.text
        after = c.post("/route", json={"text": text}).json()
        own = c.post("/models", json={"name": "served-own", "evaluations": [
            {**x, "correct": 1 - x["correct"] if i % 4 == 3 else x["correct"]} for i, x in enumerate(rows)]},
            headers=auth)
        assert own.status_code == 200 and own.json()["alias_of"] is None, own.text
        later = c.post("/route", json={"text": text}).json()
    assert "served-copy" not in {x["model"] for x in after["candidates"] + later["candidates"]}
    assert [x["model"] for x in after["candidates"]] == [x["model"] for x in before["candidates"]]
    assert "served-own" in {x["model"] for x in later["candidates"]}        # (a model of its own is one)
