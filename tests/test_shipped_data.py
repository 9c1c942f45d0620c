"""The test data shipped in tests/data/: the MMLU-Pro slice is the shared data's seeded 160-question sample, whole
(every evaluation, split and model of those questions), and its vector file holds exactly its questions' vectors,
so no test needs MiniLM or ../shared to build its registry."""
from __future__ import annotations

import duckdb
import pytest

from registry import Registry
from tests.conftest import N_QUESTIONS, SLICE


@pytest.mark.slow
def test_the_slice_is_the_shared_datas_seeded_sample(mmlu_dir):
    con = duckdb.connect()
    con.execute(f"""CREATE TABLE q AS SELECT * FROM read_csv('{mmlu_dir}/questions.csv.gz')
                    USING SAMPLE reservoir({N_QUESTIONS} ROWS) REPEATABLE (7)""")
    same = {
        "questions": ("SELECT * FROM q", "questions.csv.gz"),
        "evaluations": (f"""SELECT e.* FROM read_csv('{mmlu_dir}/evaluations.csv.gz') e SEMI JOIN q
                            USING (question_id)""", "evaluations.csv.gz"),
        "splits": (f"SELECT s.* FROM read_csv('{mmlu_dir}/splits.csv') s SEMI JOIN q USING (question_id)",
                   "splits.csv"),
        "models": (f"SELECT * FROM read_csv('{mmlu_dir}/models.csv')", "models.csv"),
    }
    for name, (shared, file) in same.items():
        ours = f"SELECT * FROM read_csv('{SLICE / file}')"
        differ = con.execute(f"SELECT count(*) FROM (({shared}) EXCEPT ALL ({ours})) UNION ALL "
                             f"SELECT count(*) FROM (({ours}) EXCEPT ALL ({shared}))").fetchall()
        assert differ == [(0,), (0,)], name
    assert con.execute("SELECT count(*) FROM q").fetchone()[0] == N_QUESTIONS


def test_the_slice_imports_with_its_own_vectors_and_no_minilm(tmp_path):
    with Registry(tmp_path / "r.duckdb") as reg:
        done = reg.import_files(directory=str(SLICE))
    with Registry(tmp_path / "r.duckdb") as reg, reg.store.tx() as tx:
        models, queries, vectors = tx.sql("""SELECT (SELECT count(*) FROM models), (SELECT count(*) FROM queries),
                                             (SELECT count(*) FROM text_vectors)""")[0]
    assert (models, queries, vectors) == (31, N_QUESTIONS, N_QUESTIONS)
    assert done.vectors_loaded == N_QUESTIONS and done.texts_embedded == 0
