"""Reading a file someone else wrote with bounded memory: a JSON document no larger than a limit, JSON lines no
longer than a limit, a zip archive (Inspect's `.eval`) whose members unpack to no more than a limit. Each refusal is
one InputError line naming the file and the limit, before anything large is read, so a hostile file (a zip bomb, a
gigabyte of spaces, JSON nested past the stack) costs neither memory nor a traceback. The limits are well above any
real harness file we have seen; an environment variable raises each where a real file is larger."""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from registry.core.errors import InputError

MB = 1 << 20


def limit(name: str, default_mb: int) -> int:
    """A limit in bytes: REGISTRY_<name>_MB where set to a positive number, else the default."""
    raw = os.environ.get(f"REGISTRY_{name}_MB", "")
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    return int((value if value > 0 else default_mb) * MB)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError as exc:
        raise InputError(f"cannot read it ({exc.strerror})", file=path) from None


def _too_large(what: str, size: int, cap: int, variable: str) -> str:
    return (f"{what} is {size / MB:,.0f} MB, more than the {cap / MB:,.0f} MB this reader takes (set "
            f"REGISTRY_{variable}_MB to raise the limit)")


def json_document(path: str | Path, *, loads: Callable = json.loads):
    """The JSON value a file holds, read whole: refused, one line, when the file is larger than REGISTRY_JSON_MB
    (default 256), not UTF-8, not JSON, or nested deeper than Python's stack."""
    path = str(path)
    check_size(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise InputError(f"cannot read it ({exc.strerror})", file=path) from None
    if not raw.strip():
        raise InputError("the file holds no JSON (it is empty or only white space)", file=path)
    return parse(raw, path, loads=loads)


def check_size(path: str | Path) -> None:
    """A JSON file read whole must be at most REGISTRY_JSON_MB (default 256): else one line."""
    cap = limit("JSON", 256)
    size = _size(str(path))
    if size > cap:
        raise InputError(_too_large("the file", size, cap, "JSON"), file=str(path))


def parse(raw: bytes, path: str, *, line: int | None = None, loads: Callable = json.loads):
    """One JSON value from bytes, every failure one InputError line."""
    try:
        return loads(raw)
    except UnicodeDecodeError as exc:
        raise InputError(f"invalid UTF-8 at byte {exc.start} (the file must be UTF-8 encoded)", file=path,
                         line=line) from None
    except RecursionError:
        raise InputError(f"the file nests its JSON deeper than {sys.getrecursionlimit():,} levels: no results file "
                         f"does", file=path, line=line) from None
    except ValueError as exc:     # json's JSONDecodeError and orjson's are both ValueErrors
        if isinstance(exc, json.JSONDecodeError):
            raise InputError(f"not valid JSON ({exc.msg}, column {exc.colno})", file=path,
                             line=line or exc.lineno) from None
        text = str(exc).split(":")[0]
        if "recursion" in text.lower() or "depth" in text.lower():
            text = "nested too deep"
        raise InputError(f"not valid JSON ({text})", file=path, line=line) from None


def json_lines(path: str | Path, *, loads: Callable = json.loads) -> Iterator[tuple[int, object]]:
    """(record, value) for each non-blank line of a JSON-lines file, reading one line at a time (`record` counts
    non-blank lines, as InputError's `line` does for JSON lines): a line longer than REGISTRY_JSON_LINE_MB (default
    64) is refused, one line, without reading it whole."""
    path = str(path)
    cap = limit("JSON_LINE", 64)
    try:
        with open(path, "rb") as f:
            record = 0
            while True:
                raw = f.readline(cap + 1)
                if not raw:
                    return
                if len(raw) > cap:
                    raise InputError(f"a line is longer than the {cap / MB:,.0f} MB this reader takes (set "
                                     f"REGISTRY_JSON_LINE_MB to raise the limit)", file=path, line=record + 1)
                if raw.strip():
                    record += 1
                    yield record, parse(raw, path, line=record, loads=loads)
    except OSError as exc:
        raise InputError(f"cannot read it ({exc.strerror})", file=path) from None


def check_archive(path: str | Path) -> None:
    """A zip archive whose members, as its directory declares them, unpack to at most REGISTRY_ARCHIVE_MB (default
    1024) in all, and to at most 100 times their packed size (each member over 16 MB, and all over 64 MB: a real log
    packs 5-20 times, a zip bomb thousands); then each member unpacked once, a block at a time, to check that it is
    what the directory says (zipfile stops at the declared size and checks the CRC; read whole, it would first inflate
    all the packed bytes of a member that lies about its size). Anything else: one line."""
    import zipfile

    path = str(path)
    cap = limit("ARCHIVE", 1024)
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (OSError, zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise InputError(f"not a readable zip archive ({type(exc).__name__}: {str(exc)[:200]})", file=path) from None
    total = sum(i.file_size for i in infos)
    if total > cap:
        raise InputError(_too_large("unpacked, the archive", total, cap, "ARCHIVE"), file=path)
    packed = sum(i.compress_size for i in infos)
    if total > 64 * MB and total > 100 * max(packed, 1):
        raise InputError(f"its members unpack {total / max(packed, 1):,.0f} times their packed size ({total / MB:,.0f} "
                         f"MB): a zip bomb, not a log", file=path)
    for i in infos:
        if i.file_size > 16 * MB and i.file_size > 100 * max(i.compress_size, 1):
            raise InputError(f"member {i.filename[:200]!r} unpacks {i.file_size / max(i.compress_size, 1):,.0f} "
                             f"times its packed size ({i.file_size / MB:,.0f} MB): a zip bomb, not a log", file=path)
    try:
        with zipfile.ZipFile(path) as z:
            for i in infos:
                with z.open(i) as member:
                    while member.read(MB):
                        pass
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, NotImplementedError, RuntimeError) as exc:
        raise InputError(f"a damaged zip archive ({type(exc).__name__}: {str(exc)[:200]})", file=path) from None
