"""Encoder checkpoints kept in the registry: install, list, activate, load.

A checkpoint is safetensors bytes with its config and meta in the header (locus/checkpoint.py); the registry stores the
bytes as they are, and the active encoder is the newest row of `encoder_activations`. Activating another encoder
enqueues a re-embedding of every model under it (`request_activation`); the onboarding that embeds them writes the
activation row in the same transaction, so a crash before that commit leaves the previous encoder answering every
read, and the next onboarding completes the switch. Old versions stay.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from registry.core import resources
from registry.core.errors import InputError, NotFound, RegistryError
from registry.core.lazy import LazyModule
from registry.core.transaction import Tx
from registry.data.outbox import enqueue

text_encoder = LazyModule("registry.locus.text_encoder")   # (numpy: only installing a checkpoint checks it)

SHIPPED = resources.data_dir() / "locus-mmlu-pro.safetensors"
_models: dict = {}  # weights sha256 (or ("float64", sha256)) -> LocusModel, loaded once per process


@dataclass
class EncoderInfo:
    id: int
    name: str
    text_encoder: str
    active: bool
    metrics: dict
    created: str
    weights_sha256: str
    n_bytes: int
    # the checkpoint's own record of its routing hit@1, measured when it was trained (on the embeddings of that
    # run: val's from the train answers alone): the test figure where it has one, else val's. Not today's figure
    # on this registry, which `registry evaluate` measures (models embedded from their train and val answers)
    hit1_at_training: float | None = None
    hit1_at_training_split: str | None = None


def at_training(metrics: dict) -> tuple[float | None, str | None]:
    """(hit@1, split) of a checkpoint's metrics as training recorded them: test where it has one, else val."""
    for split, value in (("test", metrics.get("test_hit@1", (metrics.get("test") or {}).get("hit@1"))),
                         ("val", metrics.get("val_hit@1"))):
        if isinstance(value, (int, float)):
            return round(float(value), 4), split
    return None, None


def checkpoint_header(blob: bytes, source: str = "checkpoint") -> dict:
    """The checkpoint's config and meta, read without torch; refuses anything that is not our safetensors."""
    from registry.locus.checkpoint import read_header  # imports no torch

    try:
        return read_header(blob)
    except ValueError as exc:
        raise InputError(str(exc), file=source) from None


def _working_model(blob: bytes, source: str):
    """The checkpoint's model, after one forward pass on a two-row set and one prediction; anything that fails
    (a truncated file, a config the model cannot be built from, heads that do not divide the width) is InputError."""
    import torch

    from registry.locus.checkpoint import load_checkpoint

    try:
        model = load_checkpoint(bytes(blob))[0]
        q = torch.zeros(1, 2, model.cfg.d_query)
        with torch.no_grad():
            z = model.embed(q, torch.tensor([[0.0, 1.0]]), torch.ones(1, 2, dtype=torch.bool))
            model.predict_logits(z, q[0])
    except Exception as exc:  # whatever the checkpoint's content makes torch raise: the file is unusable
        raise InputError(f"checkpoint cannot be used: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                         file=source) from None
    return model


def install(tx: Tx, blob: bytes, name: str | None = None, source: str = "checkpoint") -> int:
    """Store a checkpoint (bytes as given). Refused if it expects another text encoder than this registry's."""
    header = checkpoint_header(blob, source)
    meta = header.get("meta", {})
    expects = meta.get("text_encoder")
    if expects != text_encoder.TEXT_ENCODER:
        raise InputError(f"encoder expects text encoder {expects!r}, but this registry embeds query text with "
                         f"{text_encoder.TEXT_ENCODER!r}", file=source)
    sha = hashlib.sha256(blob).hexdigest()
    same = tx.sql("SELECT id FROM encoders WHERE weights_sha256 = ?", [sha])
    if same:
        return int(same[0][0])
    if sha not in _models:  # parsed and run once now: a checkpoint that cannot work is never stored (nor activated)
        _models[sha] = _working_model(blob, source)
    name = name or meta.get("name") or f"locus-{sha[:12]}"
    if tx.sql("SELECT 1 FROM encoders WHERE name = ?", [name]):
        name = f"{name}-{sha[:8]}"
    return int(tx.sql("""INSERT INTO encoders (name, text_encoder, config, meta, weights, weights_sha256)
                         VALUES (?, ?, ?, ?, ?, ?) RETURNING id""",
                      [name, expects, json.dumps(header["config"]), json.dumps(meta), blob, sha])[0][0])


def active_id(tx: Tx, as_of: str | None = None) -> int | None:
    """The active encoder (as it stood at `as_of`). The current one is read once per open database: activations
    are written only by `activate` and `ensure_default`, which update the cached value when they commit."""
    if not as_of and "active_encoder" in tx.cache:
        return tx.cache["active_encoder"]
    if as_of:
        try:
            tx.sql("SELECT ?::TIMESTAMP", [as_of])
        except Exception:
            raise InputError(f"--as-of: not a timestamp: {as_of!r} (use e.g. 2026-01-31 or '2026-01-31 12:00')") \
                from None
    where = "WHERE created <= ?::TIMESTAMP" if as_of else ""
    row = tx.sql(f"SELECT encoder_id FROM encoder_activations {where} ORDER BY id DESC LIMIT 1",
                 [as_of] if as_of else [])
    found = int(row[0][0]) if row else None
    if not as_of:    # a read never overwrites a value a concurrent activation committed meanwhile
        tx.after_commit(lambda: tx.cache.setdefault("active_encoder", found))
    return found


def _remember_active(tx: Tx, encoder_id: int | None) -> None:
    tx.after_commit(lambda: tx.cache.__setitem__("active_encoder", encoder_id))


def ensure_default(tx: Tx) -> int | None:
    """A registry without encoders gets the shipped checkpoint, active, so onboarding needs no training."""
    current = active_id(tx)
    if current is not None or not SHIPPED.is_file():
        return current
    encoder_id = install(tx, SHIPPED.read_bytes(), source=str(SHIPPED))
    tx.sql("INSERT INTO encoder_activations (encoder_id) VALUES (?) RETURNING id", [encoder_id])
    _remember_active(tx, encoder_id)
    return encoder_id


def activate(tx: Tx, encoder_id: int) -> bool:
    """Record that an encoder is active from now on; -> whether that changed anything. Only onboarding calls it
    with models to embed, in the transaction that writes their versions under it (`request_activation`)."""
    if not tx.sql("SELECT 1 FROM encoders WHERE id = ?", [encoder_id]):
        raise NotFound(f"unknown encoder {encoder_id}")
    if active_id(tx) == encoder_id:
        return False
    tx.sql("INSERT INTO encoder_activations (encoder_id) VALUES (?) RETURNING id", [encoder_id])
    _remember_active(tx, encoder_id)
    return True


SWITCH = "new encoder"      # the reason of the onboarding jobs an activation enqueues


def pending_switch(tx: Tx) -> int | None:
    """The encoder an activation waits for: the newest unfinished activation's, where it is not the active one
    (its models' re-embedding has not committed yet, a crash may have cut it short); else None."""
    row = tx.sql("""SELECT j.encoder_id FROM onboarding_jobs j LEFT JOIN onboarding_results r ON r.job_id = j.id
                    WHERE r.job_id IS NULL AND j.reason = ? AND j.encoder_id IS NOT NULL
                    ORDER BY j.id DESC LIMIT 1""", [SWITCH])
    target = int(row[0][0]) if row else None
    return None if target is None or target == active_id(tx) else target


def request_activation(tx: Tx, encoder_id: int) -> bool:
    """Ask for an encoder to become active: every model is queued for re-embedding under it, and the onboarding
    that embeds them switches (`onboarding.run_pending`), so reads never see an active encoder without its
    embeddings. A registry without models switches at once. Asking for the active encoder while a switch is
    pending cancels the switch. -> whether anything is to change."""
    if not tx.sql("SELECT 1 FROM encoders WHERE id = ?", [encoder_id]):
        raise NotFound(f"unknown encoder {encoder_id}")
    if (pending_switch(tx) or ensure_default(tx)) == encoder_id:
        return False
    model_ids = [r[0] for r in tx.sql("SELECT id FROM models ORDER BY id")]
    if not model_ids:
        return activate(tx, encoder_id)
    enqueue(tx, model_ids, SWITCH, encoder_id=encoder_id)
    return True


def require_active(tx: Tx, as_of: str | None = None) -> int:
    """The active encoder's id (as it stood at `as_of`), or the one error every answer gives without one."""
    encoder_id = active_id(tx, as_of) if as_of else ensure_default(tx)
    if encoder_id is None and as_of:
        first = tx.sql("SELECT min(created)::VARCHAR FROM encoder_activations")[0][0]
        if first is not None:
            raise NotFound(f"nothing was registered as of {as_of}: the registry's history starts at {first[:19]}")
    if encoder_id is None:
        raise RegistryError("no active encoder: train one (`registry train`) or install one "
                            "(`registry encoders install FILE`)")
    return encoder_id


def listing(tx: Tx) -> list[EncoderInfo]:
    active = active_id(tx)
    rows = tx.sql("""SELECT id, name, text_encoder, meta::VARCHAR, created::VARCHAR, weights_sha256,
                            octet_length(weights)
                     FROM encoders ORDER BY id""")
    out = [EncoderInfo(id=i, name=n, text_encoder=t, active=(i == active), metrics=json.loads(m).get("metrics", {}),
                       created=c, weights_sha256=s, n_bytes=b) for i, n, t, m, c, s, b in rows]
    for e in out:
        e.hit1_at_training, e.hit1_at_training_split = at_training(e.metrics)
    return out


def load(tx: Tx, encoder_id: int):
    """(LocusModel in eval mode, meta) for an encoder id; the weights are parsed once per process, and an encoder's
    row (never changed once written) is read once per open database."""
    key = ("encoder", int(encoder_id))
    row = tx.cache.get(key)
    if row is None:
        found = tx.sql("SELECT weights_sha256, meta::VARCHAR FROM encoders WHERE id = ?", [encoder_id])
        if not found:
            raise NotFound(f"unknown encoder {encoder_id}")
        row = (found[0][0], json.loads(found[0][1]))
        tx.after_commit(lambda: tx.cache.__setitem__(key, row))
    sha, meta = row
    if sha not in _models:
        from registry.locus.checkpoint import load_numpy

        blob = tx.sql("SELECT weights FROM encoders WHERE id = ?", [encoder_id])[0][0]
        _models[sha] = load_numpy(bytes(blob))      # torch only if something asks for more than numpy runs
    return _models[sha], dict(meta)
