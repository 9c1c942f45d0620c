"""registry: an embedded-database model registry for LLMs, built on the LOCUS method."""
from registry.api import Registry
from registry.core.errors import DatabaseLocked, InputError, NotFound, RegistryError, SchemaOutdated

__all__ = ["Registry", "RegistryError", "InputError", "NotFound", "SchemaOutdated", "DatabaseLocked"]
