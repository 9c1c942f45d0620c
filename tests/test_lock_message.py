"""A locked database file: the message says which process holds it."""
from __future__ import annotations

import pytest

from registry import Registry


def hold(db, *argv: str):
    """A process holding the DuckDB file's lock, with `argv` on its command line after the code it runs."""
    import subprocess
    import sys

    code = "import sys, time, duckdb; c = duckdb.connect(sys.argv[1]); print('held', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code, str(db), *argv], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("argv, server", [
    (("-m", "registry", "import", "/data/mmlu"), False),            # another import: no "HTTP API" to point to
    (("-m", "registry", "serve", "--port", "8000", "--token", "s3cret"), True),
    ((), False),                                                    # not a registry: its command line, no guess
])
def test_the_lock_message_says_who_holds_the_file(db_copy, argv, server, monkeypatch):
    from registry.core.errors import DatabaseLocked

    monkeypatch.setenv("REGISTRY_BUSY_TIMEOUT", "0")       # (another command's turn is waited for: not here)
    proc = hold(db_copy, *argv)
    try:
        with pytest.raises(DatabaseLocked) as caught:
            Registry(db_copy)
    finally:
        proc.kill()
        proc.wait()
    msg = str(caught.value)
    assert f"locked by process {proc.pid} (" in msg and "\n" not in msg
    assert ("HTTP API" in msg) == server and ("registry serve" not in msg or server)
    if argv:
        assert f"(registry {' '.join(argv[2:4])}" in msg
    else:
        assert "(python" in msg
    assert "s3cret" not in msg                                      # a token on the command line stays hidden
