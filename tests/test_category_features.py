"""Category features (issue 16, item 3): one row per query category in the predictor, read against the model
embedding (logit += [z, 1] . row), its vocabulary kept in the checkpoint's config. A checkpoint without it (the
shipped one) loads and predicts exactly as before; a query with an unseen or missing category routes on its text
alone (row 0, zero)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from registry import Registry, routing
from registry.checkpoint import load_checkpoint, read_header, save_checkpoint
from registry.cli import cli
from registry.encoder import EncoderConfig, LocusModel
from registry.encoders import SHIPPED
from registry.errors import InputError
from registry.evaluation import dataset
from registry.training import TrainConfig, category_vocabulary, embed_models, train

torch.set_num_threads(1)

# P(correct) of the shipped checkpoint for three random embeddings on four random query vectors (the draws of
# `_probe`), computed by the code before category features existed (main at 9e716b4)
SHIPPED_P = [[0.8113746, 0.7564256, 0.7567828, 0.863001], [0.3530256, 0.2199877, 0.3224002, 0.4133504],
             [0.769098, 0.4933041, 0.5543044, 0.6784717]]


def _probe():
    rng = np.random.default_rng(16)
    return rng.standard_normal((3, 128)).astype(np.float32), (rng.standard_normal((4, 384)) / 20).astype(np.float32)


def _with_categories(model: LocusModel, names, seed: int = 0) -> LocusModel:
    """The model's weights in a model that reads these categories, its category rows random (row 0, none, zero)."""
    out = LocusModel(replace(model.cfg, categories=tuple(names)))
    state = dict(model.state_dict())
    rows = torch.randn(len(names) + 1, model.cfg.d_model + 1, generator=torch.Generator().manual_seed(seed)) / 4
    rows[0] = 0
    state["q_cat.weight"] = rows
    out.load_state_dict(state)
    return out.eval()


def test_shipped_checkpoint_loads_and_predicts_as_before():
    blob = SHIPPED.read_bytes()
    model, cfg, meta = load_checkpoint(blob)
    assert cfg.categories == () and "categories" not in read_header(blob)["config"]
    assert save_checkpoint(model, cfg, meta) == blob                       # re-saved: the same bytes
    z, q = _probe()
    p = model.p_correct(z, q)
    np.testing.assert_allclose(p, SHIPPED_P, rtol=0, atol=1e-7)
    # a text-only model ignores any categories it is given, bit for bit, on both scoring paths
    assert np.array_equal(model.p_correct(z, q, ["law", None, "(none)", "math"]), p)
    with torch.no_grad():
        exact = torch.sigmoid(model.predict_logits(torch.from_numpy(z), torch.from_numpy(q))).numpy()
    np.testing.assert_allclose(exact, p, rtol=0, atol=1e-6)
    assert model.category_ids(["law"]) is None


def test_category_checkpoint_round_trips_its_vocabulary():
    base, cfg, meta = load_checkpoint(SHIPPED.read_bytes())
    model = _with_categories(base, ["law", "math", "physics"])
    blob = save_checkpoint(model, model.cfg, meta)
    assert read_header(blob)["config"]["categories"] == ["law", "math", "physics"]
    loaded, cfg2, _ = load_checkpoint(blob)
    assert cfg2.categories == ("law", "math", "physics") and cfg2 == model.cfg
    assert save_checkpoint(loaded, cfg2, meta) == blob
    z, q = _probe()
    cats = ["math", "law", "physics", "math"]
    assert np.array_equal(loaded.p_correct(z, q, cats), model.p_correct(z, q, cats))
    # the category is read: each one moves P, and the rows are the ones saved
    assert not np.allclose(loaded.p_correct(z, q, cats), loaded.p_correct(z, q))
    assert loaded.category_ids(["law", "math", "physics", "cooking", None, "(none)"]).tolist() == [1, 2, 3, 0, 0, 0]
    # the numpy scorer and torch agree with categories too
    with torch.no_grad():
        exact = torch.sigmoid(loaded.predict_logits(torch.from_numpy(z), torch.from_numpy(q),
                                                    cat=torch.from_numpy(loaded.category_ids(cats)))).numpy()
    np.testing.assert_allclose(loaded.p_correct(z, q, cats), exact, rtol=0, atol=1e-5)


def test_unseen_or_missing_category_reads_as_none():
    base, _, _ = load_checkpoint(SHIPPED.read_bytes())
    model = _with_categories(base, ["law", "math"])
    z, q = _probe()
    none = model.p_correct(z, q)                                           # no categories given at all
    for cats in (["cooking"] * 4, [None] * 4, ["(none)"] * 4, [float("nan")] * 4):
        assert np.array_equal(model.p_correct(z, q, cats), none)
    np.testing.assert_allclose(none, base.p_correct(z, q), rtol=0, atol=1e-7)   # the text-only prediction


def _toy(seed: int = 0):
    """300 random query vectors in categories a, b and none; model 0 answers exactly the a questions, model 1 the b
    ones, models 2 and 3 at random: who should answer is in the category, not the (random) text."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((300, 16)).astype(np.float32)
    cats = np.array(["a", "b", "(none)"] * 100, dtype=object)
    correct = (rng.random((4, 300)) < 0.5).astype(np.int8)
    correct[0] = cats == "a"
    correct[1] = cats == "b"
    return q, cats, correct, np.arange(200), np.arange(200, 250)


TOY = EncoderConfig(d_query=16, d_model=32, n_inducing=8, n_heads=4, n_isab=2, d_hidden=16, dropout=0.0)


@pytest.mark.slow     # trains or starts a process: seconds, the full suite runs it
def test_training_fits_category_rows_on_top_of_the_text_only_model():
    """With category features every weight but the category rows is the text-only run's (nothing before the last
    stage reads the categories); the rows give each training model its fitted offset on each category, so model 0
    is predicted right on a and wrong on b, model 1 the reverse; passing categories without the feature changes
    nothing."""
    q, cats, correct, tr, va = _toy()
    cfg = TrainConfig(max_steps=4, eval_every=2, n_targets=64, big_set=200, anchors=64, min_anchors=16,
                      teacher_epochs=4, refit_epochs=2, encoder=TOY)
    plain, _, _ = train(q, correct, tr, va, cfg)
    ignored, ecfg, _ = train(q, correct, tr, va, cfg, categories=cats)
    assert ecfg.categories == ()
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), ignored.state_dict().values()))
    model, ecfg, metrics = train(q, correct, tr, va, replace(cfg, category_features=True), categories=cats)
    assert ecfg.categories == ("a", "b") and ecfg.category_field == "category"
    state = model.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in plain.state_dict().items())
    rows = model.q_cat.weight
    assert rows[0].abs().sum() == 0 and rows[1:].abs().sum() > 0
    assert metrics["category"]["fit_max_error"] < 1e-6
    p = model.p_correct(embed_models(model, q, correct, tr), q[va], cats[va])
    a, b = cats[va] == "a", cats[va] == "b"
    assert p[0, a].min() > 0.7 > 0.3 > p[0, b].max() and p[1, b].min() > 0.7 > 0.3 > p[1, a].max()
    with pytest.raises(InputError, match="no train query has one"):
        category_vocabulary(np.array(["(none)"] * 300, dtype=object), tr)


def test_probes_read_category_rows():
    """The likelihood reading (probes.py) scores and differentiates the category term as the model does."""
    from registry import probes

    base, _, _ = load_checkpoint(SHIPPED.read_bytes())
    model = _with_categories(base, ["law", "math"])
    z, q = _probe()
    cats = ["law", "math", None, "cooking"]
    pred = probes.Predictor(model)
    qs = pred.project(q, cats)
    lg = pred.logits(z[0].astype(np.float64), qs)
    np.testing.assert_allclose(1 / (1 + np.exp(-lg)), model.p_correct(z[:1], q, cats)[0], atol=1e-6)
    out, grad = pred.logits_grad(z[0].astype(np.float64), qs)
    h = np.zeros(128)
    h[5] = 1e-6
    numeric = (pred.logits(z[0] + h, qs) - pred.logits(z[0] - h, qs)) / 2e-6
    np.testing.assert_allclose(grad[:, 5], numeric, atol=1e-4)


def _install(reg: Registry, tmp_path, names) -> LocusModel:
    base, _, meta = load_checkpoint(SHIPPED.read_bytes())
    model = _with_categories(base, names)
    path = tmp_path / "cat.safetensors"
    path.write_bytes(save_checkpoint(model, model.cfg, dict(meta, name="with-categories")))
    reg.install_encoder(str(path), activate=True)
    return model


def test_registry_routes_with_categories_and_without(db_copy, tmp_path):
    """An encoder with category features, installed and active: evaluate scores each test query with its
    category; route uses a registered text's category; a category the encoder never saw routes as none."""
    with Registry(db_copy) as reg:
        with reg.store.tx() as tx:
            data = dataset(tx)
            texts = dict(tx.sql("SELECT id, text FROM queries"))
        present = sorted(set(data.categories.tolist()))
        assert len(present) >= 3
        unseen = present[0]                                   # the encoder's vocabulary leaves it out
        model = _install(reg, tmp_path, present[1:])
        report = reg.evaluate(baselines=False)
        assert 0 < report.methods["locus"]["hit@1"] <= 1 and "locus_interaction" in report.methods
        names = [m.name for m in reg.models()]
        te = data.splits["test"]
        picks = {}
        for label, want in (("seen", present[1]), ("unseen", unseen)):
            j = te[np.flatnonzero(data.categories[te] == want)[0]]
            dec = reg.route_batch([texts[int(data.query_ids[j])]], log=False)[0]
            raw = {c.model: c.raw_prob for c in dec.candidates}
            with reg.store.tx() as tx:
                from registry.evaluation import current_embeddings
                z, _, _ = current_embeddings(tx, data)
            expect = model.p_correct(z, data.qvecs[[j]], [want])[:, 0]
            as_none = model.p_correct(z, data.qvecs[[j]], [None])[:, 0]
            got = np.array([raw[n] for n in data.models])
            np.testing.assert_allclose(got, expect, atol=2e-6)
            picks[label] = (got, as_none)
            assert dec.model in names
        seen_p, seen_none = picks["seen"]
        assert not np.allclose(seen_p, seen_none, atol=1e-4)          # the category was read
        unseen_p, unseen_none = picks["unseen"]
        np.testing.assert_allclose(unseen_p, unseen_none, atol=2e-6)   # an unseen one reads as none
    # a text the routing state knows no category of (not a registered query): row 0
    with Registry(db_copy) as reg, reg.store.tx() as tx:
        st = routing.state(tx, reg.path)
        q = data.qvecs[:2]
        probs, raw = routing.probabilities(st, q, ["not-a-registered-hash", "neither"])
        np.testing.assert_allclose(raw, model.scorer(st.z)(q), atol=1e-6)


@pytest.mark.slow     # trains or starts a process: seconds, the full suite runs it
@pytest.mark.parametrize("field", ["category", "source"])
def test_train_category_features_flag(db_copy, field):
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "train", "--category-features", "--category-field", field,
                                   "--steps", "2", "--epochs", "1", "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    with Registry(db_copy) as reg, reg.store.tx() as tx:
        cfg = json.loads(tx.sql("SELECT config::VARCHAR FROM encoders WHERE id = ?", [info["id"]])[0][0])
        data = dataset(tx)
    assert cfg["categories"] == sorted(set(data.query_field(field)[data.splits["train"]].tolist()) - {"(none)"})
    assert cfg.get("category_field", "category") == field
    assert info["metrics"]["category"]["field"] == field
