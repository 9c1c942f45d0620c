"""Endpoints over HTTP: set and removed with the token."""
from __future__ import annotations

from fastapi.testclient import TestClient

from registry import Registry
from registry.core.keys import UpstreamKeys
from registry.serve.app import create_app


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
