"""`registry ask` over loopback, against fake OpenAI-compatible upstreams this script starts.

Bar 1: an endpoint answering as Qwen1.5-72B-Chat did (the gold letter where its stored result is 1, another letter
where 0) is called "same" as it from 128 fingerprint-planned questions, per plan seed (100 seeds); an endpoint right
at random 55% of the time is "same" as no model. Each seed: the plan, the 128 questions rendered and asked through
the client, the replies extracted and graded, the fingerprint of the graded answers (nothing stored).
Bar 2: with 200 ms per upstream request, `Registry.ask` of 128 questions end to end (plan, asking, storing,
embedding, verdict) on a copy of the registry; asking again with the same -n sends no request; an upstream that
answers 429 (Retry-After: 1) to its first 8 requests is retried and the run completes.

    .venv/bin/python bench/ask.py --db registry.duckdb [--seeds 100] [--data ../shared/data/mmlu-pro]
"""
from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from registry import Registry  # noqa: E402
from registry.answers import fingerprint, probe_plans  # noqa: E402
from registry.asking import client, grading, prompt  # noqa: E402
from registry.asking.run import WITH_GOLD  # noqa: E402
from registry.core.store import Store  # noqa: E402
from tests.http_tools import ChatUpstream  # noqa: E402

LETTERS = "ABCDEFGHIJ"


def as_model(reg, model: str):
    with reg.store.tx() as tx:
        rows = tx.sql("""SELECT q.text, g.answer, e.correct FROM evaluations e JOIN queries q ON q.id = e.query_id
                         JOIN query_answers g ON g.query_id = q.id JOIN models m ON m.id = e.model_id
                         WHERE m.name = ? ORDER BY e.batch_id""", [model])
    book = {t: a if ok else LETTERS[(LETTERS.index(a) + 1) % 4] for t, a, ok in rows}
    return lambda text: f"Let me think step by step. The answer is ({book.get(text, 'A')})."


def at_random(share: float, seed: int, reg):
    with reg.store.tx() as tx:
        gold = dict(tx.sql(f"SELECT text, answer FROM {WITH_GOLD}"))
    rng, lock = random.Random(seed), threading.Lock()

    def answer(text):
        with lock:
            right = rng.random() < share
        return f"Answer: {gold[text] if right else LETTERS[(LETTERS.index(gold[text]) + 1) % 4]}"
    return answer


def verdicts(reg, upstream: ChatUpstream, seeds: int, n: int) -> list[str]:
    """Per plan seed: the fingerprint of the endpoint's graded answers to the seed's planned questions."""
    out = []
    endpoint = client.Endpoint(upstream.url, "bench")
    minimum = reg.probation_min          # (a read of its own: before the transaction, not inside it)
    with reg.store.tx() as tx:
        gold = {int(q): (t, a) for q, t, a in tx.sql(f"SELECT id, text, answer FROM {WITH_GOLD}")}
        ids = dict(tx.sql("SELECT external_id, id FROM queries"))
        for seed in range(seeds):
            plan = probe_plans.fingerprint_plan(tx, n, seed=seed, min_answers=minimum)
            qids = [ids[p.question_id] for p in plan.probes][:n]
            replies, _ = client.ask_all(endpoint, [(q, prompt.render(gold[q][0], "letter")) for q in qids],
                                        concurrency=16)
            y = np.array([int(grading.grade(grading.extract_letter(r.text), gold[r.key][1], "letter"))
                          for r in replies])
            f = fingerprint.by_answers(tx, np.array(qids), y)
            out.append("none" if f is None else (f.match if f.verdict == "same" else "not conclusive"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/mmlu-pro"))
    ap.add_argument("--seeds", type=int, default=100)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-ask-"))
    db = work / "registry.duckdb"
    shutil.copy(args.db, db)
    store = Store(db, migrate=False)      # a copy of a registry made before migration 0008
    store.upgrade()
    store.close()
    rows = []
    with Registry(db) as reg:
        with reg.store.tx() as tx:
            has = tx.sql("SELECT count(*) FROM query_answers")[0][0]
        if not has:        # a registry built before queries carried answers: the questions file gives them
            reg.import_files(queries=str(Path(args.data) / "questions.csv.gz"), onboard=False)
        same = ChatUpstream(as_model(reg, "Qwen1.5-72B-Chat"))
        t = time.perf_counter()
        v = verdicts(reg, same, args.seeds, 128)
        rows.append(("bar 1: as Qwen1.5-72B-Chat, 128 planned questions: 'same: Qwen1.5-72B-Chat'",
                     f"{v.count('Qwen1.5-72B-Chat')} of {len(v)} seeds", ">= 99 of 100",
                     f"{time.perf_counter() - t:.0f} s"))
        same.close()
        coin = ChatUpstream(at_random(0.55, 1, reg))
        v = verdicts(reg, coin, args.seeds, 128)
        rows.append(("bar 1: right at random 55%: 'same' as any model",
                     f"{sum(x not in ('none', 'not conclusive') for x in v)} of {len(v)} seeds", "0", ""))
        coin.close()

        slow = ChatUpstream(as_model(reg, "Qwen1.5-72B-Chat"), latency=0.2)
        t = time.perf_counter()
        r = reg.ask("bench-asked", base_url=slow.url, n=128)
        took = time.perf_counter() - t
        rows.append(("bar 2: 128 questions at 200 ms per request, concurrency 8, end to end",
                     f"{took:.1f} s ({r.requests} requests, verdict {r.verdict['verdict'] if r.verdict else None})",
                     "<= 15 s", ""))
        sent = slow.requests
        t = time.perf_counter()
        again = reg.ask("bench-asked", n=128)
        rows.append(("bar 2: asking again with the same -n: requests sent", f"{slow.requests - sent} "
                     f"({time.perf_counter() - t:.1f} s, {again.asked} asked)", "0", ""))
        slow.close()
        busy = ChatUpstream(lambda text: "**A**", throttle=8, retry_after="1")
        r = reg.ask("bench-busy", base_url=busy.url, n=32, plan="random")
        rows.append(("bar 2: 429 (Retry-After 1) to the first 8 requests", f"{r.answered} of 32 answered, "
                     f"{r.retries} retries", "all answered", ""))
        busy.close()
    shutil.rmtree(work, ignore_errors=True)
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'result':<42} {'bar':<14} time")
    for name, result, bar, took in rows:
        print(f"{name:<{width}}  {result:<42} {bar:<14} {took}")


if __name__ == "__main__":
    main()
