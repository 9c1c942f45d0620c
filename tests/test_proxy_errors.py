"""The routing proxy's errors: in the OpenAI shape, and the routing log says who answered."""
from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from registry import Registry
from registry.serve.app import create_app

from .http_tools import serving


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

    with serving(app) as origin:
        yield f"{origin}/v1", failing


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
