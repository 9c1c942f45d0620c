"""Progress on stderr is our own lines, never a library's bar: an import that embeds new texts and a `verify` of three
endpoints at once (whose bars used to interleave) print no tqdm bar, and say how far they are in plain lines."""
from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from registry.api import Registry
from registry.cli import cli
from tests.conftest import EEE

from . import verify_fakes as vf

X = "gpt-4o-2024-05-13"
BAR = re.compile(r"it/s\]|%\||/s\]|\r")         # what a tqdm bar leaves: rate, percent and bar, carriage returns


@pytest.mark.slow
def test_an_import_that_embeds_texts_prints_no_bar(db_copy):
    run = EEE / "fixtures" / "helm" / "narrative_qa-model=openai_gpt2"      # 5 texts the registry has not seen
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "import", "--from", "helm", str(run), "--threshold", "0.3"])
    assert r.exit_code == 0, r.output
    assert not BAR.search(r.stderr), r.stderr
    assert re.search(r"^text encoder \((onnx|torch)\): 5 of 5 texts embedded \(\d+ s\)$", r.stderr, re.M), r.stderr


@pytest.mark.slow
def test_verify_of_three_endpoints_prints_lines_not_bars(db_copy, upstreams):
    book = vf.books(db_copy, [X])
    with Registry(db_copy) as reg:
        for i in range(3):
            reg.claim(X, upstreams(vf.case(book, "faithful", X, seed=i)).url, name=f"{X}@{i}")
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "verify", X, "-n", "12", "--repeat", "2"])
    assert r.exit_code == 3 and "not conclusive" in r.stdout, r.output        # (12 questions: too few to tell)
    assert not BAR.search(r.stderr), r.stderr
    for i in range(3):      # each endpoint's lines name it: read one at a time, however they interleave
        assert f"asking {X}@{i}: 14 of 14 questions answered" in r.stderr, r.stderr
