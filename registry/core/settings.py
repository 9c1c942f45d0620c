"""The registry's settings from the environment, read in one place: every REGISTRY_* variable the library and the
server look at is a field of `Settings`, and `current()` reads them all afresh (a test, or a caller that changed
the environment, sees its change on the next call). docs/configuration.md lists them beside the CLI's flags.

An unset or empty variable takes its default; a value that does not parse is refused naming the variable.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from registry.core.errors import InputError

DEFAULT_DB = "registry.duckdb"


@dataclass(frozen=True)
class Settings:
    # REGISTRY_DB: the registry a command or `Registry()` opens when none is given: a DuckDB file's path, or a
    # PostgreSQL URL postgresql://user@host:port/dbname (the CLI's --db reads the same variable)
    db: str = DEFAULT_DB
    # REGISTRY_PROBATION_MIN: the fewest evaluations behind a model's embedding for routing to choose it unasked;
    # None: the library's own default (locus/evidence.py, 500). The CLI's --probation-min wins over it.
    probation_min: int | None = None
    # REGISTRY_DUCKDB_THREADS: the worker threads DuckDB runs each query on, in every DuckDB database the registry
    # opens (its file, and the in-memory one that reads files for a PostgreSQL registry); None: DuckDB's own
    # default (one per core) for the CLI and the library, 1 for `registry serve` (serve/app.py)
    duckdb_threads: int | None = None
    # REGISTRY_TOKEN: the bearer token a server's writing endpoints need (serve's --token or --token-file wins), and
    # what a command sends a server it goes through; REGISTRY_TOKEN_FILE: a file holding it (not on any command
    # line, where `ps` shows it), read where REGISTRY_TOKEN is unset
    token: str | None = None
    # REGISTRY_UPSTREAM_KEYS: `registry serve` only: NAME=URL,NAME=URL: the environment variables holding upstream
    # API keys that the server may read, each bound to the one origin its key may reach (the CLI's --upstream-key
    # adds to them); none: the server sends no key
    upstream_keys: tuple[str, ...] = ()
    # REGISTRY_THREADS: `registry serve` only: threads per numeric call (torch, faiss, numpy's BLAS)
    threads: int = 1
    # REGISTRY_SWITCH_INTERVAL: `registry serve` only: seconds between Python's thread switches (CPython's default
    # is 0.005; a route must not wait out the writer's time slice)
    switch_interval: float = 0.001
    # REGISTRY_WRITER_NICE: `registry serve` only: the writer thread's nice value when the CPU is full; < 0 (a
    # boost, needs CAP_SYS_NICE, else it stays 0) lets registrations go before routes, > 0 lets routes go first
    writer_nice: int = 0
    # REGISTRY_BUSY_TIMEOUT: seconds a process waits for a DuckDB file another registry process holds (a command
    # line's turn, as SQLite's busy timeout), retrying with backoff, before it says the file is locked; 0: at once
    busy_timeout: float = 30.0


def current() -> Settings:
    """The settings as the environment holds them now."""
    env = os.environ
    return Settings(db=env.get("REGISTRY_DB") or DEFAULT_DB,
                    probation_min=_number("REGISTRY_PROBATION_MIN", int, None),
                    token=env.get("REGISTRY_TOKEN") or token_from_file(env.get("REGISTRY_TOKEN_FILE") or None,
                                                                       "REGISTRY_TOKEN_FILE"),
                    upstream_keys=tuple(p.strip() for p in env.get("REGISTRY_UPSTREAM_KEYS", "").split(",")
                                        if p.strip()),
                    duckdb_threads=_number("REGISTRY_DUCKDB_THREADS", int, None, least=1),
                    threads=_number("REGISTRY_THREADS", int, Settings.threads, least=1),
                    switch_interval=_number("REGISTRY_SWITCH_INTERVAL", float, Settings.switch_interval),
                    writer_nice=_number("REGISTRY_WRITER_NICE", int, Settings.writer_nice),
                    busy_timeout=_number("REGISTRY_BUSY_TIMEOUT", float, Settings.busy_timeout, least=0))


def _number(name: str, kind: type, default: Any, least: int | None = None) -> Any:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise InputError(f"{name} must be {'a whole number' if kind is int else 'a number'}, got {raw!r}") from None
    if least is not None and value < least:
        raise InputError(f"{name} must be at least {least}, got {raw!r}")
    return value


def token_from_file(path: str | None, label: str) -> str | None:
    """The token in `path`: its first line, stripped (a regular file of at most 4 KiB). None where no path is given;
    InputError, one line, for a file that cannot be one."""
    if path is None:
        return None
    import stat

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
            raise InputError(f"{label}: {path}: not a regular file of at most 4 KiB")
        with open(path, encoding="utf-8") as fh:
            token = fh.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{label}: {path}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    if not token:
        raise InputError(f"{label}: {path}: holds no token (its first line is blank)")
    return token
