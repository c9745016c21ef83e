"""Checkpoints: tensors and JSON metadata in one .npz, no pickle, written atomically.

A checkpoint holds the architecture (Model.config()), every parameter and running statistic,
the optimizer's state, the step and the random generator state, so a resumed run continues
exactly where the saved one stopped.
"""
import json
import os
import tempfile

import numpy as np

FORMAT = "minidl-checkpoint-1"


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or does not fit the model."""


def write_npz(path, arrays, info):
    """Write tensors and a JSON record as one .npz, atomically: a temporary file, then rename."""
    arrays = dict(arrays, __meta__=np.frombuffer(json.dumps(info).encode(), dtype=np.uint8))
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".npz")
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)      # mkstemp makes 0600; these are ordinary files
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)       # atomic on POSIX: readers see the old file or the new one
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def read_npz(path, what="checkpoint", error=None):
    """(info dict, {name: array}) of a file written by write_npz; `error` (a ValueError class)
    names the file for anything missing, corrupt or not ours."""
    error = error or CheckpointError
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise error(f"{what} {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        info = json.loads(arrays.pop("__meta__").tobytes())
        if not isinstance(info, dict):
            raise ValueError("its JSON record is not an object")
    except Exception as e:
        raise error(f"{what} {path} is not a readable minidl {what}: {type(e).__name__}: {e}") from None
    return info, arrays


def save(path, model, optimizer=None, meta=None):
    """Write model (+ optimizer) state to `path` atomically: a temporary file, then rename."""
    arrays = {f"param/{k}": v for k, v in model.get_weights().items()}
    info = {"format": FORMAT, "model": model.config(), "meta": meta or {}}
    if optimizer is not None and optimizer.model is not None:
        state = optimizer.state_dict()
        arrays.update({f"optim/{k}": v for k, v in state.pop("arrays").items()})
        info["optimizer"] = state
    return write_npz(path, arrays, info)


def read(path):
    """(info dict, {name: array}) of a checkpoint; CheckpointError names the file if it is bad."""
    info, arrays = read_npz(path)
    if info.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: unknown format {info.get('format')!r}")
    return info, arrays


def load_weights(path, model):
    """Copy a checkpoint's parameters and statistics into `model`, naming any mismatch."""
    info, arrays = read(path)
    weights = {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}
    try:
        model.set_weights(weights)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path} does not fit the model: {e}") from None
    return info, arrays


def load(path, model, optimizer=None):
    """Restore weights and, when given, the optimizer state; returns the checkpoint's meta dict.

    The optimizer state is checked before anything is written, so a checkpoint of another
    optimizer leaves the model untouched.
    """
    info, arrays = read(path)
    if optimizer is not None:
        state = dict(info.get("optimizer") or {})
        if not state:
            raise CheckpointError(f"checkpoint {path} has no optimizer state")
        state["arrays"] = {k[len("optim/"):]: v for k, v in arrays.items() if k.startswith("optim/")}
        if state.get("name") != optimizer.name or set(state["arrays"]) != set(optimizer.slots):
            raise CheckpointError(f"checkpoint {path} holds {state.get('name')!r} optimizer state, "
                                  f"not {optimizer.name!r}")
    load_weights(path, model)
    if optimizer is not None:
        try:
            optimizer.load_state_dict(state)
        except ValueError as e:
            raise CheckpointError(f"checkpoint {path}: {e}") from None
    return info["meta"]


def load_model(path, **kwargs):
    """Rebuild the model a checkpoint describes and load its weights; kwargs go to Model."""
    from .graph import Model
    info, _ = read(path)
    model = Model.from_config(info["model"], **kwargs)
    load_weights(path, model)
    return model
