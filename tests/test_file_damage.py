"""No input or file takes the registry down (issue 50): names that are not UTF-8 text, damaged database files, a full
disk (and a failed import into a new path on it: no file left), a FIFO or another engine's file as --db, a schema
newer than ours (and `registry db check`), a blank serve token. Every failure one line, the right exit code, the
database unchanged."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from registry import InputError, Registry
from tests.helpers import one_line_error, run

from .conftest import snapshot

ROOT = Path(__file__).resolve().parents[1]


def registry_cli(db, *args: str | bytes, timeout: int = 120) -> subprocess.CompletedProcess:
    """`python -m registry --db DB ARGS` in a process of its own: arguments as the shell gives them (bytes)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "registry", "--db", str(db), *args], capture_output=True,
                          env=env, timeout=timeout)


def one_line_stderr(out: subprocess.CompletedProcess, code: int = 1) -> str:
    err = out.stderr.decode("utf-8", "replace").strip()
    assert out.returncode == code, err
    assert "\n" not in err and err.startswith("Error: ") and "Traceback" not in err, err
    return err


def known_results(db, tmp_path) -> Path:
    """A results file of queries the registry holds (one model's answers): no query text to embed."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute("""SELECT q.external_id, e.correct FROM evaluations e JOIN queries q ON q.id = e.query_id
                              WHERE e.model_id = (SELECT min(id) FROM models) ORDER BY 1""").fetchall()
    finally:
        con.close()
    path = tmp_path / "known.csv"
    path.write_text("question_id,correct\n" + "".join(f"{q},{int(c)}\n" for q, c in rows))
    return path


# --- 1. names are text before they reach the database ------------------------------------------------------------

def test_a_name_that_is_not_utf8_is_one_line_on_the_command_line(db_copy, tmp_path):
    evals = known_results(db_copy, tmp_path)
    before = snapshot(db_copy)
    # the shell's bytes: `registry register $'x\xff' --evals f` and `registry show $'x\xff'`
    text = one_line_stderr(registry_cli(db_copy, "register", b"x\xff", "--evals", str(evals)))
    assert "not valid UTF-8" in text and "0xff" in text
    for args in (["show", "x\udcff"], ["register", "\ud800 x", "--evals", evals],
                 ["register", "newcomer", "--evals", evals, "--family", "\ud800 x"],
                 ["register", "newcomer", "--evals", evals, "--provider", "x\udcff"],
                 ["register", "newcomer", "--evals", evals, "--tag", "k=\ud800"],
                 ["similar", "x\udcff"], ["mark-unavailable", "\ud800"], ["history", "x\udcff"]):
        text = one_line_error(run(db_copy, *args))
        assert "not valid UTF-8 text" in text, (args, text)
    assert snapshot(db_copy) == before


def test_the_library_refuses_such_names_as_input_errors(db_copy, tmp_path):
    evals = known_results(db_copy, tmp_path)
    before = snapshot(db_copy)
    with Registry(db_copy) as reg:
        for call in (lambda: reg.register("\ud800 x", str(evals)),
                     lambda: reg.register("newcomer", str(evals), family="\ud800"),
                     lambda: reg.register("newcomer", str(evals), tags={"k\ud800": "v"}),
                     lambda: reg.register("newcomer", str(evals), alias_of="x\udcff"),
                     lambda: reg.show("\ud800 x"), lambda: reg.mark_unavailable(["\ud800"]),
                     lambda: reg.history("x\udcff")):
            with pytest.raises(InputError, match="not valid UTF-8 text") as info:
                call()
            assert "\n" not in str(info.value)
    assert snapshot(db_copy) == before


def test_over_http_a_surrogate_in_a_name_is_a_4xx_not_a_500(db_copy):
    from fastapi.testclient import TestClient

    from registry.serve.app import create_app

    before = snapshot(db_copy)
    rows = [{"question_id": "q1", "correct": 1}]
    with TestClient(create_app(str(db_copy), token="t"), raise_server_exceptions=False) as c:
        for body in ({"name": "\ud800 x", "evaluations": rows},
                     {"name": "newcomer", "family": "\ud800 x", "evaluations": rows},
                     {"name": "newcomer", "tags": {"k\ud800": "v"}, "evaluations": rows}):
            r = c.post("/models", content=json.dumps(body),         # ("\\ud800" escaped, as a client sends it)
                       headers={"Authorization": "Bearer t", "Content-Type": "application/json"})
            assert 400 <= r.status_code < 500, r.text
            detail = r.json()["detail"]
            assert isinstance(detail, str) and "\n" not in detail and "UTF-8" in detail, detail
    assert snapshot(db_copy) == before


# --- 2. damage is called damage, a lock a lock -------------------------------------------------------------------

@pytest.mark.parametrize("offset", [300, 4100, 8300])
def test_flipped_bytes_in_the_header_blocks_are_damage_not_a_lock(base_db, tmp_path, offset):
    path = tmp_path / "flipped.duckdb"
    shutil.copy(base_db, path)
    with open(path, "r+b") as fh:
        fh.seek(offset)
        flipped = bytes(b ^ 0xFF for b in fh.read(64))
        fh.seek(offset)
        fh.write(flipped)
    for args in (["stats"], ["import", "--models", tmp_path / "none.csv"], ["db", "check"]):
        text = one_line_error(run(path, *args))
        assert str(path) in text and "database file is damaged" in text and "checksum" in text, (args, text)
        assert "locked" not in text


# --- 3. a full disk ----------------------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB tmpfs, mounted for the test (as root; skipped where no file system can be mounted)."""
    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8): no disk can be filled here")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path, leave: int = 0) -> Path:
    """Fill the file system of `folder` to `leave` bytes or fewer: a filler file, written until the disk is full."""
    filler = folder / "filler"
    with open(filler, "wb") as fh:
        free = shutil.disk_usage(folder).free - leave
        chunk = b"\0" * (64 * 1024)
        try:
            while free > 0:
                fh.write(chunk[:free])
                fh.flush()
                free -= min(len(chunk), free)
        except OSError:
            pass
    return filler


def test_register_and_import_on_a_full_disk_are_one_line_and_change_nothing(base_db, small_disk, tmp_path):
    db = small_disk / "registry.duckdb"
    shutil.copy(base_db, db)
    evals = known_results(db, tmp_path)
    models = tmp_path / "models.csv"
    models.write_text("model,family\nbrand-new-1,f\nbrand-new-2,f\n")
    before = snapshot(db)
    filler = fill(small_disk)
    for args in (["register", "newcomer", "--evals", evals], ["import", "--models", models]):
        text = one_line_error(run(db, *args))
        assert str(db) in text and "No space left on device" in text and str(small_disk) in text, text
        assert "free in" in text and "the write was rolled back" in text
    assert snapshot(db) == before
    filler.unlink()
    assert run(db, "import", "--models", models).exit_code == 0     # with room again, the same import works


@pytest.mark.parametrize("leave", [0, 150_000])
def test_a_failed_import_into_a_new_path_on_a_full_disk_leaves_no_file(small_disk, tmp_path, leave):
    models = tmp_path / "models.csv"
    models.write_text("model,family\nm1,f\n")
    new = small_disk / "new.duckdb"
    filler = fill(small_disk, leave)
    text = one_line_error(run(new, "import", "--models", models))
    assert "No space left on device" in text and str(new) in text
    assert not new.exists() and not Path(f"{new}.wal").exists() and not Path(f"{new}.index").exists()
    filler.unlink()
    res = run(new, "import", "--models", models)                        # the retry starts afresh
    assert res.exit_code == 0, res.output
    assert run(new, "models", "--json").exit_code == 0


# --- 5. a path that is not a DuckDB database ---------------------------------------------------------------------

def test_a_fifo_as_the_database_is_refused_at_once(tmp_path):
    fifo = tmp_path / "pipe.duckdb"
    os.mkfifo(fifo)
    out = registry_cli(fifo, "stats", timeout=60)          # (it waited for a writer for ever)
    text = one_line_stderr(out)
    assert str(fifo) in text and "FIFO" in text and "not a database file" in text
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_an_sqlite_file_is_not_a_duckdb_database_and_nothing_is_fetched(tmp_path):
    import sqlite3

    lite = tmp_path / "other.db"
    con = sqlite3.connect(lite)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    before = lite.read_bytes()
    for args in (["stats"], ["import", "--models", tmp_path / "m.csv"], ["db", "check"]):
        text = one_line_error(run(lite, *args))
        assert str(lite) in text and "not a DuckDB database" in text and "SQLite" in text, text
        assert "extension" not in text and "http" not in text
    assert lite.read_bytes() == before


def test_every_connection_is_opened_without_extension_autoloading(tmp_path):
    from registry.core.store import Store

    store = Store(tmp_path / "r.duckdb")
    try:
        with store.tx() as tx:
            rows = dict(tx.sql("SELECT name, value FROM duckdb_settings() WHERE name IN "
                               "('autoinstall_known_extensions', 'autoload_known_extensions')"))
        assert rows == {"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"}
        assert store._duckdb_config()["autoload_known_extensions"] is False       # (the staging database's too)
    finally:
        store.close()


# --- 6. a newer schema; `registry db check` ----------------------------------------------------------------------

def alter(db, *statements: str) -> None:
    con = duckdb.connect(str(db))
    try:
        for statement in statements:
            con.execute(statement)
    finally:
        con.close()


def test_a_schema_newer_than_ours_says_so_and_names_both_revisions(db_copy):
    from registry.core.store import head_revision

    alter(db_copy, "UPDATE alembic_version SET version_num = '9999_from_the_future'")
    before = snapshot(db_copy)
    for args in (["stats"], ["import", "--models", db_copy.parent / "none.csv"], ["db", "check"]):
        text = one_line_error(run(db_copy, *args))
        assert "newer than this registry knows" in text and "9999_from_the_future" in text, text
        assert head_revision() in text and "run `registry db upgrade`" not in text
    assert snapshot(db_copy) == before


def test_db_check_says_ok_for_a_sound_file(db_copy):
    res = run(db_copy, "db", "check")
    assert res.exit_code == 0 and "OK" in res.output and str(db_copy) in res.output, res.output
    res = run(db_copy, "db", "check", "--json")
    assert res.exit_code == 0 and '"ok": true' in res.output and '"problems": []' in res.output
    with Registry(db_copy) as reg:
        assert reg.check().ok


@pytest.mark.parametrize("damage, found", [
    (["DROP TABLE routing_log"], "table routing_log is missing"),
    (["INSERT INTO alembic_version VALUES ('0008')"], "alembic_version holds 2 rows"),
    (["ALTER TABLE models DROP COLUMN cost"], "table models lacks column cost"),
    (["DELETE FROM alembic_version"], "alembic_version holds no revision"),
])
def test_db_check_finds_what_is_wrong(db_copy, damage, found):
    alter(db_copy, *damage)
    before = snapshot(db_copy)
    text = one_line_error(run(db_copy, "db", "check"))
    assert found in text and str(db_copy) in text, text
    res = run(db_copy, "db", "check", "--json")
    assert res.exit_code == 1 and '"ok": false' in res.output and found in res.output
    assert snapshot(db_copy) == before


def test_db_check_of_a_missing_path_creates_nothing(tmp_path):
    missing = tmp_path / "typo.duckdb"
    assert "no such registry" in one_line_error(run(missing, "db", "check"))
    assert not missing.exists()


# --- 7. a blank serve token --------------------------------------------------------------------------------------

def test_serve_refuses_a_given_but_blank_token(db_copy):
    # (a process of its own: a server that took "" for no token would serve, open to writes, until stopped)
    text = one_line_stderr(registry_cli(db_copy, "serve", "--port", "1", "--token", "", timeout=60))
    assert "the token is blank" in text
