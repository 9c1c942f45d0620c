"""The embedding space: similar, fingerprint, portfolio, fallback, map, geometry (issue 5), through the API and the
CLI, on the session's small real registry; every figure is checked against one recomputed here from the raw tables."""
from __future__ import annotations

import itertools

import duckdb
import numpy as np
import pytest
from scipy.stats import pearsonr

from registry import Registry
from tests.helpers import run, run_json

from .conftest import snapshot

GPT = "gpt-4o-2024-05-13"


def raw_vectors(db) -> dict[str, np.ndarray]:
    """Each model's newest embedding, read straight from DuckDB (not through the index)."""
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("""SELECT m.name, v.vector FROM embedding_versions v JOIN models m ON m.id = v.model_id
                          QUALIFY row_number() OVER (PARTITION BY v.model_id ORDER BY v.version DESC) = 1""").fetchall()
    con.close()
    return {n: np.asarray(v, np.float64) for n, v in rows}


def evals_file(small_data, tmp_path, model, flip=False, limit=None) -> str:
    out = tmp_path / f"{model}{'-flipped' if flip else ''}.csv"
    value = "1 - correct" if flip else "correct"
    duckdb.sql(f"""COPY (SELECT question_id, {value} AS correct FROM read_csv('{small_data}/evaluations.csv.gz')
                   WHERE model = '{model}' ORDER BY question_id {f'LIMIT {limit}' if limit else ''})
                   TO '{out}' (HEADER)""")
    return str(out)


def test_similar_cli_mirrors_api_and_finds_a_registered_model_from_its_file(db_copy, small_data, tmp_path):
    out = run_json(db_copy, "similar", GPT, "-k", 3)["neighbours"]
    with Registry(db_copy) as reg:
        api = reg.similar(GPT, k=3)
    assert [n["model"] for n in out] == [n.model for n in api] and GPT not in [n["model"] for n in out]
    vecs = raw_vectors(db_copy)       # each distance is the embeddings' own; the order is `combined`'s
    assert [n["distance"] for n in out] == pytest.approx(
        [float(np.linalg.norm(vecs[GPT] - vecs[n["model"]])) for n in out], abs=1e-3)
    with Registry(db_copy) as reg:
        everyone = reg.similar(GPT, k=len(vecs))
    assert [n.model for n in everyone][:3] == [n["model"] for n in out]
    assert [n.combined for n in everyone] == sorted(n.combined for n in everyone)
    found = run_json(db_copy, "similar", "--evals", evals_file(small_data, tmp_path, GPT), "-k", 1)["neighbours"]
    assert found[0]["model"] == GPT


def test_fingerprint_names_the_model_and_writes_nothing(db_copy, small_data, tmp_path):
    before = snapshot(db_copy)
    same = run_json(db_copy, "fingerprint", "--evals", evals_file(small_data, tmp_path, GPT))
    assert same["match"] == GPT and same["verdict"] == "same" and same["method"] == "answers"
    assert same["disagreement"] == 0.0 and same["shared_queries"] == 160 and same["disagreement"] <= same["threshold"]
    flipped = run_json(db_copy, "fingerprint", "--evals", evals_file(small_data, tmp_path, GPT, flip=True))
    assert flipped["match"] != GPT and flipped["verdict"] == "not conclusive"   # every answer reversed
    cal = run_json(db_copy, "fingerprint", "--calibration")
    assert cal["answers"]["p_min"] == same["p_min"] and len(cal["answers"]["closest_pair"]) == 2
    assert cal["answer_thresholds"]["128"] is not None and cal["embedding"]["models"] >= 2
    assert snapshot(db_copy) == before


def _sum_cost(vecs, members):
    pts = np.stack(list(vecs.values()))
    return np.min([np.linalg.norm(pts - vecs[m], axis=1) for m in members], axis=0)


def test_portfolio_clusters_radius_and_constraints(db_copy):
    vecs = raw_vectors(db_copy)
    for method in ("kmedoids", "kcenter"):
        p = run_json(db_copy, "portfolio", "-k", 4, "--method", method)
        assert p["k"] == 4 == len(set(p["models"])) and p["method"] == method and p["share_of_pool"] > 0
        assert sorted(sum(p["clusters"].values(), [])) == sorted(vecs)      # every model in exactly one cluster
        assert p["radius"] == pytest.approx(_sum_cost(vecs, p["models"]).max(), abs=1e-3)
    # k-medoids (FasterPAM) against brute force over every pair
    km = run_json(db_copy, "portfolio", "-k", 2, "--method", "kmedoids")
    best = min(_sum_cost(vecs, pair).sum() for pair in itertools.combinations(vecs, 2))
    assert _sum_cost(vecs, km["models"]).sum() <= best * 1.02
    with Registry(db_copy) as reg:
        params = {m.name: m.params_b for m in reg.models()}
        p = reg.portfolio(5, "kcenter", max_params=10, require=["Yi-34B"], exclude=["Mistral-7B-v0.1"])
    assert p.models[0] == "Yi-34B" and "Mistral-7B-v0.1" not in p.models
    assert all(params[m] is not None and params[m] <= 10 for m in p.models[1:])


def test_portfolio_target_reaches_the_share(db_copy):
    strict = run_json(db_copy, "portfolio", "--target", 0.99, "--method", "kcenter")
    loose = run_json(db_copy, "portfolio", "--target", 0.5, "--method", "kcenter")
    assert strict["share_of_pool"] >= 0.99 and loose["share_of_pool"] >= 0.5
    assert loose["k"] <= strict["k"] <= 31 and len(strict["models"]) == strict["k"]


def test_fallback_chain_and_all(db_copy):
    down = "Llama-2-13b-hf"
    chain = run_json(db_copy, "fallback", "Llama-2-7b-hf", "--unavailable", down, "-k", 4)["chain"]
    vecs = raw_vectors(db_copy)       # the chain is the embedding's order (`similar` also weighs shared errors)
    near = sorted((n for n in vecs if n != "Llama-2-7b-hf"),
                  key=lambda n: np.linalg.norm(vecs[n] - vecs["Llama-2-7b-hf"]))
    assert [c["model"] for c in chain] == [m for m in near if m != down][:4]
    assert [c["distance"] for c in chain] == sorted(c["distance"] for c in chain)
    every = run_json(db_copy, "fallback", "--all", "--unavailable", down, "-k", 3)["chains"]
    assert len(every) == 31 and every["Llama-2-7b-hf"] == chain[:3]
    assert all(len(c) == 3 and m not in [x["model"] for x in c] and down not in [x["model"] for x in c]
               for m, c in every.items())


def test_geometry_matches_a_recomputation_from_raw_tables(db_copy):
    g = run_json(db_copy, "geometry")
    vecs = raw_vectors(db_copy)
    con = duckdb.connect(str(db_copy), read_only=True)
    rows = con.execute("""SELECT m.name, e.query_id, arg_max(e.correct, e.batch_id) FROM evaluations e
                          JOIN models m ON m.id = e.model_id JOIN query_splits s ON s.query_id = e.query_id
                          WHERE s.split = 'test' GROUP BY ALL""").fetchall()
    con.close()
    ans: dict[str, dict] = {}
    for name, q, c in rows:
        ans.setdefault(name, {})[q] = c
    xs, ys = [], []
    for a, b in itertools.combinations(sorted(vecs), 2):
        shared = ans[a].keys() & ans[b].keys()
        if len(shared) >= 10:
            xs.append(np.linalg.norm(vecs[a] - vecs[b]))
            ys.append(np.mean([ans[a][q] != ans[b][q] for q in shared]))
    assert g["pairs"] == len(xs) == 465
    assert g["pearson"] == pytest.approx(pearsonr(xs, ys)[0], abs=1e-3)
    assert -1 <= g["spearman"] <= 1


@pytest.mark.slow   # trains an encoder / draws a t-SNE map: seconds, not the inner loop
def test_map_draws_every_model(db_copy, tmp_path):
    from PIL import Image

    out = tmp_path / "map.png"
    m = run_json(db_copy, "map", "--out", out)
    assert m["models"] == 31 and m["method"] == "pca" and m["families"] >= 10
    with Image.open(out) as img:
        colours = np.unique(np.asarray(img.convert("RGB")).reshape(-1, 3), axis=0)
        assert img.size[0] > 1000 and len(colours) > 50   # a real picture, not blank


@pytest.mark.parametrize("args, message", [
    (["similar", "no-such-model"], "unknown model 'no-such-model'"),
    (["fallback", "no-such-model"], "unknown model 'no-such-model'"),
    (["portfolio", "-k", 2, "--require", "no-such-model"], "unknown model 'no-such-model'"),
    (["portfolio", "-k", 40], "k=40 is larger than the pool"),
    (["portfolio", "-k", 2, "--max-params", 0.5], "no model fits --max-params 0.5"),
    (["fingerprint", "--evals", "FEW"], "the answers test needs 32"),
])
def test_bad_input_is_one_clear_line(db_copy, small_data, tmp_path, args, message):
    args = [evals_file(small_data, tmp_path, GPT, limit=5) if a == "FEW" else a for a in args]
    res = run(db_copy, *args)
    assert res.exit_code == 1 and message in res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_empty_registry_is_one_clear_line(tmp_path):
    db = tmp_path / "empty.duckdb"
    assert run(db, "db", "upgrade").exit_code == 0
    for args in (["portfolio", "-k", 2], ["geometry"], ["fallback", "--all"], ["map", "--out", tmp_path / "m.png"]):
        res = run(db, *args)
        assert res.exit_code == 1 and "no embedded models" in res.output, (args, res.output)
        assert len(res.output.strip().splitlines()) == 1


def test_index_sidecar_of_a_rebuilt_database_is_not_reused(base_db, tmp_path):
    """A registry deleted and rebuilt at the same path must not answer from the old file's index."""
    import shutil

    from registry.embedding import index as index_mod

    path = tmp_path / "r.duckdb"
    shutil.copy(base_db, path)
    with Registry(path) as reg:
        first = [n.model for n in reg.similar("gemma-7b", k=3)]
    assert (tmp_path / "r.duckdb.index").is_dir()
    path.unlink()
    shutil.copy(base_db, path)   # same versions, but created at other times in a real rebuild: fake that
    con = duckdb.connect(str(path))
    con.execute("UPDATE embedding_versions SET created = created + INTERVAL 1 DAY")
    con.close()
    with Registry(path) as reg, reg.store.tx() as tx:
        active = tx.sql("SELECT encoder_id FROM encoder_activations ORDER BY id DESC LIMIT 1")[0][0]
        vi = index_mod.get(tx, active)
        stamp = tx.sql("SELECT created::VARCHAR FROM embedding_versions WHERE id = ?", [vi.through_version])[0][0]
    assert vi.stamp == stamp
    with Registry(path) as reg:
        assert [n.model for n in reg.similar("gemma-7b", k=3)] == first


def test_portfolio_by_routing_value_keeps_the_routing(db_copy):
    """--target defaults to the greedy routing-value method: chosen on validation predictions, scored on test, and
    never larger than the covering methods' portfolio for the same share; the greedy step recomputes by hand."""
    from registry.answers import geometry, portfolio

    by_routing = run_json(db_copy, "portfolio", "--target", 0.99)
    by_cover = run_json(db_copy, "portfolio", "--target", 0.99, "--method", "kmedoids")
    assert by_routing["method"] == "routing" and by_routing["share_of_pool"] >= 0.99
    assert by_routing["k"] <= by_cover["k"]
    with Registry(db_copy) as reg, reg.store.tx() as tx:
        p = reg.pool(tx)
        val = np.array([r[0] for r in tx.sql("SELECT query_id FROM query_splits WHERE split = 'val' ORDER BY 1")])
        value = geometry.predicted(tx, p.encoder_id, p.vectors, val)
    first = int(np.argmax(value.mean(axis=1)))                   # one model: the best mean predicted P(correct)
    second = int(np.argmax([np.maximum(value[first], value[m]).mean() if m != first else -1
                            for m in range(len(p.names))]))
    members = portfolio.routing_members(value, 2, np.ones(len(p.names), bool), np.array([], int))
    assert members == [first, second]


def test_rank_puts_the_model_that_errs_alike_first_among_well_placed_neighbours():
    # pure ranking: four well-placed neighbours sharing 1,000 answers; the one that errs alike is not the nearest
    from registry.answers.neighbours import Neighbour, rank

    def n(name, distance, corr):
        return Neighbour(name, distance, disagreement=0.3, shared_queries=1000, embedded_from=5000,
                         error_correlation=corr)

    near = [n("nearest", 0.50, 0.02), n("kin", 0.70, 0.30), n("other", 0.80, 0.01), n("far", 1.00, -0.02)]
    ranked = rank(near, 5000, 128)
    assert [x.model for x in ranked][:2] == ["kin", "nearest"] and ranked[0].placed_by == "answers"
    # without shared answers the embedding alone orders them
    bare = [Neighbour(x.model, x.distance, embedded_from=5000) for x in near]
    assert [x.model for x in rank(bare, 5000, 128)] == ["nearest", "kin", "other", "far"]


def test_a_model_known_from_few_answers_is_placed_by_what_they_support():
    """One ranking: junk known from 128 answers (a disagreement near an independent model's) sits below every
    established neighbour that disagrees no more on its questions; a 128-answer copy sits right below its original;
    an unsure query model ranks every neighbour by its disagreement's upper bound, not by its embedding."""
    from registry.answers.neighbours import Neighbour, rank, upper_rate

    def est(name, distance, corr, rate):
        return Neighbour(name, distance, disagreement=rate, shared_queries=5000, embedded_from=5000,
                         error_correlation=corr)

    family, other = est("family", 0.40, 0.30, 0.20), est("other", 0.30, 0.05, 0.25)
    far = est("far", 0.9, -0.05, 0.4)
    coin = Neighbour("coin", 0.01, disagreement=0.45, shared_queries=128, embedded_from=128)
    copy = Neighbour("copy", 0.35, disagreement=0.20, shared_queries=128, embedded_from=128)
    kin_rates = {"coin": {"family": 0.22, "other": 0.26, "far": 0.41},
                 "copy": {"family": 0.20, "other": 0.31, "far": 0.41}}
    ranked = rank([coin, copy, far, family, other], 5000, 500, lambda x, others: kin_rates[x.model])
    assert [x.model for x in ranked] == ["family", "copy", "other", "far", "coin"], [x.model for x in ranked]
    assert ranked[1].placed_by == "few answers" and ranked[1].combined == ranked[0].combined
    # without the neighbours' own questions to compare on, a few-answer model still never leads on its embedding
    assert rank([Neighbour("coin", 0.01, disagreement=0.45, shared_queries=128, embedded_from=128),
                 est("family", 0.4, 0.3, 0.2)], 5000, 500, lambda x, o: {"family": 0.2})[0].model == "family"
    # an unsure query model: the pessimistic bound orders them; the embedding only breaks ties
    near = [Neighbour("close-by-embedding", 0.01, disagreement=0.30, shared_queries=128, embedded_from=5000),
            Neighbour("twin", 0.90, disagreement=0.0, shared_queries=128, embedded_from=5000),
            Neighbour("few-shared", 0.05, disagreement=0.0, shared_queries=3, embedded_from=5000)]
    assert [x.model for x in rank(near, 128, 500)] == ["twin", "close-by-embedding", "few-shared"]
    assert upper_rate(0.0, 128) < 0.03 and upper_rate(0.0, 3) > 0.5 and upper_rate(0.5, 0) == 1.0


@pytest.mark.slow
def test_similar_finds_a_fine_tune_the_embedding_alone_misses(mmlu_dir, tmp_path):
    # on the whole shared data Mixtral-8x7B-Instruct's nearest embedding is another vendor's model; the two
    # Mixtrals err together on questions the rest get right
    with Registry(tmp_path / "r.duckdb") as reg:
        reg.import_files(directory=str(mmlu_dir))
        near = reg.similar("Mixtral-8x7B-Instruct-v0.1", k=31)
    assert near[0].model == "Mixtral-8x7B-v0.1" and near[0].placed_by == "answers"
    assert near[0].error_correlation == max(x.error_correlation for x in near)
    assert min(near, key=lambda x: x.distance).model != "Mixtral-8x7B-v0.1"


def test_the_model_page_shows_how_much_each_neighbour_errs_alike(db_copy):
    from fastapi.testclient import TestClient

    from registry.serve.app import create_app

    with Registry(db_copy) as reg:
        near = reg.similar(GPT, k=8)
    with TestClient(create_app(str(db_copy))) as c:
        page = c.get(f"/ui/models/{GPT}").text
    assert "errs alike" in page and near[0].error_correlation is not None
    assert f"<td>{near[0].error_correlation:.3f}</td><td>{near[0].placed_by}</td>" in page
