"""`registry verify` and `registry watch` against fake endpoints built from registered models' real MMLU-Pro answers
(tests/verify_fakes.py: faithful, degraded, substituted, mixed, switch; each with 2% of outcomes flipped per call).

Bar 1 (simulated in-process from the request on, 100 plan seeds per case): each seed plans n questions as `verify`
does (usecases/verify.planned), renders each as the client would, has the fake answer it, extracts and grades the
reply, repeats the plan's first 32, and judges the endpoint with the same code as `verify` (asking/verdicts.judge,
every other registered model beside it). Two references: X's registered results (no reference
endpoint marked) and a marked reference endpoint that is itself nondeterministic (2% flips). Then the power curve.
Bar 2 (watch): the sequential test (asking/sequential.py) over 30 rounds of 64 questions, 100 runs of a faithful
endpoint and 100 of a switch (faithful 4 rounds, then degraded).
Bar 3 and one run per case over loopback through the real client: `Registry.verify` of 5 endpoints x 256 questions
at 200 ms per request, then again (no request may be sent twice), then one `watch --once` round.

    .venv/bin/python bench/verify.py --db registry.duckdb [--seeds 100] [--only sim|watch|loopback]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from registry import Registry  # noqa: E402
from registry.asking import grading, prompt, sequential, verdicts  # noqa: E402
from registry.core.store import Store  # noqa: E402
from registry.usecases import endpoint_verdicts  # noqa: E402
from registry.usecases import verify as uc  # noqa: E402
from tests import verify_fakes as vf  # noqa: E402

X, SUB, CHEAP = "gpt-4o-2024-05-13", "gemini-1.5-pro-002", "Meta-Llama-3_1-8B-Instruct"
CASES = {"faithful": None, "degraded": CHEAP, "substituted": SUB, "mixed": CHEAP}


class World:
    """The registry's questions and every model's registered outcomes, read once."""

    def __init__(self, reg):
        with reg.store.tx() as tx:
            self.gold = {int(q): (t, a, g) for q, _, t, a, g in tx.sql(uc.GOLD)}
            self.names = dict(tx.sql("SELECT id, name FROM models"))
            self.ids = sorted(self.names)
            self.qids = sorted(self.gold)
            self.mat = endpoint_verdicts.outcomes(tx, self.ids, self.qids)
            self.x = {n: i for i, n in self.names.items()}[X]
        self.col = {q: j for j, q in enumerate(self.qids)}
        self.row = {m: i for i, m in enumerate(self.ids)}
        self.books = {}
        for m in (X, SUB, CHEAP):
            r = self.mat[self.row[{n: i for i, n in self.names.items()}[m]]]
            self.books[m] = {self.gold[q][0]: (self.gold[q][1], bool(r[j])) for q, j in self.col.items() if r[j] >= 0}
        xs = self.mat[self.row[self.x]]
        self.plannable = [q for q in self.qids if xs[self.col[q]] >= 0]

    def ask(self, fake, qids) -> np.ndarray:
        """The fake's replies to the questions as the client renders them, extracted and graded."""
        out = []
        for q in qids:
            text, answer, kind = self.gold[q]
            body = prompt.render(text, kind)[0]["content"].split("\n\n", 1)[1]
            got = grading.extract(fake(body), kind)
            out.append(grading.grade(got, answer, kind))
        return np.array(out, dtype=bool)

    def judge(self, e, qids, ref, ref_repeats, self_pairs, alpha=verdicts.ALPHA) -> verdicts.Verdict:
        sub = self.mat[:, [self.col[q] for q in qids]]
        others = verdicts.Others(sub[self.row[self.x]], {self.names[m]: sub[self.row[m]] for m in self.ids
                                                          if m != self.x})
        return verdicts.judge(verdicts.Sides(e, ref, self_pairs, ref_repeats), others, alpha=alpha)


def one(world, kind, seed, n, *, reference: str, repeat: int = 32, degrade: float = 0.10, alpha=verdicts.ALPHA):
    """One verify of one fake, as usecases/verify.verify asks: the plan, its first `repeat` again, then every
    disagreement with the reference asked again of both sides."""
    plan = uc.planned(world.plannable, n, seed)
    fake = vf.case(world.books, kind, X, other=CASES.get(kind), seed=seed, degrade=degrade)
    e = world.ask(fake, plan)
    e2 = np.full(n, -1, dtype=np.int8)
    e2[:repeat] = world.ask(fake, plan[:repeat])
    pairs = (int((e2[:repeat] != e[:repeat]).sum()), repeat)
    if reference == "registered":
        ref, r2, ref_pairs = world.mat[world.row[world.x], [world.col[q] for q in plan]].astype(bool), None, None
    else:
        official = vf.case(world.books, "reference", X, seed=10_000 + seed)
        ref = world.ask(official, plan)
        r2 = np.full(n, -1, dtype=np.int8)
        r2[:repeat] = world.ask(official, plan[:repeat])
        ref_pairs = (int((r2[:repeat] != ref[:repeat]).sum()), repeat)
    off = [i for i in range(n) if e[i] != ref[i]]
    for i in off:                                    # the second pass: each disagreement asked again of both
        if e2[i] < 0:
            e2[i] = world.ask(fake, [plan[i]])[0]
        if r2 is not None and r2[i] < 0:
            r2[i] = world.ask(official, [plan[i]])[0]
    return world.judge(e, plan, ref, ref_pairs, pairs, alpha=alpha)     # (the second pass: as verify asks it)


def bar1(world, seeds: int, n: int = 256) -> None:
    print(f"\nBar 1: verdicts from {n} questions (+32 repeats), {seeds} plan seeds per case, X = {X}, "
          f"alpha {verdicts.ALPHA} per test")
    print(f"{'reference':<12} {'case':<12} {'right':>6}  verdicts")
    for reference in ("registered", "endpoint"):
        for kind in CASES:
            started = time.perf_counter()
            got = [one(world, kind, s, n, reference=reference) for s in range(seeds)]
            seen = Counter(v.verdict for v in got)
            if kind == "substituted":
                right = sum(v.verdict == "substituted" and v.substitute == SUB for v in got)
            elif kind == "mixed":
                right = sum(v.verdict not in ("faithful", "not conclusive") for v in got)
            else:
                right = seen[kind]
            print(f"{reference:<12} {kind:<12} {right:>3}/{seeds}  {dict(seen)}  ({time.perf_counter() - started:.0f} s)")
    many = 10 * seeds
    print(f"\nFalse alarms measured: a faithful endpoint over {many} plan seeds (seeds 0-{many - 1})")
    for reference in ("registered", "endpoint"):
        got = Counter(one(world, "faithful", s, n, reference=reference).verdict for s in range(many))
        wrong = many - got["faithful"]
        print(f"{reference:<12} not called faithful: {wrong}/{many} = {wrong / many:.2%}  {dict(got)}")


def power(world, seeds: int) -> None:
    print(f"\nPower curve: share of {seeds} seeds called degraded (reference: registered results | a reference "
          f"endpoint), by questions n and share of X's right answers turned wrong")
    print(f"{'n':>5} " + " ".join(f"{d:>13.0%}" for d in (0.02, 0.05, 0.10, 0.20)))
    for n in (64, 128, 256, 512):
        cells = []
        for d in (0.02, 0.05, 0.10, 0.20):
            reg = sum(one(world, "degraded", s, n, reference="registered", degrade=d).verdict == "degraded"
                      for s in range(seeds))
            end = sum(one(world, "degraded", s, n, reference="endpoint", degrade=d).verdict == "degraded"
                      for s in range(seeds))
            cells.append(f"{reg / seeds:>5.0%} | {end / seeds:>4.0%}")
        print(f"{n:>5} " + " ".join(f"{c:>13}" for c in cells))


def loopback(reg, world, latency: float = 0.2) -> None:
    """Bar 3 and one run per case through the real client: five fake upstreams on loopback (the reference and the
    four cases), each request answered after `latency` seconds."""
    from tests.http_tools import ChatUpstream

    kinds = ["reference", *CASES]
    ups = {k: ChatUpstream(vf.case(world.books, k, X, other=CASES.get(k), seed=i), latency=latency)
           for i, k in enumerate(kinds)}
    try:
        for k, u in ups.items():
            reg.claim(X, u.url, name=f"{X}@{k}", reference=k == "reference")
        started = time.perf_counter()
        r = reg.verify(X, n=256, repeat=32)
        took = time.perf_counter() - started
        print(f"\nBar 3: verify of {len(ups)} endpoints x {r.n} questions (+{r.repeat} repeats, then disagreements "
              f"asked again) at {latency * 1000:.0f} ms per request: {took:.1f} s; requests "
              f"{sum(u.requests for u in ups.values())}")
        print(f"{'endpoint':<28} {'sent':>5} {'n':>4} {'acc':>6} {'disagree':>8} {'self':>6} {'drop':>7}  verdict")
        for e in r.endpoints:
            v = e.verdict
            print(f"{e.endpoint.split('@')[1]:<28} {e.asked:>5} {v.get('n', ''):>4} {v.get('accuracy') or 0:>6.3f} "
                  f"{v.get('disagreement') or 0:>8.3f} {v.get('self_disagreement') or 0:>6.3f} {v.get('drop') or 0:>+7.3f}"
                  f"  {v['verdict']} {v.get('substitute') or v.get('leaning') or ''}")
        sent = sum(u.requests for u in ups.values())
        started = time.perf_counter()
        again = reg.verify(X, n=256, repeat=32)
        print(f"verify again: {sum(u.requests for u in ups.values()) - sent} requests sent "
              f"({time.perf_counter() - started:.1f} s), verdicts {[e.verdict['verdict'] for e in again.endpoints]}")
        started = time.perf_counter()
        w = reg.watch(n=64)
        print(f"watch --once: {len(w.rounds)} endpoints x 64 fresh questions, {w.asked} requests, "
              f"{time.perf_counter() - started:.1f} s; events {[e.change for e in w.events]}; "
              + ", ".join(f"{x.endpoint.split('@')[1]} {x.worse_held}/{x.better_held} held" for x in w.rounds))
        switch = vf.case(world.books, "switch", X, seed=99)
        ups["switch"] = ChatUpstream(switch, latency=latency)
        reg.claim(X, ups["switch"].url, name=f"{X}@switch")
        started, flagged = time.perf_counter(), None
        for t in range(1, 9):                        # its rounds: faithful for 4, then degraded
            switch.degrading = t > 4
            w = reg.watch(n=64)
            flagged = flagged or next((t for e in w.events if e.endpoint.endswith("@switch")), None)
        print(f"switch over loopback, 8 watch rounds of 64 (all endpoints watched): its event in round {flagged} "
              f"(switched after round 4); {time.perf_counter() - started:.0f} s")
    finally:
        for u in ups.values():
            u.close()


def watch_run(world, seed: int, *, switch_at: int | None, rounds: int = 30, n: int = 64,
              reference: str = "registered") -> list[int]:
    """One watched endpoint over `rounds` rounds of n fresh questions, as usecases/watch asks: the round's questions,
    then its disagreements with the reference asked again of both; -> the rounds that raised an event (1-based).
    switch_at: the round after which it is degraded (None: faithful throughout)."""
    order = uc.planned(world.plannable, rounds * n, 50_000 + seed)
    fake = vf.case(world.books, "switch", X, seed=seed)
    official = vf.case(world.books, "reference", X, seed=20_000 + seed)
    state, events = sequential.State(), []
    for t in range(1, rounds + 1):
        fake.degrading = switch_at is not None and t > switch_at
        qs = order[(t - 1) * n: t * n]
        e = world.ask(fake, qs)
        if reference == "registered":
            r = world.mat[world.row[world.x], [world.col[q] for q in qs]].astype(bool)
        else:
            r = world.ask(official, qs)
        off = np.flatnonzero(e != r)
        e2 = world.ask(fake, [qs[i] for i in off])
        held = e2 == e[off]
        if reference != "registered":
            held &= world.ask(official, [qs[i] for i in off]) == r[off]
        worse = int((held & ~e[off]).sum())
        state, alarm, _ = sequential.step(state, worse, int(held.sum()) - worse, n)
        if alarm and state.verdict == "faithful":
            events.append(t)
            state.verdict = "changed"
    return events


def bar2(world, runs: int) -> None:
    print(f"\nBar 2: watch, {runs} runs of 30 rounds x 64 questions per case (sequential test: alpha "
          f"{sequential.ALPHA} per {sequential.HORIZON} rounds)")
    for reference in ("registered", "endpoint"):
        started = time.perf_counter()
        false = [watch_run(world, s, switch_at=None, reference=reference) for s in range(runs)]
        delays = []
        for s in range(runs):
            got = watch_run(world, s, switch_at=4, reference=reference)
            early, late = [t for t in got if t <= 4], [t - 4 for t in got if t > 4]
            delays.append("before the switch" if early else late[0] if late else "never")
        within = sum(isinstance(d, int) and d <= 4 for d in delays)
        many = [watch_run(world, s, switch_at=None, reference=reference) for s in range(runs, 10 * runs)]
        print(f"{reference:<12} faithful: {sum(len(f) for f in false)} false events in {runs} runs; switch after round "
              f"4 flagged within 4 rounds: {within}/{runs}; delay (rounds after the switch): "
              f"{dict(sorted(Counter(delays).items(), key=str))}; measured: {sum(bool(f) for f in false + many)} of "
              f"{10 * runs} faithful runs with an event ({time.perf_counter() - started:.0f} s)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="registry.duckdb")
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--only", choices=["sim", "power", "watch", "loopback"])
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-verify-"))
    db = tmp / "registry.duckdb"
    shutil.copy(args.db, db)
    index = Path(str(args.db) + ".index")
    if index.exists():
        shutil.copytree(index, Path(str(db) + ".index"))
    store = Store(db, migrate=False)
    store.upgrade()                                   # (the tables of endpoint claims and watch rounds)
    store.close()
    with Registry(db) as reg:
        world = World(reg)
        if args.only in (None, "sim"):
            bar1(world, args.seeds)
        if args.only in (None, "power"):
            power(world, args.seeds)
        if args.only in (None, "watch"):
            bar2(world, args.seeds)
        if args.only in (None, "loopback"):
            loopback(reg, world)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
