"""Query files for batch routing, in and out. In: JSONL (one object per line with `text`, or `question` plus optional
`options`, and an optional `id`; a bare JSON string also counts) or CSV with the same columns. Out: JSONL (one
decision per line) or CSV (one row per query: id, model, fallback, prob), chosen by the file's suffix.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from pathlib import Path

from registry.core.errors import InputError
from registry.locus import text_encoder


def read_queries(path: str) -> tuple[list[str], list[str]]:
    """(ids, texts). Every problem names the file and line: bytes that are not UTF-8, a line that is not JSON, a
    record without text."""
    p = Path(path)
    if not p.is_file():
        raise InputError("no such file", file=str(path))
    raw = p.read_bytes()
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise InputError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
                         file=str(path), line=line) from None
    if p.suffix.lower() == ".csv":
        return _read_csv(content, str(path))
    return _read_jsonl(content, str(path))


def _text_of(rec, path: str, line: int) -> str:
    if isinstance(rec, str):
        return rec
    if not isinstance(rec, dict):
        raise InputError("each line must be a JSON object or string", file=path, line=line)
    text = rec.get("text", rec.get("query"))
    if text is None and rec.get("question") is not None:
        try:
            text = text_encoder.query_text(str(rec["question"]), text_encoder.parse_options(rec.get("options")))
        except (ValueError, json.JSONDecodeError) as exc:
            raise InputError(f"bad options: {exc}", file=path, line=line) from None
    if not isinstance(text, str):
        raise InputError("missing field 'text' (or 'question')", file=path, line=line)
    if not text.strip():
        raise InputError("empty query", file=path, line=line)
    return text


def _read_jsonl(content: str, path: str):
    ids: list[str] = []
    texts: list[str] = []
    n = 0                          # records, as every reader of ours counts lines (InputError shows the file's line)
    for line in content.splitlines():
        if not line.strip():
            continue
        n += 1
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"not JSON: {exc.msg} (column {exc.colno})", file=path, line=n) from None
        texts.append(_text_of(rec, path, n))
        ids.append(str(rec.get("id", rec.get("question_id", len(ids) + 1))) if isinstance(rec, dict)
                   else str(len(ids) + 1))
    if not texts:
        raise InputError("no queries in the file", file=path)
    return ids, texts


def _read_csv(content: str, path: str):
    reader = csv.DictReader(io.StringIO(content))
    cols = {c.strip().lower(): c for c in (reader.fieldnames or [])}
    if not ({"text", "query", "question"} & set(cols)):
        raise InputError("CSV needs a 'text' (or 'question') column", file=path, line=1)
    ids: list[str] = []
    texts: list[str] = []
    for n, row in enumerate(reader, 2):
        rec = {k.strip().lower(): v for k, v in row.items() if k is not None}
        if rec.get("text") in (None, "") and rec.get("query") in (None, ""):
            rec.pop("text", None), rec.pop("query", None)
        texts.append(_text_of(rec, path, n))
        ids.append(str(rec.get("id") or rec.get("question_id") or len(ids) + 1))
    if not texts:
        raise InputError("no queries in the file", file=path)
    return ids, texts


OUT_SUFFIXES = (".jsonl", ".csv")


def check_out_path(path: str) -> None:
    """Decisions are written only under a name that says their format: .jsonl or .csv."""
    if Path(path).suffix.lower() not in OUT_SUFFIXES:
        raise InputError(f"--out {path}: decisions are written as {' or '.join(OUT_SUFFIXES)} (by the name's suffix)")


def write_decisions(path: str, ids: list[str], decisions) -> None:
    check_out_path(path)
    out = Path(path)
    if out.suffix.lower() == ".csv":
        with out.open("w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, lineterminator="\n")        # LF, as every other file the registry writes
            w.writerow(["id", "model", "fallback", "prob", "encoder"])
            for i, d in zip(ids, decisions):
                prob = next((c.prob for c in d.candidates if c.model == d.model), None)
                w.writerow([i, d.model or "", d.fallback, prob, d.encoder])
        return
    with out.open("w", encoding="utf-8") as f:
        for i, d in zip(ids, decisions):
            f.write(json.dumps({"id": i, **asdict(d)}) + "\n")
