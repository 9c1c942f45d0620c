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


def _report(served: float, knn: float, auc_locus: float, auc_interaction: float = 0.79) -> dict:
    m = {"served": {"hit@1": served, "auc": 0.8}, "locus": {"hit@1": 0.90, "auc": auc_locus},
         "locus_interaction": {"hit@1": served, "auc": auc_interaction},
         "knn": {"hit@1": knn, "auc": 0.75}, "mf": {"hit@1": 0.91, "auc": 0.76}, "irt": {"hit@1": 0.92, "auc": 0.7},
         "per_category": {"hit@1": 0.93, "vs_served": {"diff": served - 0.93, "se": 0.01}},
         "best_single": {"hit@1": 0.89}, "oracle": {"hit@1": 0.99}}
    return {"dataset": "d", "seed": 0, "queries": 100, "models": 5, "served": {"policy": "blend"}, "methods": m}


FRONTIER_BAR = "router at 95% of best: cheaper than any single, <= 60%"


def test_bars_hold_and_fail_where_they_should():
    held = benchmarks.bars(_report(0.94, 0.94, 0.77))
    assert held.pop(FRONTIER_BAR) is None and all(held.values())          # no prices: no cost bar
    b = benchmarks.bars(_report(0.93, 0.94, 0.755))
    assert not b["served >= simple - 0.005"] and b["served > best single"] and not b["predictor AUC >= KNN, MF"]
    assert b["predictor+interaction AUC >= KNN, MF"]
    assert not benchmarks.bars(_report(0.94, 0.94, 0.77, 0.755))["predictor+interaction AUC >= KNN, MF"]


def _priced(router_ratio: float | None, single_cost: float | None) -> dict:
    point = lambda label, ratio: None if ratio is None else {  # noqa: E731
        "label": label, "accuracy": 0.8, "mean_cost": ratio * 0.002, "cost_ratio": ratio}
    reach = {"0.95": {"router": point("router L=1", router_ratio),
                      "single": point("cheap", None if single_cost is None else single_cost / 0.002)}}
    return dict(_report(0.94, 0.94, 0.77), frontier={"priced_models": 3, "best_single": {}, "reach": reach})


def test_the_cost_bar_needs_the_router_cheaper_than_every_single_model_and_at_most_60_percent():
    assert benchmarks.bars(_priced(0.23, 0.002))[FRONTIER_BAR] is True          # the best model itself: 100%
    assert benchmarks.bars(_priced(0.23, 0.0004))[FRONTIER_BAR] is False        # a single model at 20% beats it
    assert benchmarks.bars(_priced(0.65, 0.002))[FRONTIER_BAR] is False         # over 60%
    assert benchmarks.bars(_priced(None, 0.002))[FRONTIER_BAR] is False         # never reached
    t = benchmarks.table([_priced(0.23, 0.002)])
    assert "| cost for 0.95 of best single: router / cheapest single | 0.230 (router L=1) / 1.000 (cheap) |" in t


def test_the_table_puts_the_datasets_side_by_side():
    t = benchmarks.table([_report(0.94, 0.94, 0.77), dict(_report(0.93, 0.94, 0.7), dataset="e", seed=1)])
    lines = t.splitlines()
    assert lines[0] == "| method | d s0 | e s1 |"
    assert "| served | 0.9400 (0.8000) | 0.9300 (0.8000) |" in lines
    assert "| per-source |  |  |" in lines and "| served policy | blend | blend |" in lines
    assert "| served >= simple - 0.005 | yes | NO |" in lines
    # the best simple router by test hit@1 is KNN (0.94) in both, which has no paired figures: only per-category has
    assert "| served minus the best simple router (paired SE) |  |  |" in lines
    t = benchmarks.table([dict(_report(0.94, 0.90, 0.77))])
    assert "| served minus the best simple router (paired SE) | +0.0100 (0.0100, per_category) |" in t.splitlines()


def test_a_folder_without_evaluations_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="not a dataset folder"):
        benchmarks.main([str(tmp_path)])


def test_folds_pool_into_one_column_per_seed_weighted_by_queries():
    def fold(f, served, knn, better, worse, queries):
        r = _report(served, knn, 0.77)
        r["methods"]["knn"]["vs_served"] = {"served_better": better, "served_worse": worse}
        return dict(r, dataset=f"ae-fold{f}", queries=queries)

    rs = [fold(0, 0.70, 0.72, 3, 6, 100), fold(1, 0.80, 0.74, 9, 3, 300), dict(_report(0.9, 0.9, 0.8), dataset="other")]
    [p] = benchmarks.pooled(rs)
    assert p["dataset"] == "ae (2 folds)" and p["queries"] == 400
    assert p["methods"]["served"]["hit@1"] == pytest.approx((70 + 240) / 400)
    v = p["methods"]["knn"]["vs_served"]
    assert (v["served_better"], v["served_worse"], v["diff"]) == (12, 9, 0.0075)
    assert v["se"] == pytest.approx(((21 - 400 * 0.0075 ** 2) / 399 / 400) ** 0.5, abs=1e-4)
    assert "vs_served" not in p["methods"]["mf"]              # no fold gave one
    assert benchmarks.bars(p)["served >= simple - 0.005"] is False        # served 0.775 < IRT's 0.92
    assert benchmarks.pooled(rs[:1]) == []                    # one fold is not a pool
