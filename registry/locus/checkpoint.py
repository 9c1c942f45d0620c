"""LOCUS checkpoints as safetensors bytes: tensors, plus config and meta as JSON in the header. Never unpickles.

The header metadata holds one key (safetensors keeps metadata in a hash map, so with several keys their order in the
file could vary between processes); its JSON is written with sorted keys, so saving the same model twice, or saving a
loaded checkpoint again, gives the same bytes. The header is read by numpy_network.read_header, which never imports
torch (what routing reads a checkpoint with); this module is the torch side: saving a model, and loading one (to
train, or behind load_numpy's network for what numpy does not run).
"""
from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import TYPE_CHECKING

# (read_header is the numpy network's, which reads a checkpoint without torch; imported here for this module's readers)
from registry.locus.numpy_network import FORMAT, HEADER_KEY, EncoderConfig, read_header

if TYPE_CHECKING:                                   # torch is imported only by the functions that need it
    from registry.locus.network import LocusModel
    from registry.locus.numpy_network import NumpyLocus

# EncoderConfig fields added after format 1 -> the default a missing one takes
_LATER_FIELDS = {"categories": (), "category_field": "category"}



def save_checkpoint(model: LocusModel, config: EncoderConfig, meta: dict) -> bytes:
    from safetensors.torch import save as st_save

    cfg = asdict(config)
    for name in _LATER_FIELDS:                      # at their default, left out: an old checkpoint re-saves as it was
        if cfg.get(name) == _LATER_FIELDS[name]:
            del cfg[name]
    header = {"format": FORMAT, "config": cfg, "meta": meta}
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    return st_save(tensors, metadata={HEADER_KEY: text})


def read_config(blob: bytes) -> tuple[EncoderConfig, dict]:
    """(config, meta) of a checkpoint, without torch; unknown config fields are a ValueError."""
    info = read_header(blob)
    known = {f.name for f in fields(EncoderConfig)}
    unknown = set(info["config"]) - known
    if unknown:
        raise ValueError(f"checkpoint config has unknown fields {sorted(unknown)}")
    return EncoderConfig(**info["config"]), info["meta"]


def load_numpy(blob: bytes) -> NumpyLocus:
    """The checkpoint's network in numpy (embedding and scoring without torch); anything else it is asked for is
    read from the torch model, loaded from the same bytes the first time."""
    from registry.locus.numpy_network import NumpyLocus

    config, _ = read_config(blob)
    return NumpyLocus(blob, config, torch_loader=lambda b: load_checkpoint(b)[0])


def load_checkpoint(blob: bytes) -> tuple[LocusModel, EncoderConfig, dict]:
    from safetensors.torch import load as st_load

    from registry.locus.network import LocusModel

    config, meta = read_config(blob)
    model = LocusModel(config)
    try:
        tensors = st_load(bytes(blob))
    except Exception as exc:  # safetensors' own error type: a truncated or corrupt file
        raise ValueError(f"checkpoint tensors cannot be read: {str(exc).splitlines()[0]}") from None
    missing, extra = set(model.state_dict()) - set(tensors), set(tensors) - set(model.state_dict())
    if missing or extra:
        raise ValueError(f"checkpoint tensors do not match the model: missing {sorted(missing)}, extra {sorted(extra)}")
    wrong = [k for k, v in model.state_dict().items() if tuple(tensors[k].shape) != tuple(v.shape)]
    if wrong:
        raise ValueError(f"checkpoint tensors do not match its config: {wrong[0]} is {tuple(tensors[wrong[0]].shape)}, "
                         f"the config makes it {tuple(model.state_dict()[wrong[0]].shape)}"
                         + (f" ({len(wrong) - 1} more)" if len(wrong) > 1 else ""))
    model.load_state_dict(tensors, strict=True)
    model.eval()
    return model, config, meta
