"""A module imported when it is first used. The facade names every domain module, but a command uses a few: `stats`
must not pay for numpy, FAISS or the routing code to print five counts."""
from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """Stands for the module `name`: the first attribute read imports it (the import system's own locks make that
    safe from several threads at once), and every read is the module's attribute."""

    def __init__(self, name: str):
        self.__dict__["__lazy_name__"] = name

    def __getattr__(self, attr: str) -> Any:
        module = self.__dict__.get("__lazy_module__")
        if module is None:
            module = self.__dict__["__lazy_module__"] = importlib.import_module(self.__lazy_name__)
        return getattr(module, attr)

    def __setattr__(self, attr: str, value: Any) -> None:    # a patch must reach the module every caller reads
        setattr(importlib.import_module(self.__lazy_name__), attr, value)

    def __repr__(self) -> str:
        return f"<lazy module {self.__lazy_name__!r}>"


def lazy_modules(package: str, names: str) -> list[LazyModule]:
    """One LazyModule per space-separated name in `package`, in order:
    `catalog, maps = lazy_modules("registry.answers", "catalog maps")`."""
    return [LazyModule(f"{package}.{name}") for name in names.split()]
