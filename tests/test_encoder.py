import io
import json
import pickle
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from registry.cli import cli
from registry.embedding.encoders import SHIPPED
from registry.locus.checkpoint import load_checkpoint, read_header, save_checkpoint
from registry.locus.network import EncoderConfig, LocusModel
from registry.locus.scoring import embed_models, predict_proba
from registry.locus.stages import set_statistic
from registry.locus.text_encoder import TEXT_ENCODER
from registry.locus.training import TrainConfig, train

from .conftest import snapshot

torch.set_num_threads(1)  # tiny tensors: extra threads only add contention on a shared machine

SMALL = EncoderConfig(d_query=16, d_model=32, n_inducing=8, n_heads=4, n_isab=2, d_hidden=16, dropout=0.1)


def small_model(seed=0):
    torch.manual_seed(seed)
    return LocusModel(SMALL).eval()


def random_set(b=3, n=20, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, SMALL.d_query, generator=g)
    y = (torch.rand(b, n, generator=g) > 0.5).float()
    return q, y, torch.ones(b, n, dtype=torch.bool)


def test_embedding_invariant_to_order():
    m = small_model()
    q, y, mask = random_set()
    perm = torch.randperm(q.shape[1], generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(m.embed(q, y, mask), m.embed(q[:, perm], y[:, perm], mask[:, perm]),
                                   rtol=1e-5, atol=1e-5)


def test_padded_rows_never_change_embedding():
    m = small_model()
    q, y, mask = random_set()
    g = torch.Generator().manual_seed(9)
    pad = 13
    qp = torch.cat([q, 100 * torch.randn(q.shape[0], pad, q.shape[2], generator=g)], 1)   # junk, not zeros
    yp = torch.cat([y, torch.rand(y.shape[0], pad, generator=g)], 1)
    mp = torch.cat([mask, torch.zeros(mask.shape[0], pad, dtype=torch.bool)], 1)
    # and interleave the padding with the real rows
    perm = torch.randperm(qp.shape[1], generator=g)
    qp[0, 3] = float("nan")                                      # a NaN in a padded row must not leak either
    mp[0, 3] = False
    with torch.no_grad():
        z0 = m.embed(q[1:], y[1:], mask[1:])
        z1 = m.embed(qp[1:, perm], yp[1:, perm], mp[1:, perm])
        torch.testing.assert_close(z0, z1, rtol=1e-5, atol=1e-5)
        zr = m.embed(qp[:1], yp[:1], mp[:1])
        assert torch.isfinite(zr).all()
        keep = mp[0]
        torch.testing.assert_close(zr, m.embed(qp[:1, keep], yp[:1, keep], mp[:1, keep]), rtol=1e-5, atol=1e-5)


def test_set_of_one_is_finite_and_predictor_shapes():
    m = small_model()
    q, y, mask = random_set(b=2, n=1)
    with torch.no_grad():
        z = m.embed(q, y, mask)
        assert z.shape == (2, SMALL.d_model) and torch.isfinite(z).all()
        logits = m.predict_logits(z, torch.randn(7, SMALL.d_query))
        assert logits.shape == (2, 7) and torch.isfinite(logits).all()


def test_predictor_chunking_matches_direct_mlp():
    m = small_model()
    z, qq = torch.randn(5, SMALL.d_model), torch.randn(11, SMALL.d_query)
    with torch.no_grad():
        u = m.q_proj(qq)
        zz, uu = z[:, None].expand(5, 11, -1), u[None].expand(5, 11, -1)
        w = torch.cat([m.w_z.weight, m.w_u.weight, m.w_zu.weight], 1)
        direct = m.head(torch.relu(torch.cat([zz, uu, zz * uu], -1) @ w.T + m.w_z.bias))[..., 0]
        torch.testing.assert_close(m.predict_logits(z, qq, chunk_elems=5 * SMALL.d_hidden * 3), direct,
                                   rtol=1e-5, atol=1e-5)


def test_checkpoint_round_trip_bit_for_bit():
    m = small_model()
    meta = {"text_encoder": "x", "metrics": {"hit@1": 0.7123456789}, "digest": "abc"}
    blob = save_checkpoint(m, SMALL, meta)
    m2, cfg2, meta2 = load_checkpoint(blob)
    assert cfg2 == SMALL and meta2 == meta
    assert save_checkpoint(m2, cfg2, meta2) == blob
    q, y, mask = random_set()
    with torch.no_grad():
        assert torch.equal(m.embed(q, y, mask), m2.embed(q, y, mask))
        z = m.embed(q, y, mask)
        assert torch.equal(m.predict_logits(z, q[0]), m2.predict_logits(z, q[0]))


def test_input_layer_shortcut_matches_concatenated_rows():
    m = small_model()
    q, y, mask = random_set()
    with torch.no_grad():
        direct = m.inp(torch.cat([q, y[..., None], q * (2 * y[..., None] - 1)], -1))
        P, S = m.row_proj(q)
        yy = y[..., None]
        torch.testing.assert_close(P + (2 * yy - 1) * S + yy * m.inp.weight[:, SMALL.d_query] + m.inp.bias, direct,
                                   rtol=1e-5, atol=1e-5)


def test_a_checkpoint_recording_settings_since_removed_loads():
    """The shipped checkpoint's record of its training names settings TrainConfig no longer has (the recipes it
    did not use); the record is never read back, so it loads, and re-saves to the same bytes."""
    blob = SHIPPED.read_bytes()
    recorded = set(read_header(blob)["meta"]["train_config"])
    assert {"big_set_embed", "teacher", "route_weight", "ema"} <= recorded - {f.name for f in fields(TrainConfig)}
    model, cfg, meta = load_checkpoint(blob)
    assert save_checkpoint(model, cfg, meta) == blob


def test_read_header_without_torch():
    m = small_model()
    blob = save_checkpoint(m, SMALL, {"name": "x", "embed_max_set": None})
    h = read_header(blob)
    assert h["format"] == "locus-checkpoint/1" and h["meta"]["name"] == "x" and h["config"]["d_model"] == 32
    root = Path(__file__).resolve().parents[1]
    code = ("import sys; from registry.locus.checkpoint import read_header; "
            "h = read_header(sys.stdin.buffer.read()); assert 'torch' not in sys.modules, 'torch imported'; "
            "print(h['meta']['name'])")
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, cwd=root, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == b"x", out.stderr.decode()
    for bad in (b"", b"\x80junk", b"PK\x03\x04", b"12345678{}", pickle.dumps(1)):
        with pytest.raises(ValueError):
            read_header(bad)


def test_checkpoint_whose_header_length_looks_like_a_pickle_loads():
    # a safetensors file starts with its header length, little-endian: it can begin with 0x80 (pickle's first byte)
    # or with "PK" (a zip's, as torch.save writes); such a checkpoint is still ours and must load
    m = small_model()

    def header_len(pad: int) -> int:
        return int.from_bytes(save_checkpoint(m, SMALL, {"name": "x", "pad": "p" * pad})[:8], "little")

    for first in (b"\x80", b"PK"):
        target, modulus = int.from_bytes(first, "little"), 256 ** len(first)
        pad = (target - header_len(0)) % modulus             # one pad character = one header byte, up to alignment
        while header_len(pad) % modulus != target:
            pad += 1
        meta = {"name": "x", "pad": "p" * pad}
        blob = save_checkpoint(m, SMALL, meta)
        assert blob.startswith(first)
        assert load_checkpoint(blob)[2] == meta


def test_pickle_blob_is_refused():
    m = small_model()
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    for blob in (pickle.dumps({"a": 1}), buf.getvalue(), b"", b"garbage-bytes-here"):
        with pytest.raises(ValueError):
            load_checkpoint(blob)


def synthetic(seed=0, n_models=6, n_q=300):
    rng = np.random.default_rng(seed)
    qv = rng.normal(size=(n_q, SMALL.d_query)).astype(np.float32)
    qv /= np.linalg.norm(qv, axis=1, keepdims=True)
    skill = rng.normal(size=(n_models, SMALL.d_query))
    correct = (qv @ skill.T > 0).T.astype(np.int8)
    correct[0, :10] = -1                                          # a few missing evaluations
    return qv, correct, np.arange(0, 200), np.arange(200, 250), np.arange(250, 300)


def test_set_statistic_is_the_mean_of_signed_rows_and_ignores_padding():
    # the linear teacher's target for a set: mean over real rows of [(2y-1) q, y]; padded rows must not count
    rng = np.random.default_rng(5)
    q = torch.from_numpy(rng.normal(size=(2, 7, 4)).astype(np.float32))
    y = torch.from_numpy((rng.random((2, 7)) > 0.5).astype(np.float32))
    mask = torch.tensor([[True] * 7, [True] * 3 + [False] * 4])
    s = set_statistic(q, y, mask)
    for b, n in ((0, 7), (1, 3)):
        qn, yn = q[b, :n].numpy(), y[b, :n].numpy()
        want = np.concatenate([((2 * yn - 1)[:, None] * qn).mean(0), [yn.mean()]])
        np.testing.assert_allclose(s[b].numpy(), want, rtol=1e-6, atol=1e-6)
    garbage = q.clone()
    garbage[1, 3:] = 1e6                                          # padded rows changed: statistic unchanged
    assert torch.equal(set_statistic(garbage, y, mask), s)


@pytest.mark.slow
def test_training_is_deterministic():
    qv, correct, tr, va, te = synthetic()
    cfg = TrainConfig(seed=3, max_steps=12, eval_every=4, anchors=32, min_anchors=4, n_targets=64, big_set=96,
                      warmup=2, teacher_epochs=2, teacher_batch=32, encoder=SMALL)
    runs = []
    for _ in range(2):
        model, ecfg, metrics = train(qv, correct, tr, va, cfg)
        z = embed_models(model, qv, correct, tr)
        runs.append((metrics["history"], metrics["val_hit@1"], predict_proba(model, z, qv[te])))
    assert runs[0][0] == runs[1][0] and runs[0][1] == runs[1][1]
    assert np.array_equal(runs[0][2], runs[1][2])
    assert ecfg == SMALL


def test_registry_refuses_checkpoints_it_cannot_use(db_copy, tmp_path):
    """Through the CLI on a real registry: one line naming the file and the problem, nothing written (also for a
    truncated file, tensors that do not fit the config, a header that is not ours); a checkpoint that expects this
    registry's text encoder installs and lists."""
    model, cfg, meta = load_checkpoint(SHIPPED.read_bytes())
    other = tmp_path / "other.safetensors"
    other.write_bytes(save_checkpoint(model, cfg, dict(meta, text_encoder="all-mpnet-base-v2@384")))
    pickled = tmp_path / "pickled.pt"
    torch.save(model.state_dict(), pickled)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(SHIPPED.read_bytes()[:-1000])
    wrong_shape = tmp_path / "wrong-shape.safetensors"
    wrong_shape.write_bytes(save_checkpoint(model, replace(cfg, d_hidden=32), meta))
    meta_list = tmp_path / "meta-list.safetensors"
    meta_list.write_bytes(save_checkpoint(model, cfg, [meta]))
    odd_heads = tmp_path / "odd-heads.safetensors"             # loads (shapes fit) but cannot run: 128 % 7 != 0
    odd_heads.write_bytes(save_checkpoint(model, replace(cfg, n_heads=7), meta))
    negative = tmp_path / "negative.safetensors"
    negative.write_bytes(save_checkpoint(model, replace(cfg, d_model=-4), meta))
    run = lambda *args: CliRunner().invoke(cli, ["--db", str(db_copy), "encoders", *map(str, args)])  # noqa: E731
    before = snapshot(db_copy)
    for path, words in ((other, ("all-mpnet-base-v2@384", TEXT_ENCODER)), (pickled, ("pickle",)),
                        (truncated, ("cannot be read",)), (wrong_shape, ("do not match its config", "more")),
                        (meta_list, ("config or meta",)), (odd_heads, ("cannot be used",)),
                        (negative, ("cannot be used",))):
        res = run("install", path)
        assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
        assert res.output.startswith(f"Error: {path}: ") and all(w in res.output for w in words), res.output
    assert snapshot(db_copy) == before

    ours = tmp_path / "ours.safetensors"
    ours.write_bytes(save_checkpoint(model, cfg, dict(meta, name="same-weights-new-name")))
    res = run("install", ours)
    assert res.exit_code == 0, res.output
    listed = {e["name"]: e for e in json.loads(run("--json").output)}
    assert listed["same-weights-new-name"]["text_encoder"] == TEXT_ENCODER
    assert not listed["same-weights-new-name"]["active"]


@pytest.mark.parametrize("cfg", [SMALL, replace(SMALL, query_bias=True, categories=("law", "math"))])
def test_numpy_network_is_the_torch_network(cfg):
    """Every command that does not train embeds and scores with the checkpoint's weights in numpy: the same z as
    torch's forward pass to float32 rounding, padded sets (junk and NaN in the padding) included, and the same
    P(correct); what numpy does not run is read from the torch model built from the same bytes."""
    from registry.locus.checkpoint import load_numpy

    torch.manual_seed(3)
    m = LocusModel(cfg).eval()
    with torch.no_grad():                # trained-looking weights: LayerNorms and biases away from their init
        for p in m.parameters():
            p.add_(0.05 * torch.randn_like(p))
    blob = save_checkpoint(m, cfg, {"trained": "test"})
    nm = load_numpy(blob)
    q, y, mask = random_set(b=4, n=40, seed=2)
    mask[1, 25:], mask[3, 7:] = False, False
    q[1, 30], q[3, 9] = 50.0, float("nan")
    with torch.no_grad():
        zt = m.embed(q, y, mask).numpy()
    zn = nm.embed(q.numpy(), y.numpy(), mask.numpy())
    assert zn.dtype == np.float32
    np.testing.assert_allclose(zn, zt, atol=1e-6)
    assert not np.allclose(nm.embed(q.numpy(), 1 - y.numpy(), mask.numpy()), zt, atol=1e-3)
    P, S = nm.row_proj(q.numpy()[0])
    with torch.no_grad():
        Pt, St = m.row_proj(torch.nan_to_num(q[0]))
    np.testing.assert_allclose(P[:30], Pt.numpy()[:30], atol=1e-6)
    names = ["law", "math", None, "art"] * 10 if cfg.categories else None
    qs = q.numpy()[0]
    np.testing.assert_allclose(nm.p_correct(zn, qs, names), m.p_correct(zn, qs, names), atol=1e-6)
    # fewer queries than models: the other way of grouping the sum (a route's), in float32, in blocks of models
    # (1,200: two whole blocks and part of a third)
    many = np.concatenate([zn] * 300)
    np.testing.assert_allclose(nm.p_correct(many, qs[:5], names and names[:5]), m.p_correct(many, qs[:5],
                               names and names[:5]), atol=1e-6)
    assert nm.n_params() == m.n_params()          # read from the torch model, loaded on demand


def test_shipped_encoder_embeds_alike_in_numpy_and_torch():
    """The shipped checkpoint's sets embedded by embed_sets' numpy path (a few sets: registration) and its torch
    path (bulk: an import's onboarding) agree to recompute's tolerance, sets of several lengths batched together."""
    from registry.embedding import embed
    from registry.locus.checkpoint import load_numpy

    nm = load_numpy(SHIPPED.read_bytes())
    rng = np.random.default_rng(4)
    sets = [(0.05 * rng.standard_normal((n, nm.cfg.d_query)).astype(np.float32),
             (rng.random(n) < 0.6).astype(np.float32)) for n in (300, 128, 90, 50)]
    in_numpy = embed.embed_sets(nm, sets)
    in_torch = embed.embed_sets(nm.torch_model(), sets)
    np.testing.assert_allclose(in_numpy, in_torch, atol=1e-6)
    assert np.linalg.norm(in_numpy[0] - in_numpy[1]) > 1e-3       # distinct sets, distinct embeddings
