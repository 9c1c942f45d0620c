"""`registry encoders` and `registry train`: the encoders a registry holds (`listing`), one installed from a
checkpoint file or trained on the registry's train split (val for model selection), and one made active, which
re-embeds every model under it (old versions stay)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from registry.core.errors import InputError
from registry.core.store import Store
from registry.embedding import encoders, onboarding
from registry.usecases import onboard as onboard_uc


def listing(store: Store) -> list[encoders.EncoderInfo]:
    with store.tx() as tx:
        encoders.ensure_default(tx)
        return encoders.listing(tx)


def activate(store: Store, encoder_id: int, *, min_evaluations: int) -> list[onboarding.JobOutcome]:
    """Make an encoder active; every model is re-embedded under it, and it becomes active when their versions
    commit: until then (a crash meanwhile) reads answer under the previous one."""
    with store.tx() as tx:
        encoders.request_activation(tx, int(encoder_id))
    return onboard_uc.onboard(store, min_evaluations)


def install(store: Store, path: str, name: str | None = None, *, activate_it: bool = False,
            min_evaluations: int) -> int:
    """A checkpoint file stored as an encoder (-> its id), made active with `activate_it`."""
    p = Path(path)
    if not p.is_file():
        raise InputError("no such file", file=str(path))
    with store.tx() as tx:
        encoder_id = encoders.install(tx, p.read_bytes(), name=name, source=str(path))
    if activate_it:
        activate(store, encoder_id, min_evaluations=min_evaluations)
    return encoder_id


def train(store: Store, *, min_evaluations: int, activate_it: bool = False, **options: Any) -> int:
    """A LOCUS encoder trained on the registry's train split (`options`: training.checkpoint_from's), stored as a
    checkpoint -> its encoder id; made active with `activate_it`."""
    from registry.embedding import dataset  # (torch: only for the commands that train)
    from registry.locus import training

    with store.tx() as tx:
        data = dataset.dataset(tx)
    blob, meta = training.checkpoint_from(data, **options)
    with store.tx() as tx:
        encoder_id = encoders.install(tx, blob, name=meta["name"])
    if activate_it:
        activate(store, encoder_id, min_evaluations=min_evaluations)
    return encoder_id
