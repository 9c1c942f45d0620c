"""A registry one can tidy: `registry delete` and `registry rename` (answers/tidying.py), through the command line,
the library and HTTP. A deleted model leaves every list and answer while its versions stay readable; a renamed one is
named anew everywhere and keeps its history; an endpoint removed leaves no model behind."""
from __future__ import annotations

import json
import re

import pytest
from fastapi.testclient import TestClient

from registry import Registry
from registry.core.errors import Conflict, NotFound
from registry.serve.app import create_app
from tests.helpers import run, run_json

AUTH = {"authorization": "Bearer t0ken"}


def named(name: str, answer) -> bool:
    """Whether `name` appears as a whole JSON string anywhere in an answer."""
    return json.dumps(name) in json.dumps(answer, default=str)


def answers(db, model: str, text: str) -> dict:
    """What the command line answers about the registry: its list, a route, nearest models, a portfolio, a fallback."""
    return {"models": run_json(db, "models"), "route": run_json(db, "route", text, "--no-log"),
            "similar": run_json(db, "similar", model), "portfolio": run_json(db, "portfolio"),
            "fallback": run_json(db, "fallback", model)}


def two_models(db) -> tuple[str, str, str]:
    """Two established models (the first is nobody's alias) and a text the registry holds."""
    with Registry(db) as reg:
        names = [m.name for m in reg.models()]
        with reg.store.tx() as tx:
            text = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]
    return names[0], names[-1], text


@pytest.mark.slow
def test_a_deleted_model_leaves_every_answer_and_its_versions_stay(db_copy):
    gone, other, text = two_models(db_copy)
    before = answers(db_copy, other, text)
    assert named(gone, before["models"]) and named(gone, before["route"])      # (the check can see it)
    versions = run_json(db_copy, "history", gone)["versions"]
    out = run(db_copy, "delete", gone, "--reason", "retired")
    assert out.exit_code == 0 and "deleted" in out.stdout and "routing: refitting" in out.stderr, out.output
    after = answers(db_copy, other, text)
    assert not [k for k, v in after.items() if named(gone, v)], after
    kept = run_json(db_copy, "history", gone)            # its versions stay readable, and say it was deleted
    assert kept["versions"] == versions and kept["deleted"] and kept["changes"][0]["reason"] == "retired"
    with TestClient(create_app(str(db_copy), token="t0ken")) as c:
        for path in ("/models", "/v1/models", "/", f"/models/{other}/similar"):
            r = c.get(path, headers=AUTH)
            assert r.status_code == 200 and not re.search(rf"(?<![\w.@-]){re.escape(gone)}(?![\w.@-])", r.text), path
        assert c.get(f"/models/{gone}").status_code == 404
    again = run(db_copy, "delete", gone)
    assert again.exit_code == 1 and "unknown model" in again.output


@pytest.mark.slow
def test_a_renamed_model_is_named_anew_everywhere_and_keeps_its_history(db_copy):
    old, other, text = two_models(db_copy)
    versions = run_json(db_copy, "history", old)["versions"]
    assert run(db_copy, "rename", old, "renamed-model").exit_code == 0
    after = answers(db_copy, other, text)
    assert not [k for k, v in after.items() if named(old, v)]
    assert named("renamed-model", after["models"]) and named("renamed-model", after["route"])
    h = run_json(db_copy, "history", "renamed-model")
    assert h["versions"] == versions and h["changes"][0]["name"] == old and h["deleted"] is None
    with Registry(db_copy) as reg:
        with pytest.raises(Conflict):
            reg.rename("renamed-model", other)            # a name taken
        with pytest.raises(NotFound):
            reg.rename(old, "x")                         # the old name is no model now
    with TestClient(create_app(str(db_copy), token="t0ken")) as c:
        assert c.post("/models/renamed-model/rename", json={"name": "y"}).status_code == 401     # no token
        r = c.post("/models/renamed-model/rename", json={"name": old}, headers=AUTH)
        assert r.status_code == 200 and r.json()["new"] == old
        assert c.get(f"/models/{old}").status_code == 200 and c.get("/models/renamed-model").status_code == 404
        assert c.delete(f"/models/{old}").status_code == 401
        d = c.delete(f"/models/{old}", params={"reason": "over HTTP"}, headers=AUTH)
        assert d.status_code == 200 and d.json()["model"] == old
        assert not named(old, c.get("/models").json())


@pytest.mark.slow
def test_an_endpoint_removed_leaves_no_model_and_a_deleted_model_takes_its_claims(db_copy):
    model, other, _ = two_models(db_copy)
    with Registry(db_copy) as reg:
        reg.claim(model, "https://api.example.com/v1", name=f"{model}@example")
        reg.claim(other, "https://api.example.com/v1", name=f"{other}@example")
        assert {f"{model}@example", f"{other}@example"} <= {m.name for m in reg.models()}
        reg.remove_endpoint(f"{model}@example")
        assert f"{model}@example" not in {m.name for m in reg.models()}
        assert f"{model}@example" not in {e.model for e in reg.endpoints()}
        d = reg.delete(other)
        assert d.also == [f"{other}@example"]
        left = {m.name for m in reg.models()}
        assert other not in left and f"{other}@example" not in left and not reg.claims()
        assert other not in {e.model for e in reg.endpoints()}
