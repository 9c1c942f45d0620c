"""The OpenAPI document is the contract the server keeps: schemathesis (`--checks all`: declared statuses, error
shapes, headers, schema-valid requests accepted, invalid ones refused, the token honoured, 405 with Allow) against a
real `registry serve --token` on the default registry (every model, question and evaluation of the shared data),
with and without the token; and the document itself: the error shape, the codes, the security scheme."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from registry import Registry
from registry.serve.app import create_app

from .conftest import start_server

TOKEN = "c0ntract"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES, SEED = 20, 20261203      # bounded and fixed: a run takes about a minute and finds the same cases
# the documented 502 / 504 of the operations that call an upstream are not the server's own errors (bench/
# probe_contract.py runs 100 examples per operation with the same settings)
CONFIG = Path(__file__).with_name("schemathesis.toml")


@pytest.fixture(scope="module")
def default_registry(tmp_path_factory, mmlu_dir) -> Path:
    """The default registry (`bin/build-default`'s import: 31 models, 12,032 questions) in a tmp folder."""
    path = tmp_path_factory.mktemp("default") / "registry.duckdb"
    with Registry(path) as reg:
        reg.import_files(directory=str(mmlu_dir))
    return path


@pytest.fixture(scope="module")
def served(default_registry, tmp_path_factory):
    db = tmp_path_factory.mktemp("served") / "registry.duckdb"
    shutil.copy(default_registry, db)
    proc, origin = start_server(db, TOKEN)
    # the first new text loads MiniLM (seconds on a busy machine): once here, not inside schemathesis's 10 s limit
    assert httpx.post(f"{origin}/route", json={"text": "warm up the text encoder"}, timeout=120).status_code == 200
    yield origin
    proc.terminate()
    proc.wait(timeout=30)


def schemathesis(origin: str, *args: str, examples: int = EXAMPLES) -> tuple[int, str]:
    """schemathesis's own CLI on the server's document: (exit status, output)."""
    cmd = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG), "run", f"{origin}/openapi.json",
           "--checks", "all",
           "--max-examples", str(examples), "--seed", str(SEED), "--workers", "1", "--request-timeout", "60",
           "--no-color", *args]
    try:
        with tempfile.TemporaryDirectory() as cwd:      # (its run cache goes there, not into the checkout)
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=cwd)
    except FileNotFoundError:
        pytest.fail("schemathesis is missing: pip install -e '.[contract]'")
    return out.returncode, out.stdout + out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("who", ["with the token", "without it"])
def test_schemathesis_finds_no_failure(served, who):
    rc, out = schemathesis(served, *(["--header", f"Authorization: Bearer {TOKEN}"] if who == "with the token"
                                     else []), examples=EXAMPLES if who == "with the token" else 5)
    cases = re.search(r"(\d+) generated, (\d+) passed", out)
    assert rc == 0 and cases, out[-6000:]
    assert int(cases[1]) > (1000 if who == "with the token" else 200)        # every operation was exercised


@pytest.mark.slow
def test_what_the_contract_promises_holds_by_hand(served):
    """A few of the promises, checked directly: an unknown query id is a 404, a request the registry cannot answer
    a 409, both with the declared shape; a wrong method names every method of the path in Allow."""
    c = httpx.Client(base_url=served, timeout=60)
    r = c.post("/models", json={"name": "m", "evaluations": [{"question_id": "no-such-id", "correct": 1}]},
               headers=AUTH)
    assert r.status_code == 404 and set(r.json()) == {"detail"} and "unknown query id" in r.json()["detail"]
    r = c.post("/route", json={"text": "What is 2 + 2?", "cost_weight": 1.0})     # no model has a price
    assert r.status_code == 409 and "needs a price" in r.json()["detail"]
    r = c.request("OPTIONS", "/models/gpt-4o-2024-05-13/evaluations")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    r = c.request("TRACE", "/v1/models")
    assert r.status_code == 405 and r.headers["allow"] == "GET" and "error" in r.json()
    r = c.post("/v1/chat/completions", params={"cost_weight": "abc"}, headers=AUTH,
               json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 422 and "cost_weight" in r.json()["error"]["message"]
    r = c.get("/log", params={"limit": 10 ** 30}, headers=AUTH)         # past DuckDB's BIGINT: no limit, not a 500
    assert r.status_code == 200
    r = c.get("/portfolio", params={"k": 2, "target": 0.99})            # both: the fewest, at most k
    assert r.status_code == 200 and len(r.json()["models"]) <= 2


def _document(db, token) -> dict:
    app = create_app(str(db), token=token)
    try:
        return app.openapi()
    finally:        # (what the app's lifespan closes; no server runs here)
        app.state.server.serving.close()
        app.state.server.registry.close()


@pytest.mark.slow
def test_the_document_declares_each_error_with_its_shape(db_copy):
    doc = _document(db_copy, TOKEN)
    assert "HTTPValidationError" not in json.dumps(doc)       # FastAPI's list of problems, which is never sent
    ops = {(m, p): op for p, item in doc["paths"].items() for m, op in item.items()}
    for (method, path), op in ops.items():
        shape = "OpenAIError" if path.startswith("/v1/") else "Error"
        errors = {code: r for code, r in op["responses"].items() if code >= "400"}
        assert {"400", "413", "421", "422", "500"} <= set(errors), (method, path)
        for r in errors.values():
            assert r["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{shape}"}
        assert not any(p["name"].lower() == "authorization" for p in op.get("parameters", ()))
    assert ops["post", "/models"]["security"] == [{"bearer": []}] and "401" in ops["post", "/models"]["responses"]
    assert ops["get", "/log"]["security"] == [{"bearer": []}]
    assert ops["post", "/route"]["security"] == [{}, {"bearer": []}]          # optional: a text is then not logged
    assert "security" not in ops["get", "/models"] and "401" not in ops["get", "/models"]["responses"]
    assert {"404", "502", "504"} <= set(ops["post", "/v1/chat/completions"]["responses"])
    body = doc["components"]["schemas"]["ChatRequest"]
    assert body["required"] == ["model", "messages"] and body["properties"]["messages"]["minItems"] == 1


def test_without_a_token_nothing_asks_for_one(db_copy):
    doc = _document(db_copy, None)
    assert "securitySchemes" not in doc["components"]
    assert not any("security" in op or "401" in op["responses"] for item in doc["paths"].values()
                   for op in item.values())


def test_a_portfolio_with_k_and_a_target_holds_at_most_k(db_copy):
    with Registry(db_copy) as reg:
        alone = reg.portfolio(target=1.0, method="kmedoids")
        both = reg.portfolio(len(alone.models) - 1, target=1.0, method="kmedoids")
    assert len(alone.models) > 2 and len(both.models) == len(alone.models) - 1
    assert f"no portfolio of at most {len(both.models)} eligible models reaches 1" in both.note
