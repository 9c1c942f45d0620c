"""Two commands that create one new registry file at once: the file survives with everything either reported, and only
the process whose connection created a file, with nothing committed in it, ever removes it."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from registry.core.store import Store

# (each process sleeps until a common instant, then runs the command: both start as together as a barrier allows)
AT = ("import os, runpy, sys, time; time.sleep(max(0.0, float(sys.argv[1]) - time.time())); "
      "sys.argv = ['registry', *sys.argv[2:]]; runpy.run_module('registry', run_name='__main__')")


def counts(db) -> tuple[int, int]:
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT (SELECT count(*) FROM models), (SELECT count(*) FROM evaluations)").fetchone()
    finally:
        con.close()


@pytest.mark.slow
@pytest.mark.parametrize("busy_timeout", ["0.2", "60"])
def test_two_imports_started_together_keep_the_file(small_data, tmp_path, busy_timeout):
    """With a short wait, the process that waits gives up (exit 1) and, before, deleted the file the other was
    filling; with a long one both exit 0 and the second adds nothing. Either way the file holds the whole import,
    passes `db check`, and every process that exited 0 said what it holds."""
    import duckdb

    db = tmp_path / "r.duckdb"
    con = duckdb.connect()
    want = con.execute(f"SELECT count(*) FROM read_csv('{small_data}/evaluations.csv.gz')").fetchone()[0]
    models = con.execute(f"SELECT count(*) FROM read_csv('{small_data}/models.csv')").fetchone()[0]
    con.close()
    env = {**os.environ, "REGISTRY_BUSY_TIMEOUT": busy_timeout}
    start = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, "-c", AT, str(start), "--db", str(db), "import", str(small_data)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    assert db.exists(), outs
    assert counts(db) == (models, want), outs
    check = subprocess.run([sys.executable, "-m", "registry", "--db", str(db), "db", "check"], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    held = f"{models} models, {N_QUERIES:,} queries, {want:,} evaluations"
    for rc, out, err in outs:
        assert rc in (0, 1), err
        if rc == 0:
            assert held in out, out
        else:
            assert "locked by process" in err and "Traceback" not in err, err
    if busy_timeout == "60":
        assert [rc for rc, _, _ in outs] == [0, 0] and sum("nothing added" in out for _, out, _ in outs) == 1


N_QUERIES = 160      # (conftest's slice)


def test_a_store_removes_only_a_file_its_own_connection_created_and_left_empty(tmp_path):
    path = str(tmp_path / "r.duckdb")
    first = Store(path)
    assert first.created
    first.close()
    second = Store(path)                     # the file was there: not this Store's to remove
    assert not second.created and not second.discard_if_created()
    assert os.path.exists(path)
    os.remove(path)
    third = Store(path)
    with third.tx() as tx:                   # something committed: the file stays even for its creator
        tx.sql("INSERT INTO import_batches (id, files, row_counts, digest) VALUES (1, '{}', '{}', 'x')")
    assert not third.discard_if_created() and os.path.exists(path)
    os.remove(path)
    fourth = Store(path)
    assert fourth.discard_if_created() and not os.path.exists(path) and not os.path.exists(path + ".wal")
