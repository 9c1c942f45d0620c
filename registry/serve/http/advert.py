"""Where a running `registry serve` can be reached, told to the command line: `<db>.serving`, a small JSON file
beside the DuckDB file it holds (pid, URL, whether its writes need the token), written atomically once the server
holds the file and removed when it stops. DuckDB lets no other process open a file the server holds, so a command
started meanwhile finds the lock, reads this file and goes through the server's HTTP API (serve/http/client.py).

A file whose process is gone (a server killed with SIGKILL leaves it) or that names another process than the lock's
holder is ignored: the lock, not this file, says who holds the database."""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass

SUFFIX = ".serving"


@dataclass(frozen=True)
class Advert:
    pid: int            # the server's process id (the DuckDB lock names the same one)
    url: str            # http://host:port, a loopback address where the server listens on every address
    db: str             # the database file's absolute path
    token: bool         # its writes need `Authorization: Bearer <token>`
    started: float      # seconds since the epoch


def path_of(db: str) -> str:
    return str(db) + SUFFIX


def url_for(host: str, port: int) -> str:
    """The URL a process on this machine reaches a server bound to `host` at: 0.0.0.0 and :: by loopback."""
    host = host.strip()
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host in ("::", "[::]"):
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def write(db: str, url: str, token: bool) -> str | None:
    """Advertise this process as the server of `db` (atomically: a reader sees the old file or the whole new one).
    -> the file's path; None where it cannot be written (a read-only folder): the command line then says the file
    is served without knowing where."""
    path = path_of(db)
    body = json.dumps({"pid": os.getpid(), "url": url, "db": os.path.abspath(db), "token": bool(token),
                       "started": time.time()})
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", dir=os.path.dirname(os.path.abspath(path)))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(body + "\n")
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return None
    return path


def remove(db: str) -> None:
    """Withdraw this process's advert (left alone if another process's: a server started since wrote it)."""
    found = read(db, check_alive=False)
    if found is not None and found.pid == os.getpid():
        try:
            os.remove(path_of(db))
        except OSError:
            pass


def read(db: str, pid: int | None = None, check_alive: bool = True) -> Advert | None:
    """The server advertised for `db`: None when there is no file, it cannot be read, its process is gone, or it
    names another process than `pid` (the lock's holder)."""
    try:
        with open(path_of(db), encoding="utf-8") as f:
            raw = json.load(f)
        found = Advert(pid=int(raw["pid"]), url=str(raw["url"]), db=str(raw.get("db", db)),
                       token=bool(raw.get("token", True)), started=float(raw.get("started", 0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid is not None and found.pid != pid:
        return None
    if check_alive and not alive(found.pid):
        return None
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # another user's process: alive
        return True
    except OSError:
        return False
    return True
