"""Papercuts of the real-world-mess issue: a portfolio's routing gains and one default method; the proxy's errors in
the OpenAI shape and an honest routing log; endpoints over HTTP and a lock message naming its holder; case-blind
model order, distinct family colours, a map that shows structure, import batch ids and left-out models."""
from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest
import uvicorn
from click.testing import CliRunner
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from registry.core.keys import UpstreamKeys
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


# --- the proxy ---------------------------------------------------------------------------------------------------

@pytest.fixture
def upstream():
    """A fake OpenAI upstream on loopback: answers "from <model>", or 500 for the models in `failing`."""
    app = FastAPI()
    failing: set[str] = set()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        if body["model"] in failing:
            return JSONResponse({"error": "down"}, status_code=500)
        return {"id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": f"from {body['model']}"}}]}

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", failing
    server.should_exit = True
    thread.join(timeout=10)


def openai_shaped(r, status: int) -> str:
    """The error's message, after checking it is in OpenAI's shape (what its client reads) and nothing else."""
    body = r.json()
    assert r.status_code == status and set(body) == {"error"}, (r.status_code, body)
    assert set(body["error"]) == {"message", "type", "code"} and body["error"]["message"], body
    assert body["error"]["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    return body["error"]["message"]


def test_proxy_errors_are_openai_shaped_and_the_log_says_who_answered(db_copy, upstream):
    from registry import RouteOptions

    base, failing = upstream
    with Registry(db_copy) as reg:
        with reg.store.tx() as tx:
            text = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]
        choice = reg.route(text, RouteOptions(log=False)).model
        chain = [link.model for link in reg.fallback(choice, k=2).chain]
        for m in [choice, chain[0]]:
            reg.set_endpoint(m, base, upstream_model=f"up-{m}")
    msg = {"model": "auto", "messages": [{"role": "user", "content": text}]}
    with TestClient(create_app(str(db_copy))) as c:
        def last_log():
            return c.get("/log", params={"limit": 1}).json()[0]

        assert c.post("/v1/chat/completions", json=msg).status_code == 200
        entry = last_log()
        assert (entry["model"], entry["fallback"]) == (choice, False)
        assert entry["options"]["proxy"] == {"chosen": choice, "answered": choice, "failed": []}
        failing.add(f"up-{choice}")                                       # the choice's upstream fails
        assert c.post("/v1/chat/completions", json=msg).headers["x-registry-model"] == chain[0]
        entry = last_log()
        assert (entry["model"], entry["fallback"]) == (chain[0], True)
        assert entry["options"]["proxy"] == {"chosen": choice, "answered": chain[0], "failed": [choice]}
        failing.add(f"up-{chain[0]}")                                     # every upstream fails
        r = c.post("/v1/chat/completions", json=msg)
        assert "every model in the chain failed" in openai_shaped(r, 502)
        assert r.json()["error"]["code"] == "upstream_failed"
        entry = last_log()                         # not "routed to the choice, fallback false": none could answer
        assert entry["model"] is None and entry["fallback"] is False
        assert entry["options"]["proxy"] == {"chosen": choice, "answered": None, "failed": [choice, chain[0]]}
        assert entry["candidates"][0]["model"]                            # the routing's candidates kept
        # every other error of the /v1 routes, in the same shape
        assert "has no endpoint" in openai_shaped(c.post("/v1/chat/completions", json={**msg, "model": "x"}), 404)
        assert "messages" in openai_shaped(c.post("/v1/chat/completions", json={**msg, "messages": []}), 422)
        assert "bad JSON" in openai_shaped(c.post("/v1/chat/completions", content=b"{nope",
                                                          headers={"Content-Type": "application/json"}), 400)
        assert "cost_weight" in openai_shaped(c.post("/v1/chat/completions?cost_weight=abc", json=msg), 422)
        openai_shaped(c.get("/v1/completions"), 404)                      # no such route
        openai_shaped(c.get("/v1/chat/completions"), 405)                 # a wrong method
        assert c.get("/no-such-page").json() == {"detail": "Not Found"}   # the rest of the API as it was
        assert "detail" in c.get("/models/no-such-model").json()


# --- endpoints over HTTP, the lock's holder ----------------------------------------------------------------------

def test_endpoints_are_set_and_removed_over_http_with_the_token(db_copy):
    auth = {"Authorization": "Bearer t0ken"}
    body = {"base_url": "http://127.0.0.1:9/v1/", "upstream_model": "up-yi", "api_key_env": "YI_KEY"}
    keys = UpstreamKeys.parse(["YI_KEY=http://127.0.0.1:9"])
    with TestClient(create_app(str(db_copy), token="t0ken", keys=keys)) as c:
        assert c.put("/endpoints/Yi-6B", json=body).status_code == 401              # a write: the token
        r = c.put("/endpoints/Yi-6B", json=body, headers=auth)
        assert r.status_code == 200 and r.json() == {"model": "Yi-6B", "base_url": "http://127.0.0.1:9/v1",
                                                     "upstream_model": "up-yi", "api_key_env": "YI_KEY"}
        assert [m["id"] for m in c.get("/v1/models", headers=auth).json()["data"]] == ["auto", "Yi-6B"]   # the proxy
        assert c.get("/endpoints").json() == [r.json()]
        bad = c.put("/endpoints/Yi-6B", json={"base_url": "ftp://x"}, headers=auth)
        assert bad.status_code == 400 and "must start with http" in bad.json()["detail"]
        assert c.put("/endpoints/no-such", json=body, headers=auth).status_code == 404
        assert c.put("/endpoints/Yi-6B", json={}, headers=auth).status_code == 422
        assert c.delete("/endpoints/Yi-6B").status_code == 401
        assert c.delete("/endpoints/Yi-6B", headers=auth).json() == {"model": "Yi-6B", "removed": True}
        assert c.get("/endpoints").json() == [] and c.get("/v1/models", headers=auth).json()["data"] == [
            {"id": "auto", "object": "model", "owned_by": "registry"}]
        gone = c.delete("/endpoints/Yi-6B", headers=auth)
        assert gone.status_code == 404 and "has no endpoint" in gone.json()["detail"]
    with Registry(db_copy) as reg:
        assert reg.endpoints() == []


def hold(db, *argv: str):
    """A process holding the DuckDB file's lock, with `argv` on its command line after the code it runs."""
    import subprocess
    import sys

    code = "import sys, time, duckdb; c = duckdb.connect(sys.argv[1]); print('held', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code, str(db), *argv], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("argv, server", [
    (("-m", "registry", "import", "/data/mmlu"), False),            # another import: no "HTTP API" to point to
    (("-m", "registry", "serve", "--port", "8000", "--token", "s3cret"), True),
    ((), False),                                                    # not a registry: its command line, no guess
])
def test_the_lock_message_says_who_holds_the_file(db_copy, argv, server, monkeypatch):
    from registry.core.errors import DatabaseLocked

    monkeypatch.setenv("REGISTRY_BUSY_TIMEOUT", "0")       # (another command's turn is waited for: not here)
    proc = hold(db_copy, *argv)
    try:
        with pytest.raises(DatabaseLocked) as caught:
            Registry(db_copy)
    finally:
        proc.kill()
        proc.wait()
    msg = str(caught.value)
    assert f"locked by process {proc.pid} (" in msg and "\n" not in msg
    assert ("HTTP API" in msg) == server and ("registry serve" not in msg or server)
    if argv:
        assert f"(registry {' '.join(argv[2:4])}" in msg
    else:
        assert "(python" in msg
    assert "s3cret" not in msg                                      # a token on the command line stays hidden


# --- lists, colours, the map, show, route ------------------------------------------------------------------------

def test_family_colours_stay_distinct_past_the_palette():
    from registry.answers.maps import PALETTE, family_colours

    families = [f"family-{i}" for i in range(40)]
    colours = family_colours(families)
    assert len(set(colours.values())) == 40                                 # no two families share a colour
    assert len(set(colours.values()) & set(PALETTE)) == len(PALETTE)       # the palette first
    assert family_colours(families) == family_colours(reversed(families))  # the same whatever the order given
    real = ["command-r", "deepseek", "gemini-1.5", "gemma", "gpt-4o", "jamba", "llama-2", "llama-3", "llama-3.1",
            "mistral", "mixtral", "phi-3", "qwen1.5", "yi", "(unknown)", "a-new-family"]
    assert len(set(family_colours(real).values())) == len(real)


def test_the_map_of_a_small_registry_is_a_pca_that_shows_more_than_one_direction(db_copy):
    from scipy.spatial.distance import pdist
    from scipy.stats import pearsonr

    from registry.answers import maps

    with Registry(db_copy) as reg, reg.store.tx() as tx:
        vectors = reg.pool(tx).vectors.astype(np.float64)
    xy, method = maps.project(vectors)
    assert method == "pca" and len(vectors) <= maps.PCA_MAX
    drawn = (xy - xy.min(0)) / np.ptp(xy, axis=0)                 # as the plot shows it, each axis to its range
    eig = np.linalg.eigvalsh(np.cov(drawn.T))
    assert eig.max() / eig.sum() < 0.9                            # not a straight line (t-SNE's: 0.99 on 31 models)
    assert pearsonr(pdist(vectors), pdist(xy))[0] > 0.95           # 2-D distances track the 128-d ones


def rename(db, old: str, new: str) -> None:
    import duckdb

    con = duckdb.connect(str(db))
    con.execute("UPDATE models SET name = ? WHERE name = ?", [new, old])
    con.close()


def test_model_lists_sort_without_regard_to_case(db_copy):
    rename(db_copy, "Yi-6B", "api-model")
    with Registry(db_copy) as reg:
        reg.set_endpoint("api-model", "http://127.0.0.1:9/v1")
        reg.set_endpoint("Yi-34B", "http://127.0.0.1:9/v1")
    names = [m["name"] for m in run_json(db_copy, "models")]
    assert names == sorted(names, key=str.casefold) and names != sorted(names)      # "api-model" before "Yi-34B"
    with Registry(db_copy) as reg:
        assert [a.model for a in reg.availability()] == names
    assert [e["model"] for e in run_json(db_copy, "endpoints")] == ["api-model", "Yi-34B"]
    chains = run_json(db_copy, "fallback", "--all")["chains"]
    assert list(chains) == sorted(chains, key=str.casefold)


def test_show_names_import_batch_ids_as_ids(db_copy):
    out = run(db_copy, "show", "Yi-6B").output
    line = next(ln for ln in out.splitlines() if ln.startswith("evaluations:"))
    assert "import batch ids: 1" in line and "import batches:" not in line


def test_route_by_size_does_not_list_the_models_it_left_out(db_copy):
    import duckdb

    from registry import RouteOptions

    with Registry(db_copy) as reg, reg.store.tx() as tx:
        text = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]
    with Registry(db_copy) as reg:
        top = [c.model for c in reg.route(text, RouteOptions(log=False)).candidates[:3]]   # the three most likely
    con = duckdb.connect(str(db_copy))
    con.execute(f"UPDATE models SET params_b = NULL WHERE name IN ({', '.join('?' * 3)})", top)
    con.close()
    out = run(db_copy, "route", text, "--cost-by", "params", "--min-prob", "0.8", "--no-log")
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    start = next(i for i, ln in enumerate(lines) if "candidate" in ln) + 2
    rows = [ln.split()[1] if ln.startswith("*") else ln.split()[0] for ln in lines[start:start + 5]]
    assert not set(rows) & set(top), rows                                   # left out: not listed as candidates
    named = next(ln for ln in lines if ln.startswith("left out (no parameter count; cost by params_b): "))
    named = named.split(": ", 1)[1].split(", ")
    assert set(top) <= set(named) and f"{len(named)} models without a parameter count left out" in out.output
    d = run_json(db_copy, "route", text, "--cost-by", "params", "--min-prob", "0.8", "--no-log")
    assert {c["model"] for c in d["candidates"] if not c["eligible"]} == set(named)   # the JSON marks them


def test_the_home_page_labels_the_map_and_marks_aliases(db_copy, tmp_path):
    with Registry(db_copy) as reg:
        names = [m.name for m in reg.models()]
        with reg.store.tx() as tx:
            rows = tx.sql("""SELECT q.external_id, e.correct::INT FROM evaluations e JOIN queries q ON q.id = e.query_id
                             JOIN models m ON m.id = e.model_id WHERE m.name = ? ORDER BY q.id""", [names[0]])
        copy = tmp_path / "copy.csv"
        copy.write_text("question_id,correct\n" + "".join(f"{q},{c}\n" for q, c in rows))
        reg.register("second-name", str(copy), alias_of=names[0])
    with TestClient(create_app(str(db_copy))) as c:
        page = c.get("/").text
    assert all(f'font-size="13">{n}</text>' in page for n in names)          # every dot carries its name
    assert f'(another name of <a href="/ui/models/{names[0]}">{names[0]}</a>)' in page
