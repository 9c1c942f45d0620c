"""registry: an embedded-database model registry for LLMs, built on the LOCUS method."""
from registry.api import Registry
from registry.core.errors import DatabaseLocked, InputError, NotFound, RegistryError, SchemaOutdated
from registry.routing.options import RouteOptions

__all__ = ["Registry", "RouteOptions", "RegistryError", "InputError", "NotFound", "SchemaOutdated", "DatabaseLocked"]
