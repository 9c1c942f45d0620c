"""Query text vectors that travel with their data: Parquet files of (content hash, text encoder, vector).

Embedding benchmark questions with MiniLM is the slow part of a first import (12,032 MMLU-Pro texts: 8 to 18 minutes
on 2 cores), and every registry, CI job and new user embeds the same public texts again. A vector file carries them:

- `export` writes the registry's vectors (float32, or float16 at half the size; the loss is in BENCHMARKS.md).
- `read` checks a file whole before anything is used: the text encoder named in it must be the registry's, every
  vector must have the encoder's dimension and be finite, and a content hash given twice must carry the same
  vector. A file that fails is one line naming the file and the problem, and nothing is written.
- A vector is keyed by the sha256 of the exact text it was computed from (the registry's `content_hash`), so it can
  only ever be used for that text: a question whose text changed has another hash and is embedded afresh.
- `fill_missing` takes vectors for the registry's texts that lack one from the files given (a folder's
  `text_vectors.parquet`, then the files shipped in the repo's `data/`); MiniLM embeds only what is left.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

import numpy as np

from registry.core import resources
from registry.core.errors import InputError
from registry.core.transaction import Tx
from registry.locus import text_encoder

DATA = resources.data_dir()
SUFFIX = ".vectors.parquet"          # shipped files: data/<name>.vectors.parquet
DIR_FILE = "text_vectors.parquet"    # a data folder's own file, read by `registry import DIR`
DTYPES = ("float32", "float16")


def shipped() -> list[Path]:
    return sorted(DATA.glob(f"*{SUFFIX}"))


@dataclass
class VectorsResult:
    path: str
    rows: int                 # vectors in the file (or written)
    added: int = 0            # vectors the registry did not have
    text_encoder: str = text_encoder.TEXT_ENCODER
    dtype: str = "float32"
    source: str | None = None


def export(tx: Tx, path: str | Path, source: str | None = None, dtype: str = "float32") -> VectorsResult:
    """Write every vector of the registry's text encoder to a Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if dtype not in DTYPES:
        raise InputError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    tbl = tx.arrow("SELECT content_hash, vector FROM text_vectors WHERE text_encoder = ? ORDER BY content_hash",
                   [text_encoder.TEXT_ENCODER])
    n = tbl.num_rows
    flat = tbl.column("vector").combine_chunks().flatten().to_numpy(zero_copy_only=False) if n else np.zeros(0)
    mat = flat.reshape(n, text_encoder.TEXT_DIM).astype(dtype)
    value = pa.from_numpy_dtype(np.dtype(dtype))
    out = pa.table({
        "content_hash": tbl.column("content_hash"),
        "text_encoder": pa.array([text_encoder.TEXT_ENCODER] * n).dictionary_encode(),
        "vector": pa.FixedSizeListArray.from_arrays(pa.array(mat.ravel(), type=value), text_encoder.TEXT_DIM),
    }).replace_schema_metadata({"registry.text_encoder": text_encoder.TEXT_ENCODER,
                                "registry.dim": str(text_encoder.TEXT_DIM), "registry.source": source or ""})
    path = Path(path)
    if path.is_dir():
        raise InputError("is a directory, not a file", file=str(path))
    pq.write_table(out, path, compression="zstd")
    return VectorsResult(str(path), n, dtype=dtype, source=source)


def read(path: str | Path) -> tuple[list[str], np.ndarray]:
    """(content hashes [n], vectors [n, dim] float32) from a vector file, checked whole (module docstring)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = str(path)
    if not Path(path).is_file():
        raise InputError("no such file", file=path)
    try:
        tbl = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"not a readable Parquet file (truncated or corrupt?): {str(exc).splitlines()[0]}",
                         file=path) from None
    missing = {"content_hash", "text_encoder", "vector"} - set(tbl.column_names)
    if missing:
        raise InputError(f"missing column {sorted(missing)[0]} (a vector file has content_hash, text_encoder, "
                         f"vector)", file=path)
    encoders = set(tbl.column("text_encoder").cast(pa.string()).unique().to_pylist())
    if encoders - {text_encoder.TEXT_ENCODER}:
        other = sorted(str(e) for e in encoders - {text_encoder.TEXT_ENCODER})[0]
        raise InputError(f"vectors of text encoder {other!r}; this registry uses {text_encoder.TEXT_ENCODER!r}",
                         file=path)
    hashes = tbl.column("content_hash").to_pylist()
    if any(not isinstance(h, str) or len(h) != 64 for h in hashes):
        bad = next(i for i, h in enumerate(hashes) if not isinstance(h, str) or len(h) != 64)
        raise InputError(f"row {bad + 1}: content_hash must be a sha256 hex digest, got {hashes[bad]!r}", file=path)
    col = tbl.column("vector").combine_chunks()
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type)):
        raise InputError(f"column vector has type {col.type}, expected a list of floats", file=path)
    lengths = pc.list_value_length(col).fill_null(text_encoder.TEXT_DIM).to_numpy(zero_copy_only=False)
    wrong = np.flatnonzero(lengths != text_encoder.TEXT_DIM)
    if len(wrong):
        raise InputError(f"row {wrong[0] + 1}: vector of dimension {int(lengths[wrong[0]])}, the text encoder's is "
                         f"{text_encoder.TEXT_DIM}", file=path)
    if col.null_count:
        raise InputError(f"row {int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0]) + 1}: "
                         f"no vector", file=path)
    mat = col.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(hashes), text_encoder.TEXT_DIM)
    finite = np.isfinite(mat).all(axis=1)
    if not finite.all():
        raise InputError(f"row {int(np.flatnonzero(~finite)[0]) + 1}: vector has NaN or infinite values", file=path)
    order = np.argsort(np.asarray(hashes, dtype=object), kind="stable")
    sorted_h = np.asarray(hashes, dtype=object)[order]
    same = np.flatnonzero(sorted_h[1:] == sorted_h[:-1])
    for i in same:
        a, b = order[i], order[i + 1]
        if not np.array_equal(mat[a], mat[b]):
            raise InputError(f"rows {min(a, b) + 1} and {max(a, b) + 1}: content hash {hashes[a][:12]}... given "
                             f"two different vectors", file=path)
    keep = np.ones(len(hashes), dtype=bool)
    keep[order[same + 1]] = False                   # identical repeats collapse into one
    return [h for h, k in zip(hashes, keep) if k], mat[keep]


def load(tx: Tx, path: str | Path, only: set[str] | None = None) -> VectorsResult:
    """Add a file's vectors (those the registry lacks; with `only`, just those hashes) in the caller's
    transaction."""
    hashes, mat = read(path)
    n = len(hashes)
    if only is not None:
        keep = [i for i, h in enumerate(hashes) if h in only]
        hashes, mat = [hashes[i] for i in keep], mat[keep]
    return VectorsResult(str(path), n, insert(tx, hashes, mat))


@overload
def insert(tx: Tx, hashes: list[str], mat: np.ndarray, count: Literal[True] = True) -> int: ...
@overload
def insert(tx: Tx, hashes: list[str], mat: np.ndarray, count: bool) -> int | None: ...
def insert(tx: Tx, hashes: list[str], mat: np.ndarray, count: bool = True) -> int | None:
    """Add vectors [n, dim] for content hashes (the one writer of text_vectors): a hash already there, or repeated
    here, keeps one vector. -> how many were new (None without `count`: two reads fewer, for the server's writer)."""
    import pyarrow as pa

    if not hashes:
        return 0
    before = tx.sql("SELECT count(*) FROM text_vectors")[0][0] if count else None
    mat = np.ascontiguousarray(mat, dtype=np.float32)
    tbl = pa.table({"h": hashes, "v": pa.FixedSizeListArray.from_arrays(pa.array(mat.ravel(), type=pa.float32()),
                                                                          text_encoder.TEXT_DIM)})
    with tx.table("_vectors_file", tbl):
        tx.sql("""INSERT INTO text_vectors (content_hash, text_encoder, vector)
                  SELECT DISTINCT ON (h) h, ?, v::FLOAT[] FROM _vectors_file ON CONFLICT DO NOTHING""",
               [text_encoder.TEXT_ENCODER])
    return int(tx.sql("SELECT count(*) FROM text_vectors")[0][0] - before) if count else None


def missing_hashes(tx: Tx) -> set[str]:
    return {r[0] for r in tx.sql("""SELECT DISTINCT content_hash FROM queries WHERE content_hash NOT IN
                                    (SELECT content_hash FROM text_vectors WHERE text_encoder = ?)""",
                                 [text_encoder.TEXT_ENCODER])}


def fill_missing(tx: Tx, files: list[Path]) -> int:
    """Vectors for the registry's texts that lack one, from these files in order; -> how many were filled."""
    filled = 0
    for f in files:
        need = missing_hashes(tx)
        if not need:
            break
        filled += load(tx, f, only=need).added
    return filled
