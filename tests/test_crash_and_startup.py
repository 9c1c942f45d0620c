"""A SIGKILL in the middle of an import leaves all of it or none of it; start-up stays light."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import duckdb
import pytest

from registry import Registry

from .conftest import snapshot


@pytest.mark.slow
def test_sigkill_during_evaluations_import_is_all_or_nothing(db_copy, small_data, tmp_path):
    # A big evaluations file for a new model, so the import takes long enough to be killed in the middle.
    big = tmp_path / "big.csv"
    con = duckdb.connect()
    con.execute(f"""COPY (SELECT 'killed-model-' || (i % 400) AS model, q.question_id,
                           (i + q.question_id) % 2 AS correct
                    FROM range(400) t(i), read_csv('{small_data}/questions.csv.gz') q)
                    TO '{big}' (HEADER)""")
    con.close()
    before = snapshot(db_copy)
    code = ("import sys; from registry import Registry; reg = Registry(sys.argv[1]); print('go', flush=True); "
            "reg.import_files(evaluations=sys.argv[2]); print('done', flush=True)")
    outcomes = set()
    for delay in (0.05, 0.2, 5.0):  # killed right after the import began, a little later, and (likely) after it
        proc = subprocess.Popen([sys.executable, "-c", code, str(db_copy), str(big)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "go"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with Registry(db_copy) as reg:  # opens, recovers from its WAL
            n = sum(1 for m in reg.models() if m.name.startswith("killed-model-"))
            rows = reg.stats().evaluation_rows
        assert n in (0, 400)
        if n == 0:
            assert snapshot(db_copy) == before
            outcomes.add("none")
        else:
            assert rows == before["evaluations"][0] + 400 * 160
            outcomes.add("all")
            break
    # the first kill, 50 ms in, lands before the import commits: the test saw a kill leave nothing behind
    assert "none" in outcomes
    if "all" not in outcomes:   # and the same file, left to finish, brings all of it: "none" was the kill's doing
        with Registry(db_copy) as reg:
            reg.import_files(evaluations=str(big))
            assert sum(1 for m in reg.models() if m.name.startswith("killed-model-")) == 400


LIGHT_CHECK = """
import sys
from click.testing import CliRunner
from registry.cli import cli
for args in {args!r}:
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
heavy = [m for m in ("torch", "sentence_transformers", "faiss", "alembic", "sqlalchemy", "pyarrow")
         if m in sys.modules]
print(",".join(heavy))
"""


def test_the_schema_check_reads_the_head_as_alembic_does():
    """The head revision every command checks, read from the migration files without Alembic, is Alembic's."""
    from alembic.script import ScriptDirectory

    from registry.core import store

    assert store.head_revision() == ScriptDirectory.from_config(store.alembic_config()).get_current_head()


def test_help_and_read_commands_do_not_import_heavy_libraries(db_copy):
    """Nor the ORM or Alembic on DuckDB: a read command opens the file and checks the schema with one read."""
    args = [["--help"], ["--db", str(db_copy), "models"], ["--db", str(db_copy), "stats", "--json"],
            ["--db", str(db_copy), "show", "gemma-7b"]]
    out = subprocess.run([sys.executable, "-c", LIGHT_CHECK.format(args=args)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


@pytest.mark.slow
def test_commands_that_do_not_train_never_import_torch(db_copy, small_data, tmp_path):
    """Registration, similar --evals, fingerprint, show and diff run the network in numpy: a process where torch
    (and scipy) cannot be imported runs them all."""
    evals = tmp_path / "evals.csv"
    con = duckdb.connect()
    con.execute(f"""COPY (SELECT question_id AS query_id, correct FROM read_csv('{small_data}/evaluations.csv.gz')
                    WHERE model = 'gemma-7b' ORDER BY question_id LIMIT 100) TO '{evals}' (HEADER)""")
    con.close()
    db = str(db_copy)
    args = [["--db", db, "register", "numpy-only", "--evals", str(evals)],
            ["--db", db, "similar", "--evals", str(evals)], ["--db", db, "fingerprint", "--evals", str(evals)],
            ["--db", db, "similar", "numpy-only"], ["--db", db, "register", "numpy-only", "--evals", str(evals),
                                                    "--update", "--family", "gemma"]]
    blocked = "import sys; sys.modules.update(torch=None, scipy=None, sentence_transformers=None)\n"
    out = subprocess.run([sys.executable, "-c", blocked + LIGHT_CHECK.format(args=args)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.slow     # trains or starts a process: seconds, the full suite runs it
def test_python_dash_m_runs(tmp_path):
    db = tmp_path / "x.duckdb"
    out = subprocess.run([sys.executable, "-m", "registry", "--db", str(db), "db", "upgrade"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    out = subprocess.run([sys.executable, "-m", "registry", "--db", str(db), "stats", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["models"] == 0
