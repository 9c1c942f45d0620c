"""A token holder cannot send one of the server's keys, or any other of its environment variables, to an address
the owner did not bind it to: against a real `registry serve --upstream-key` on loopback, with a bound upstream and
an "attacker's" upstream that records every Authorization it is sent."""
from __future__ import annotations

import shutil

import httpx
import pytest

from registry import Registry
from registry.core.errors import InputError
from registry.core.keys import KeyRefused, UpstreamKeys, origin

from .conftest import start_server
from .http_tools import FakeUpstream

pytestmark = pytest.mark.slow

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BOUND, OTHER = "KEYS_TEST_BOUND_KEY", "KEYS_TEST_OTHER_SECRET"
SECRETS = {BOUND: "sk-bound-0123456789", OTHER: "cloud-secret-9876543210"}


def chat(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture(scope="module")
def keyed(base_db, tmp_path_factory):
    """-> (origin, the bound upstream, the attacker's upstream, the models: [bound one, one set before serving])."""
    good, evil = FakeUpstream(), FakeUpstream()
    db = tmp_path_factory.mktemp("keys") / "registry.duckdb"
    shutil.copy(base_db, db)
    with Registry(db) as reg:
        names = [m.name for m in reg.models()][:3]
        reg.set_endpoint(names[0], good.base, upstream_model="good", api_key_env=BOUND)
        # rows written before serving (the command line) that name a key for another address
        reg.set_endpoint(names[1], evil.base, upstream_model="evil-bound", api_key_env=BOUND)
        reg.set_endpoint(names[2], evil.base, upstream_model="evil-other", api_key_env=OTHER)
    with pytest.MonkeyPatch.context() as mp:
        for k, v in SECRETS.items():
            mp.setenv(k, v)
        proc, where = start_server(db, TOKEN, ("--upstream-key", f"{BOUND}={good.base}"))
    yield where, good, evil, names
    proc.terminate()
    proc.wait(timeout=30)
    good.close()
    evil.close()


def test_no_key_reaches_an_address_the_owner_did_not_bind(keyed):
    where, good, evil, names = keyed
    post = lambda path, body: httpx.post(where + path, json=body, headers=AUTH, timeout=30)   # noqa: E731
    put = lambda path, body: httpx.put(where + path, json=body, headers=AUTH, timeout=30)     # noqa: E731
    # the bound key reaches its own upstream
    r = post("/v1/chat/completions", chat(names[0]))
    assert r.status_code == 200 and good.seen[-1] == ("good", f"Bearer {SECRETS[BOUND]}")
    # rows naming a key for another address, written before serving: refused at the proxy, nothing sent
    for name in names[1:]:
        r = post("/v1/chat/completions", chat(name))
        assert r.status_code == 502 and "api_key_env" in r.json()["error"]["message"], r.text
    # writes over HTTP: another variable, the bound one to another origin, the same host on another port
    moved = good.base.replace(str(good.port), str(evil.port))
    for body in ({"base_url": evil.base, "api_key_env": OTHER}, {"base_url": evil.base, "api_key_env": BOUND},
                 {"base_url": moved, "api_key_env": BOUND}, {"base_url": good.base, "api_key_env": OTHER}):
        r = put(f"/endpoints/{names[0]}", body)
        assert r.status_code == 409 and "api_key_env" in r.json()["detail"], (body, r.text)
        r = post(f"/models/{names[0]}/ask", {**body, "n": 2, "plan": "random"})
        assert r.status_code == 409, (body, r.text)
        r = post("/models/fresh-asked-model/ask", {**body, "n": 2, "plan": "random"})
        assert r.status_code == 409, (body, r.text)
    assert httpx.get(where + "/models/fresh-asked-model").status_code == 404         # nothing was written
    assert [e for e in httpx.get(where + "/endpoints").json() if e["model"] == names[0]] == [
        {"model": names[0], "base_url": good.base, "upstream_model": "good", "api_key_env": BOUND}]
    # the attacker never saw a request that carried a key
    assert all(auth is None for _, auth in evil.seen), evil.seen
    # an endpoint without a key may point anywhere: it is sent none
    assert put(f"/endpoints/{names[1]}", {"base_url": evil.base, "upstream_model": "evil-none"}).status_code == 200
    assert post("/v1/chat/completions", chat(names[1])).status_code == 200
    assert evil.seen[-1] == ("evil-none", None)


def test_an_upstream_that_echoes_its_key_passes_on_neither_its_body_nor_its_headers(keyed):
    where, good, _, names = keyed
    good.modes["good"] = "echo"
    try:
        r = httpx.post(where + "/v1/chat/completions", json=chat(names[0]), headers=AUTH, timeout=30)
    finally:
        del good.modes["good"]
    assert good.seen[-1] == ("good", f"Bearer {SECRETS[BOUND]}")        # the upstream did get (and echo) it
    assert r.status_code == 401 and set(r.json()) == {"error"}, r.text
    assert "upstream answered 401" in r.json()["error"]["message"]
    assert SECRETS[BOUND] not in r.text and SECRETS[BOUND][:8] not in r.text
    assert "x-echo" not in r.headers and "set-cookie" not in r.headers
    assert all(SECRETS[BOUND] not in v for v in r.headers.values())


def test_bindings_parse_and_check():
    keys = UpstreamKeys.parse(["K=https://API.example.com/v1", "J=http://127.0.0.1:8080"])
    assert keys.bound == {"K": "https://api.example.com:443", "J": "http://127.0.0.1:8080"}
    keys.check("K", "https://api.example.com:443/v2")                  # same origin, any path
    for var, url in (("K", "http://api.example.com/v1"), ("K", "https://api.example.com.evil.org/v1"),
                     ("K", "https://api.example.com:444/v1"), ("OTHER", "https://api.example.com/v1")):
        with pytest.raises(KeyRefused):
            keys.check(var, url)
    for bad in (["K"], ["1K=https://x"], ["K=ftp://x"], ["K=http://]bad"], ["K=https://a", "K=https://b"]):
        with pytest.raises(InputError):
            UpstreamKeys.parse(bad)
    assert origin("http://[::1]:9/v1") == "http://[::1]:9"
    with pytest.raises(KeyRefused, match="KEYS_TEST_UNSET"):          # a keyed endpoint is never called keyless
        UpstreamKeys.parse(["KEYS_TEST_UNSET=https://x"]).header("KEYS_TEST_UNSET", "https://x/v1")
