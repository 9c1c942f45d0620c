"""The command line's way to a DuckDB file that a `registry serve` holds: DuckDB lets no other process open it, so
`RemoteRegistry` answers the `Registry` methods that have an HTTP counterpart (models, show, stats, similar, route,
register, history) through the server's API, and rebuilds the library's own result dataclasses from its JSON, so
that a command prints exactly what it prints on the file itself. Writes send `REGISTRY_TOKEN` as the bearer
token. Anything else is one line: the file is served by process N at URL, and what to do.

`through_server` finds the server from the lock (its holder's pid) and the advert beside the file (advert.py)."""
from __future__ import annotations

import gzip
import http.client
import json
import threading
import time
from dataclasses import fields
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit

from registry.core import settings
from registry.core.errors import Conflict, DatabaseLocked, InputError, NotFound, RegistryError
from registry.serve.http import advert

READ_TIMEOUT = 120.0        # seconds a read may take (a similar over a large registry under load)
WRITE_TIMEOUT = 900.0       # a registration waits for the writer, an embedding and a snapshot
CONTENT_TYPES = {".csv": "text/csv", ".tsv": "text/csv", ".jsonl": "application/x-ndjson",
                 ".ndjson": "application/x-ndjson", ".parquet": "application/vnd.apache.parquet"}
# the Registry methods whose HTTP counterpart the command line does not call (yet): the one line names it
ELSEWHERE = {"routing_log": "GET /log", "fallback": "GET /models/{name}/fallback", "portfolio": "GET /portfolio",
             "mark_unavailable": "POST /availability/unavailable", "mark_available": "POST /availability/available",
             "endpoints": "GET /endpoints", "set_endpoint": "PUT /endpoints/{model}",
             "remove_endpoint": "DELETE /endpoints/{model}", "fingerprint": "POST /fingerprint",
             "ask": "POST /models/{name}/ask", "route_batch": "POST /route/batch"}
MIN_EVALUATIONS = 32        # the server's (embedding.MIN_EVALUATIONS): a registration asking for another is local


def through_server(db: str, locked: DatabaseLocked, command: str = "this command") -> RemoteRegistry | None:
    """The server holding `db` (the lock's `served` holder, found by its advert and proven, `proven`), waited for
    while it starts (it holds the file before it listens) up to REGISTRY_BUSY_TIMEOUT. None: the holder has exited
    meanwhile (the caller opens the file again). A server that advertises nothing, or cannot prove its advert: the
    lock's own one-line error, and nothing sent."""
    deadline = time.monotonic() + settings.current().busy_timeout
    quiet = False
    while True:
        found = advert.read(db, pid=locked.pid, quiet=quiet)
        quiet = True         # (an odd advert is said once)
        if found is not None:
            if proven(db, found, until=deadline):
                return RemoteRegistry(db, found, command)
            raise DatabaseLocked(f"{locked}; its advert ({advert.path_of(db)}) names {found.url}, which did not "
                                 f"prove it holds this database: nothing was sent there", pid=locked.pid,
                                 served=locked.served) from None
        if locked.pid is None or not advert.alive(locked.pid):
            return None
        if time.monotonic() >= deadline:
            raise locked
        time.sleep(0.1)


def advertised(db: str, command: str = "this command") -> RemoteRegistry | None:
    """The server advertised for `db`, before the file is even opened (a command's start-up is then a third
    shorter: no database driver): only a proven advert (`proven`) of a live `registry serve` of this very file.
    None otherwise: the caller opens the file, and the lock decides (`through_server`)."""
    import os
    import sys

    from registry.core.errors import command_line

    found = advert.read(db)
    if found is None or os.path.realpath(found.db) != os.path.realpath(db):
        return None
    words = command_line(found.pid)
    if not (words and words[0] == "registry" and "serve" in words[1:]):
        return None              # (its pid now another program's)
    if not proven(db, found, until=time.monotonic() + 2.0):
        print(f"{advert.path_of(db)}: ignored: {found.url} did not prove it holds this database; nothing was sent "
              f"there", file=sys.stderr, flush=True)
        return None
    return RemoteRegistry(db, found, command)


PROOF_S = 5.0          # the most one challenge may take, all of it (a server that drips bytes gets no longer)


def proven(db: str, found: advert.Advert, *, until: float) -> bool:
    """Whether the server at the advert's URL answers a fresh challenge with the advert's secret (advert.proof): a
    GET with nothing of ours in it (no token, no file), its answer read within PROOF_S seconds and 4 KiB. A refused
    connection is tried again until `until` while the advertised process lives (a server that has just started
    holds the file before it listens)."""
    import hmac
    import secrets
    import socket

    if not found.secret:
        return False
    nonce = secrets.token_hex(16)
    url = urlsplit(found.url)
    if url.scheme != "http" or not url.hostname or not url.port:
        return False
    host = url.hostname
    request = (f"GET /serving/proof?nonce={nonce} HTTP/1.1\r\nHost: {url.netloc}\r\nConnection: close\r\n"
               f"\r\n").encode()
    while True:
        stop = time.monotonic() + PROOF_S
        try:
            with socket.create_connection((host, url.port), timeout=PROOF_S) as sock:
                sock.sendall(request)
                raw = b""
                while len(raw) <= 4096:
                    left = stop - time.monotonic()
                    if left <= 0:
                        return False
                    sock.settimeout(left)
                    chunk = sock.recv(4097 - len(raw))
                    if not chunk:
                        break
                    raw += chunk
            break
        except ConnectionRefusedError:
            if time.monotonic() >= until or not advert.alive(found.pid):
                return False
            time.sleep(0.1)
        except OSError:
            return False
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200") or len(raw) > 4096:
        return False
    try:
        answer = json.loads(body)["proof"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(answer, str) and hmac.compare_digest(answer, advert.proof(found.secret, nonce, db))


def build(cls, raw: dict, **given):
    """A dataclass from a JSON object, its own fields only."""
    names = {f.name for f in fields(cls)}
    return cls(**{**{k: v for k, v in raw.items() if k in names}, **given})


class RemoteRegistry:
    """A `Registry` whose file a server holds: the methods with an HTTP counterpart, answered by the server."""

    def __init__(self, path: str, server: advert.Advert, command: str = "this command"):
        self.path, self.server, self.command = path, server, command
        self.min_evaluations = MIN_EVALUATIONS
        self.token = settings.current().token
        self._stats: dict | None = None
        self._shown: dict = {}          # model -> ModelDetail, fetched ahead by `similar`

    def close(self) -> None:
        pass

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in ELSEWHERE:
            return self.elsewhere(ELSEWHERE[name])
        raise self.unsupported()

    def elsewhere(self, endpoint: str):
        """A Registry method whose endpoint the command line does not call: the one line names the endpoint."""
        def refuse(*args, **kwargs):
            raise RegistryError(f"{self.served()}, and `{self.command}` does not go through it from the command "
                                f"line: use its API ({endpoint}), or run the command when the server has stopped")
        return refuse

    def served(self) -> str:
        return f"{self.path} is served by process {self.server.pid} at {self.server.url}"

    def unsupported(self, what: str = "") -> RegistryError:
        """The one line for a command (or an option of one) that the server's API does not offer."""
        return RegistryError(f"{self.served()}, and `{self.command}`{what} has no HTTP counterpart: run it when the "
                             f"server has stopped (or on a copy of the file), or use the server's API")

    # --- reads ------------------------------------------------------------------------------------------------
    def models(self, *, limit: int | None = None, offset: int = 0):
        from registry.answers.catalog import MODEL_PAGE_MAX, ModelInfo

        out: list = []
        while True:          # every model asked for, a page at a time (the server's pages are bounded)
            size = MODEL_PAGE_MAX if limit is None else min(MODEL_PAGE_MAX, limit - len(out))
            page = self.request("GET", f"/models?limit={size}&offset={offset + len(out)}")
            out += [build(ModelInfo, m) for m in page]
            if len(page) < size or (limit is not None and len(out) >= limit):
                return out

    def model_count(self) -> int:
        return int(self.request("GET", "/stats")["models"])

    def show(self, name: str):
        from registry.answers.catalog import ModelDetail

        return build(ModelDetail, self.request("GET", f"/models/{self.quoted(name)}"))

    def stats(self):
        from registry.answers.catalog import Stats

        self._stats = self.request("GET", "/stats")
        return build(Stats, {**self._stats, "path": self.path})

    @property
    def probation_min(self) -> int:
        if self._stats is None:
            self._stats = self.request("GET", "/stats")
        return int(self._stats["probation_min"])

    def similar(self, model: str | None = None, k: int = 5, *, evals: str | None = None, as_of: str | None = None):
        from registry.answers.neighbours import Neighbour

        if evals is not None or as_of is not None:
            raise self.unsupported(" with --evals" if evals is not None else " with --as-of")
        if model is None:
            raise InputError("give a model name or an evaluations file (not both)")
        # what `registry similar` asks next (the model's own evidence, the probation minimum), fetched meanwhile
        ahead = threading.Thread(target=self._ahead, args=(model,), daemon=True)
        ahead.start()
        try:
            return [build(Neighbour, n) for n in self.request("GET", f"/models/{self.quoted(model)}/similar?k={k}")]
        finally:
            ahead.join()

    def _ahead(self, model: str) -> None:
        try:
            self._shown[model] = self.show(model)
            _ = self.probation_min          # (read ahead too: the property keeps what it read)
        except RegistryError:
            pass        # (asked again when needed, and its error raised then)

    def embedded_from(self, names: list[str], as_of: str | None = None) -> dict[str, int]:
        if as_of is not None:
            raise self.unsupported(" with --as-of")
        out = {}
        for name in names:
            try:
                n = (self._shown.get(name) or self.show(name)).embedded_from
            except NotFound:
                continue
            if n is not None:
                out[name] = n
        return out

    def history(self, name: str):
        from registry.answers.versions import History, VersionInfo

        h = self.request("GET", f"/models/{self.quoted(name)}/history")
        return History(model=h["model"], versions=[build(VersionInfo, v) for v in h["versions"]])

    def route(self, query: str, options=None):
        from registry.routing.decision import Candidate, Decision, RouteOptions

        options = options or RouteOptions()
        if not options.log:
            raise RegistryError(f"{self.served()}, which logs every route it answers: --no-log cannot be honoured "
                                f"through it (drop --no-log, or route when the server has stopped)")
        body = {"text": query, "cost_weight": options.cost_weight, "min_prob": options.min_prob,
                "unavailable": list(options.unavailable) or None, "cost_by": options.cost_by,
                "include_probation": options.include_probation, "top": options.top or 0}
        if not options.log_text:
            body["log_text"] = False
        d = self.request("POST", "/route", json.dumps(body).encode(), {"Content-Type": "application/json"})
        return build(Decision, d, candidates=[build(Candidate, c) for c in d.get("candidates", [])])

    # --- writes -----------------------------------------------------------------------------------------------
    def register(self, name: str, evals: str, *, family: str | None = None, provider: str | None = None,
                 params_b: float | None = None, cost: float | None = None, open_weights: bool | None = None,
                 tags: dict | None = None, k: int = 5, progress: bool = False, update: bool = False,
                 alias_of: str | None = None):
        """`Registry.register` as an upload of the results file (POST /models/{name}/evaluations), its metadata in
        the query string; the server reads the file by the same rules, and its errors name the file as given."""
        from registry.answers.neighbours import Neighbour
        from registry.answers.registration import RegisterResult

        if alias_of is not None:
            raise self.unsupported(" with --alias-of")
        if self.min_evaluations != MIN_EVALUATIONS:
            raise self.unsupported(" with --min-evals")
        self.need_token()
        file = Path(evals)
        plain = file.name.lower().removesuffix(".gz")
        kind = CONTENT_TYPES.get(Path(plain).suffix, "text/csv")
        try:
            data = file.read_bytes()
            if file.name.lower().endswith(".gz"):
                data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            if not file.exists():
                raise InputError("no such file", file=str(evals)) from None
            raise InputError(f"cannot read it: {exc}", file=str(evals)) from None
        query = [(key, str(value).lower() if isinstance(value, bool) else str(value))
                 for key, value in (("family", family), ("provider", provider), ("params_b", params_b),
                                    ("cost", cost), ("open_weights", open_weights)) if value is not None]
        query += [("tag", f"{key}={value}") for key, value in (tags or {}).items()]
        query += [("update", "true")] if update else []
        query += [("k", str(k))]
        r = self.request("POST", f"/models/{self.quoted(name)}/evaluations?{urlencode(query)}", data,
                         {"Content-Type": kind}, timeout=WRITE_TIMEOUT, file=str(evals))
        return build(RegisterResult, r, neighbours=[build(Neighbour, n) for n in r.get("neighbours", [])])

    def need_token(self) -> None:
        if self.server.token and not self.token:
            raise RegistryError(f"{self.served()}, whose writes need its token: set REGISTRY_TOKEN to it")

    # --- HTTP -------------------------------------------------------------------------------------------------
    @staticmethod
    def quoted(name: str) -> str:
        return quote(name, safe="/")

    def request(self, method: str, target: str, body: bytes | None = None, headers: dict | None = None, *,
                timeout: float = READ_TIMEOUT, file: str | None = None):
        """The server's JSON answer; an error answer raised as the library's error with the server's one line (a
        file the server read as `the uploaded file` named as the caller gave it)."""
        url = urlsplit(self.server.url)
        assert url.hostname is not None, "a server's advertised URL names its host"
        headers = dict(headers or {})
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        deadline = time.monotonic() + settings.current().busy_timeout
        while True:          # a server that has just started holds the file before it listens: its turn
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
            try:
                conn.request(method, target, body=body, headers=headers)
                answer = conn.getresponse()
                status, raw = answer.status, answer.read()
                break
            except ConnectionRefusedError:
                if time.monotonic() >= deadline or not advert.alive(self.server.pid):
                    raise RegistryError(f"{self.served()}, which does not answer (connection refused)") from None
                time.sleep(0.1)
            except (OSError, http.client.HTTPException) as exc:
                raise RegistryError(f"{self.served()}, which did not answer: {exc or type(exc).__name__}") from None
            finally:
                conn.close()
        try:
            data = json.loads(raw)
        except ValueError:
            data = {"detail": raw.decode(errors="replace")[:200].strip() or f"HTTP {status}"}
        if status < 400:
            return data
        detail = str(data.get("detail", f"HTTP {status}")) if isinstance(data, dict) else f"HTTP {status}"
        if file is not None:
            detail = detail.replace("the uploaded file", file)
        if status == 401:
            raise RegistryError(f"{self.served()}, which refused the token in REGISTRY_TOKEN: {detail}")
        raise {404: NotFound, 409: Conflict}.get(status, InputError if status in (400, 422) else RegistryError)(
            detail)
