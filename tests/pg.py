"""A throwaway PostgreSQL for the tests (and by hand, `python -m tests.pg`): initdb in a temporary folder, a free
loopback port, `pg_ctl start`; `stop()` ends it. Run as root, the server runs as the `postgres` user (PostgreSQL
refuses to run as root)."""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def bin_dir() -> Path | None:
    """PostgreSQL 15's binaries if installed, else the newest installed; None if there are none."""
    preferred = Path("/usr/lib/postgresql/15/bin")
    if (preferred / "initdb").exists():
        return preferred
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, durable: bool = False):
        self.bin = bin_dir()
        if self.bin is None:
            raise RuntimeError("no PostgreSQL binaries under /usr/lib/postgresql/*/bin (apt-get install postgresql)")
        self.dir = Path(tempfile.mkdtemp(prefix="registry-pg-"))
        self.port = _free_port()
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.user = "postgres" if os.geteuid() == 0 else os.environ.get("USER", "postgres")
        if self.as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        data = self.dir / "data"
        self._run([str(self.bin / "initdb"), "-D", str(data), "-U", self.user, "--auth=trust", "-E", "UTF8",
                   "--locale=C", "--no-sync"])
        # tests: no fsync (a crash of the test machine loses a throwaway database); a bench passes durable=True
        fast = "" if durable else " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200"
                f" -c shared_buffers=128MB{fast}")
        self._run([str(self.bin / "pg_ctl"), "-D", str(data), "-l", str(self.dir / "log"), "-w", "-t", "60",
                   "-o", opts, "start"])
        self.started = True

    def _run(self, cmd):
        res = subprocess.run(self.as_postgres + cmd, capture_output=True, text=True)
        if res.returncode != 0:
            log = (self.dir / "log").read_text()[-2000:] if (self.dir / "log").exists() else ""
            raise RuntimeError(f"{' '.join(cmd[:1])} failed: {res.stderr.strip()[-2000:]} {log}")

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"

    def admin(self, sql: str) -> None:
        """Run one statement outside a transaction (CREATE DATABASE)."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql)

    def create_db(self, name: str, template: str | None = None) -> str:
        self.admin(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return self.url(name)

    def stop(self) -> None:
        if getattr(self, "started", False):
            subprocess.run(self.as_postgres + [str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m",
                                               "immediate", "-w", "stop"], capture_output=True)
            self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)


if __name__ == "__main__":        # by hand: start one and print its URL; Ctrl-C stops it
    import time

    server = Server()
    server.create_db("registry")
    print(server.url("registry"), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
