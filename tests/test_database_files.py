"""Damaged and read-only database files: one line naming the file; read commands read a file they may not
write."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.helpers import one_line_error, run

ROOT = Path(__file__).resolve().parents[1]



LONG_NAME = "x" * 140_000        # over the csv module's field limit of 131,072 characters


def first_model(db) -> str:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT name FROM models ORDER BY name LIMIT 1").fetchall()[0][0]
    finally:
        con.close()



def damaged(base_db, tmp_path, how: str) -> Path:
    path = tmp_path / f"{how}.duckdb"
    shutil.copy(base_db, path)
    if how == "noise":
        with open(path, "r+b") as fh:
            fh.seek(300_000)
            fh.write(os.urandom(16 * 1024))
    else:
        os.truncate(path, {"cut1m": 1_000_000, "cut8m": 8_000_000}[how])
    return path


@pytest.mark.parametrize("how", ["cut1m", "cut8m", "noise"])
def test_a_damaged_database_file_is_one_line_naming_it(base_db, tmp_path, how):
    assert base_db.stat().st_size > 8_000_000         # (the truncations cut into the file's data)
    model = first_model(base_db)
    path = damaged(base_db, tmp_path, how)
    failed = 0
    for args in (["stats"], ["models"], ["similar", model], ["show", model]):
        res = run(path, *args)
        if res.exit_code == 0:                         # a command may read only blocks that are intact
            continue
        text = one_line_error(res)
        assert str(path) in text and "database file is damaged" in text, (args, text)
        failed += 1
    assert failed                                     # stats reads every table: it meets the damage


def as_unprivileged(cmd: list[str]) -> list[str]:
    """The command run without the power to override file modes: root (as these tests run in CI) keeps its uid,
    since the interpreter may live under /root, but drops every capability (setpriv)."""
    if os.geteuid() != 0:
        return cmd
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a file mode cannot stop this process from writing")
    return [setpriv, "--bounding-set=-all", "--inh-caps=-all", *cmd]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["file", "folder"])
def test_read_commands_read_a_file_they_may_not_write(base_db, tmp_path, where):
    folder = tmp_path / "ro"
    folder.mkdir()
    path = folder / "registry.duckdb"
    shutil.copy(base_db, path)
    path.chmod(0o444)
    if where == "folder":                             # as on a read-only mount: no write-ahead log can be made
        folder.chmod(0o555)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    model = first_model(base_db)
    try:
        for args in (["stats"], ["models"], ["show", model]):
            out = subprocess.run(as_unprivileged([sys.executable, "-m", "registry", "--db", str(path), *args]),
                                 capture_output=True, text=True, env=env, timeout=120)
            assert out.returncode == 0, (args, out.stderr)
        out = subprocess.run(as_unprivileged([sys.executable, "-m", "registry", "--db", str(path),
                                              "mark-unavailable", model]),
                             capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 1 and out.stderr.strip().count("\n") == 0, out.stderr
        assert "read-only" in out.stderr and str(path) in out.stderr
    finally:
        folder.chmod(0o755)


def test_memory_limited_lowers_duckdb_limit_and_restores_it(tmp_path):
    """An import's transaction runs under a lowered DuckDB memory limit (usecases/importing.IMPORT_MEMORY): lowered
    inside, never raised above DuckDB's default, and back to the default after, an error or not."""
    from registry import Registry

    with Registry(tmp_path / "m.duckdb") as reg:
        limit = lambda: reg.store.con.execute("SELECT current_setting('memory_limit')").fetchone()[0]  # noqa: E731
        before = limit()
        with reg.store.memory_limited(1 << 30):
            assert limit() == "1.0 GiB"
        assert limit() == before
        with reg.store.memory_limited(1 << 50):                    # a petabyte: the default stays
            assert limit() == before
        with pytest.raises(RuntimeError), reg.store.memory_limited(1 << 29):
            raise RuntimeError("boom")
        assert limit() == before


def test_a_sidecar_is_written_whole_or_not_at_all(tmp_path):
    """What is kept beside a database (`<db>.index/`): written to a temporary name and renamed, so a reader sees the
    old file or the new one; a write that fails leaves the old one and no temporary behind."""
    from registry.core import database_file

    db = tmp_path / "r.duckdb"
    side = database_file.sidecar(str(db), "answers.bin")
    assert side == tmp_path / "r.duckdb.index" / "answers.bin"
    assert database_file.sidecar("postgresql://u@h/db", "answers.bin") is None
    assert database_file.sidecar(None, "answers.bin") is None
    assert database_file.write_whole(side, lambda tmp: tmp.write_bytes(b"old")) is True
    assert side.read_bytes() == b"old"

    def fails(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise OSError("disk full")
    assert database_file.write_whole(side, fails) is False
    assert side.read_bytes() == b"old"
    assert sorted(p.name for p in side.parent.iterdir()) == ["answers.bin"]
    assert database_file.write_whole(None, lambda tmp: tmp.write_bytes(b"x")) is False
