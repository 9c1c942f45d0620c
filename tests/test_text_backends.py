"""The text encoder's backends (registry/locus/text_encoder.py, text_backends/onnxrt.py): the ONNX Runtime backend
gives torch's vectors (cosine >= 0.9999 on real MMLU-Pro questions), is the default where onnxruntime is installed,
and routes a new text in a new process without importing torch; torch serves where onnxruntime is missing."""
from __future__ import annotations

import json
import subprocess
import sys

import duckdb
import numpy as np
import pytest

from registry.locus import text_encoder
from registry.locus.text_backends import onnxrt


@pytest.fixture
def fresh_backends(monkeypatch):
    """This process's backend choice as if nothing were loaded yet (restored after the test)."""
    for name in ("_onnx", "_onnx_failed", "_preferred"):
        monkeypatch.setattr(text_encoder, name, None)


def test_without_onnxruntime_torch_serves(fresh_backends, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)       # as if it were not installed
    assert text_encoder.load_onnx() is None
    assert text_encoder.backend() == "torch"
    assert "onnxruntime is not installed" in text_encoder.backend_note()


def test_a_backend_is_named_from_a_fixed_list(fresh_backends):
    with pytest.raises(ValueError, match="one of onnx, torch"):
        text_encoder.encode([], backend="openvino")
    with pytest.raises(ValueError, match="one of onnx, torch"):
        text_encoder.prefer("int8")
    text_encoder.prefer("torch")
    assert text_encoder.backend() == "torch"


def test_the_tokenizer_takes_sentence_transformers_settings_not_the_files(tmp_path):
    """tokenizer.json itself truncates and pads to 128; the encoder truncates at 256 and pads to a batch's longest."""
    saved = json.loads((text_encoder.model_dir() / "tokenizer.json").read_text())
    assert saved["truncation"]["max_length"] == 128 and saved["padding"] is not None
    tok = onnxrt.tokenizer(text_encoder.model_dir(), text_encoder.MAX_SEQ_LENGTH)
    short, long = tok.encode_batch(["What is the derivative of x^2?", "word " * 600])
    assert len(long.ids) == 256 and long.ids[0] == 101 and long.ids[-1] == 102      # [CLS] ... [SEP], cut at 256
    assert len(short.ids) < 20 and 0 not in short.ids                               # no padding


def test_the_cache_is_keyed_by_the_weights_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    weights = tmp_path / "model"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"one")
    first = onnxrt.graph_path(weights)
    assert first.parent == tmp_path / "cache" / "locus-registry" / "text-encoder"
    assert onnxrt.weights_digest(weights) == "7692c3ad3540bb803c020b3aee66cd8887123234ea0c6e7143c0add73ff431ed"
    (weights / "model.safetensors").write_bytes(b"two!")                 # other weights: another graph
    assert onnxrt.graph_path(weights) != first


def test_a_vector_says_which_encoder_and_weights_made_it():
    torch, onnx = text_encoder.describe("torch"), text_encoder.describe("onnx")
    assert torch["text_encoder"] == onnx["text_encoder"] == text_encoder.TEXT_ENCODER     # shown equivalent: one name
    assert torch["weights_sha256"] == onnx["weights_sha256"] and len(onnx["weights_sha256"]) == 64
    assert onnx["weights_sha256"][:16] in onnx["graph"] and "graph" not in torch
    assert onnx["min_cosine_to_torch"] >= 0.9999


# --- with MiniLM: the slow tier --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_onnx_gives_torchs_vectors_on_real_questions(mmlu_dir):
    con = duckdb.connect()
    rows = con.execute(f"""SELECT question, options FROM read_csv('{mmlu_dir}/questions.csv.gz')
                           USING SAMPLE reservoir(300 ROWS) REPEATABLE (11)""").fetchall()
    texts = [text_encoder.query_text(q, text_encoder.parse_options(o)) for q, o in rows]
    texts += ["", "  padded with spaces  ", "word " * 600]       # empty, stripped or not, truncated at 256 tokens
    onnx = text_encoder.encode(texts, backend="onnx")
    torch = text_encoder.encode(texts, backend="torch")
    cos = (onnx * torch).sum(axis=1)
    assert cos.min() >= 0.9999, f"least cosine {cos.min()}"
    assert np.allclose(np.linalg.norm(onnx, axis=1), 1, atol=1e-5)
    assert text_encoder.backend() == "onnx"                       # the default where onnxruntime is installed
    alone = text_encoder.encode(texts[:1], backend="onnx")[0]     # a text's vector does not depend on its batch
    assert float(alone @ onnx[0]) >= 0.99999


ROUTE_NEW_TEXT = """
import json, sys
from registry import Registry
from registry.locus import text_encoder
with Registry(sys.argv[1]) as reg:
    d = reg.route(sys.argv[2])
print(json.dumps({"model": d.model, "torch": "torch" in sys.modules, "loaded": text_encoder.loaded(),
                  "heavy": sorted(m for m in ("transformers", "sentence_transformers") if m in sys.modules)}))
"""


@pytest.mark.slow
def test_a_new_text_routes_in_a_new_process_without_torch(db_copy):
    assert text_encoder.onnx_graph() is not None                  # exported (with torch) here if not yet cached
    subprocess.run([sys.executable, "-c", ROUTE_NEW_TEXT, str(db_copy), "warm the routing state?"],
                   capture_output=True, text=True, timeout=300, check=True)   # builds and saves the routing state
    out = subprocess.run([sys.executable, "-c", ROUTE_NEW_TEXT, str(db_copy), "A question no registry has seen?"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["loaded"] == ["onnx"] and got["torch"] is False and got["heavy"] == [], got
    assert got["model"]

