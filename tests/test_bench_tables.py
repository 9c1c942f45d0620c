"""bench/benchmarks.py's table and bar checks, on reports shaped like `registry evaluate --json`'s (the runs
themselves train, minutes per dataset: they are the bench, not a test)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("benchmarks", ROOT / "bench" / "benchmarks.py")
benchmarks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchmarks)


def _report(served: float, knn: float, auc_locus: float) -> dict:
    m = {"served": {"hit@1": served, "auc": 0.8}, "locus": {"hit@1": 0.90, "auc": auc_locus},
         "knn": {"hit@1": knn, "auc": 0.75}, "mf": {"hit@1": 0.91, "auc": 0.76}, "irt": {"hit@1": 0.92, "auc": 0.7},
         "per_category": {"hit@1": 0.93}, "best_single": {"hit@1": 0.89}, "oracle": {"hit@1": 0.99}}
    return {"dataset": "d", "seed": 0, "queries": 100, "models": 5, "served": {"policy": "blend"}, "methods": m}


def test_bars_hold_and_fail_where_they_should():
    assert all(benchmarks.bars(_report(0.94, 0.94, 0.77)).values())
    b = benchmarks.bars(_report(0.93, 0.94, 0.755))
    assert not b["served >= simple - 0.005"] and b["served > best single"] and not b["predictor AUC >= KNN, MF"]


def test_the_table_puts_the_datasets_side_by_side():
    t = benchmarks.table([_report(0.94, 0.94, 0.77), dict(_report(0.93, 0.94, 0.7), dataset="e", seed=1)])
    lines = t.splitlines()
    assert lines[0] == "| method | d s0 | e s1 |"
    assert "| served | 0.9400 (0.8000) | 0.9300 (0.8000) |" in lines
    assert "| per-source |  |  |" in lines and "| served policy | blend | blend |" in lines
    assert "| served >= simple - 0.005 | yes | NO |" in lines


def test_a_folder_without_evaluations_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="not a dataset folder"):
        benchmarks.main([str(tmp_path)])
