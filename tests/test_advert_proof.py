"""The `<db>.serving` advert is trusted only once its server proves it holds the database: another user's advert, a
rewritten one, a FIFO, a link to /dev/zero or a malformed file gets nothing of ours (no token, no results file), never
hangs a command, and is said in one line."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

TOKEN = "s3cret-token-of-the-victim"


class Listener:
    """An attacker's HTTP listener: records every request whole, answers each with a 'proof' that proves nothing."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            raw = b""
            try:
                while b"\r\n\r\n" not in raw:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    raw += chunk
                head = raw.split(b"\r\n\r\n")[0].lower()
                size = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.startswith(b"content-length")),
                            0)
                while len(raw.split(b"\r\n\r\n", 1)[1]) < size:
                    raw += conn.recv(65536)
            except (OSError, IndexError, ValueError):
                pass
            self.requests.append(raw)
            body = json.dumps({"proof": "0" * 64, "models": 1}).encode()
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
            except OSError:
                pass
            conn.close()

    def close(self):
        self._stop = True
        self.sock.close()

    def leaked(self) -> list[bytes]:
        """Requests that carried anything of the victim's: the token, or a body (a results file)."""
        return [r for r in self.requests if TOKEN.encode() in r or b"authorization" in r.lower()
                or len(r.split(b"\r\n\r\n", 1)[-1]) > 0]


@pytest.fixture
def listener():
    lst = Listener()
    yield lst
    lst.close()


def cli(db, *args, timeout=60):
    env = {**os.environ, "REGISTRY_TOKEN": TOKEN, "REGISTRY_BUSY_TIMEOUT": "1"}
    return subprocess.run([sys.executable, "-m", "registry", "--db", str(db), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=timeout)


def plant(db, listener, *, pid: int, mode: int = 0o600, secret: str = "f" * 64) -> str:
    path = str(db) + ".serving"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.write(fd, json.dumps({"pid": pid, "url": f"http://127.0.0.1:{listener.port}", "db": os.path.abspath(db),
                             "token": True, "started": time.time(), "secret": secret}).encode())
    os.close(fd)
    os.chmod(path, mode)
    return path


def look_alike(db, seconds: float = 60):
    """A process holding the DuckDB file's lock with `registry serve` on its command line (an attacker's stand-in for
    a server, or the victim's server whose port another process took over)."""
    code = ("import sys, time, duckdb; c = duckdb.connect(sys.argv[1]); print('held', flush=True); "
            "time.sleep(float(sys.argv[2]))")
    proc = subprocess.Popen([sys.executable, "-c", code, str(db), str(seconds), "-m", "registry", "serve"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's file needs root (chown)")
def test_another_users_advert_gets_nothing(db_copy, listener):
    """Planted by another user in a shared folder, naming a live `registry serve` look-alike: ignored in one line;
    the command opens the file itself."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "registry", "serve"])
    try:
        path = plant(db_copy, listener, pid=proc.pid)
        os.chown(path, 65534, 65534)
        r = cli(db_copy, "stats")
    finally:
        proc.kill()
        proc.wait()
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "ignored" in lines[0] and "owned by uid 65534" in lines[0], r.stderr
    assert listener.requests == []


@pytest.mark.slow
def test_a_rewritten_advert_whose_server_cannot_prove_it_gets_no_token_and_no_file(db_copy, listener, tmp_path):
    """The user's own advert, rewritten to point elsewhere (or the victim's server gone and its port taken): the
    listener gets a challenge with nothing of ours in it; reads and a registration both refuse in one line."""
    proc = look_alike(db_copy)
    try:
        plant(db_copy, listener, pid=proc.pid)
        evals = tmp_path / "mine.csv"
        evals.write_text("question_id,correct\nq1,1\n")
        outs = [cli(db_copy, "stats"), cli(db_copy, "register", "m", "--evals", evals)]
    finally:
        proc.kill()
        proc.wait()
    for r in outs:
        assert r.returncode == 1, r.stderr
        assert "did not prove it holds this database" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith("Error: "), r.stderr
    assert listener.requests and all(r.startswith(b"GET /serving/proof?nonce=") for r in listener.requests)
    assert listener.leaked() == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "malformed", "world-readable", "huge"])
def test_odd_adverts_are_one_line_and_never_hang(db_copy, listener, kind):
    path = str(db_copy) + ".serving"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        os.symlink("/dev/zero", path)
    elif kind == "malformed":
        with open(path, "w") as fh:
            fh.write('{"pid": "x", "url": ')
        os.chmod(path, 0o600)
    elif kind == "world-readable":
        plant(db_copy, listener, pid=os.getpid(), mode=0o644)
    else:
        with open(path, "w") as fh:
            fh.write(" " * 100_000)
        os.chmod(path, 0o600)
    t0 = time.monotonic()
    r = cli(db_copy, "stats", timeout=30)
    assert time.monotonic() - t0 < 20
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(path + ": ignored: "), r.stderr
    assert listener.requests == []
