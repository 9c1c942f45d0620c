"""A careful client of an OpenAI-compatible `/v1/chat/completions`: bounded concurrency, retries with backoff on
429, 5xx and timeouts (honouring Retry-After), a deadline per request, progress lines, the tokens used summed from
`usage`. The API key is read from the environment at each request, only where its owner lets it go
(core/keys.py), and never stored or logged."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx

from registry.core.keys import OWNER, UpstreamKeys

RETRY_STATUS = {429, 500, 502, 503, 504}
MAX_RETRY_AFTER = 30.0      # a longer Retry-After is capped: the run has its own deadline per request


@dataclass
class Reply:
    key: object
    text: str | None            # None: no answer (gave up after the retries, or a refusal)
    error: str | None = None
    attempts: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    served_model: str | None = None     # the `model` the answer names (a provider may name a dated snapshot)
    prompt_bytes: int = 0               # UTF-8 bytes of the prompt sent (the billing check's yardstick)


UNREACHABLE_AFTER = 3        # refused connections, with no reply yet, after which the rest is not tried
CONNECT_TIMEOUT = 10.0       # seconds to connect (the deadline bounds the whole reply): past it, as if refused


@dataclass
class Usage:
    requests: int = 0           # HTTP requests sent, retries included
    retries: int = 0
    replies: int = 0            # replies received (any status)
    refused: int = 0            # connections that could not be made
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failures: dict = field(default_factory=dict)    # why a question got no answer -> count


@dataclass
class Endpoint:
    base_url: str
    upstream_model: str
    api_key_env: str | None = None
    keys: UpstreamKeys = field(default=OWNER, compare=False, repr=False)    # where its key may go


def _headers(endpoint: Endpoint) -> dict:
    # the key read now, never kept; KeyRefused where it may not go to this URL or is not set
    return {"content-type": "application/json", **endpoint.keys.header(endpoint.api_key_env, endpoint.base_url)}


def _retry_after(response: httpx.Response, attempt: int, backoff: float) -> float:
    raw = response.headers.get("retry-after") if response is not None else None
    try:
        return min(MAX_RETRY_AFTER, max(0.0, float(raw))) if raw is not None else backoff * 2 ** attempt
    except ValueError:
        return backoff * 2 ** attempt


MAX_REPLY_BYTES = 8 << 20    # a chat reply is kilobytes: a larger body is an endpoint misbehaving, not an answer


class ReplyTooLarge(Exception):
    pass


def _post(http: httpx.Client, url: str, body: dict, endpoint: Endpoint, deadline: float):
    """POST and read the whole reply within `deadline` seconds of wall time: a per-read timeout alone lets an
    upstream that sends a byte now and then hold a request for ever. -> (response, body bytes)."""
    end = time.monotonic() + deadline
    timeout = httpx.Timeout(deadline, connect=min(deadline, CONNECT_TIMEOUT))
    with http.stream("POST", url, json=body, headers=_headers(endpoint), timeout=timeout) as r:
        chunks, size = [], 0
        for chunk in r.iter_bytes():
            size += len(chunk)
            if size > MAX_REPLY_BYTES:
                raise ReplyTooLarge()
            chunks.append(chunk)
            if time.monotonic() > end:
                raise httpx.ReadTimeout("whole-reply deadline")
        return r, b"".join(chunks)


def _unreachable(usage: Usage, lock: threading.Lock, after: int = UNREACHABLE_AFTER) -> bool:
    with lock:
        return usage.refused >= after and not usage.replies


def ask_one(http: httpx.Client, endpoint: Endpoint, key, messages: list[dict], *, deadline: float,
            retries: int, backoff: float, usage: Usage, lock: threading.Lock,
            unreachable_after: int = UNREACHABLE_AFTER, cancel: threading.Event | None = None) -> Reply:
    body = {"model": endpoint.upstream_model, "messages": messages, "temperature": 0}
    url = endpoint.base_url.rstrip("/") + ("/chat/completions" if endpoint.base_url.rstrip("/").endswith("/v1")
                                           else "/v1/chat/completions")
    reply = Reply(key, None)
    for attempt in range(retries + 1):
        if cancel is not None and cancel.is_set():
            reply.error = "cancelled"
            return reply
        if _unreachable(usage, lock, unreachable_after):
            # an address nothing listens at is not a transient failure: its other questions are not sent
            reply.error = f"endpoint unreachable ({usage.refused} connections refused or timed out)"
            return reply
        reply.attempts += 1
        with lock:
            usage.requests += 1
            usage.retries += attempt > 0
        wait = backoff * 2 ** attempt
        try:
            r, content = _post(http, url, body, endpoint, deadline)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            reply.error = type(exc).__name__
            with lock:
                usage.refused += 1
            if _unreachable(usage, lock, unreachable_after):
                continue
        except httpx.TimeoutException:
            reply.error = f"no reply within the {deadline:g} s deadline"
        except httpx.HTTPError as exc:
            reply.error = f"{type(exc).__name__}"
        except RuntimeError:         # (the client closed under the request: cancelled)
            if cancel is None or not cancel.is_set():
                raise
            reply.error = "cancelled"
            return reply
        except ReplyTooLarge:
            reply.error = f"a reply over {MAX_REPLY_BYTES:,} bytes"
            return reply
        else:
            with lock:
                usage.replies += 1
            if r.status_code in RETRY_STATUS:
                reply.error = f"HTTP {r.status_code}"
                wait = _retry_after(r, attempt, backoff)
            elif r.status_code >= 400:
                reply.error = f"HTTP {r.status_code}"
                return reply                            # a refusal: asking again would get the same
            elif r.status_code >= 300:                  # (never followed: a key goes only where its owner said)
                reply.error = f"redirected (HTTP {r.status_code}): not an answer"
                return reply
            else:
                data = None
                try:
                    data = json.loads(content)
                    reply.text = str(data["choices"][0]["message"]["content"] or "")
                except (ValueError, KeyError, IndexError, TypeError):
                    reply.text = ""                       # a reply, but no text in it: graded unparseable
                usage_of = data.get("usage") if isinstance(data, dict) else None
                got: dict = usage_of if isinstance(usage_of, dict) else {}
                named = data.get("model") if isinstance(data, dict) else None
                reply.served_model = named[:200] if isinstance(named, str) else None
                reply.prompt_bytes = sum(len(str(m.get("content", "")).encode()) for m in messages)
                reply.prompt_tokens, reply.completion_tokens = (_count(got.get("prompt_tokens")),
                                                                _count(got.get("completion_tokens")))
                reply.error = None
                return reply
        if attempt < retries:
            if cancel is not None:
                cancel.wait(wait)
            else:
                time.sleep(wait)
    return reply


def _count(value) -> int:
    """A token count as an upstream reports it; anything that is not a whole number >= 0 counts as none."""
    return value if type(value) is int and value >= 0 else int(value) if type(value) is float and value >= 0 \
        and value.is_integer() else 0


def ask_all(endpoint: Endpoint, prompts: list[tuple], *, concurrency: int = 8, deadline: float = 60.0,
            retries: int = 4, backoff: float = 0.5, progress: bool = False,
            unreachable_after: int = UNREACHABLE_AFTER, cancel: threading.Event | None = None,
            label: str | None = None) -> tuple[list[Reply], Usage]:
    """prompts: [(key, messages)] -> the replies in the same order, and what it took. KeyRefused before anything
    is sent where the endpoint's key may not reach it. unreachable_after: connections refused (or timed out) with
    no reply yet after which nothing more is sent. `cancel` set (a client that hung up, a server stopping): nothing
    more is sent, and requests under way are cut (their connections closed): their replies say "cancelled".
    `progress`: plain lines on stderr named `label` (default: the upstream model), never a bar, so that several
    endpoints asked at once (`verify`) stay readable."""
    from registry.locus.text_encoder import ProgressLines

    _headers(endpoint)

    usage, lock = Usage(), threading.Lock()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    done = threading.Event()
    bar = ProgressLines(f"asking {label or endpoint.upstream_model}", len(prompts), "questions answered",
                        enabled=progress)
    with httpx.Client(limits=limits) as http, ThreadPoolExecutor(max(1, concurrency)) as pool:
        def one(item):
            if cancel is not None and cancel.is_set():
                return Reply(item[0], None, error="cancelled")
            out = ask_one(http, endpoint, item[0], item[1], deadline=deadline, retries=retries, backoff=backoff,
                          usage=usage, lock=lock, unreachable_after=unreachable_after, cancel=cancel)
            if cancel is not None and cancel.is_set() and out.text is None:
                out.error = "cancelled"
            bar.step()
            return out

        def cut(cancel: threading.Event) -> None:    # (closing the client ends the requests it has under way)
            while not done.wait(0.1):
                if cancel.is_set():
                    http.close()
                    return
        if cancel is not None:
            threading.Thread(target=cut, args=(cancel,), daemon=True, name="registry-ask-cancel").start()
        try:
            replies = list(pool.map(one, prompts))
        finally:
            done.set()
    for r in replies:
        usage.prompt_tokens += r.prompt_tokens
        usage.completion_tokens += r.completion_tokens
        if r.text is None:
            usage.failures[r.error or "no reply"] = usage.failures.get(r.error or "no reply", 0) + 1
    return replies, usage
