"""Checkpoints: tensors and JSON metadata in one .npz, no pickle, written atomically.

A checkpoint holds the architecture (Model.config()), every parameter and running statistic,
the optimizer's state, the step and the random generator state, so a resumed run continues
exactly where the saved one stopped.
"""
import json
import os
import tempfile
import zipfile

import numpy as np

FORMAT = "minidl-checkpoint-1"


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or does not fit the model."""


def write_npz(path, arrays, info):
    """Write tensors and a JSON record as one .npz, atomically: a temporary file, then rename."""
    arrays = dict(arrays, __meta__=np.frombuffer(json.dumps(info).encode(), dtype=np.uint8))
    folder, base = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    prefix = f".{base}.tmp-"
    _remove_stale(folder, prefix)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".npz")
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


def unwritable(path):
    """Why a file cannot be written at `path` (its folder is created if missing), or None."""
    if os.path.isdir(path):
        return "is a directory"
    folder = os.path.dirname(path) or "."
    parent = folder
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        return f"cannot be written ({parent} is a file, not a folder)"
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".minidl-write-test-"):
            pass
    except OSError as e:
        return f"cannot be written ({e.strerror or e})"
    return None


def _remove_stale(folder, prefix):
    """Temporary files of this target left by a save that was killed (kill -9) before its rename."""
    for name in os.listdir(folder):
        if name.startswith(prefix) and name.endswith(".npz"):
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


def read_npz(path, what="checkpoint", error=None):
    """(info dict, {name: array}) of a file written by write_npz; `error` (a ValueError class)
    names the file for anything missing, corrupt or not ours."""
    error = error or CheckpointError
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise error(f"{what} {path}: no such file")
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":
            raise error(f"{what} {path} is not a minidl {what}: not an .npz (zip) archive")
    try:
        _check_members(path)
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        info = json.loads(arrays.pop("__meta__").tobytes())
        if not isinstance(info, dict):
            raise ValueError("its JSON record is not an object")
    except Exception as e:
        raise error(f"{what} {path} is not a readable minidl {what}: {type(e).__name__}: {e}") from None
    for k, a in arrays.items():
        if a.dtype.kind not in "fiub":
            raise error(f"{what} {path}: tensor {k} has dtype {a.dtype}, expected numbers")
    return info, arrays


def _check_members(path):
    """Every member stored uncompressed, as np.savez writes them, so reading allocates no more
    than the file's own size (a compressed member could expand to anything)."""
    with zipfile.ZipFile(path) as z:
        for m in z.infolist():
            if m.compress_type != zipfile.ZIP_STORED or m.file_size != m.compress_size:
                raise ValueError(f"member {m.filename} is compressed; minidl writes stored members only")
        if "__meta__.npy" not in z.namelist():
            raise ValueError("it has no JSON record (__meta__)")


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


def _weights(arrays):
    return {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}


def _meta(path, info):
    meta = info.get("meta", {})
    ok = isinstance(meta, dict) and all(type(meta.get(k, 0)) is int and meta.get(k, 0) >= 0 for k in ("step", "seed"))
    if not ok or not isinstance(meta.get("rng", {}), dict):
        raise CheckpointError(f"checkpoint {path}: its meta record (step, seed, rng) is malformed: {meta!r}"[:300])
    return meta


def load_weights(path, model):
    """Copy a checkpoint's (or a .safetensors file's) parameters and statistics into `model`."""
    if _is_safetensors(path):
        return _load_safetensors(path, model)
    info, arrays = read(path)
    try:
        model.set_weights(_weights(arrays))
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path} does not fit the model: {e}") from None
    return info, arrays


def load(path, model, optimizer=None):
    """Restore weights and, when given, the optimizer state; returns the checkpoint's meta dict.

    Everything is checked before anything is written: the weights against the model (a wrong
    model is named by its first mismatching layer), then the optimizer state.
    """
    info, arrays = read(path)
    meta, weights = _meta(path, info), _weights(arrays)
    try:
        model._check_weights(weights, strict=True)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path} does not fit the model: {e}") from None
    if optimizer is not None:
        state = info.get("optimizer")
        if not isinstance(state, dict):
            raise CheckpointError(f"checkpoint {path} has no optimizer state")
        state = dict(state, arrays={k[len("optim/"):]: v for k, v in arrays.items() if k.startswith("optim/")})
        try:
            optimizer.load_state_dict(state)
        except ValueError as e:
            raise CheckpointError(f"checkpoint {path}: {e}") from None
    model.set_weights(weights)
    return meta


def load_model(path, **kwargs):
    """Rebuild the model a checkpoint describes and load its weights; kwargs go to Model.

    The config is validated and every tensor checked against it before anything is allocated.
    """
    from .graph import Model
    if _is_safetensors(path):
        config, _ = read_safetensors(path)
        try:
            model = Model.from_config(config, **kwargs)
        except ValueError as e:
            raise CheckpointError(f"weights {path}: {e}") from None
        _load_safetensors(path, model)
        return model
    info, arrays = read(path)
    try:
        return Model.from_config(info.get("model"), weights=_weights(arrays), **kwargs)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path}: {e}") from None


# -- .safetensors weights (python -m minidl.export --safetensors) ---------------------------------
SAFETENSORS_FORMAT = "minidl-safetensors-1"


def _is_safetensors(path):
    return os.fspath(path).endswith(".safetensors")


def read_safetensors(path):
    """(model config, {PyTorch name: array}) of a .safetensors file written by minidl.export.

    Its tensors carry the PyTorch twin's names (minidl.torch_names); its metadata the architecture.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"weights {path}: no such file")
    try:
        from safetensors import safe_open
    except ImportError:
        raise CheckpointError(f"weights {path}: reading .safetensors needs the safetensors package "
                              f"(pip install minidl[export])") from None
    try:
        with safe_open(path, "np") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        config = json.loads(meta["model"]) if "model" in meta else None
    except Exception as e:
        raise CheckpointError(f"weights {path} is not a readable .safetensors file: {type(e).__name__}: {e}") from None
    if meta.get("format") != SAFETENSORS_FORMAT or not isinstance(config, dict):
        raise CheckpointError(f"weights {path}: no minidl model in its metadata (format "
                              f"{meta.get('format')!r}); written by something other than minidl.export")
    return config, tensors


def _load_safetensors(path, model):
    from .torch_names import from_torch
    config, tensors = read_safetensors(path)
    try:
        model.set_weights(from_torch(tensors, model))
    except ValueError as e:
        raise CheckpointError(f"weights {path} do not fit the model: {e}") from None
    return {"format": SAFETENSORS_FORMAT, "model": config}, tensors
