"""The routing state saved in the registry (routing/state.py; kept by routing/fit.py): a new process routes from it
exactly as the process that built it, without torch; anything that matters to routing gives a new state; a saved
state is data, never code."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import duckdb
import numpy as np
import pytest

from registry import Registry
from registry.routing import fit, state

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
            st = fit.keep(tx)
        assert st.names
    assert saved_rows(db_copy) == []


def test_a_saved_state_names_only_the_registrys_own_classes():
    arrays: dict = {}
    doc = state._encode({"x": (1, 2.5, None), "s": frozenset({"a"}), 3: np.arange(2)}, arrays)
    back = state._decode(json.loads(json.dumps(doc)), arrays)
    assert back["x"] == (1, 2.5, None) and back["s"] == frozenset({"a"}) and back[3].tolist() == [0, 1]
    with pytest.raises(ValueError, match="not one of the registry's classes"):
        state._decode({"$dataclass": "subprocess:Popen", "fields": {"args": ["true"]}}, {})
    with pytest.raises(TypeError):
        state._encode(object(), {})


def state_of(db):
    """The routing state a new Store builds or reads for the file (saving it, as the first route of a process does)."""
    with Registry(db) as reg:
        with reg.store.tx() as tx:
            return fit.keep(tx)


def mark_saved_fit(db) -> None:
    """The saved state's interaction weight `a` set to 123 (no fit picks it): a state that shows it took the fit."""
    import dataclasses

    with Registry(db) as reg:
        with reg.store.tx() as tx:
            (key,) = [k for (k,) in tx.sql("SELECT key FROM routing_states WHERE key LIKE 'routing-state/%'")]
            fields = state.load(tx, fit.keep(tx).key)
            served = fields["interaction"]
            marked = dataclasses.replace(served, fitted=dataclasses.replace(served.fitted, a=123.0))
            tx.sql("DELETE FROM routing_states WHERE key = ?", [key])
            state.save(tx, state.State(**{**fields, "interaction": marked}, model=None, score=None))


@pytest.mark.slow
def test_a_registration_that_leaves_the_contenders_as_they_were_takes_the_saved_fit(db_copy, small_data, tmp_path):
    """A model on probation is no contender: the state after its registration has the same fit and policy inputs, and
    takes them from the saved state instead of fitting them again (seconds on a full registry); it routes exactly as
    a state built with nothing saved. A registration that changes the contenders fits anew."""
    from tests.helpers import invented

    state_of(db_copy)                                           # built and saved
    with Registry(db_copy) as reg:
        reg.register("thin", str(invented(small_data, tmp_path, n=40)))    # 40 < 64: on probation
    scratch = tmp_path / "scratch.duckdb"
    shutil.copy(db_copy, scratch)
    with duckdb.connect(str(scratch)) as con:
        con.execute("DELETE FROM routing_states")
    taken, fresh = state_of(db_copy), state_of(scratch)
    assert taken.names == fresh.names and "thin" in taken.names and taken.evidence.probation[taken.names.index("thin")]
    assert taken.interaction.inputs == fresh.interaction.inputs
    a, b = taken.interaction.fitted, fresh.interaction.fitted
    assert (a.a, a.k, a.w, a.categories) == (b.a, b.k, b.w, b.categories)
    for name in ("rows", "offsets", "ref_vecs", "resid", "seen"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert taken.interaction.policy.name == fresh.interaction.policy.name
    with duckdb.connect(str(db_copy), read_only=True) as con:
        texts = [t for (t,) in con.execute("SELECT text FROM queries ORDER BY id LIMIT 40").fetchall()]
    routes = {}
    for db in (db_copy, scratch):
        with Registry(db) as reg:
            routes[db] = [(d.model, [(c.model, c.prob) for c in d.candidates]) for d in reg.route_batch(texts)]
    assert routes[db_copy] == routes[scratch]
    # the fit is taken, not computed again: a mark on the saved fit shows through the next registration's state
    mark_saved_fit(db_copy)
    with Registry(db_copy) as reg:
        reg.register("thin-too", str(invented(small_data, tmp_path, n=30, wrong_at=3)))
    assert state_of(db_copy).interaction.fitted.a == 123.0
    # a strong model with enough evaluations is a contender: the inputs change and the terms are fitted anew
    with Registry(db_copy) as reg:
        reg.register("strong", str(invented(small_data, tmp_path, n=160, wrong_at=6)))
    refit = state_of(db_copy)
    assert not refit.evidence.probation[refit.names.index("strong")]
    assert refit.interaction.fitted.a != 123.0 and refit.interaction.inputs != taken.interaction.inputs


def test_moving_queries_between_train_and_val_gives_a_new_state_and_a_new_fit(db_copy, small_data, tmp_path):
    """Splits laid out in id order (every train query before every val query), then the boundary moved by two: the
    state's key and its fit's inputs both change (DuckDB's hash of several columns is linear in them, so an XOR of
    row hashes missed two queries moved together; train's and val's ids hashed end to end missed where one ends),
    and the state routes as one built with nothing saved."""
    with duckdb.connect(str(db_copy), read_only=True) as con:
        ids = [q for (q,) in con.execute("""SELECT q.external_id FROM queries q JOIN query_splits s ON s.query_id = q.id
                                            WHERE s.split <> 'test' ORDER BY q.id""").fetchall()]
    cut = len(ids) * 3 // 4

    def split_at(n: int) -> None:
        path = tmp_path / f"splits{n}.csv"
        path.write_text("question_id,split\n" + "".join(f"{q},{'train' if i < n else 'val'}\n"
                                                        for i, q in enumerate(ids)))
        with Registry(db_copy) as reg:
            reg.import_files(splits=str(path))

    split_at(cut)
    before = state_of(db_copy)
    split_at(cut - 2)
    after = state_of(db_copy)
    assert after.key != before.key and after.interaction.inputs != before.interaction.inputs
    scratch = tmp_path / "scratch.duckdb"
    shutil.copy(db_copy, scratch)
    with duckdb.connect(str(scratch)) as con:
        con.execute("DELETE FROM routing_states")
    fresh = state_of(scratch)
    assert fresh.interaction.inputs == after.interaction.inputs
    assert (after.interaction.fitted.a, after.interaction.fitted.w) == (fresh.interaction.fitted.a,
                                                                        fresh.interaction.fitted.w)
    assert np.array_equal(after.interaction.fitted.resid, fresh.interaction.fitted.resid)


def test_a_registration_refits_and_says_so_and_the_route_after_it_only_reads(db_copy, small_data, tmp_path):
    """A registration that adds a contender refits the routing state (seconds): it says so on stderr; the route
    after it reads the saved state and says nothing; a registry without a state builds it on its first route."""
    from tests.helpers import invented, run

    with Registry(db_copy) as reg, reg.store.tx() as tx:     # (a text the registry holds: routed without MiniLM)
        text = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]
    first = run(db_copy, "route", text)                       # (db_copy holds no state: built once, here)
    assert first.exit_code == 0 and "refitting the routing state" in first.stderr, first.output
    again = run(db_copy, "route", text)
    assert again.exit_code == 0 and "routing state" not in again.stderr, again.stderr
    reg = run(db_copy, "register", "a-new-contender", "--evals", invented(small_data, tmp_path, n=150))
    assert reg.exit_code == 0 and "routing: refitting the routing state" in reg.stderr, reg.output
    (key,) = [k for k, *_ in saved_rows(db_copy)]
    after = run(db_copy, "route", text)
    assert after.exit_code == 0 and "routing state" not in after.stderr, after.stderr
    assert [k for k, *_ in saved_rows(db_copy)] == [key]      # read, not built again


def test_a_refit_after_a_registration_on_probation_reads_no_dataset(db_copy, small_data, tmp_path, monkeypatch):
    """In one process (a server's refits), a registration that leaves the candidates as they were gives the same
    contenders and inputs: the refit takes the kept fit without reading the [models, queries] dataset again."""
    from registry.embedding import dataset as dataset_module
    from tests.helpers import invented

    with Registry(db_copy) as reg:
        with reg.store.tx() as tx:
            first = fit.keep(tx, refit=True)
        reads = []
        real = dataset_module.dataset
        monkeypatch.setattr(dataset_module, "dataset", lambda tx: reads.append(1) or real(tx))
        reg.register("thin", str(invented(small_data, tmp_path, n=40)))          # on probation: no candidate
        with reg.store.tx() as tx:
            after = fit.keep(tx, refit=True)
        assert "thin" in after.names and after.interaction.fitted is first.interaction.fitted
        assert reads == []
        reg.register("strong", str(invented(small_data, tmp_path, n=160, wrong_at=6)))   # a candidate: read, fit
        with reg.store.tx() as tx:
            fit.keep(tx, refit=True)
        assert reads


def test_the_code_digest_reads_the_same_constants_as_a_whole_parse():
    """The key's settings come from each top-level upper-case literal, parsed one statement at a time: the same
    names and values, in the same order, as a parse of the whole module (multi-line literals included)."""
    import ast

    def whole(text: str) -> list:
        out = []
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and node.targets[0].id.isupper():
                try:
                    out.append((node.targets[0].id, ast.literal_eval(node.value)))
                except ValueError:
                    pass
        return out
    sample = 'X = 1\nY = {\n    "a": (1, 2),\n}\n_Z = f(3)\nW == 4\nclass A:\n    B = 5\nC: int = 6\nD = [1,\n     2]\n'
    assert state.module_constants(sample) == whole(sample) == [("X", 1), ("Y", {"a": (1, 2)}), ("D", [1, 2])]
    for m in state.BUILT_BY:
        text = open(state._origin(m)).read()
        assert state.module_constants(text) == whole(text), m


@pytest.mark.slow
def test_the_copy_beside_the_file_is_read_only_for_the_row_it_copies(db_copy):
    built = route_in_a_new_process(db_copy)          # saves the state, and on the next read its copy beside the file
    side = db_copy.parent / f"{db_copy.name}.index" / "routing-state.npz"
    assert route_in_a_new_process(db_copy)["routes"] == built["routes"]
    assert side.is_file()
    stamp = side.read_bytes()[:200]
    assert state.FORMAT.encode() in stamp
    whole = side.read_bytes()
    for cut in (100, len(whole) // 2):            # damaged (in the stamp, in the arrays): the row is read instead
        side.write_bytes(whole[:cut])
        assert route_in_a_new_process(db_copy)["routes"] == built["routes"]
        assert side.read_bytes() == whole          # (and copied again)
    with duckdb.connect(str(db_copy)) as con:     # the row saved again later: the old copy is not its payload
        con.execute("UPDATE routing_states SET created = created + INTERVAL 1 SECOND")
    before = side.read_bytes()
    assert route_in_a_new_process(db_copy)["routes"] == built["routes"]
    assert side.read_bytes() != before
