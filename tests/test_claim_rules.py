"""Claims obey the model-name rule and a cap, and the reference mark is the owner's: a claim's name or upstream model
that a terminal or a page would show wrongly, or that is huge, is one line and changes nothing."""
from __future__ import annotations

import pytest

from registry import InputError, Registry
from registry.asking.claims import MAX_CLAIMS
from registry.core.errors import Conflict

from .conftest import snapshot

X = "gpt-4o-2024-05-13"


@pytest.mark.parametrize("name", ["a\x00b", "a\nb", "a\x1b[31mb", "abc\u202efdp.exe", "x" * 100_000, "m/claims",
                                  "m/verify", "m/ask"])
def test_a_claim_name_obeys_the_model_name_rule(db_copy, name):
    before = snapshot(db_copy)
    with Registry(db_copy) as reg, pytest.raises(InputError) as caught:
        reg.claim(X, "http://127.0.0.1:9/v1", name=name)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 400
    assert snapshot(db_copy) == before


def test_a_huge_upstream_model_is_refused(db_copy):
    before = snapshot(db_copy)
    with Registry(db_copy) as reg, pytest.raises(InputError) as caught:
        reg.claim(X, "http://127.0.0.1:9/v1", name=f"{X}@p", upstream_model="u" * 1_000_000)
    assert "--upstream-model" in str(caught.value) and len(str(caught.value)) < 400
    assert snapshot(db_copy) == before


def test_claims_of_one_model_are_capped(db_copy):
    with Registry(db_copy) as reg:
        for i in range(MAX_CLAIMS):
            reg.claim(X, f"http://127.0.0.1:{9000 + i}/v1", name=f"{X}@p{i}")
    before = snapshot(db_copy)
    with Registry(db_copy) as reg:
        with pytest.raises(Conflict) as caught:
            reg.claim(X, "http://127.0.0.1:9999/v1", name=f"{X}@one-too-many")
        assert f"{MAX_CLAIMS} claiming endpoints" in str(caught.value)
    assert snapshot(db_copy) == before
    with Registry(db_copy) as reg:       # (a claim changed is no new one)
        assert not reg.claim(X, "http://127.0.0.1:9000/v1", name=f"{X}@p0", watched=False).watched
