"""The router learns from its own traffic: feedback in, embeddings and routes updated, drift caught.

Bar 1. A registry built from the MMLU-Pro train and val results only (the test results are what the fake upstreams
answer with). The 1,203 test questions, sampled with repetition (seed 0), are 10,000 requests through the real proxy
(`/v1/chat/completions`, model `auto`; the app in process, FastAPI's TestClient), every model's endpoint a fake
OpenAI upstream (uvicorn, loopback) that answers each question right or wrong as the stored test result says (the
gold letter, or another). A grader in the loop reads every answer's letter against the gold one and sends the
outcome back (`POST /v1/feedback`, in batches of --batch). After request 2,000 the model that answered the most
requests of the most-routed category (over requests 1-2,000 of the feedback run) silently drops there: 60% of its
right answers in that category (a fixed subset of the questions, by hash) turn wrong. Three runs on fresh copies:
feedback with the drop, the control (the same requests and drop, no feedback sent), and feedback without a drop.

Bar 3 (`--latency N`): N proxied requests on a known text with feedback sent after each (on) against N without
(off), interleaved, on one server: the request's time as the client sees it; then 10,000 outcomes posted at once
(in parts of 1,000) and re-embedded: the time until every model's new version is in.

    .venv/bin/python bench/feedback.py [--base /tmp/feedback_base.duckdb] [--n 10000] [--latency 500]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")       # as `registry serve` runs: one thread per numeric call
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import uvicorn  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from registry import Registry  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "mmlu-pro"
DROP_AT = 2_000
LETTERS = "ABCDEFGHIJ"


def build_base(path: Path) -> None:
    """The registry from the train and val results only (the queries, splits and vectors whole)."""
    folder = Path(tempfile.mkdtemp())
    for name in ("models.csv", "questions.csv.gz", "splits.csv"):
        shutil.copy(DATA / name, folder / name)
    splits = pd.read_csv(DATA / "splits.csv")
    test = set(splits.loc[splits.split == "test", "question_id"])
    ev = pd.read_csv(DATA / "evaluations.csv.gz")
    ev[~ev.question_id.isin(test)].to_csv(folder / "evaluations.csv.gz", index=False)
    with Registry(path) as reg:
        reg.import_files(directory=str(folder), vectors=str(ROOT / "data" / "minilm-mmlu_pro.vectors.parquet"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class World:
    """The test questions, their gold letters and every model's stored test result; the fake upstreams' state."""

    def __init__(self, base: Path):
        with Registry(base) as reg, reg.store.tx() as tx:
            rows = tx.sql("""SELECT q.external_id, q.text, q.category, a.answer FROM queries q
                             JOIN query_splits s ON s.query_id = q.id JOIN query_answers a ON a.query_id = q.id
                             WHERE s.split = 'test' ORDER BY q.id""")
        self.qids = [int(r[0]) for r in rows]
        self.text = {int(r[0]): r[1] for r in rows}
        self.qid_of = {r[1]: int(r[0]) for r in rows}
        self.category = {int(r[0]): r[2] for r in rows}
        self.gold = {int(r[0]): r[3] for r in rows}
        ev = pd.read_csv(DATA / "evaluations.csv.gz")
        ev = ev[ev.question_id.isin(set(self.qids))]
        self.result = {(m, int(q)): int(c) for m, q, c in zip(ev.model, ev.question_id, ev.correct)}
        self.drop: tuple[str, str] | None = None       # (model, category) once dropped

    def dropped(self, model: str, qid: int) -> bool:
        """A fixed 60% of the model's right answers in the category, by the question's hash."""
        return bool(self.drop and self.drop == (model, self.category[qid])
                    and int(hashlib.sha256(f"drop:{qid}".encode()).hexdigest()[:8], 16) % 100 < 60)

    def answer(self, model: str, text: str) -> str:
        qid = self.qid_of.get(text)
        if qid is None:
            return "I cannot tell."
        right = self.result.get((model, qid), 0) == 1 and not self.dropped(model, qid)
        gold = self.gold[qid]
        letter = gold if right else LETTERS[(LETTERS.index(gold) + 1 + qid % 3) % len(LETTERS)]
        return f"The answer is ({letter})."


def fake_upstream(world: World) -> str:
    fake = FastAPI()

    @fake.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        text = body["messages"][-1]["content"]
        return {"id": "upstream", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": world.answer(body["model"], text)},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": len(text) // 4, "completion_tokens": 6}}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(fake, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}/v1"


def fresh_copy(base: Path, upstream: str, folder: Path, name: str) -> Path:
    db = folder / f"{name}.duckdb"
    shutil.copy(base, db)
    with Registry(db) as reg:
        for m in reg.models():
            reg.set_endpoint(m.name, upstream)
    return db


def grade(world: World, qid: int, content: str) -> int:
    found = re.search(r"\(([A-J])\)", content or "")
    return int(bool(found) and found.group(1) == world.gold[qid])


class Served:
    """A real `registry serve` on a file (its own process), and a client of it."""

    def __init__(self, db: Path, *extra: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "registry", "--db", str(db), "serve", "--port",
                                      str(self.port), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.client = httpx.Client(timeout=120)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server stopped: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if self.client.get(f"{self.url}/health").json().get("ready"):
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)

    def chat(self, text: str) -> httpx.Response:
        return self.client.post(f"{self.url}/v1/chat/completions",
                                json={"model": "auto", "messages": [{"role": "user", "content": text}]})

    def stop(self) -> dict:
        health = self.client.get(f"{self.url}/health").json()
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.client.close()
        return health


def run(world: World, db: Path, sequence: list[int], *, feedback: bool, drop: bool, batch: int,
        target: tuple[str, str] | None = None) -> dict:
    """One run of the request sequence through a real server -> its per-request log and figures."""
    world.drop = None
    log, events, pending = [], [], []
    feedback_s = 0.0
    t0 = time.perf_counter()
    server = Served(db)
    try:
        for i, qid in enumerate(sequence):
            if drop and i == DROP_AT:
                if target is None:
                    target = most_routed(log[:DROP_AT])
                world.drop = target
            r = server.chat(world.text[qid])
            assert r.status_code == 200, r.text
            ok = grade(world, qid, r.json()["choices"][0]["message"]["content"])
            log.append((i, qid, world.category[qid], r.headers["x-registry-model"], ok))
            if (i + 1) % 1000 == 0:
                print(f"  {i + 1:,} requests, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
            if feedback:
                pending.append({"request_id": r.headers["x-registry-request-id"], "outcome": ok, "source": "grader"})
                if len(pending) >= batch or i == len(sequence) - 1:
                    tf = time.perf_counter()
                    f = server.client.post(f"{server.url}/v1/feedback", json={"outcomes": pending})
                    feedback_s += time.perf_counter() - tf
                    assert f.status_code == 200, f.text
                    events += [(i, e["model"], e["category"], e["drop"], e["evidence"]) for e in f.json()["events"]]
                    pending = []
    finally:
        health = server.stop()
    w = health.get("writer", {})
    print(f"  feedback posts {feedback_s:.0f} s; writer: {w.get('refits')} refits, {w.get('cycles')} cycles, longest "
          f"{w.get('longest_cycle_ms')} ms, refresh {w.get('refresh_ms', 0) / 1000:.0f} s", file=sys.stderr, flush=True)
    return {"log": log, "events": events, "target": target, "seconds": time.perf_counter() - t0,
            "refits": health.get("writer", {}).get("refits")}


def most_routed(log: list) -> tuple[str, str]:
    cats = pd.Series([c for _, _, c, _, _ in log]).value_counts()
    cat = str(cats.index[0])
    models = pd.Series([m for _, _, c, m, _ in log if c == cat]).value_counts()
    return str(models.index[0]), cat


def figures(out: dict, target: tuple[str, str], n: int) -> dict:
    df = pd.DataFrame(out["log"], columns=["i", "qid", "category", "model", "ok"])
    model, cat = target
    inc = df[df.category == cat]
    before = inc[inc.i < DROP_AT]
    share_before = float((before.model == model).mean())
    after = inc[(inc.i >= DROP_AT) & (inc.i < DROP_AT + 2000)]
    roll = (after.model == model).rolling(50).mean()
    below = after.i[roll < share_before / 2]
    last = df[df.i >= n - 3000]
    first_event = next((i for i, m, c, _, _ in out["events"] if (m, c) == (model, cat) and i >= DROP_AT), None)
    return {"share_before": share_before,
            "share_2001_4000": float((after.model == model).mean()),
            "share_3001_4000": float((after[after.i >= DROP_AT + 1000].model == model).mean()),
            "below_half_after": None if below.empty else int(below.iloc[0]) - DROP_AT,
            "acc_cat_last3000": float(last[last.category == cat].ok.mean()),
            "n_cat_last3000": int((last.category == cat).sum()),
            "acc_all": float(df.ok.mean()), "acc_last3000": float(last.ok.mean()),
            "events": len(out["events"]), "event_after": None if first_event is None else first_event - DROP_AT,
            "seconds": round(out["seconds"], 1)}


def false_alarms(db: Path) -> dict:
    """The drift test's false-alarm rate when predictions are right: simulated over the run's own predictions."""
    from registry.traffic import drift

    with Registry(db) as reg, reg.store.tx() as tx:
        series = drift.outcomes(tx)
        ps = [s["p"] for s in series.values()]
        y = np.concatenate([s["y"] for s in series.values()])
        p = np.concatenate(ps)
    rates = [drift.false_alarm_rate(s, runs=100) * len(s) for s in ps]
    return {"outcomes": int(len(p)), "mean_predicted": round(float(p.mean()), 4),
            "mean_observed": round(float(y.mean()), 4),
            "simulated_per_10k": round(10_000 * sum(rates) / 10_000 / max(len(p), 1), 3)}


def kills(world: World, base: Path, upstream: str, folder: Path, *, n_kills: int, seed: int) -> dict:
    """Bar 2: SIGKILL the server at random moments of a request and feedback stream, restart it on the same file,
    resend what was not acknowledged; then every acknowledged outcome must be stored, none twice, and refusals of
    ids never issued, used or past their window must be one line with nothing stored."""
    import random

    rnd = random.Random(seed)
    db = fresh_copy(base, upstream, folder, "kills")
    acked: set[str] = set()
    unacked: list[dict] = []
    killed_in_feedback = 0
    server = Served(db)
    t0 = time.perf_counter()
    for k in range(n_kills):
        timer = threading.Timer(rnd.uniform(0.5, 2.5), server.proc.kill)
        timer.start()
        pending: list[dict] = []
        while server.proc.poll() is None:
            try:
                if unacked:         # what a kill left unacknowledged: sent again (stored once, or refused as used)
                    r = server.client.post(f"{server.url}/v1/feedback", json={"outcomes": unacked[:1]})
                    if r.status_code == 200 or "already has an outcome" in r.text:
                        acked.add(unacked[0]["request_id"])
                    unacked.pop(0)
                    continue
                qid = rnd.choice(world.qids)
                r = server.chat(world.text[qid])
                pending.append({"request_id": r.headers["x-registry-request-id"],
                                "outcome": grade(world, qid, r.json()["choices"][0]["message"]["content"]),
                                "source": "grader"})
                if len(pending) >= 5:
                    batch, pending = pending, []
                    try:
                        f = server.client.post(f"{server.url}/v1/feedback", json={"outcomes": batch})
                    except httpx.TransportError:
                        killed_in_feedback += 1
                        unacked += batch
                        break
                    assert f.status_code == 200, f.text
                    acked.update(o["request_id"] for o in batch)
            except httpx.TransportError:
                break
        timer.cancel()
        server.proc.kill()
        server.proc.wait()
        server.client.close()
        server = Served(db)
    print(f"  {n_kills} kills in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    # refusals, each one line, nothing stored
    import duckdb

    def count() -> int:
        return int(server.client.get(f"{server.url}/feedback/sources").json()[0]["outcomes"])

    stored_before = count()
    some = sorted(acked)[0]
    refusals = {}
    for name, body in (("never issued", {"request_id": "req-" + "0" * 24, "outcome": 1}),
                       ("already used", {"request_id": some, "outcome": 0})):
        r = server.client.post(f"{server.url}/v1/feedback", json=body)
        refusals[name] = (r.status_code, r.json()["error"]["message"])
    fresh = server.chat(world.text[world.qids[0]]).headers["x-registry-request-id"]
    health = server.stop()
    late = Served(db, "--feedback-window", "0.5")
    time.sleep(1.0)
    r = late.client.post(f"{late.url}/v1/feedback", json={"request_id": fresh, "outcome": 1})
    refusals["past its window"] = (r.status_code, r.json()["error"]["message"])
    server = late
    stored_after = count()
    server.stop()
    con = duckdb.connect(str(db), read_only=True)
    stored = [r[0] for r in con.execute("SELECT request_id FROM feedback").fetchall()]
    con.close()
    return {"kills": n_kills, "killed_in_feedback": killed_in_feedback, "acknowledged": len(acked),
            "stored": len(stored), "acknowledged_missing": len(acked - set(stored)),
            "stored_twice": len(stored) - len(set(stored)), "refusals": refusals,
            "refusals_one_line": all("\n" not in m for _, m in refusals.values()),
            "nothing_stored_by_refusals": stored_before == stored_after, "writer": health.get("writer", {}).get(
                "cycles")}


def latency(world: World, base: Path, upstream: str, folder: Path, *, n: int, outcomes: int, seed: int) -> dict:
    """Bar 3: a proxied request's time with feedback on (its outcome sent after it) and off, interleaved on one
    server; then `outcomes` outcomes posted at once (in parts of 1,000) until landed and re-embedded."""
    rnd = np.random.default_rng(seed)
    db = fresh_copy(base, upstream, folder, "latency")
    server = Served(db)
    on, off = [], []
    try:
        for i in range(2 * n):
            qid = int(rnd.choice(world.qids))
            t = time.perf_counter()
            r = server.chat(world.text[qid])
            (on if i % 2 == 0 else off).append(1000 * (time.perf_counter() - t))
            if i % 2 == 0:
                ok = grade(world, qid, r.json()["choices"][0]["message"]["content"])
                f = server.client.post(f"{server.url}/v1/feedback", json={
                    "request_id": r.headers["x-registry-request-id"], "outcome": ok, "source": "grader"})
                assert f.status_code == 200, f.text
        ids = []
        for _ in range(outcomes):
            qid = int(rnd.choice(world.qids))
            r = server.chat(world.text[qid])
            ids.append({"request_id": r.headers["x-registry-request-id"],
                        "outcome": grade(world, qid, r.json()["choices"][0]["message"]["content"]),
                        "source": "grader"})
        t = time.perf_counter()
        reembedded: set[str] = set()
        for start in range(0, len(ids), 1000):
            f = server.client.post(f"{server.url}/v1/feedback", json={"outcomes": ids[start:start + 1000]})
            assert f.status_code == 200, f.text
            reembedded.update(f.json()["reembedded"])
        landed_s = time.perf_counter() - t
    finally:
        server.stop()
    return {"p50_on_ms": round(statistics.median(on), 2), "p50_off_ms": round(statistics.median(off), 2),
            "p99_on_ms": round(float(np.percentile(on, 99)), 2), "p99_off_ms": round(float(np.percentile(off, 99)), 2),
            "added_p50_ms": round(statistics.median(on) - statistics.median(off), 2), "outcomes": outcomes,
            "landed_and_reembedded_s": round(landed_s, 1), "models_reembedded": len(reembedded)}


def main() -> None:
    from registry.embedding.index import load_faiss

    load_faiss().omp_set_num_threads(1)     # (its idle OpenMP threads spin: `registry serve` sets one too)
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="/tmp/feedback_base.duckdb")
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", default="feedback,control,nodrop")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--kills", type=int, default=0, help="bar 2 only: this many SIGKILLs")
    ap.add_argument("--latency", type=int, default=0, help="bar 3 only: this many requests each way")
    args = ap.parse_args()
    base = Path(args.base)
    if not base.exists():
        t = time.perf_counter()
        build_base(base)
        print(f"built {base} from the train and val results in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    world = World(base)
    upstream = fake_upstream(world)
    sequence = np.random.default_rng(args.seed).choice(world.qids, size=args.n, replace=True).tolist()
    folder = Path(tempfile.mkdtemp())
    if args.kills or args.latency:
        out = {}
        if args.kills:
            out["kills"] = kills(world, base, upstream, folder, n_kills=args.kills, seed=args.seed)
        if args.latency:
            out["latency"] = latency(world, base, upstream, folder, n=args.latency, outcomes=10_000, seed=args.seed)
        print(json.dumps(out, indent=1, default=str))
        return
    wanted = args.runs.split(",")
    results, target = {}, None
    for name, fb, drop in (("feedback", True, True), ("control", False, True), ("nodrop", True, False)):
        if name not in wanted:
            continue
        db = fresh_copy(base, upstream, folder, name)
        out = run(world, db, sequence, feedback=fb, drop=drop, batch=args.batch, target=target)
        target = target or out["target"]
        results[name] = out
        results[name]["db"] = db
        print(f"{name}: {out['seconds']:.0f} s, {len(out['events'])} event(s)", file=sys.stderr, flush=True)
    assert target is not None
    table = {name: figures(out, target, args.n) for name, out in results.items()}
    if "nodrop" in results:
        table["nodrop"]["false_alarms"] = false_alarms(results["nodrop"]["db"])
    events = {name: [(i, m, c, d) for i, m, c, d, _ in out["events"]] for name, out in results.items()}
    if args.json:
        print(json.dumps({"target": target, "table": table, "events": events}, indent=1, default=str))
        return
    print(f"drop: {target[0]} on {target[1]} after request {DROP_AT:,} ({args.n:,} requests, feedback in batches "
          f"of {args.batch})")
    keys = ["share_before", "share_2001_4000", "share_3001_4000", "below_half_after", "acc_cat_last3000",
            "n_cat_last3000", "acc_all", "acc_last3000", "events", "event_after", "seconds"]
    print(f"{'':22s}" + "".join(f"{n:>12s}" for n in table))
    for k in keys:
        print(f"{k:22s}" + "".join(f"{_fmt(table[n].get(k)):>12s}" for n in table))
    for name, evs in events.items():
        for e in evs[:5]:
            print(f"  {name} event at request {e[0] + 1:,}: {e[1]} on {e[2]}, drop {e[3]:.3f}")
    if "nodrop" in table:
        print(f"  false alarms (no drop): {table['nodrop']['events']} event(s) in {args.n:,} outcomes; simulated "
              f"with outcomes drawn from the predictions: {table['nodrop']['false_alarms']}")


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


if __name__ == "__main__":
    main()
