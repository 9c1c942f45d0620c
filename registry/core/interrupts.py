"""Ctrl-C in the command line: what counts as one (`is_interrupt`), the SIGINT handler that notes it came
(`raise_interrupt`, `sigint_seen`), and its stop of the DuckDB statement running (`sigint_stops_statements`,
`statement`): DuckDB's calls back into Python cannot carry a KeyboardInterrupt. The error a command then raises is
errors.Interrupted."""
from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def is_interrupt(exc: BaseException) -> bool:
    """Ctrl-C, however it arrives: Python's KeyboardInterrupt, or DuckDB's own stop of the query it was running
    (InterruptException, or a RuntimeError 'Query interrupted')."""
    return (isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "InterruptException"
            or (isinstance(exc, RuntimeError) and str(exc).strip() == "Query interrupted"))


# Ctrl-C while DuckDB runs a statement: DuckDB's own calls back into Python (an Arrow scan) cannot carry a
# KeyboardInterrupt raised inside them (pybind11 aborts the process: SIGABRT, no message), so inside
# `sigint_stops_statements` the statement is stopped through DuckDB instead, and the interrupt raised once it returns
_sigint: dict[str, Any] = {"armed": False, "running": None, "pending": False, "seen": False}


def raise_interrupt(signum: int, frame: Any) -> None:
    """The command line's SIGINT handler: KeyboardInterrupt, as Python's own, and a note that Ctrl-C came
    (`sigint_seen`): raised where Python cannot pass it on (a garbage collector's callback), it is lost, and the
    command would finish as if it had not come."""
    _sigint["seen"] = True
    raise KeyboardInterrupt


def forget_sigint() -> None:
    """A new command begins (a process may run several: a test's, a library user's)."""
    _sigint["seen"] = False


def sigint_seen() -> bool:
    """Whether Ctrl-C came in this process (under `raise_interrupt` or `sigint_stops_statements`)."""
    return bool(_sigint["seen"])


@contextmanager
def sigint_stops_statements() -> Iterator[None]:
    """While inside (on the main thread): Ctrl-C during a DuckDB statement (`statement`) interrupts that statement
    (it raises DuckDB's 'Query interrupted'); anywhere else it is Python's KeyboardInterrupt, as always."""
    if threading.current_thread() is not threading.main_thread() or _sigint["armed"]:
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        _sigint["seen"] = True
        if _sigint["running"] is None:
            raise KeyboardInterrupt
        _sigint["pending"] = True
        _sigint["running"].interrupt()

    previous = signal.signal(signal.SIGINT, handler)
    _sigint.update(armed=True, pending=False)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _sigint.update(armed=False, running=None, pending=False)


@contextmanager
def statement(con: Any) -> Iterator[None]:
    """Around one DuckDB call: where Ctrl-C is deferred, it interrupts `con`, and is raised when the call returns
    (a statement that finished before DuckDB saw the interrupt)."""
    if not _sigint["armed"]:
        yield
        return
    _sigint["running"] = con
    try:
        yield
    except BaseException:
        if _sigint["pending"]:         # (the statement failed because it was interrupted: that is what goes on)
            _sigint["pending"] = False
            raise KeyboardInterrupt from None
        raise
    finally:
        _sigint["running"] = None
    if _sigint["pending"]:
        _sigint["pending"] = False
        raise KeyboardInterrupt
