"""Query text vectors that travel with their data (issue 18): export, checked import, and the rule that a vector is
only ever used for the very text it was computed from. Real registry files, the real MiniLM for changed texts."""
from __future__ import annotations

import csv
import gzip

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from registry import Registry
from registry.cli import cli
from registry.core.errors import InputError
from registry.locus import text_encoder

from .conftest import snapshot


def vectors_of(path) -> dict[str, np.ndarray]:
    with Registry(path) as reg, reg.store.tx() as tx:
        return {h: np.asarray(v, dtype=np.float32) for h, v in tx.sql(
            "SELECT content_hash, vector FROM text_vectors WHERE text_encoder = ?", [text_encoder.TEXT_ENCODER])}


def test_export_import_round_trip(db_copy, tmp_path):
    out = tmp_path / "v.parquet"
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "vectors", "export", str(out), "--source", "test"])
    assert r.exit_code == 0, r.output
    meta = pq.read_schema(out).metadata
    assert meta[b"registry.text_encoder"].decode() == text_encoder.TEXT_ENCODER and meta[b"registry.source"] == b"test"
    fresh = tmp_path / "fresh.duckdb"
    r = CliRunner().invoke(cli, ["--db", str(fresh), "vectors", "import", str(out), "--json"])
    assert r.exit_code == 0, r.output
    want, got = vectors_of(db_copy), vectors_of(fresh)
    assert set(want) == set(got) and all(np.array_equal(want[h], got[h]) for h in want)
    again = CliRunner().invoke(cli, ["--db", str(fresh), "vectors", "import", str(out)])
    assert again.exit_code == 0 and f"{len(want)} vectors read, 0 new" in again.output
    half = tmp_path / "h.parquet"
    with Registry(db_copy) as reg:
        assert reg.export_vectors(str(half), dtype="float16").rows == len(want)
    h = vectors_of(db_copy)
    back = pq.read_table(half).column("vector").combine_chunks().flatten().to_numpy().astype(np.float32)
    assert back.reshape(len(h), -1).shape[1] == text_encoder.TEXT_DIM


def _write(path, hashes, mat, encoder=text_encoder.TEXT_ENCODER, list_type=None):
    vec = pa.array([list(map(float, v)) for v in mat], type=list_type or pa.list_(pa.float32()))
    pq.write_table(pa.table({"content_hash": hashes, "text_encoder": [encoder] * len(hashes), "vector": vec}), path)
    return path


def test_bad_vector_files_are_one_line_errors_and_change_nothing(db_copy, tmp_path):
    good = vectors_of(db_copy)
    hashes = sorted(good)[:3]
    mat = np.stack([good[h] for h in hashes])
    nan = mat.copy()
    nan[1, 5] = np.nan
    other = mat.copy()
    other[0, 0] += 0.5
    full = tmp_path / "full.parquet"
    _write(full, hashes, mat)
    truncated = tmp_path / "cut.parquet"
    truncated.write_bytes(full.read_bytes()[: len(full.read_bytes()) // 2])
    cases = {
        "another text encoder": (_write(tmp_path / "enc.parquet", hashes, mat, encoder="all-mpnet-base-v2@384"),
                                 "vectors of text encoder 'all-mpnet-base-v2@384'"),
        "wrong dimension": (_write(tmp_path / "dim.parquet", hashes, mat[:, :383]), "row 1: vector of dimension 383"),
        "NaN": (_write(tmp_path / "nan.parquet", hashes, nan), "row 2: vector has NaN or infinite values"),
        "duplicate hash, two vectors": (_write(tmp_path / "dup.parquet", [hashes[0], hashes[0]], [mat[0], other[0]]),
                                        "rows 1 and 2: content hash"),
        "truncated": (truncated, "not a readable Parquet file"),
        "not a hash": (_write(tmp_path / "h.parquet", ["abc"], mat[:1]), "content_hash must be a sha256"),
    }
    fresh = tmp_path / "fresh.duckdb"
    with Registry(fresh):
        pass
    before = snapshot(fresh)
    for what, (path, message) in cases.items():
        r = CliRunner().invoke(cli, ["--db", str(fresh), "vectors", "import", str(path)])
        assert r.exit_code == 1 and message in r.output and str(path) in r.output, (what, r.output)
        assert len(r.output.strip().splitlines()) == 1, (what, r.output)
        assert snapshot(fresh) == before, what
    # identical repeats collapse into one
    with Registry(fresh) as reg:
        assert reg.import_vectors(str(_write(tmp_path / "same.parquet", [hashes[0]] * 2, [mat[0]] * 2))).added == 1
        with pytest.raises(InputError, match="no such file"):
            reg.import_vectors(str(tmp_path / "missing.parquet"))


@pytest.mark.slow
def test_a_changed_text_is_embedded_afresh(db_copy, small_data, tmp_path):
    """A vector file made from the old texts, a questions file where one text changed: that text gets MiniLM's
    vector of the new text, never the old one; every other text comes from the file."""
    exported = tmp_path / "text_vectors.parquet"
    with Registry(db_copy) as reg:
        reg.export_vectors(str(exported))
    folder = tmp_path / "data"
    folder.mkdir()
    with gzip.open(small_data / "questions.csv.gz", "rt", newline="") as f:
        rows = list(csv.DictReader(f))
    changed_id = rows[0]["question_id"]
    rows[0]["question"] = rows[0]["question"] + " (revised)"
    with gzip.open(folder / "questions.csv.gz", "wt", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (folder / "text_vectors.parquet").write_bytes(exported.read_bytes())
    fresh = tmp_path / "fresh.duckdb"
    with Registry(fresh) as reg:
        result = reg.import_files(directory=str(folder))
        assert result.texts_embedded == 1 and result.vectors_loaded == len(rows)
        with reg.store.tx() as tx:
            text, h = tx.sql("SELECT text, content_hash FROM queries WHERE external_id = ?", [changed_id])[0]
            stored = np.asarray(tx.sql("SELECT vector FROM text_vectors WHERE content_hash = ?", [h])[0][0],
                                dtype=np.float32)
    assert text.startswith(rows[0]["question"])
    assert np.allclose(stored, text_encoder.encode([text])[0], atol=1e-5)
    old = vectors_of(db_copy)
    assert h not in old and not any(np.allclose(stored, v, atol=1e-3) for v in old.values())
