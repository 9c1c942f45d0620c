"""`registry prompt TEXT` (simonw/llm's `llm "prompt"`): one prompt routed, then sent to the chosen model's endpoint (a
fake OpenAI-compatible upstream on loopback); a more likely model without an endpoint, or whose endpoint fails, is
passed over and said; no endpoint at all, or none answering, is one line."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from registry import Registry
from registry.cli import cli
from registry.core.errors import EndpointFailed
from registry.routing.decision import RouteOptions

from .http_tools import FakeUpstream

NOWHERE = "http://127.0.0.1:9/v1"       # nothing listens there: connections refused


def known_text(reg) -> str:
    """A query text the registry holds: routed from its stored vector, without MiniLM."""
    with reg.store.tx() as tx:
        return tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]


@pytest.fixture
def upstream():
    u = FakeUpstream()
    yield u
    u.close()


def prompt(db, *args):
    return CliRunner().invoke(cli, ["--db", str(db), "prompt", *args])


def test_an_empty_prompt_is_refused(db_copy):
    r = prompt(db_copy, " ")
    assert r.exit_code != 0 and "give the prompt's text" in r.output


def test_a_prompt_goes_to_the_most_likely_model_with_an_endpoint(db_copy, upstream):
    r = prompt(db_copy, "Any question at all?")
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "no model has an endpoint" in r.output, r.output
    with Registry(db_copy) as reg:
        text = known_text(reg)
        d = reg.route(text, RouteOptions(log=False))
        top, second = d.model, next(c.model for c in d.candidates if c.eligible and c.model != d.model)
        reg.set_endpoint(second, upstream.base, upstream_model=f"up-{second}")
    r = prompt(db_copy, text, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert (out["model"], out["chosen"], out["answer"]) == (second, second, f"from up-{second}")
    assert out["skipped"] == [{"model": top, "why": "no endpoint"}]          # the top choice has none: said
    assert out["decision"]["fallback"] is True and out["decision"]["prob"] > 0
    assert {c["model"]: c["endpoint"] for c in out["decision"]["candidates"]}[top] is False
    assert (out["prompt_tokens"], out["completion_tokens"]) == (None, None)   # (this upstream reports none)
    sent = [m for m, _ in upstream.seen]
    assert sent == [f"up-{second}"]


@pytest.mark.slow
def test_the_answer_is_printed_and_a_failing_endpoint_is_passed_over(db_copy, upstream):
    with Registry(db_copy) as reg:
        text = known_text(reg)
        d = reg.route(text, RouteOptions(log=False))
        top, second = d.model, next(c.model for c in d.candidates if c.eligible and c.model != d.model)
        reg.set_endpoint(second, upstream.base, upstream_model=f"up-{second}")
    r = prompt(db_copy, text)                                                  # text: the answer, then who gave it
    assert r.exit_code == 0 and r.stdout == f"from up-{second}\n", r.output
    assert f"-- {second} (P(correct) " in r.stderr and f"passed over {top}: no endpoint" in r.stderr
    # the top choice's endpoint refuses connections: the next model with an endpoint answers, and that is said
    with Registry(db_copy) as reg:
        reg.set_endpoint(top, NOWHERE)
    out = json.loads(prompt(db_copy, text, "--json").stdout)
    assert (out["model"], out["chosen"]) == (second, top)
    assert out["skipped"][0]["model"] == top and "its endpoint failed" in out["skipped"][0]["why"]
    # none answers: one line naming each
    with Registry(db_copy) as reg:
        reg.set_endpoint(second, NOWHERE)
        with pytest.raises(EndpointFailed, match=f"no model answered the prompt: {top}: its endpoint failed"):
            reg.prompt(text, backoff=0)
    r = prompt(db_copy, text)
    assert r.exit_code != 0 and r.output.count("\n") == 1 and "no model answered the prompt" in r.output, r.output

