"""Many users on one file: while `registry serve` holds a DuckDB file, the command line's reads and writes go
through its HTTP API and print what they print on the file itself; two commands on a file no server holds take
turns (REGISTRY_BUSY_TIMEOUT) instead of the second failing at once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from registry import Registry

from .conftest import start_server

TOKEN = "many-users"
ROOT = Path(__file__).resolve().parents[1]


def cli(db, *args: str, token: str | None = None, env: dict | None = None, timeout: float = 300):
    full = {k: v for k, v in os.environ.items() if k != "REGISTRY_TOKEN"}
    full.update(env or {})
    if token:
        full["REGISTRY_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "registry", "--db", str(db), *args], capture_output=True,
                          text=True, timeout=timeout, env=full, cwd=ROOT)


def results_file(db, path: Path, model: str, n: int = 120) -> Path:
    """`n` of `model`'s results on non-test queries, flipped (another model's answers), as a CSV to register."""
    with Registry(db) as reg, reg.store.tx() as tx:
        rows = tx.sql("""SELECT q.external_id, 1 - e.correct::INT FROM evaluations e JOIN models m ON m.id = e.model_id
                         JOIN queries q ON q.id = e.query_id LEFT JOIN query_splits s ON s.query_id = q.id
                         WHERE m.name = ? AND coalesce(s.split, '') <> 'test' ORDER BY q.external_id LIMIT ?""",
                      [model, n])
    path.write_text("question_id,correct\n" + "".join(f"{q},{c}\n" for q, c in rows))
    return path


def known_text(db) -> str:
    with Registry(db) as reg, reg.store.tx() as tx:
        return tx.sql("""SELECT q.text FROM queries q JOIN text_vectors v ON v.content_hash = q.content_hash
                         ORDER BY q.id LIMIT 1""")[0][0]


@pytest.mark.slow
def test_commands_go_through_the_server_and_print_what_they_print_on_the_file(db_copy, tmp_path):
    with Registry(db_copy) as reg:
        model = reg.models()[0].name
    evals = results_file(db_copy, tmp_path / "new.csv", model)
    text = known_text(db_copy)
    reads = [("stats",), ("models",), ("models", "--limit", "5", "--offset", "3"), ("show", model),
             ("similar", model, "-k", "4"), ("history", model)]
    proc, origin = start_server(db_copy, TOKEN)
    try:
        found = json.loads(Path(str(db_copy) + ".serving").read_text())
        assert found["pid"] == proc.pid and found["url"] == origin and found["token"] is True
        routed = cli(db_copy, "route", text, "--json")
        assert routed.returncode == 0, routed.stderr
        assert json.loads(routed.stdout)["model"]
        assert cli(db_copy, "route", text).returncode == 0

        # a write needs the token: without it one line, nothing sent
        r = cli(db_copy, "register", "via-server", "--evals", str(evals))
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "REGISTRY_TOKEN" in r.stderr, r.stderr
        r = cli(db_copy, "register", "via-server", "--evals", str(evals), token="wrong")
        assert r.returncode == 1 and "refused the token" in r.stderr and r.stderr.count("\n") == 1, r.stderr
        r = cli(db_copy, "register", "via-server", "--evals", str(evals), "--family", "flipped", "--tag", "k=v",
                "--json", token=TOKEN)
        assert r.returncode == 0, r.stderr
        registered = json.loads(r.stdout)
        assert registered["model"] == "via-server" and registered["evaluations_added"] == 120
        # an error names the file as the user gave it, as on the file itself
        bad = tmp_path / "bad.csv"
        bad.write_text("question_id,correct\nno-such-query,1\n")
        r = cli(db_copy, "register", "via-server-2", "--evals", str(bad), token=TOKEN)
        assert r.returncode == 1 and str(bad) in r.stderr and "uploaded" not in r.stderr, r.stderr
        after = cli(db_copy, "show", "via-server", "--json")
        assert json.loads(after.stdout)["family"] == "flipped" and json.loads(after.stdout)["tags"] == {"k": "v"}
        served = {args: [cli(db_copy, *args, *j) for j in ((), ("--json",))] for args in reads}
        for args, outs in served.items():
            for r in outs:
                assert r.returncode == 0 and r.stdout and not r.stderr, (args, r.stdout, r.stderr)

        # a command without an HTTP counterpart: one line, where the file is served and what to do
        r = cli(db_copy, "diff", model)
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert f"served by process {proc.pid} at {origin}" in r.stderr and "`registry diff`" in r.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert not Path(str(db_copy) + ".serving").exists()          # withdrawn at shutdown

    # the same reads on the file itself print the same, text and --json
    for args, outs in served.items():
        for r, j in zip(outs, ((), ("--json",))):
            local = cli(db_copy, *args, *j)
            assert local.returncode == 0 and local.stdout == r.stdout, (args, j, local.stdout, r.stdout)
    assert served[("stats",)][0].stdout.startswith(f"{db_copy}: ")     # the path as given


@pytest.mark.slow
def test_two_registers_started_together_both_land(db_copy, tmp_path):
    with Registry(db_copy) as reg:
        a, b = [m.name for m in reg.models()[:2]]
    files = [results_file(db_copy, tmp_path / f"{m}.csv", m) for m in (a, b)]
    procs = [subprocess.Popen([sys.executable, "-m", "registry", "--db", str(db_copy), "register", f"turn-{i}",
                               "--evals", str(f), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT) for i, f in enumerate(files)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sum("waiting for process" in err for _, err in outs) <= 1
    with Registry(db_copy) as reg:
        names = {m.name for m in reg.models()}
    assert {"turn-0", "turn-1"} <= names


def hold(db, seconds: float, *argv: str):
    """A process holding the DuckDB file's lock for `seconds`, `argv` on its command line (a `registry serve`'s
    look-alike, say)."""
    code = ("import sys, time, duckdb; c = duckdb.connect(sys.argv[1]); print('held', flush=True); "
            "time.sleep(float(sys.argv[2])); c.close()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(db), str(seconds), *argv], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.slow
def test_a_command_waits_its_turn_on_a_held_file(db_copy):
    """The holder lets go only once the command has said it waits (a fixed hold raced a slow start on a busy
    machine: the command came after the file was free, and said nothing)."""
    code = ("import sys, duckdb; c = duckdb.connect(sys.argv[1]); print('held', flush=True); sys.stdin.readline(); "
            "c.close()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(db_copy)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    env = {k: v for k, v in os.environ.items() if k != "REGISTRY_TOKEN"} | {"REGISTRY_BUSY_TIMEOUT": "60"}
    try:
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "registry", "--db", str(db_copy), "stats", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        said = proc.stderr.readline()
        time.sleep(0.5)
        holder.stdin.write("go\n")
        holder.stdin.flush()
        out, rest = proc.communicate(timeout=120)
        waited = time.monotonic() - t0
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert proc.returncode == 0 and json.loads(out)["models"] > 0, said + rest
    assert f"waiting for process {holder.pid}" in said and rest == "", said + rest
    assert waited >= 0.5


def test_past_the_busy_timeout_the_lock_is_one_line(db_copy):
    proc = hold(db_copy, 30)
    try:
        t0 = time.monotonic()
        r = cli(db_copy, "stats", env={"REGISTRY_BUSY_TIMEOUT": "0.5"})
        waited = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 2, lines          # that it waits, then the lock
    assert "waiting for process" in lines[0] and f"locked by process {proc.pid}" in lines[1]
    assert waited < 10


def test_a_stale_advert_is_ignored(db_copy):
    """A server killed with SIGKILL leaves its advert: one naming a process that is gone (or not the lock's holder)
    is not followed; the lock's own line says who holds the file."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    fd = os.open(str(db_copy) + ".serving", os.O_WRONLY | os.O_CREAT, 0o600)    # (as a server writes it)
    os.write(fd, json.dumps({"pid": dead.pid, "url": "http://127.0.0.1:9", "db": str(db_copy), "token": False,
                             "started": 0, "secret": "s" * 64}).encode())
    os.close(fd)
    proc = hold(db_copy, 30, "-m", "registry", "serve", "--port", "9")
    try:
        r = cli(db_copy, "stats", env={"REGISTRY_BUSY_TIMEOUT": "0.5"})
    finally:
        proc.kill()
        proc.wait()
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, lines
    assert f"locked by process {proc.pid}" in lines[0] and "HTTP API" in lines[0] and "127.0.0.1:9" not in lines[0]


def test_the_advert_is_written_whole_and_withdrawn_only_by_its_writer(tmp_path):
    from registry.serve.http import advert

    db = str(tmp_path / "r.duckdb")
    assert advert.write(db, advert.url_for("0.0.0.0", 8000), True, "s" * 64) == db + ".serving"
    found = advert.read(db, pid=os.getpid())
    assert found is not None and found.url == "http://127.0.0.1:8000" and found.token and found.secret == "s" * 64
    assert os.stat(db + ".serving").st_mode & 0o777 == 0o600            # its secret: the owner's alone
    assert advert.read(db, pid=os.getpid() + 1) is None                  # not the lock's holder
    assert advert.url_for("::", 80) == "http://[::1]:80"
    assert [p.name for p in tmp_path.iterdir()] == ["r.duckdb.serving"]  # no temporary file left
    Path(db + ".serving").write_text(json.dumps({"pid": 1, "url": "http://x:1", "secret": "t" * 64}))
    os.chmod(db + ".serving", 0o600)
    advert.remove(db)                                                     # another process's: kept
    assert Path(db + ".serving").exists()


def test_the_busy_timeout_is_a_setting(monkeypatch):
    from registry.core import settings
    from registry.core.errors import InputError

    assert settings.Settings().busy_timeout == 30
    monkeypatch.setenv("REGISTRY_BUSY_TIMEOUT", "2.5")
    assert settings.current().busy_timeout == 2.5
    monkeypatch.setenv("REGISTRY_BUSY_TIMEOUT", "-1")
    with pytest.raises(InputError, match="REGISTRY_BUSY_TIMEOUT"):
        settings.current()


@pytest.mark.slow
def test_the_server_answers_similar_from_memory_as_the_library_does(db_copy, tmp_path):
    """A running server ranks `similar` from its snapshot and answer book (no read of every evaluation, which took
    seconds beside the writer under load); the answer is the library's, models known from few answers (placed by
    their answers' bound and their kin) included."""
    import random

    from fastapi.testclient import TestClient

    from registry.serve.app import create_app

    with Registry(db_copy) as reg:
        first = reg.models()[0].name
        reg.register("few-copy", str(results_file(db_copy, tmp_path / "copy.csv", first, 48)))
        rnd = random.Random(0)
        coin = tmp_path / "coin.csv"
        coin.write_text("question_id,correct\n" + "".join(
            f"{line.split(',')[0]},{rnd.randint(0, 1)}\n"
            for line in results_file(db_copy, tmp_path / "c.csv", first, 56).read_text().splitlines()[1:]))
        reg.register("few-coin", str(coin))
    app = create_app(str(db_copy))
    with TestClient(app) as client:
        state = app.state.server
        names = [m.name for m in state.registry.models() if m.version is not None]
        assert {"few-copy", "few-coin"} <= set(names)
        placed = set()
        for name in names:
            for k in (3, len(names)):
                served = state.serving.similar(name, k=k)
                assert served == state.registry.similar(name, k=k), (name, k)
                placed |= {x.placed_by for x in served}
        assert "few answers" in placed and "answers" in placed
        assert client.get(f"/models/{first}/similar?k=4").json() == json.loads(json.dumps(
            [x.__dict__ for x in state.registry.similar(first, k=4)]))
