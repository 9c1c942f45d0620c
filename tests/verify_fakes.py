"""Fake endpoints for `registry verify` and `registry watch`, each built from registered models' real MMLU-Pro answers
(their stored 0/1 results): a reply gives the gold letter where the model was right, another letter where wrong.

- faithful: answers as X, each outcome flipped with probability `noise` (2%) on every call, right to wrong and
  wrong to right alike, as nondeterministic serving does;
- degraded: as X with a fixed `degrade` share (10%) of X's right answers turned wrong, plus the noise;
- substituted: as another registered model, plus the noise;
- mixed: a `mix` share (30%) of requests answered as a cheaper model;
- switch: faithful until `degrading` is set, then degraded.
The bench (bench/verify.py) calls them in-process; the tests serve them over loopback (http_tools.ChatUpstream)."""
from __future__ import annotations

import hashlib
import threading

import duckdb

LETTERS = "ABCDEFGHIJ"


def books(db, models: list[str]) -> dict[str, dict[str, tuple[str, bool]]]:
    """{model: {question text: (gold letter, right)}} from a registry file's current results."""
    con = duckdb.connect(str(db), read_only=True)
    out = {}
    for model in models:
        rows = con.execute("""SELECT q.text, g.answer, arg_max(e.correct, e.batch_id) FROM evaluations e
                              JOIN queries q ON q.id = e.query_id JOIN models m ON m.id = e.model_id
                              JOIN query_answers g ON g.query_id = q.id WHERE m.name = ?
                              GROUP BY q.text, g.answer""", [model]).fetchall()
        out[model] = {t: (a, bool(ok)) for t, a, ok in rows}
    con.close()
    return out


def books_from(reg, models: list[str]) -> dict[str, dict[str, tuple[str, bool]]]:
    """`books` through a Registry (a DuckDB file or a PostgreSQL database alike)."""
    out = {}
    with reg.store.tx() as tx:
        for model in models:
            rows = tx.sql("""SELECT q.text, g.answer, e.correct FROM evaluations e JOIN queries q ON q.id = e.query_id
                             JOIN models m ON m.id = e.model_id JOIN query_answers g ON g.query_id = q.id
                             WHERE m.name = ? ORDER BY e.batch_id""", [model])
            out[model] = {t: (a, bool(ok)) for t, a, ok in rows}      # (the newest batch last: it wins)
    return out


def reply(gold: str, right: bool) -> str:
    letter = gold if right else LETTERS[(LETTERS.index(gold) + 1) % 4]     # (never the gold letter)
    return f"Let me think. The answer is ({letter})."


class Fake:
    """answer(question text) -> reply text, as `as_model`'s book says with the case's changes."""

    def __init__(self, book: dict, *, noise: float = 0.02, degrade: float = 0.0, mix: float = 0.0,
                 cheap: dict | None = None, seed: int = 0, degrading: bool = True):
        self.book, self.noise, self.degrade, self.mix, self.cheap = book, noise, degrade, mix, cheap
        self.seed, self.degrading = seed, degrading
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()

    def draw(self, *key) -> float:
        """A uniform draw fixed by the key: the same question's k-th call gets the same luck whatever the order
        concurrent requests arrive in (a test's verdicts do not depend on the threads)."""
        h = hashlib.sha256(":".join(map(str, (self.seed, *key))).encode()).digest()
        return int.from_bytes(h[:8], "big") / 2 ** 64

    def degraded(self, text: str) -> bool:
        """Whether this question is among the fixed share turned wrong (the same on every call)."""
        return self.draw("degrade", text) < self.degrade

    def outcome(self, text: str) -> tuple[str, bool] | None:
        with self.lock:
            k = self.calls[text] = self.calls.get(text, 0) + 1
        mixed, flip = self.draw("mix", text, k) < self.mix, self.draw("flip", text, k) < self.noise
        source = self.cheap if mixed and self.cheap is not None else self.book
        if text not in source:
            return None
        gold, right = source[text]
        if right and self.degrading and not mixed and self.degraded(text):
            right = False
        return gold, right != flip

    def __call__(self, text: str) -> str:
        got = self.outcome(text)
        return "The answer is (A)." if got is None else reply(*got)


def case(books_: dict, kind: str, x: str, *, other: str | None = None, seed: int = 0, noise: float = 0.02,
         degrade: float = 0.10, mix: float = 0.30) -> Fake:
    """One of the cases by name: reference | faithful | degraded | substituted | mixed | switch."""
    if kind in ("reference", "faithful"):
        return Fake(books_[x], noise=noise, seed=seed)
    if kind == "degraded":
        return Fake(books_[x], noise=noise, degrade=degrade, seed=seed)
    if kind == "switch":
        return Fake(books_[x], noise=noise, degrade=degrade, seed=seed, degrading=False)
    if kind == "substituted":
        return Fake(books_[other], noise=noise, seed=seed)
    if kind == "mixed":
        return Fake(books_[x], noise=noise, mix=mix, cheap=books_[other], seed=seed)
    raise ValueError(kind)
