"""Where a running `registry serve` can be reached, told to the command line: `<db>.serving`, a small JSON file
beside the DuckDB file it holds (pid, URL, whether its writes need the token), written atomically once the server
holds the file and removed when it stops. DuckDB lets no other process open a file the server holds, so a command
started meanwhile finds the lock, reads this file and goes through the server's HTTP API (serve/http/client.py).

A file whose process is gone (a server killed with SIGKILL leaves it) or that names another process than the lock's
holder is ignored: the lock, not this file, says who holds the database.

Trusted only once proven: the advert holds a secret drawn by the server at start, in a file only its owner may read
(mode 0600). The command line reads an advert only if it is a small regular file (no link, FIFO or device) owned by
this user and unreadable to others (anything else is ignored, said in one line), and before it sends anything (a token,
a results file) it asks the advertised URL to answer a fresh challenge with that secret (`proof`, GET
/serving/proof?nonce=N): a server that cannot answer, another user's advert, or a port taken over since, gets nothing.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
import sys
import time
from dataclasses import dataclass

SUFFIX = ".serving"
MAX_BYTES = 4096        # an advert is one short JSON line: anything longer is not ours


@dataclass(frozen=True)
class Advert:
    pid: int            # the server's process id (the DuckDB lock names the same one)
    url: str            # http://host:port, a loopback address where the server listens on every address
    db: str             # the database file's absolute path
    token: bool         # its writes need `Authorization: Bearer <token>`
    started: float      # seconds since the epoch
    secret: str = ""    # what the server proves it holds (`proof`)


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


def new_secret() -> str:
    import secrets  # (here, not above: every command looks for an advert, only `serve` writes one)

    return secrets.token_hex(32)


def proof(secret: str, nonce: str, db: str) -> str:
    """The answer to a challenge: HMAC-SHA256 of the nonce and the database's real path under the advert's secret."""
    return hmac.new(secret.encode(), f"{nonce}\n{os.path.realpath(db)}".encode(), hashlib.sha256).hexdigest()


def write(db: str, url: str, token: bool, secret: str) -> str | None:
    """Advertise this process as the server of `db` (atomically: a reader sees the old file or the whole new one),
    readable by its owner only (it holds `secret`). -> the file's path; None where it cannot be written (a read-only
    folder): the command line then says the file is served without knowing where."""
    import tempfile

    path = path_of(db)
    body = json.dumps({"pid": os.getpid(), "url": url, "db": os.path.abspath(db), "token": bool(token),
                       "started": time.time(), "secret": secret})
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", dir=os.path.dirname(os.path.abspath(path)))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(body + "\n")
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return None
    return path


def remove(db: str) -> None:
    """Withdraw this process's advert (left alone if another process's: a server started since wrote it)."""
    found = read(db, check_alive=False, quiet=True)
    if found is not None and found.pid == os.getpid():
        try:
            os.remove(path_of(db))
        except OSError:
            pass


def read(db: str, pid: int | None = None, check_alive: bool = True, quiet: bool = False) -> Advert | None:
    """The server advertised for `db`: None when there is no file, it is not a small regular file of this user's
    that only this user can read (said on stderr in one line, unless `quiet`), it cannot be parsed, its process is
    gone, or it names another process than `pid` (the lock's holder)."""
    path = path_of(db)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)    # (a FIFO must not hold us)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _ignored(path, f"cannot be opened safely ({exc.strerror or exc}: a link, or not readable)", quiet)
    try:
        st = os.fstat(fd)
        problem = ("not a regular file" if not stat.S_ISREG(st.st_mode)
                   else f"owned by uid {st.st_uid}, not this user" if st.st_uid != os.geteuid()
                   else "readable by other users" if st.st_mode & 0o077
                   else f"over {MAX_BYTES} bytes" if st.st_size > MAX_BYTES else None)
        if problem:
            return _ignored(path, problem, quiet)
        data = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        raw = json.loads(data.decode("utf-8"))
        found = Advert(pid=int(raw["pid"]), url=str(raw["url"]), db=str(raw.get("db", db)),
                       token=bool(raw.get("token", True)), started=float(raw.get("started", 0)),
                       secret=str(raw["secret"]))
    except (ValueError, KeyError, TypeError, AttributeError):
        return _ignored(path, "not an advert this registry wrote (malformed, or no secret)", quiet)
    if pid is not None and found.pid != pid:
        return None
    if check_alive and not alive(found.pid):
        return None
    return found


def _ignored(path: str, why: str, quiet: bool) -> Advert | None:
    """None, having said why on stderr (unless `quiet`)."""
    if not quiet:
        print(f"{path}: ignored: {why}; the command opens the database itself", file=sys.stderr, flush=True)
    return None


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
