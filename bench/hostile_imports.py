"""Hostile files into `registry import`: each refused with one line, peak memory bounded, the database unchanged.

    .venv/bin/python bench/hostile_imports.py [--big-mb 1024] [--json]

Every case is a real harness layout (lm-evaluation-harness, Every Eval Ever, HELM, Inspect, the registry's CSV
folder) with one file replaced by something hostile: a gigabyte of spaces, a gigabyte-long JSON line, JSON nested
10^5 deep, bytes that are not UTF-8, NUL bytes, random binary, an empty or truncated file, the wrong JSON type, a NaN
score, an Inspect `.eval` zip bomb (3 MB that unpacks to 3 GB) and zips that lie. The valid parts come from the
shared Every Eval Ever fixtures. Each import runs as its own process (`registry --db base import ...`); its peak RSS
is the kernel's (wait4's ru_maxrss). The database's fingerprint (each table's row count and hash) is read before and
after every case. Prints one row per case and a summary; exit 1 if any case fails a bar.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = str(ROOT / ".venv" / "bin" / "registry")
EEE = ROOT.parent / "shared" / "data" / "eee" / "fixtures"
DATA = ROOT.parent / "shared" / "data" / "mmlu-pro"
MB = 1 << 20
PEAK_BAR_MB = 1024


def spaces(path: Path, mb: int, *, prefix: bytes = b"", suffix: bytes = b"") -> None:
    block = b" " * MB
    with open(path, "wb") as f:
        f.write(prefix)
        for _ in range(mb):
            f.write(block)
        f.write(suffix)


def payloads(big_mb: int) -> dict:
    """name -> a function writing the hostile content to a path."""
    return {
        "spaces_1g": lambda p: spaces(p, big_mb),
        "long_line": lambda p: spaces(p, big_mb, prefix=b'{"doc": "', suffix=b'"}\n'),
        "deep": lambda p: p.write_bytes(b"[" * 100_000 + b"]" * 100_000),
        "deep_obj": lambda p: p.write_bytes(b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
        "not_utf8": lambda p: p.write_bytes(b'{"model_name": "\xff\xfe\xfa", "x": "\xc3\x28"}'),
        "empty": lambda p: p.write_bytes(b""),
        "truncated": lambda p: p.write_bytes(b'{"configs": {"a": [1, 2'),
        "wrong_type": lambda p: p.write_bytes(b"[1, 2, 3]"),
        "nul": lambda p: p.write_bytes(b"\0" * MB),
        "binary": lambda p: p.write_bytes(os.urandom(8 * MB)),
    }


# --- the layouts: each returns (paths to import, extra arguments) -------------------------------------------------

def lm_eval(folder: Path, hostile: str | None, payload, *, nan: bool = False) -> list[str]:
    folder.mkdir()
    results = folder / "results_2026-01-01T00-00-00.json"
    samples = folder / "samples_mmlu_2026-01-01T00-00-00.jsonl"
    results.write_text(json.dumps({"model_name": "hostile/model", "configs": {"mmlu": {"metric_list": [
        {"metric": "acc"}]}}, "results": {"mmlu": {"acc,none": 0.5}}}))
    score = "NaN" if nan else "1.0"
    samples.write_text("\n".join(
        f'{{"doc_id": {i}, "doc": {{"question": "hostile question {i}?", "choices": ["a", "b"]}}, '
        f'"acc": {score}}}' for i in range(3)) + "\n")
    if hostile == "results":
        payload(results)
    elif hostile == "samples":
        payload(samples)
    return [str(folder)]


def eee(folder: Path, hostile: str | None, payload) -> list[str]:
    src = next((EEE / "skill_reference_conversion").rglob("*_samples.jsonl"))
    agg = src.with_name(src.name.removesuffix("_samples.jsonl") + ".json")
    folder.mkdir()
    shutil.copy(agg, folder / agg.name)
    shutil.copy(src, folder / src.name)
    target = {"aggregate": folder / agg.name, "samples": folder / src.name}.get(hostile or "")
    if target is not None:
        payload(target)
        if hostile == "samples":        # (so that the checksum check is not what refuses it)
            doc = json.loads((folder / agg.name).read_text())
            (doc.get("detailed_evaluation_results") or {}).pop("checksum", None)
            (folder / agg.name).write_text(json.dumps(doc))
    return [str(folder)]


def helm(folder: Path, hostile: str | None, payload) -> list[str]:
    src = next(p for p in (EEE / "helm").iterdir() if p.name.startswith("mmlu"))
    shutil.copytree(src, folder)
    if hostile:
        payload(folder / hostile)
    return [str(folder)]


def inspect_json(folder: Path, hostile: str | None, payload) -> list[str]:
    folder.mkdir()
    log = folder / "2026-01-01T00-00-00_task_abc.json"
    payload(log)
    return [str(log), "--from", "inspect"]


def zip_bomb(path: Path, gb: float) -> None:
    """A deflated member of `gb` GB of zeros, written in blocks (the archive itself a few MB)."""
    left, block = int(gb * (1 << 30)), b"\0" * (16 * MB)
    with zipfile.ZipFile(path, "w") as z:
        info = zipfile.ZipInfo("samples/1_epoch_1.json")
        info.compress_type = zipfile.ZIP_DEFLATED
        with z.open(info, "w", force_zip64=True) as f:
            while left > 0:
                chunk = block[:min(left, len(block))]
                f.write(chunk)
                left -= len(chunk)


def lying_zip(path: Path) -> None:
    """A member whose directory entry says 100 bytes while its data unpacks to 200 MB."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("header.json", b"\0" * (200 * MB))
    raw = bytearray(path.read_bytes())
    cd = raw.rfind(b"PK\x01\x02")                  # the central directory's entry: its uncompressed size at +24
    raw[cd + 24:cd + 28] = (100).to_bytes(4, "little")
    lh = raw.find(b"PK\x03\x04")                   # and the local header's, at +22
    raw[lh + 22:lh + 26] = (100).to_bytes(4, "little")
    path.write_bytes(bytes(raw))


def inspect_eval(folder: Path, kind: str) -> list[str]:
    folder.mkdir()
    log = folder / "2026-01-01T00-00-00_task_abc.eval"
    if kind == "zip_bomb":
        zip_bomb(log, 3.0)
    elif kind == "lying_zip":
        lying_zip(log)
    elif kind == "truncated_zip":
        zip_bomb(log, 0.05)
        log.write_bytes(log.read_bytes()[: log.stat().st_size // 2])
    elif kind == "not_zip":
        log.write_bytes(os.urandom(MB))
    elif kind == "empty":
        log.write_bytes(b"")
    elif kind == "garbage_member":
        with zipfile.ZipFile(log, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("header.json", b"[" * 100_000)
            z.writestr("_journal/start.json", os.urandom(4096))
    return [str(log)]


def csv_folder(folder: Path, hostile: str | None, payload) -> list[str]:
    folder.mkdir()
    for name in ("models.csv", "splits.csv"):
        shutil.copy(DATA / name, folder / name)
    (folder / "questions.csv").write_text("question_id,question,options,answer,category,src\n"
                                          '900001,"a hostile question?","[""a"",""b""]",A,math,hostile\n')
    (folder / "evaluations.csv").write_text("model,question_id,correct\n")
    if hostile == "header":
        spaces(folder / "questions.csv", 1024, prefix=b"question_id")
    elif hostile:
        payload(folder / "questions.csv")
    return [str(folder), "--from", "csv"]


def cases(big_mb: int):
    """(name, builder(folder) -> argv tail)."""
    p = payloads(big_mb)
    whole = ("spaces_1g", "deep", "deep_obj", "not_utf8", "empty", "truncated", "wrong_type", "nul", "binary")
    lines = ("spaces_1g", "long_line", "deep", "not_utf8", "truncated", "wrong_type", "nul", "binary")
    out = []
    out += [(f"lm-eval results {k}", lambda f, k=k: lm_eval(f, "results", p[k])) for k in whole]
    out += [(f"lm-eval samples {k}", lambda f, k=k: lm_eval(f, "samples", p[k])) for k in lines]
    out += [("lm-eval samples NaN", lambda f: lm_eval(f, None, None, nan=True))]
    out += [(f"eee aggregate {k}", lambda f, k=k: eee(f, "aggregate", p[k])) for k in whole]
    out += [(f"eee samples {k}", lambda f, k=k: eee(f, "samples", p[k])) for k in lines]
    out += [(f"helm scenario_state {k}", lambda f, k=k: helm(f, "scenario_state.json", p[k])) for k in whole]
    out += [(f"helm per_instance_stats {k}", lambda f, k=k: helm(f, "per_instance_stats.json", p[k]))
            for k in ("spaces_1g", "deep", "not_utf8", "truncated", "wrong_type")]
    out += [(f"inspect .json {k}", lambda f, k=k: inspect_json(f, None, p[k]))
            for k in ("spaces_1g", "deep", "not_utf8", "truncated", "binary")]
    out += [(f"inspect .eval {k}", lambda f, k=k: inspect_eval(f, k))
            for k in ("zip_bomb", "lying_zip", "truncated_zip", "not_zip", "empty", "garbage_member")]
    out += [(f"csv questions {k}", lambda f, k=k: csv_folder(f, k, p.get(k)))
            for k in ("spaces_1g", "header", "not_utf8", "binary")]
    return out


def fingerprint(db: str) -> dict:
    import duckdb

    con = duckdb.connect(db, read_only=True)
    try:
        tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                            "WHERE table_schema = 'main' ORDER BY 1").fetchall()]
        return {t: con.execute(f'SELECT count(*), bit_xor(hash(t)) FROM "{t}" t').fetchone() for t in tables}
    finally:
        con.close()


def peak_of(db: str, argv: list[str]) -> tuple[int, str, float]:
    """(exit code, stderr, peak RSS MB) of one import as its own child process."""
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        err = os.open(os.environ["HOSTILE_ERR"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(devnull, 1)
        os.dup2(err, 2)
        os.execve(REGISTRY, [REGISTRY, "--db", db, "import", *argv], {**os.environ, "TQDM_DISABLE": "1"})
    _, status, usage = os.wait4(pid, 0)
    err_text = Path(os.environ["HOSTILE_ERR"]).read_text(errors="replace").strip()
    return os.waitstatus_to_exitcode(status), err_text, usage.ru_maxrss / 1024


def base_registry(tmp: Path) -> str:
    """A registry of 3 models on 300 questions (from the shared data), built once."""
    import duckdb

    src = tmp / "slice"
    src.mkdir()
    con = duckdb.connect()
    con.execute(f"CREATE TABLE q AS SELECT * FROM read_csv('{DATA}/questions.csv.gz') USING SAMPLE reservoir(300 ROWS) "
                "REPEATABLE (7)")
    con.execute(f"COPY q TO '{src}/questions.csv' (HEADER)")
    con.execute(f"""COPY (SELECT e.* FROM read_csv('{DATA}/evaluations.csv.gz') e SEMI JOIN q USING (question_id)
                    WHERE model IN (SELECT DISTINCT model FROM read_csv('{DATA}/evaluations.csv.gz') ORDER BY 1
                    LIMIT 3)) TO '{src}/evaluations.csv' (HEADER)""")
    con.execute(f"COPY (SELECT s.* FROM read_csv('{DATA}/splits.csv') s SEMI JOIN q USING (question_id)) "
                f"TO '{src}/splits.csv' (HEADER)")
    con.close()
    shutil.copy(DATA / "models.csv", src / "models.csv")
    db = str(tmp / "base.duckdb")
    subprocess.run([REGISTRY, "--db", db, "import", str(src)], check=True, capture_output=True)
    return db


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--big-mb", type=int, default=1024, help="size of the gigabyte files (MB)")
    ap.add_argument("--only", default="", help="run only the cases whose name holds this")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows, failed = [], 0
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        db = base_registry(tmp)
        os.environ["HOSTILE_ERR"] = str(tmp / "stderr.txt")
        before = fingerprint(db)
        for i, (name, build) in enumerate(c for c in cases(args.big_mb) if args.only in c[0]):
            folder = tmp / f"case{i}"
            argv = build(folder)
            rc, err, peak = peak_of(db, argv)
            shutil.rmtree(folder, ignore_errors=True)
            lines = [ln for ln in err.splitlines() if ln.strip()]     # (progress lines, then the refusal)
            one_line = (rc not in (0, None) and bool(lines) and lines[-1].startswith("Error: ")
                        and sum(ln.startswith("Error") for ln in lines) == 1 and "Traceback" not in err)
            unchanged = fingerprint(db) == before
            ok = one_line and unchanged and peak <= PEAK_BAR_MB
            failed += not ok
            rows.append({"case": name, "exit": rc, "one_line": one_line, "unchanged": unchanged,
                         "peak_mb": round(peak), "ok": ok, "says": (lines[-1] if lines else "")[:150]})
            if not args.json:
                print(f"{name:34} exit {rc:>3}  peak {peak:6.0f} MB  {'one line' if one_line else 'NOT ONE LINE'}"
                      f"  {'unchanged' if unchanged else 'CHANGED'}  {'ok' if ok else 'FAIL'}  "
                      f"{(lines[-1] if lines else '')[-110:]}", flush=True)
    summary = {"cases": len(rows), "failed": failed, "peak_mb_max": max(r["peak_mb"] for r in rows),
               "bar_peak_mb": PEAK_BAR_MB}
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=1))
    else:
        print(f"\n{summary['cases']} hostile files, {failed} failing a bar; the largest peak {summary['peak_mb_max']} "
              f"MB (bar {PEAK_BAR_MB} MB)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
