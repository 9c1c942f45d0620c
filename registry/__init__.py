"""registry: an embedded-database model registry for LLMs, built on the LOCUS method."""
from registry.core.errors import DatabaseLocked, InputError, NotFound, RegistryError, SchemaOutdated
from registry.core.resources import example_data

__all__ = ["Registry", "RouteOptions", "RegistryError", "InputError", "NotFound", "SchemaOutdated", "DatabaseLocked",
           "example_data"]


def __getattr__(name: str):
    # `from registry import Registry` without the CLI's start-up paying for the facade's imports before a command
    # needs them (the command line imports this package first)
    if name == "Registry":
        from registry.api import Registry

        return Registry
    if name == "RouteOptions":
        from registry.routing.decision import RouteOptions

        return RouteOptions
    raise AttributeError(f"module 'registry' has no attribute {name!r}")
