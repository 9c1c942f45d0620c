"""The routing state saved in the registry (routing/saved_state.py): a new process routes from it exactly as the
process that built it, without torch; anything that matters to routing gives a new state; a saved state is data,
never code."""
from __future__ import annotations

import json
import subprocess
import sys

import duckdb
import numpy as np
import pytest

from registry import Registry
from registry.routing import saved_state

ROUTE_IN_A_NEW_PROCESS = """
import json, sys
from registry import Registry
with Registry(sys.argv[1]) as reg:
    with reg.store.tx() as tx:
        texts = [r[0] for r in tx.sql("SELECT text FROM queries ORDER BY id LIMIT 3")]
    ds = reg.route_batch(texts)
print(json.dumps({"torch": "torch" in sys.modules, "routes": [[d.model, [(c.model, c.prob) for c in d.candidates]]
                                                              for d in ds]}))
"""


@pytest.fixture
def db_copy(db_copy):
    """The session's registry without the routing state conftest saves in it: these tests watch it being saved."""
    with duckdb.connect(str(db_copy)) as con:
        con.execute("DELETE FROM routing_states")
    return db_copy


def saved_rows(db) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT key, encoder_id, octet_length(payload) FROM routing_states").fetchall()


def route_in_a_new_process(db) -> dict:
    out = subprocess.run([sys.executable, "-c", ROUTE_IN_A_NEW_PROCESS, str(db)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_new_process_routes_from_the_saved_state_as_the_builder_did_and_without_torch(db_copy):
    assert saved_rows(db_copy) == []
    built = route_in_a_new_process(db_copy)          # builds the state (the network in numpy) and saves it
    assert built["torch"] is False
    assert len(saved_rows(db_copy)) == 1
    again = route_in_a_new_process(db_copy)
    assert again["torch"] is False                   # the state came from the saved one
    assert [r[0] for r in again["routes"]] == [r[0] for r in built["routes"]]
    for (_, a), (_, b) in zip(again["routes"], built["routes"]):
        assert [m for m, _ in a] == [m for m, _ in b]
        assert np.allclose([p for _, p in a], [p for _, p in b], atol=1e-6)


@pytest.mark.slow
def test_a_change_that_matters_to_routing_gives_a_new_state(db_copy):
    route_in_a_new_process(db_copy)
    (key_before, *_), = saved_rows(db_copy)
    with Registry(db_copy) as reg:
        reg.mark_unavailable([reg.models()[0].name])
    after = route_in_a_new_process(db_copy)
    (key_after, *_), = saved_rows(db_copy)            # the new one replaced it
    assert key_after != key_before
    with Registry(db_copy) as reg:
        down = reg.models()[0].name
    assert all(r[0] != down for r in after["routes"])


def test_a_read_only_file_routes_without_saving(db_copy):
    with Registry(db_copy) as reg:
        with reg.store.tx() as tx:
            tx.read_only = True
            from registry.routing import state
            st = state.current(tx)
        assert st.names
    assert saved_rows(db_copy) == []


def test_a_saved_state_names_only_the_registrys_own_classes():
    arrays: dict = {}
    doc = saved_state._encode({"x": (1, 2.5, None), "s": frozenset({"a"}), 3: np.arange(2)}, arrays)
    back = saved_state._decode(json.loads(json.dumps(doc)), arrays)
    assert back["x"] == (1, 2.5, None) and back["s"] == frozenset({"a"}) and back[3].tolist() == [0, 1]
    with pytest.raises(ValueError, match="not one of the registry's classes"):
        saved_state._decode({"$dataclass": "subprocess:Popen", "fields": {"args": ["true"]}}, {})
    with pytest.raises(TypeError):
        saved_state._encode(object(), {})
