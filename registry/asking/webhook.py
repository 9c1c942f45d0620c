"""Events delivered to the owner's webhook (`registry watch --webhook URL`): every event is stored undelivered with
the round that raised it (table watch_deliveries), then POSTed in order, each round sending what is still undelivered
first. A delivery is a 2xx answer within the round's budget; a redirect, an error status or silence is a failure,
said in one line, and the event waits for the next round (a receiver tells a repeat by the event's `delivery` id).

A round spends at most BUDGET_S seconds on the webhook, all attempts together: a webhook that drips bytes, or never
answers, delays a round by that much and no more."""
from __future__ import annotations

import functools
import json
import threading
import time
from typing import Any

from registry.core.transaction import Tx

BUDGET_S = 10.0          # seconds a round may spend delivering, every attempt included
ATTEMPTS = 3             # tries of one event within a round (then it waits for the next round)
BACKOFF_S = 0.5          # before the second try; doubled before each later one


def pending(tx: Tx, url: str) -> list[tuple[int, dict]]:
    """The undelivered events for `url`, oldest first: [(delivery id, event)]."""
    return [(int(i), json.loads(e) if isinstance(e, str) else e) for i, e in tx.sql(
        "SELECT id, event FROM watch_deliveries WHERE url = ? AND delivered IS NULL ORDER BY id", [url])]


def deliver(store: Any, url: str, *, budget: float = BUDGET_S, attempts: int = ATTEMPTS,
            backoff: float = BACKOFF_S, write: Any = None) -> list[str]:
    """POST every undelivered event for `url`, in order, within `budget` seconds. -> the failures, one line each
    (the first event that cannot be delivered stops the round's deliveries: order is kept). `write` runs each
    delivery's record (a server's writer; else here)."""
    write = write or (lambda fn: fn())
    with store.tx() as tx:
        queue = pending(tx, url)
    stop = time.monotonic() + budget
    failures: list[str] = []
    for delivery, event in queue:
        error, tries = None, 0
        for attempt in range(attempts):
            left = stop - time.monotonic()
            if left <= 0:
                error = error or f"no time left of the round's {budget:g} s"
                break
            tries += 1
            error = post(url, {**event, "delivery": delivery}, left)
            if error is None:
                break
            pause = min(backoff * 2 ** attempt, stop - time.monotonic())
            if attempt < attempts - 1 and pause > 0:
                time.sleep(pause)
        write(functools.partial(_record, store, delivery, tries, error))
        if error is not None:
            failures.append(f"{url}: {error} for the event of {event.get('endpoint')} ({event.get('change')}); "
                            f"kept, and sent again next round" + (f" with {len(queue) - len(failures) - 1} later "
                                                                  f"event(s)" if len(queue) > 1 else ""))
            break
    return failures


def _record(store: Any, delivery: int, tries: int, error: str | None) -> None:
    with store.tx() as tx:
        tx.sql("UPDATE watch_deliveries SET attempts = attempts + ?, last_error = ?, "
               "delivered = CASE WHEN ? THEN now()::TIMESTAMP ELSE NULL END WHERE id = ?",
               [tries, error, error is None, delivery])


def post(url: str, body: dict, seconds: float) -> str | None:
    """One POST of `body` as JSON, answered within `seconds` all told (a worker thread does the request; past the
    time its connection is closed under it). -> None when the webhook took it (2xx), else why not."""
    import httpx

    client = httpx.Client(timeout=seconds, follow_redirects=False)
    got: dict[str, Any] = {}

    def send() -> None:
        try:
            got["status"] = client.post(url, json=body).status_code
        except httpx.HTTPError as exc:
            got["error"] = type(exc).__name__
        except Exception as exc:         # (the client closed under it: past the time)
            got["error"] = type(exc).__name__

    worker = threading.Thread(target=send, daemon=True, name="registry-webhook")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        client.close()
        return f"no answer within {seconds:.1f} s"
    client.close()
    status = got.get("status")
    if status is None:
        return str(got.get("error", "no answer"))
    if 300 <= status < 400:
        return f"redirected (HTTP {status}): not delivered, redirects are not followed"
    return None if 200 <= status < 300 else f"HTTP {status}"
