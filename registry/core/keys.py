"""Which API key may go where. An endpoint names the environment variable that holds its key (never the key); a
server reads only the variables its owner bound at start-up, each to the one origin it may reach
(`serve --upstream-key NAME=https://api.example.com`), so that nobody who can write an endpoint row can send another
of the server's variables, or a bound key, to an address of their choosing. The owner's own process (the command
line, the library) reads the variable its endpoint names, for that endpoint's URL: the owner chose both.

Keys are read at the moment a request is sent, never stored or logged."""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from registry.core.errors import Conflict, InputError

# an environment variable's name as shells write one (POSIX: letters, digits and _, not starting with a digit)
ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"
DEFAULT_PORTS = {"http": 80, "https": 443}


class KeyRefused(Conflict):
    """A key variable that may not be sent where it was asked to go (not bound, or bound to another origin), or
    that is not set: nothing was sent and nothing written. Over HTTP a 409."""


def origin(url: str) -> str:
    """'HTTPS://Api.Example.com/v1' -> 'https://api.example.com:443': scheme, host and port, the port explicit."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise InputError(f"not a URL: {url!r} ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise InputError(f"not an http(s) URL with a host: {url!r}")
    host = parts.hostname.lower().rstrip(".")
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port or DEFAULT_PORTS[scheme]}"


@dataclass(frozen=True)
class UpstreamKeys:
    """bound: variable -> the origin its key may reach; None: the owner's own process (any variable, for the URL
    the owner gave)."""
    bound: Mapping[str, str] | None = field(default=None)

    @classmethod
    def parse(cls, specs: Iterable[str]) -> UpstreamKeys:
        """`NAME=URL` each (`serve --upstream-key`, REGISTRY_UPSTREAM_KEYS comma-separated): a server's bindings,
        none if none given (then it sends no key)."""
        bound: dict[str, str] = {}
        for spec in specs:
            name, sep, url = spec.partition("=")
            name = name.strip()
            if not sep or not re.fullmatch(ENV_NAME, name):
                raise InputError(f"--upstream-key takes NAME=URL (an environment variable's name and the origin "
                                 f"its key may reach), got {spec!r}")
            where = origin(url)
            if bound.get(name, where) != where:
                raise InputError(f"--upstream-key: {name} is bound twice ({bound[name]} and {where}): a key reaches "
                                 f"one origin")
            bound[name] = where
        return cls(bound)

    @property
    def owner(self) -> bool:
        return self.bound is None

    def check(self, variable: str | None, url: str) -> None:
        """Refuse (KeyRefused) an endpoint at `url` whose key is in `variable` unless that variable may reach it."""
        if variable is None or self.bound is None:
            return
        if variable not in self.bound:
            bound = ", ".join(sorted(self.bound)) or "none"
            raise KeyRefused(f"api_key_env {variable!r} is not bound on this server (bound: {bound}); the owner "
                             f"binds a key to its origin at start-up: serve --upstream-key {variable}=URL")
        if origin(url) != self.bound[variable]:
            raise KeyRefused(f"api_key_env {variable!r} may reach only {self.bound[variable]}, not "
                             f"{origin(url)}: its key is never sent elsewhere")

    def header(self, variable: str | None, url: str) -> dict[str, str]:
        """{"authorization": "Bearer <key>"} for a request to `url` (empty without a variable); KeyRefused where
        the key may not go there or the variable is not set (a keyed endpoint is never called without its key)."""
        if variable is None:
            return {}
        self.check(variable, url)
        key = os.environ.get(variable, "").strip()
        if not key:
            raise KeyRefused(f"the API key variable {variable} is not set in "
                             f"{'this command' if self.owner else 'the server'}'s environment: set it "
                             f"{'' if self.owner else 'before `registry serve` '}or give the endpoint another one")
        return {"authorization": f"Bearer {key}"}

    def secret(self, variable: str | None) -> str | None:
        """The key's value, only to scrub it from what an upstream sends back."""
        return os.environ.get(variable) if variable else None


OWNER = UpstreamKeys()
