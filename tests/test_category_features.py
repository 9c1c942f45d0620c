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

from registry import Registry, RouteOptions
from registry.cli import cli
from registry.core.errors import InputError
from registry.embedding.dataset import dataset
from registry.embedding.encoders import SHIPPED
from registry.locus.category_rows import category_vocabulary
from registry.locus.checkpoint import load_checkpoint, read_header, save_checkpoint
from registry.locus.network import EncoderConfig, LocusModel
from registry.locus.numpy_network import LABEL_SEP, join_labels
from registry.locus.scoring import embed_models
from registry.locus.training import TrainConfig, train
from registry.routing import fit as routing_fit

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
    """The likelihood reading (locus/probe_design.py) scores and differentiates the category term as the model does."""
    from registry.locus import probe_design

    base, _, _ = load_checkpoint(SHIPPED.read_bytes())
    model = _with_categories(base, ["law", "math"])
    z, q = _probe()
    cats = ["law", "math", None, "cooking"]
    pred = probe_design.Predictor(model)
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
            dec = reg.route_batch([texts[int(data.query_ids[j])]], RouteOptions(log=False))[0]
            raw = {c.model: c.raw_prob for c in dec.candidates}
            with reg.store.tx() as tx:
                from registry.embedding.dataset import current_embeddings
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
        st = routing_fit.keep(tx)
        q = data.qvecs[:2]
        probs, raw = st.scores(q, ["not-a-registered-hash", "neither"])
        np.testing.assert_allclose(raw, model.scorer(st.z)(q), atol=1e-6)


@pytest.mark.slow     # trains or starts a process: seconds, the full suite runs it
@pytest.mark.parametrize("field", ["category", "source"])
def test_train_category_features_flag(db_copy, field):
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "train", "--category-features", "--category-field", field,
                                   "--steps", "2", "--epochs", "1", "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    with Registry(db_copy) as reg, reg.store.tx() as tx:
        cfg = json.loads(tx.sql("SELECT config::VARCHAR FROM encoders WHERE id = ?", [info["id"]])[0][0])
        data = dataset(tx)
    assert cfg["categories"] == sorted(set(data.query_field(field)[data.splits["train"]].tolist()) - {"(none)"})
    assert cfg.get("category_field", "category") == field
    assert info["metrics"]["category"]["field"] == field


# ---------------------------------------------------------------- several columns: "category+source"

def _two_columns(model: LocusModel, cats, sources, seed: int = 0) -> LocusModel:
    """The model's weights in a model that reads category and source together, its rows random (row 0 zero)."""
    names = [f"category:{c}" for c in cats] + [f"source:{s}" for s in sources]
    cfg = replace(model.cfg, categories=tuple(names), category_field="category+source")
    out = LocusModel(cfg)
    rows = torch.randn(len(names) + 1, model.cfg.d_model + 1, generator=torch.Generator().manual_seed(seed)) / 4
    rows[0] = 0
    out.load_state_dict({**model.state_dict(), "q_cat.weight": rows})
    return out.eval()


def test_two_column_checkpoint_round_trips_and_adds_both_rows():
    """A checkpoint reading category and source: the config keeps both columns, a query's two rows add up, a query
    without either (or with a value the training never saw) takes row 0 for it, the numpy scorer, torch and the
    probes agree."""
    from registry.locus import probe_design

    base, _, meta = load_checkpoint(SHIPPED.read_bytes())
    model = _two_columns(base, ["law", "math"], ["ori-law", "stemez-math", "theorem-math"])
    blob = save_checkpoint(model, model.cfg, meta)
    header = read_header(blob)["config"]
    assert header["category_field"] == "category+source" and header["categories"][0] == "category:law"
    loaded, cfg2, _ = load_checkpoint(blob)
    assert cfg2 == model.cfg and cfg2.category_columns == ("category", "source")
    assert save_checkpoint(loaded, cfg2, meta) == blob
    sep = LABEL_SEP
    labels = [f"math{sep}theorem-math", f"law{sep}ori-law", f"math{sep}", f"cooking{sep}stemez-math"]
    assert loaded.category_ids(labels).tolist() == [[2, 5], [1, 3], [2, 0], [0, 4]]
    # a label of the category alone reads as having no source
    assert loaded.category_ids([None, "(none)", "math", f"(none){sep}(none)"]).tolist() == [[0, 0], [0, 0], [2, 0],
                                                                                            [0, 0]]
    z, q = _probe()
    p = loaded.p_correct(z, q, labels)
    # the offsets add: logit = text-only logit + [z, 1] . (row(category) + row(source))
    E = loaded.q_cat.weight.detach().double().numpy()
    ids = loaded.category_ids(labels)
    Z1 = np.concatenate([z.astype(np.float64), np.ones((len(z), 1))], 1)
    text = base.p_correct(z, q).astype(np.float64)
    want = 1 / (1 + np.exp(-(np.log(text / (1 - text)) + Z1 @ (E[ids[:, 0]] + E[ids[:, 1]]).T)))
    np.testing.assert_allclose(p, want, rtol=0, atol=2e-5)
    with torch.no_grad():
        exact = torch.sigmoid(loaded.predict_logits(torch.from_numpy(z), torch.from_numpy(q),
                                                    cat=torch.from_numpy(ids))).numpy()
    np.testing.assert_allclose(p, exact, rtol=0, atol=1e-5)
    # no labels at all, or none of either column: the text-only prediction
    np.testing.assert_allclose(loaded.p_correct(z, q), text, rtol=0, atol=1e-6)
    assert np.array_equal(loaded.p_correct(z, q, [None, "(none)", f"{sep}", f"cooking{sep}baking"]),
                          loaded.p_correct(z, q))
    pred = probe_design.Predictor(loaded)
    lg = pred.logits(z[1].astype(np.float64), pred.project(q, labels))
    np.testing.assert_allclose(1 / (1 + np.exp(-lg)), p[1], atol=1e-6)
    with pytest.raises(ValueError, match="column:value"):
        replace(model.cfg, categories=("law",))


def _toy_two_columns(seed: int = 0):
    """_toy with sources inside the categories: a1 and a2 in a, b1 in b; model 2 answers exactly the a1
    questions, model 3 at random: a1 routes to model 2 only if the source is read."""
    q, cats, correct, tr, va = _toy(seed)
    src = np.array(["a1", "b1", "(none)", "a2", "b1", "(none)"] * 50, dtype=object)
    correct[2] = src == "a1"
    return q, cats, src, correct, tr, va


def test_fit_category_rows_with_two_columns():
    """The last stage with category and source: every training model gets its fitted offsets exactly, the source
    pseudo-weight is one of the choices (the best on val), a source read on top of its category moves routing
    within the category, and a query with a category and no source still gets its category's offsets."""
    from registry.locus.category_rows import fit_category_rows

    q, cats, src, correct, tr, va = _toy_two_columns()
    torch.manual_seed(0)
    model = LocusModel(TOY).eval()
    labels = join_labels([cats, src])
    out, ecfg, info = fit_category_rows(model, q, correct, tr, va, labels, field="category+source",
                                        deep_l2=(1.0, 30.0), text_scales=(1.0, 0.5))
    assert ecfg.category_field == "category+source"
    assert ecfg.categories == ("category:a", "category:b", "source:a1", "source:a2", "source:b1")
    assert info["fit_max_error"] < 1e-6 and info["deep_l2"] in (1.0, 30.0) and info["text_scale"] in (1.0, 0.5)
    assert len(info["choices_val"]) == 4
    # the text logit is scaled in the last layer only: every other weight is the text-only model's
    state = out.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items() if not k.startswith("head"))
    assert torch.equal(state["head.weight"], model.head.weight * info["text_scale"])
    z = embed_models(model, q, correct, tr)
    p = out.p_correct(z, q[va], labels[va])
    a1, a2, b1 = (src[va] == s for s in ("a1", "a2", "b1"))
    # model 2 answers the a1 questions and not the a2 ones: only the source tells them apart
    assert p[2, a1].min() > 0.6 > 0.4 > p[2, a2].max()
    assert (p[0, a2] > p[[1, 2, 3]][:, a2]).all() and (p[1, b1] > p[[0, 2, 3]][:, b1]).all()
    # a category without its source: the category's offsets alone, the same for every a question's text
    cat_only = out.p_correct(z, q[va][a2], ["a"] * int(a2.sum()))
    assert (cat_only[0] > cat_only[[1, 2, 3]]).all()
    # no category: the text-only logit, times the chosen scale
    lg = np.log(model.p_correct(z, q[va]).astype(np.float64))
    lg = lg - np.log1p(-np.exp(lg))
    np.testing.assert_allclose(out.p_correct(z, q[va], [None] * len(va)),
                               1 / (1 + np.exp(-info["text_scale"] * lg)), atol=1e-5)


def test_registry_routes_with_category_and_source(db_copy, tmp_path):
    """An installed encoder reading category and source: routing a registered text reads both of its values (the
    label the routing state and querycache give is the two joined), evaluate runs with them; a text the registry
    does not hold routes on its text alone."""
    from registry.data import query_cache
    from registry.embedding.dataset import current_embeddings

    with Registry(db_copy) as reg:
        with reg.store.tx() as tx:
            data = dataset(tx)
            texts = dict(tx.sql("SELECT id, text FROM queries"))
        te = data.splits["test"]
        j = int(te[0])
        cat, src = data.categories[j], data.sources[j]
        base, _, meta = load_checkpoint(SHIPPED.read_bytes())
        model = _two_columns(base, sorted(set(data.categories.tolist())), sorted(set(data.sources.tolist())))
        path = tmp_path / "two.safetensors"
        path.write_bytes(save_checkpoint(model, model.cfg, dict(meta, name="category-and-source")))
        reg.install_encoder(str(path), activate=True)
        label = f"{cat}{LABEL_SEP}{src}"
        with reg.store.tx() as tx:
            assert query_cache.query_categories(tx, [data.query_ids[j]], model).tolist() == [label]
            z, _, _ = current_embeddings(tx, data)
        assert data.query_field("category+source")[j] == label
        dec = reg.route_batch([texts[int(data.query_ids[j])]], RouteOptions(log=False))[0]
        got = np.array([{c.model: c.raw_prob for c in dec.candidates}[n] for n in data.models])
        np.testing.assert_allclose(got, model.p_correct(z, data.qvecs[[j]], [label])[:, 0], atol=2e-6)
        for partial in (cat, f"{LABEL_SEP}{src}"):              # either column alone moves P differently
            assert not np.allclose(got, model.p_correct(z, data.qvecs[[j]], [partial])[:, 0], atol=1e-4)
        assert 0 < reg.evaluate(baselines=False).methods["locus"]["hit@1"] <= 1
    with Registry(db_copy) as reg, reg.store.tx() as tx:
        st = routing_fit.keep(tx)
        probs, raw = st.scores(data.qvecs[:2], ["not-a-registered-hash", "neither"])
        np.testing.assert_allclose(raw, model.scorer(st.z)(data.qvecs[:2]), atol=1e-6)


@pytest.mark.slow     # trains or starts a process: seconds, the full suite runs it
def test_train_category_and_source_flag(db_copy):
    res = CliRunner().invoke(cli, ["--db", str(db_copy), "train", "--category-features", "--category-field",
                                   "category+source", "--steps", "2", "--epochs", "1", "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    with Registry(db_copy) as reg, reg.store.tx() as tx:
        cfg = json.loads(tx.sql("SELECT config::VARCHAR FROM encoders WHERE id = ?", [info["id"]])[0][0])
        data = dataset(tx)
    tr = data.splits["train"]
    assert cfg["category_field"] == "category+source"
    assert cfg["categories"] == ([f"category:{c}" for c in sorted(set(data.categories[tr].tolist()) - {"(none)"})] +
                                 [f"source:{s}" for s in sorted(set(data.sources[tr].tolist()) - {"(none)"})])
    category = info["metrics"]["category"]
    assert category["field"] == "category+source" and category["deep_l2"] in (10.0, 30.0, 100.0, 300.0)
