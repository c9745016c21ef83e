"""Inference artifacts: the inference-lowered graph (Model.config's node format) and its weights.

One .npz written atomically: every parameter by 'layer/param' name in the model's dtype, and a
JSON record {format, model (the config), dtype, probabilities, stats}. Loading checks the
format, rebuilds the graph from the config (every layer argument validated) and checks every
tensor's name, shape and dtype against it before anything is allocated.
"""
import numpy as np

from ..backend import DtypeError, get_device
from ..checkpoint import read_npz, write_npz
from ..graph import Model

FORMAT = "minidl-artifact-2"
DTYPES = ("float32", "float64", "float16")


class ArtifactError(ValueError):
    """An inference artifact is missing, corrupt, or not a minidl artifact; the message names the file."""


def write(path, model, probabilities, stats):
    """Write the lowered `model` (a Model) and how it was made as an artifact."""
    info = {"format": FORMAT, "model": model.config(), "dtype": model.device.dtype.name,
            "probabilities": probabilities, "stats": stats}
    return write_npz(path, model.get_weights(), info)


def read(path, device=None):
    """(lowered Model on `device` (None: 'auto'), probabilities, stats) of an artifact."""
    info, arrays = read_npz(path, "artifact", ArtifactError)
    fmt = info.get("format")
    if fmt != FORMAT:
        ckpt = str(fmt).startswith("minidl-checkpoint")
        hint = "; it is a checkpoint: use compile() or --checkpoint" if ckpt else ""
        raise ArtifactError(f"artifact {path}: unknown format {fmt!r}, expected {FORMAT!r}{hint}")
    dtype = info.get("dtype")
    if dtype not in DTYPES:
        raise ArtifactError(f"artifact {path}: dtype must be one of {DTYPES}, got {dtype!r}")
    for k, a in arrays.items():
        if a.dtype != np.dtype(dtype):
            raise ArtifactError(f"artifact {path}: tensor {k} is {a.dtype}, the artifact says {dtype}")
    dev = get_device("auto" if device is None else device, dtype=dtype)
    dev = dev if dev.dtype == np.dtype(dtype) else dev.with_dtype(dtype)
    try:
        model = Model.from_config(info.get("model"), device=dev, dtype=dtype, weights=arrays)
    except DtypeError:
        raise                  # the file is fine: this device cannot compute in its dtype (the error names the layer)
    except ValueError as e:
        raise ArtifactError(f"artifact {path} is inconsistent: {e}") from None
    stats = info.get("stats")
    return model, bool(info.get("probabilities")), stats if isinstance(stats, dict) else {}
