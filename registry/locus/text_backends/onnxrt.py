"""all-MiniLM-L6-v2 on ONNX Runtime: the package's own weights, exported once with torch.onnx (fp32, no
quantisation) into a user cache folder keyed by the weights' SHA-256, then run with the `tokenizers` package and
onnxruntime alone: no torch, transformers or sentence-transformers in the process that encodes.

The graph is sentence-transformers' three modules for this model (modules.json: Transformer, mean Pooling,
Normalize): BERT's last hidden state, the mean over the tokens the attention mask keeps (the count clamped at 1e-9),
L2-normalised (F.normalize's eps 1e-12). The tokenizer is the package's tokenizer.json with sentence-transformers'
settings (longest-first truncation to max_seq_length, padding to the batch's longest), not the file's own
(truncation and padding to 128). An export is kept only if it agrees with torch on PROBE_TEXTS (cosine >= MIN_COSINE).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

EXPORT_VERSION = 1          # part of the cache key: a change to the exported graph gives a new file
OPSET = 17
MIN_COSINE = 0.9999
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
PROBE_TEXTS = ["", "What is the derivative of x^2?", "  Leading and trailing spaces, UPPER case, accents: café  ",
               "Which of the following is a prime number?\n(A) 21\n(B) 27\n(C) 29\n(D) 33",
               " ".join(f"token{i} and some words" for i in range(200))]   # > 256 tokens: truncated


def cache_dir() -> Path:
    """Where exported graphs live: $XDG_CACHE_HOME/locus-registry/text-encoder (~/.cache when unset)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "locus-registry" / "text-encoder"


def weights_digest(model_dir: Path) -> str:
    """SHA-256 of the weights file, remembered beside the cache by the file's path, size and mtime (hashing 90 MB
    costs 70 ms, a third of a new process's budget for encoding one text)."""
    weights = Path(model_dir) / "model.safetensors"
    st = weights.stat()
    stamp = hashlib.sha256(f"{weights.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    memo = cache_dir() / f"weights-{stamp}.sha256"
    try:
        digest = memo.read_text().strip()
        if len(digest) == 64:
            return digest
    except OSError:
        pass
    with open(weights, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    try:
        _write_atomically(memo, digest.encode())
    except OSError:                      # a read-only home: hash again next time
        pass
    return digest


def graph_path(model_dir: Path) -> Path:
    return cache_dir() / f"all-MiniLM-L6-v2-{weights_digest(model_dir)[:16]}-export{EXPORT_VERSION}-fp32.onnx"


def export(model_dir: Path, path: Path, reference, max_seq_length: int) -> float:
    """Exports the weights in `model_dir` to `path` (atomically), checked against `reference` (texts -> torch's
    unit vectors) on PROBE_TEXTS; returns the least cosine. Needs torch, transformers and onnx."""
    import warnings

    import torch
    import transformers

    transformers.logging.disable_progress_bar()
    model = transformers.AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    graph = _pooled(model)
    ids = torch.tensor([[101, 2054, 2003, 1996, 102, 0], [101, 2054, 2003, 1996, 2154, 102]])
    mask = (ids != 0).long()                               # the traced example pads a row, so the mask stays live
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".onnx.tmp")
    os.close(fd)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")      # the tracer's notes on the mask code, which the probe check covers
            torch.onnx.export(graph, (ids, mask, torch.zeros_like(ids)), tmp, dynamo=False, opset_version=OPSET,
                              input_names=list(INPUTS), output_names=["sentence_embedding"],
                              dynamic_axes={**{k: {0: "batch", 1: "tokens"} for k in INPUTS},
                                            "sentence_embedding": {0: "batch"}})
        session = Session(model_dir, Path(tmp), max_seq_length)
        least = float((session.encode(PROBE_TEXTS) * reference(PROBE_TEXTS)).sum(axis=1).min())
        if not least >= MIN_COSINE:
            raise RuntimeError(f"the ONNX export's vectors differ from torch's (least cosine {least:.6f} on "
                               f"{len(PROBE_TEXTS)} probe texts): not used")
        os.replace(tmp, path)
        meta = {"weights_sha256": weights_digest(model_dir), "export_version": EXPORT_VERSION, "opset": OPSET,
                "torch": torch.__version__, "probe_min_cosine": least}
        _write_atomically(path.with_suffix(".json"), json.dumps(meta, indent=1).encode())
        return least
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _pooled(bert):
    """sentence-transformers' Transformer -> Pooling(mean) -> Normalize, as one torch module to export."""
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            tokens = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            mean = (tokens * mask).sum(dim=1) / torch.clamp(mask.sum(dim=1), min=1e-9)
            return torch.nn.functional.normalize(mean, p=2, dim=-1)

    return Pooled()


def tokenizer(model_dir: Path, max_seq_length: int):
    """The package's tokenizer.json with sentence-transformers' settings: truncated (longest first) at
    max_seq_length tokens, unpadded (Session pads each batch to its longest)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tok.enable_truncation(max_length=max_seq_length, strategy="longest_first")
    tok.no_padding()
    return tok


class Session:
    """A loaded graph and its tokenizer: `encode` gives what sentence-transformers' encode gives (unit vectors)."""

    def __init__(self, model_dir: Path, path: Path, max_seq_length: int, threads: int | None = None):
        import onnxruntime as ort

        self.tokenizer = tokenizer(model_dir, max_seq_length)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.path = path

    def encode(self, texts: Sequence[str], batch_size: int = 64,
               on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        """[N] texts -> [N, 384] float32. Batches of similar length (sorted by tokens), each padded to its longest.
        `on_batch(texts done)` after each batch (the caller's progress lines; no bar of its own)."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=True)
        lengths = np.array([len(e.ids) for e in encodings])
        order = np.argsort(-lengths, kind="stable")
        out = np.zeros((len(texts), self.session.get_outputs()[0].shape[-1]), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            rows = order[start:start + batch_size]
            width = int(lengths[rows[0]])
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for i, r in enumerate(rows):
                ids[i, :lengths[r]] = encodings[r].ids
                mask[i, :lengths[r]] = 1
            out[rows] = self.session.run(None, {"input_ids": ids, "attention_mask": mask,
                                                "token_type_ids": np.zeros_like(ids)})[0]
            if on_batch is not None:
                on_batch(min(start + batch_size, len(texts)))
        return out


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
