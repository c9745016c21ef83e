"""Inference artifacts: the inference-lowered graph (Model.config's node format) and its weights.

One .npz written atomically: every parameter by 'layer/param' name in the dtype its layer
computes in (bfloat16 stored as its uint16 bits, listed in `bfloat16_bits`: .npy has no
bfloat16), and a JSON record {format, model (the config, its Cast layers included), dtype (of
the inputs and outputs), precision, probabilities, stats, images (whether the model takes the input
contract's images: it carried its preprocessing; absent in artifacts from before, which take
normalised floats)}. Under bf16 or fp16 the weights take
half the bytes. Loading checks the format, every tensor's dtype against the record, rebuilds the
graph from the config (every layer argument validated, every tensor's name and shape checked
before anything is allocated), then every tensor's dtype against the layer that holds it; a
tensor holding NaN or infinity is refused by name.
Version 2 artifacts (one dtype for everything) load too.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import precision as _precision
from ..backend import DtypeError, get_device
from ..checkpoint import check_finite, read_npz, write_npz
from ..graph import Model

if TYPE_CHECKING:
    from ..backend import Device

FORMAT = "minidl-artifact-3"
READS = ("minidl-artifact-2", FORMAT)
DTYPES = ("float32", "float64", "float16")


class ArtifactError(ValueError):
    """An inference artifact is missing, corrupt, or not a minidl artifact; the message names the file."""


def write(path: str | os.PathLike, model: Model, probabilities: bool, stats: dict[str, Any],
          precision: str = "fp32", images: bool = False, dataset: str | None = None) -> str | os.PathLike:
    """Write the lowered `model` (a Model), its precision policy's name and how it was made as an artifact;
    `dataset`, where known, in the `data` record a checkpoint has (checkpoint_data.dataset_of reads both)."""
    weights = model.get_weights()
    bits = sorted(k for k, a in weights.items() if a.dtype == _precision.BFLOAT16)
    arrays = {k: a.view(np.uint16) if k in bits else a for k, a in weights.items()}
    info = {"format": FORMAT, "model": model.config(), "dtype": model.device.dtype.name, "precision": precision,
            "bfloat16_bits": bits, "probabilities": probabilities, "stats": stats, "images": bool(images)}
    if dataset is not None:
        info["data"] = {"dataset": dataset}
    return write_npz(path, arrays, info)


def read(path: str | os.PathLike,
         device: str | Device | None = None) -> tuple[Model, bool, dict[str, Any], str, bool]:
    """(lowered Model on `device` (None: 'auto'), probabilities, stats, precision name, whether it takes
    images) of an artifact."""
    info, arrays = read_npz(path, "artifact", ArtifactError)
    fmt = info.get("format")
    if fmt not in READS:
        ckpt = str(fmt).startswith("minidl-checkpoint")
        hint = "; it is a checkpoint: use compile() or --checkpoint" if ckpt else ""
        raise ArtifactError(f"artifact {path}: unknown format {fmt!r}, expected {FORMAT!r}{hint}")
    dtype, name, bits = info.get("dtype"), info.get("precision", "fp32"), info.get("bfloat16_bits", [])
    if dtype not in DTYPES:
        raise ArtifactError(f"artifact {path}: dtype must be one of {DTYPES}, got {dtype!r}")
    try:
        policy = _precision.policy(name)
    except ValueError as e:
        raise ArtifactError(f"artifact {path}: {e}") from None
    if not (isinstance(bits, list) and set(bits) <= set(arrays)):
        raise ArtifactError(f"artifact {path}: bfloat16_bits must list tensors of the file, got {bits!r}"[:300])
    for k, a in arrays.items():
        want = {np.dtype(np.uint16)} if k in bits else {np.dtype(dtype), policy.compute} - {_precision.BFLOAT16}
        if a.dtype not in want:
            raise ArtifactError(f"artifact {path}: tensor {k} is {a.dtype}, the artifact says "
                                + " or ".join(sorted(d.name for d in want)))
    arrays = {k: a.view(_precision.BFLOAT16) if k in bits else a for k, a in arrays.items()}
    check_finite(arrays, f"artifact {path}", ArtifactError)       # the bfloat16 ones too, read as such
    dev = get_device("auto" if device is None else device, dtype=dtype)
    dev = dev if dev.dtype == np.dtype(dtype) else dev.with_dtype(dtype)
    try:
        # a missing or malformed config is from_config's ValueError, named below
        model = Model.from_config(info.get("model"), device=dev, dtype=dtype, weights=arrays)  # type: ignore[arg-type]
    except DtypeError:
        raise                  # the file is fine: this device cannot compute in its dtype (the error names the layer)
    except ValueError as e:
        raise ArtifactError(f"artifact {path} is inconsistent: {e}") from None
    for k, a in arrays.items():
        if a.dtype != model.params[k].data.dtype:
            raise ArtifactError(f"artifact {path}: tensor {k} is {a.dtype.name}, but its layer computes in "
                                f"{model.params[k].data.dtype.name}")
    stats = info.get("stats")
    return (model, bool(info.get("probabilities")), stats if isinstance(stats, dict) else {}, policy.name,
            info.get("images") is True)
