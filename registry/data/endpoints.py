"""Where the routing proxy sends a model's requests: an OpenAI-compatible base URL, the model id the upstream knows
it by, and the name of the environment variable that holds its API key (read at request time, never stored or
logged). Append-only like availability: the newest row per model counts, and a row without a base URL removes it."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from registry.core.errors import InputError, NotFound, unknown_model
from registry.core.keys import ENV_NAME  # noqa: F401  (the HTTP schema reads it from here)
from registry.core.transaction import Tx

# an environment variable's name as shells write one (POSIX: letters, digits and _, not starting with a digit)


@dataclass
class Endpoint:
    model: str
    base_url: str
    upstream_model: str          # the "model" sent upstream (default: the registry's name)
    api_key_env: str | None = None


OCTET = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = f"{OCTET}(\\.{OCTET}){{3}}"
H16 = "[0-9A-Fa-f]{1,4}"
LS32 = f"({H16}:{H16}|{IPV4})"
# RFC 3986's IPv6address, form by form (what ipaddress.IPv6Address takes, zone ids aside)
IPV6 = "|".join([f"({H16}:){{6}}{LS32}", f"::({H16}:){{5}}{LS32}", f"({H16})?::({H16}:){{4}}{LS32}",
                 f"(({H16}:){{0,1}}{H16})?::({H16}:){{3}}{LS32}", f"(({H16}:){{0,2}}{H16})?::({H16}:){{2}}{LS32}",
                 f"(({H16}:){{0,3}}{H16})?::{H16}:{LS32}", f"(({H16}:){{0,4}}{H16})?::{LS32}",
                 f"(({H16}:){{0,5}}{H16})?::{H16}", f"(({H16}:){{0,6}}{H16})?::"])
# a name's last label is not all digits (a host ending in a number is read as an IPv4 address)
NAME = "([A-Za-z0-9_-]+\\.)*[0-9]*[A-Za-z_-][A-Za-z0-9_-]*"
PORT = "(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
MAX_URL = 2048          # characters of a base URL


@functools.cache
def base_url_regex() -> str:
    """The base URLs `parse_base_url` takes once stripped, as a regex that Python and ECMA engines read alike (the
    HTTP API's schema states it): http(s)://host[:port][/path], the host a name, an IPv4 address or an [IPv6
    address]; no space or control character, no credentials, query or fragment."""
    banned = ({ord(c) for c in space_chars()} | set(range(0x20)) | set(range(0x7F, 0xA0))
              | {ord("?"), ord("#")})
    return f"https?://({NAME}|{IPV4}|\\[({IPV6})\\])(:{PORT})?(/[^{char_class(map(chr, banned))}]*)?"


SPACE_SCAN_END = 0x3001      # (U+3000, the ideographic space, is the last: a test scans all of Unicode)


@functools.cache
def space_chars() -> tuple[str, ...]:
    """What Python's str.strip() and str.isspace() take for space. Scanned below SPACE_SCAN_END only: the whole
    range of code points took 0.2 s of every server's start."""
    return tuple(chr(c) for c in range(SPACE_SCAN_END) if chr(c).isspace())


def char_class(chars) -> str:
    """A regex character class body for `chars`, as \\uXXXX ranges (valid for Python, Rust and ECMA engines): what
    the HTTP API's schema patterns are written with."""
    codes, out, i = sorted(set(map(ord, chars))), [], 0
    while i < len(codes):
        j = i
        while j + 1 < len(codes) and codes[j + 1] == codes[j] + 1:
            j += 1
        out.append(f"\\u{codes[i]:04x}" + (f"-\\u{codes[j]:04x}" if j > i else ""))
        i = j + 1
    return "".join(out)


def parse_base_url(url: str) -> str:
    """An endpoint's base URL checked before anything is stored -> its canonical form (scheme and host lowercased, no
    trailing /). Raises InputError, one line, for what the proxy and `registry ask` could not send to: a scheme other
    than http(s), no host, a port outside 1-65535, credentials (user:password@), a query or a fragment."""
    from urllib.parse import urlsplit

    text = (url or "").strip()
    if len(url or "") > MAX_URL:
        raise InputError(f"base URL over {MAX_URL} characters: {text[:60]!r}...")
    if not text.startswith(("http://", "https://")):
        raise InputError(f"base URL must start with http:// or https://, got {text!r}")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise InputError(f"base URL {text!r} cannot be parsed: {exc}") from None
    if "@" in parts.netloc:
        raise InputError(f"base URL {text!r} holds credentials: give the key's environment variable "
                         f"(--api-key-env) instead")
    if "?" in text or "#" in text:
        raise InputError(f"base URL {text!r} has a query or fragment (?... or #...): give the URL up to /v1")
    if not parts.hostname:
        raise InputError(f"base URL {text!r} names no host")
    if port == 0 or (parts.netloc.endswith(":")):
        raise InputError(f"base URL {text!r}: its port must be a number from 1 to 65535")
    if not re.fullmatch(base_url_regex(), text) or not text.isascii() and not _utf8(text):
        raise InputError(f"base URL {text!r} is not of the form http(s)://host[:port][/path] (a host name, an IPv4 "
                         f"address or an [IPv6 address]; no spaces, no leading zeros in the port)")
    return f"{parts.scheme}://{parts.netloc.lower()}{parts.path}".rstrip("/")


def parse_webhook_url(url: str) -> str:
    """A webhook's URL: a base URL's rules (parse_base_url), except that a query is kept (services such as chat
    webhooks carry their token there). Raises InputError, one line."""
    text = (url or "").strip()
    head, mark, query = text.partition("?")
    if "#" in text:
        raise InputError(f"webhook URL {text!r} has a fragment (#...)")
    if mark and (not query or any(c.isspace() or ord(c) < 32 for c in query)):
        raise InputError(f"webhook URL {text!r}: its query is empty or holds spaces or control characters")
    return parse_base_url(head) + (f"?{query}" if mark else "")


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")         # (a lone surrogate is no character)
    except UnicodeEncodeError:
        return False
    return True


def checked(base_url: str, api_key_env: str | None) -> str:
    """An endpoint's base URL (parse_base_url's canonical form) and key variable, checked before anything is
    stored."""
    base_url = parse_base_url(base_url)
    if api_key_env is not None and not re.fullmatch(ENV_NAME, api_key_env):
        raise InputError(f"--api-key-env takes the NAME of an environment variable, got {api_key_env!r}")
    return base_url


def set_endpoint(tx: Tx, model: str, base_url: str, upstream_model: str | None = None,
                 api_key_env: str | None = None) -> Endpoint:
    base_url = checked(base_url, api_key_env)
    if upstream_model is not None:          # (the model-name rule: what every list and page shows stays one line)
        from registry.data.import_models_queries import model_name_problem

        problem = model_name_problem(upstream_model)
        if problem:
            raise InputError(f"--upstream-model: {problem}")
    mid = _model_id(tx, model)
    tx.sql("""INSERT INTO model_endpoints (model_id, base_url, upstream_model, api_key_env) VALUES (?, ?, ?, ?)
              RETURNING id""", [mid, base_url, upstream_model, api_key_env])
    return Endpoint(model, base_url, upstream_model or model, api_key_env)


def remove(tx: Tx, model: str) -> None:
    mid = _model_id(tx, model)
    if model not in current(tx):
        raise NotFound(f"{model!r} has no endpoint")
    tx.sql("INSERT INTO model_endpoints (model_id) VALUES (?) RETURNING id", [mid])


def current(tx: Tx) -> dict[str, Endpoint]:
    rows = tx.sql("""SELECT name, base_url, upstream_model, api_key_env FROM (
                         SELECT m.name, e.base_url, e.upstream_model, e.api_key_env,
                                row_number() OVER (PARTITION BY e.model_id ORDER BY e.id DESC) AS newest
                         FROM model_endpoints e JOIN models m ON m.id = e.model_id) x
                     WHERE newest = 1 ORDER BY lower(name), name""")
    rows = [r for r in rows if r[1] is not None]      # the newest row removed it
    return {n: Endpoint(n, b, u or n, k) for n, b, u, k in rows}


def _model_id(tx: Tx, model: str) -> int:
    row = tx.sql("SELECT id FROM models WHERE name = ?", [model])
    if not row:
        raise unknown_model(model, [r[0] for r in tx.sql("SELECT name FROM models")])
    return int(row[0][0])
