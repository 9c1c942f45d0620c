"""Read commands: a missing database is refused (never created), show suggests names, stats counts queries
without a split, diff/similar/stats/map on a small registry, a bad --as-of is one line."""
from __future__ import annotations

import json

import pytest

from registry import Registry
from registry.core.errors import InputError, NotFound
from tests.helpers import results_of, run, write_rows

Q = "What is the derivative of x^2 with respect to x?"


def known_text(db) -> str:
    """A query text the registry already holds: routed from its stored vector, without MiniLM."""
    with Registry(db) as reg, reg.store.tx() as tx:
        return tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]


def test_read_commands_refuse_a_missing_database(tmp_path):
    typo = tmp_path / "typo.duckdb"
    for args in (["models"], ["stats"], ["show", "x"], ["route", Q], ["similar", "x"], ["log"]):
        out = run(typo, *args)
        assert out.exit_code == 1 and "no such registry" in out.output and len(out.output.strip().splitlines()) == 1
        assert not typo.exists()


def test_show_suggests_names_and_prints_no_none(db_copy):
    out = run(db_copy, "show", "gpt-4o")
    assert out.exit_code == 1 and "did you mean 'gpt-4o-2024-05-13'" in out.output
    with Registry(db_copy) as reg:
        with pytest.raises(NotFound, match="did you mean 'gemini-1.5-pro-002'"):
            reg.history("gemini-1.5-pro")
    out = run(db_copy, "show", "gpt-4o-2024-05-13")
    assert out.exit_code == 0 and "None" not in out.output
    assert "embedding: version 1" in out.output and "available: yes" in out.output


@pytest.mark.slow
def test_stats_counts_queries_without_a_split(db_copy, tmp_path):
    with Registry(db_copy) as reg:
        assert reg.stats().unsplit_queries == 0
        reg.import_files(queries=str(write_rows(tmp_path / "q.csv", [("extra-1", "What is 1+1?")],
                                                header="question_id,question")))     # a new text: MiniLM
        assert reg.stats().unsplit_queries == 1
    assert "no split 1" in run(db_copy, "stats").output


def test_diff_similar_stats_and_map_papercuts(db_copy, small_data, tmp_path):
    with Registry(db_copy) as reg:
        with pytest.raises(InputError, match="one embedding version"):
            reg.diff("Yi-6B")
        with pytest.raises(NotFound, match="nothing was registered as of 2000-01-01"):
            reg.similar("Yi-6B", as_of="2000-01-01")
        everyone = reg.similar("Yi-6B", k=100)
        assert len(everyone) == 30
        f = write_rows(tmp_path / "yi.csv", results_of(small_data, "Yi-6B"))
        near = reg.similar(evals=str(f), k=3)
        assert near[0].disagreement is not None and near[0].shared_queries > 0
        yi = next(n for n in reg.similar(evals=str(f), k=31) if n.model == "Yi-6B")
        assert yi.disagreement == 0.0
    assert "the pool has 30 other embedded models" in run(db_copy, "similar", "Yi-6B", "-k", "100").output
    from registry.answers.maps import family_colours

    a = family_colours(["llama-2", "gpt-4o", "gemini"])
    b = family_colours(["llama-2", "gpt-4o", "gemini", "mistral", "qwen"])
    assert all(a[f] == b[f] for f in a) and len(set(b.values())) == 5


def test_a_bad_as_of_is_one_line_and_the_cost_advice_works(db_copy, tmp_path):
    out = run(db_copy, "similar", "gpt-4o-2024-05-13", "--as-of", "yesterday")
    assert out.exit_code == 1 and out.output.strip() == ("Error: --as-of: not a timestamp: 'yesterday' (use e.g. "
                                                         "2026-01-31 or '2026-01-31 12:00')"), out.output
    with Registry(db_copy) as reg, reg.store.tx() as tx:
        names = [m.name for m in reg.models()]
        stored = tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]     # routed without MiniLM
    out = run(db_copy, "route", stored, "--cost-weight", "0.1", "--no-log")
    assert out.exit_code == 1 and "registry import --models FILE" in out.output, out.output
    models = write_rows(tmp_path / "models.csv", [(n, 1.0 + i) for i, n in enumerate(names)], header="model,cost")
    assert run(db_copy, "import", "--models", str(models)).exit_code == 0
    out = run(db_copy, "route", stored, "--cost-weight", "0.1", "--no-log", "--json")   # did what it says
    assert out.exit_code == 0 and json.loads(out.stdout)["cost_basis"] == "cost", out.output


@pytest.mark.slow
def test_a_reader_that_went_away_is_no_error(db_copy):
    """`registry models | head`: the reader closed its end (here before the first line): no "Error: Broken pipe", no
    traceback; click ends it quietly."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "registry", "--db", str(db_copy), "models"], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert "Broken pipe" not in done.stderr and "Traceback" not in done.stderr, done.stderr
