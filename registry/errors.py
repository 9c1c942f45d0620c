"""The registry's own error types. The library raises these; only the CLI (cli_common.handles_errors) turns them
into click errors, and the HTTP server into status codes."""
from __future__ import annotations


class RegistryError(Exception):
    """Base class: every message is one line a user can act on."""


class InputError(RegistryError):
    """Bad user input: names the file, the line (or row) and the problem."""

    def __init__(self, problem: str, file: str | None = None, line: int | None = None):
        self.file, self.line, self.problem = file, line, problem
        where = ""
        if file is not None:
            where = f"{file}: " if line is None else f"{file}: line {line}: "
        super().__init__(f"{where}{problem}")


class NotFound(RegistryError):
    pass


class SchemaOutdated(RegistryError):
    pass


class DatabaseLocked(RegistryError):
    pass


def unknown_model(name: str, known, where: str = "") -> NotFound:
    """NotFound for a model name the registry lacks, with the names it most likely meant: those containing it
    (`gpt-4o` -> `gpt-4o-2024-05-13`), then the closest spellings."""
    import difflib

    known = sorted(set(known))
    low = name.lower()
    guesses = [k for k in known if low and low in k.lower()]
    guesses += [k for k in difflib.get_close_matches(name, known, n=3, cutoff=0.5) if k not in guesses]
    hint = f"; did you mean {' or '.join(repr(g) for g in guesses[:3])}?" if guesses else ""
    return NotFound(f"unknown model {name!r}{where}{hint}")
