"""The registry's own error types. The library raises these; only cli.py turns them into click errors."""
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
