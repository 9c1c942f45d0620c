"""Portfolios: each member's routing gain, stopping when none adds anything; routing is the default method on
the command line and over HTTP."""
from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from registry.serve.app import create_app
from tests.helpers import run, run_json


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
    # (after the size line, the routing accuracy line and the note)
    assert text.exit_code == 0 and "routing gain" in text.output.splitlines()[3 if p["note"] else 2]
    covering = run_json(db_copy, "portfolio", "-k", 3, "--method", "kmedoids")
    assert covering["gains"] is None and covering["k"] == 3
    with TestClient(create_app(str(db_copy))) as c:
        got = c.get("/portfolio", params={"k": 6}).json()
        assert got["method"] == "routing" and got["models"] == p["models"] and got["gains"] == p["gains"]
        assert c.get("/portfolio", params={"k": 6, "fill": True}).json()["models"] == filled["models"]
        page = c.get("/ui/portfolio", params={"k": 6}).text
        assert "routing gain" in page and 'value="routing" selected' in page
