"""Files someone else wrote, read with bounded memory: a JSON file over the limit, a JSON line over the limit, JSON
nested past the stack, a zip bomb, a zip that lies about its sizes; each refused with one line and the database
unchanged. And an export onto a disk that fills: one line, no manifest, and an import that says it is unfinished.
(bench/hostile_imports.py runs 64 such files at full size, each as its own process, with its peak memory.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from registry.core.errors import InputError
from registry.data.formats import file_limits
from tests.conftest import snapshot
from tests.helpers import run_import

MB = 1 << 20


def test_a_json_file_over_the_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setenv("REGISTRY_JSON_MB", "1")
    big = tmp_path / "scenario_state.json"
    big.write_bytes(b" " * (2 * MB))
    with pytest.raises(InputError, match=r"2 MB, more than the 1 MB this reader takes \(set REGISTRY_JSON_MB"):
        file_limits.json_document(big)
    monkeypatch.delenv("REGISTRY_JSON_MB")
    with pytest.raises(InputError, match="holds no JSON"):
        file_limits.json_document(big)


@pytest.mark.parametrize("raw, problem", [(b"[" * 100_000 + b"]" * 100_000, "nests its JSON deeper than"),
                                          (b'{"a": "\xff"}', "invalid UTF-8 at byte 7"),
                                          (b'{"a": [1, 2', "not valid JSON")])
def test_json_that_is_no_results_file_is_one_line(tmp_path, raw, problem):
    bad = tmp_path / "results.json"
    bad.write_bytes(raw)
    with pytest.raises(InputError, match=problem) as caught:
        file_limits.json_document(bad)
    assert "\n" not in str(caught.value) and str(bad) in str(caught.value)


def test_a_json_line_over_the_limit_is_refused_at_its_line(tmp_path, monkeypatch):
    monkeypatch.setenv("REGISTRY_JSON_LINE_MB", "1")
    f = tmp_path / "samples.jsonl"
    f.write_bytes(b'{"a": 1}\n\n{"b": "' + b"x" * (2 * MB) + b'"}\n')
    rows = file_limits.json_lines(f)
    assert next(rows) == (1, {"a": 1})
    with pytest.raises(InputError, match="a line is longer than the 1 MB") as caught:
        next(rows)
    assert caught.value.line == 3                       # (the editor's line: the blank line counted)


def test_a_zip_bomb_and_a_zip_that_lies_are_refused(tmp_path, monkeypatch):
    bomb = tmp_path / "bomb.eval"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("samples/1_epoch_1.json", b"\0" * (80 * MB))
    with pytest.raises(InputError, match="times their packed size .* a zip bomb"):
        file_limits.check_archive(bomb)
    monkeypatch.setenv("REGISTRY_ARCHIVE_MB", "10")
    with pytest.raises(InputError, match="unpacked, the archive is 80 MB, more than the 10 MB"):
        file_limits.check_archive(bomb)
    liar = tmp_path / "liar.eval"
    with zipfile.ZipFile(liar, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("header.json", b"\0" * (4 * MB))
    raw = bytearray(liar.read_bytes())
    for signature, at in ((b"PK\x01\x02", 24), (b"PK\x03\x04", 22)):     # declared size: 100 bytes
        start = raw.rfind(signature) if signature == b"PK\x01\x02" else raw.find(signature)
        raw[start + at:start + at + 4] = (100).to_bytes(4, "little")
    liar.write_bytes(bytes(raw))
    with pytest.raises(InputError, match="a damaged zip archive .*Bad CRC"):
        file_limits.check_archive(liar)


def lm_eval_folder(folder: Path, results: bytes | None = None, samples: bytes | None = None) -> Path:
    folder.mkdir()
    (folder / "results_2026-01-01T00-00-00.json").write_bytes(results or json.dumps(
        {"model_name": "hostile/model", "configs": {"mmlu": {"metric_list": [{"metric": "acc"}]}}}).encode())
    (folder / "samples_mmlu_2026-01-01T00-00-00.jsonl").write_bytes(samples or b'{"doc_id": 0, "doc": {"question": '
                                                                               b'"q?"}, "acc": 1}\n')
    return folder


@pytest.mark.parametrize("case", ["deep results", "long line", "nan score", "not utf-8 samples"])
def test_hostile_harness_files_are_one_line_and_change_nothing(db_copy, tmp_path, monkeypatch, case):
    monkeypatch.setenv("REGISTRY_JSON_LINE_MB", "1")
    folder = {"deep results": lambda f: lm_eval_folder(f, results=b"[" * 50_000 + b"]" * 50_000),
              "long line": lambda f: lm_eval_folder(f, samples=b'{"doc": "' + b" " * (2 * MB) + b'"}\n'),
              "nan score": lambda f: lm_eval_folder(f, samples=b'{"doc_id": 0, "doc": {"question": "q?"}, '
                                                               b'"acc": NaN}\n'),
              "not utf-8 samples": lambda f: lm_eval_folder(f, samples=b'{"doc": "\xff\xfe"}\n')}[case](tmp_path / "f")
    before = snapshot(db_copy)
    res = run_import(db_copy, str(folder), "--from", "lm-eval")
    lines = res.output.strip().splitlines()            # (the progress line "reading ...", then the refusal)
    assert res.exit_code == 1 and lines[-1].startswith("Error: ") and "Traceback" not in res.output, res.output
    assert all(ln.startswith("reading ") for ln in lines[:-1]) and str(folder) in lines[-1]
    assert snapshot(db_copy) == before


FULL_DISK_EXPORT = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # (a write past the limit fails with EFBIG, as on a full disk)
resource.setrlimit(resource.RLIMIT_FSIZE, (150_000, 150_000))
from registry.cli import main
sys.argv = ["registry", "--db", sys.argv[1], "export", sys.argv[2], "--to", "eee"]
main()
"""


@pytest.mark.slow
def test_an_export_that_cannot_write_is_one_line_and_never_taken_for_complete(db_copy, tmp_path):
    out = tmp_path / "export"
    p = subprocess.run([sys.executable, "-c", FULL_DISK_EXPORT, str(db_copy), str(out)], capture_output=True,
                       text=True, env={**os.environ, "TQDM_DISABLE": "1"}, timeout=300)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("Error") or "Traceback" in ln]
    assert p.returncode == 1 and len(errors) == 1, p.stderr[-2000:]
    assert "the export stopped while writing" in errors[0] and "File too large" in errors[0], errors[0]
    assert not (out / "registry-export.manifest").exists()
    fresh = tmp_path / "fresh.duckdb"
    p = subprocess.run([sys.executable, "-m", "registry", "--db", str(fresh), "import", str(out), "--from", "eee"],
                       capture_output=True, text=True, timeout=300)     # (no model's files were all written)
    assert p.returncode == 1 and p.stderr.splitlines()[-1].startswith("Error: "), p.stderr[-2000:]
    assert not fresh.exists()
