"""Papercuts of the real-world-mess issue: a portfolio's routing gains and one default method; the proxy's errors in
the OpenAI shape and an honest routing log; endpoints over HTTP and a lock message naming its holder; case-blind
model order, distinct family colours, a map that shows structure, import batch ids and left-out models."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from registry import Registry
from registry.cli import cli
from registry.serve.app import create_app


def run(db, *args):
    return CliRunner().invoke(cli, ["--db", str(db), *map(str, args)], catch_exceptions=False)


def run_json(db, *args):
    res = run(db, *args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


# --- portfolio -------------------------------------------------------------------------------------------------

def test_routing_portfolio_says_each_members_gain_and_stops_when_none_adds_anything():
    from registry.answers import portfolio

    value = np.array([[0.9, 0.1, 0.5], [0.2, 0.8, 0.5], [0.1, 0.1, 0.4], [0.0, 0.0, 0.1]])
    everyone = np.ones(4, bool)
    none = np.array([], int)
    assert portfolio.routing_members(value, 4, everyone, none, fill=False) == [0, 1]   # 2 and 3 never chosen
    assert portfolio.routing_members(value, 4, everyone, none, fill=True) == [0, 1, 2, 3]
    gains = portfolio.routing_gains(value, [0, 1, 2])
    assert gains == pytest.approx([0.5, (0.8 - 0.1) / 3, 0.0])


def test_portfolio_defaults_to_routing_with_gains_on_the_cli_and_over_http(db_copy):
    p = run_json(db_copy, "portfolio", "-k", 6)
    assert p["method"] == "routing"                                    # one default: the CLI's -k, as the page
    assert set(p["gains"]) == set(p["models"]) and all(g > 0 for g in p["gains"].values())
    assert len(p["models"]) == p["k"] <= 6
    filled = run_json(db_copy, "portfolio", "-k", 6, "--fill")
    assert filled["k"] == 6 and filled["models"][:p["k"]] == p["models"]
    if p["k"] < 6:
        assert "stopped at" in p["note"] and min(list(filled["gains"].values())[p["k"]:]) <= 1e-9
    text = run(db_copy, "portfolio", "-k", 6)
    assert text.exit_code == 0 and "routing gain" in text.output.splitlines()[2 if p["note"] else 1]
    covering = run_json(db_copy, "portfolio", "-k", 3, "--method", "kmedoids")
    assert covering["gains"] is None and covering["k"] == 3
    with TestClient(create_app(str(db_copy))) as c:
        got = c.get("/portfolio", params={"k": 6}).json()
        assert got["method"] == "routing" and got["models"] == p["models"] and got["gains"] == p["gains"]
        assert c.get("/portfolio", params={"k": 6, "fill": True}).json()["models"] == filled["models"]
        page = c.get("/ui/portfolio", params={"k": 6}).text
        assert "routing gain" in page and 'value="routing" selected' in page
