"""Fingerprints and the same-model test: calibration draws are per model and deterministic across processes, the
shared-answers test is calibrated at 1%, and too few answers say what each test needs."""
from __future__ import annotations

import subprocess
import sys

import duckdb
import numpy as np
import pytest

from registry import Registry
from tests.helpers import invented, results_of, run, write_rows

Q = "What is the derivative of x^2 with respect to x?"


def known_text(db) -> str:
    """A query text the registry already holds: routed from its stored vector, without MiniLM."""
    with Registry(db) as reg, reg.store.tx() as tx:
        return tx.sql("SELECT text FROM queries ORDER BY id LIMIT 1")[0][0]


def test_calibration_draws_of_a_model_do_not_depend_on_the_others(db_copy):
    """The threshold moved with every registration because each model's random halves came from one generator
    shared in the (unordered) order the models were read: another model's arrival reshuffled everyone's draws."""
    from registry.answers import fingerprint
    from registry.embedding import embed, encoders

    with Registry(db_copy) as reg, reg.store.tx() as tx:
        model, meta = encoders.load(tx, encoders.active_id(tx))
        ids = [r[0] for r in tx.sql("SELECT id FROM models ORDER BY id")]
        sets = list(embed.evaluation_sets(tx, ids, 10 ** 9, meta.get("embed_max_set")).values())
        za, zb = fingerprint.disjoint_pairs(tx, model, sets, 32, 2)
        za2, zb2 = fingerprint.disjoint_pairs(tx, model, sets[::-1][:-3], 32, 2)
    # the same model, with three others gone and the rest reversed: the very same two embeddings per draw
    assert np.allclose(za[:, 3:], za2[:, ::-1], atol=1e-5) and np.allclose(zb[:, 3:], zb2[:, ::-1], atol=1e-5)


@pytest.mark.slow
def test_calibration_is_deterministic_across_processes(db_copy, small_data, tmp_path):
    code = ("import sys; from registry import Registry; c = Registry(sys.argv[1]).calibration(); "
            "print(c.answers.p_min, c.answer_thresholds['128'], c.embedding.threshold)")
    got = {subprocess.run([sys.executable, "-c", code, str(db_copy)], capture_output=True, text=True,
                          check=True).stdout.strip() for _ in range(2)}
    assert len(got) == 1
    with Registry(db_copy) as reg:   # a model too small to calibrate on does not move it
        reg.register("invented-strong", str(invented(small_data, tmp_path)))
        c = reg.calibration()
        assert f"{c.answers.p_min} {c.answer_thresholds['128']} {c.embedding.threshold}" in got


def test_fingerprint_from_shared_answers_is_calibrated_at_one_percent(db_copy, small_data, tmp_path):
    """The "same" bar is the 1% quantile of Binomial(n, p_min), p_min the closest distinct pair's disagreement rate
    recomputed here from the raw evaluations; a rerun with a tenth of its answers flipped is named; the verdict
    shows its evidence."""
    from scipy.stats import binom

    rows = results_of(small_data, "Llama-2-13b-hf")
    rng = np.random.default_rng(3)
    flip = set(rng.choice(len(rows), len(rows) // 10, replace=False).tolist())
    rerun = write_rows(tmp_path / "rerun.csv", [(q, 1 - c if i in flip else c) for i, (q, c) in enumerate(rows)])
    with Registry(db_copy) as reg:
        f = reg.fingerprint(str(rerun))
    assert f.method == "answers" and f.match == "Llama-2-13b-hf" and f.shared_queries == len(rows)
    assert f.disagreement == round(len(flip) / len(rows), 4)
    con = duckdb.connect()
    res = con.execute(f"SELECT model, question_id, correct::INT FROM read_csv('{small_data}/evaluations.csv.gz')"
                      ).fetchall()
    answers: dict[str, dict] = {}
    for m, q, c in res:
        answers.setdefault(m, {})[q] = c
    names = sorted(answers)
    rates = [np.mean([answers[a][q] != answers[b][q] for q in answers[a].keys() & answers[b].keys()])
             for i, a in enumerate(names) for b in names[i + 1:]]
    p_min = min(rates)
    assert f.p_min == pytest.approx(p_min, abs=1e-6)
    n = f.shared_queries
    k = max(k for k in range(-1, n + 1) if k < 0 or binom.cdf(k, n, p_min) <= 0.01)
    assert f.threshold == (None if k < 0 else round(k / n, 4))
    assert f.verdict == ("same" if k >= 0 and round(f.disagreement * n) <= k else "not conclusive")
    out = run(db_copy, "fingerprint", "--evals", str(rerun))
    assert out.exit_code == 0 and "Llama-2-13b-hf" in out.output and "at most 1% of distinct models" in out.output


def test_register_warns_of_a_duplicate_only_on_the_answers_test(db_copy, small_data, tmp_path):
    twin = write_rows(tmp_path / "twin.csv", results_of(small_data, "Yi-34B"))
    other = write_rows(tmp_path / "other.csv", [(q, 1 - c) for q, c in results_of(small_data, "Yi-34B")])
    with Registry(db_copy) as reg:
        assert "answers like Yi-34B" in reg.register("yi-twin", str(twin)).warning
        r = reg.register("contrarian", str(other))
        assert r.warning is None or "answers like" not in r.warning


def test_too_few_answers_to_fingerprint_says_what_each_test_needs(db_copy, small_data, tmp_path):
    f = write_rows(tmp_path / "few.csv", results_of(small_data, "gpt-4o-2024-05-13")[:24])
    out = run(db_copy, "fingerprint", "--evals", str(f))
    assert out.exit_code == 1 and "24 answers: the answers test needs 32" in out.output, out.output
    assert "fingerprint --plan" in out.output and len(out.output.strip().splitlines()) == 1
