"""Checkpoints: tensors and JSON metadata in one .npz, no pickle, written by minidl.files' writer.

A checkpoint holds the architecture (Model.config()), every parameter and running statistic,
the optimizer's state, the step and the random generator state, so a resumed run continues
exactly where the saved one stopped; and the data it was trained on (`data`, checkpoint_data),
so `minidl infer` scores it on its own data.
"""
from __future__ import annotations

import json
import os
import zipfile
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import files
from ..files.base import CheckpointError, check_readable as _check_readable   # CheckpointError: minidl.checkpoint's
from .checkpoint_data import data_record, dataset_of, read_info  # noqa: F401 (dl.checkpoint.read_info: docs)
from ..files.kinds import of_format
from .partial_load import load_matching

if TYPE_CHECKING:
    from ..graph.model import Model
    from ..optim.base import Optimizer

FORMAT = "minidl-checkpoint-1"


def write_npz(path: str | os.PathLike, arrays: dict[str, np.ndarray], info: dict[str, Any],
              replace: bool = True) -> str | os.PathLike:
    """Write tensors and a JSON record as one .npz through minidl.files' writer (regular files only,
    through symlinks, temp file + fsync + rename); replace=False never replaces an existing file."""
    arrays = dict(arrays, __meta__=np.frombuffer(json.dumps(info).encode(), dtype=np.uint8))
    # numpy's stub types **kwds of savez as its allow_pickle flag; never onto another kind (files.kinds)
    return files.write_atomic(path, lambda f: np.savez(f, **arrays), replace=replace,  # type: ignore[arg-type]
                              kind_written=of_format(info.get("format")))


unwritable = files.problem        # why a file cannot be written at a path, or None


def read_npz(path: str | os.PathLike, what: str = "checkpoint",
             error: type[ValueError] | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(info dict, {name: array}) of a file written by write_npz; `error` (a ValueError class)
    names the file for anything missing, corrupt or not ours."""
    error = error or CheckpointError
    path = os.fspath(path)
    _check_readable(path, what, error)
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
    except Exception as e:  # noqa: BLE001 (a crafted file fails in any way: named, never a traceback)
        raise error(f"{what} {path} is not a readable minidl {what}: {type(e).__name__}: {e}") from None
    for k, a in arrays.items():
        if a.dtype.kind not in "fiub":
            raise error(f"{what} {path}: tensor {k} has dtype {a.dtype}, expected numbers")
    check_finite(arrays, f"{what} {path}", error)
    return info, arrays


def check_finite(arrays: dict[str, np.ndarray], where: str, error: type[ValueError] | None = None) -> None:
    """Refuse tensors holding NaN or infinity, naming the first: a broken file must not load as a
    model that predicts at chance, nor resume into a loss of NaN blamed on training."""
    for k, a in arrays.items():
        if a.dtype.kind == "f" or a.dtype.name == "bfloat16":
            bad = ~np.isfinite(a.astype(np.float32) if a.dtype.name == "bfloat16" else a)
            if bad.any():
                raise (error or CheckpointError)(
                    f"{where}: tensor {k} holds {int(bad.sum())} non-finite value(s) (NaN or infinity) "
                    f"of {a.size}: refused")


def _check_members(path):
    """Every member stored uncompressed, as np.savez writes them, so reading allocates no more
    than the file's own size (a compressed member could expand to anything)."""
    with zipfile.ZipFile(path) as z:
        for m in z.infolist():
            if m.compress_type != zipfile.ZIP_STORED or m.file_size != m.compress_size:
                raise ValueError(f"member {m.filename} is compressed; minidl writes stored members only")
        if "__meta__.npy" not in z.namelist():
            raise ValueError("it has no JSON record (__meta__)")


def save(path: str | os.PathLike, model: Model, optimizer: Optimizer | None = None,
         meta: dict[str, Any] | None = None) -> str | os.PathLike:
    """Write model (+ optimizer) state and its data record (checkpoint_data) to `path` atomically."""
    arrays = {f"param/{k}": v for k, v in model.get_weights().items()}
    meta = meta or {}
    info = {"format": FORMAT, "model": model.config(), "meta": meta, "data": data_record(model, meta)}
    if optimizer is not None and optimizer.model is not None:
        state = optimizer.state_dict()
        arrays.update({f"optim/{k}": v for k, v in state.pop("arrays").items()})
        info["optimizer"] = state
    return write_npz(path, arrays, info)


def read(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(info dict, {name: array}) of a checkpoint; CheckpointError names the file if it is bad.

    Parameters and optimizer state must be floating point and finite: an int8 tensor is not a
    float32 checkpoint (converting it would load garbage), a NaN is a broken one.
    """
    info, arrays = read_npz(path)
    if info.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: unknown format {info.get('format')!r}")
    for k, a in arrays.items():
        if k.startswith(("param/", "optim/")) and a.dtype.kind != "f":
            raise CheckpointError(f"checkpoint {path}: tensor {k} is {a.dtype}, expected floating point "
                                  f"(minidl saves float32)")
    return info, arrays


def first_difference(saved: Any, built: dict[str, Any]) -> str | None:
    """Where two Model.config() records differ, in words ('layer 3 (relu_1): ...'), or None.

    The model's own name is not architecture and is skipped; layer names are compared by the
    weights' names already. A Normalize of MNIST's mean and std at the input (layers.Normalize, what the
    zoo carries) is what the Loader applied to a model from before it: the two are the same model, so a
    checkpoint from before loads into today's zoo model (and back), with the same weights.
    """
    from ..data.loader import MNIST_MEAN, MNIST_STD
    from ..graph.config import without_preprocessing
    why = _difference(saved, built)
    if why and isinstance(saved, dict) and _difference(without_preprocessing(saved, MNIST_MEAN, MNIST_STD),
                                                       without_preprocessing(built, MNIST_MEAN, MNIST_STD)) is None:
        return None
    return why


def _difference(saved: Any, built: dict[str, Any]) -> str | None:
    if not isinstance(saved, dict):
        return "it holds no model config"
    built = json.loads(json.dumps(built))            # tuples as lists, as the file holds them
    for key in ("inputs", "outputs"):
        if saved.get(key) != built.get(key):
            return f"its model {key} are {saved.get(key)!r}, the model's {built.get(key)!r}"[:200]
    a, b = saved.get("layers"), built["layers"]
    if not isinstance(a, list) or len(a) != len(b):
        return f"it has {len(a) if isinstance(a, list) else 'no'} layers, the model {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        where = f"layer {i} ({y['name']})"
        if not isinstance(x, dict) or x.get("class") != y["class"]:
            return f"{where} is {x.get('class') if isinstance(x, dict) else x!r} in it, {y['class']} in the model"
        if None not in (x.get("module"), y.get("module")) and _home(x["module"]) != _home(y["module"]):
            # a user's ReLU is not minidl's ReLU (a config from before modules were recorded: by class alone)
            return f"{where} is {y['class']} of module {x.get('module')!r} in it, of {y.get('module')!r} in the model"
        if x.get("inputs") != y["inputs"]:
            return f"{where} reads layers {x.get('inputs')!r} in it, {y['inputs']!r} in the model"
        cx, cy = x.get("config"), y["config"]
        if cx != cy:
            if not isinstance(cx, dict):
                return f"{where} has no config in it"
            key = next(k for k in sorted(set(cx) | set(cy)) if cx.get(k, "(none)") != cy.get(k, "(none)"))
            return f"{where} has {key}={cx.get(key, '(none)')!r} in it, {cy.get(key, '(none)')!r} in the model"[:200]
    return None


def _home(module: Any) -> Any:
    """A layer class's module as configs compare it: every module of minidl counts as one (classes move
    between minidl's files)."""
    return "minidl" if isinstance(module, str) and module.split(".")[0] == "minidl" else module


def _check_config(path, info, model, what="checkpoint"):
    """The model a file was saved from must be the model built: same layers, arguments and edges."""
    why = first_difference(info.get("model"), model.config())
    if why:
        raise CheckpointError(f"{what} {path} was saved from another model: {why}")


def _weights(arrays):
    return {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}


def _meta(path, info, required=False):
    """The run's record (step, seed, rng, plan); required: a resume needs it (without it the run
    would start again from step 0 with trained weights)."""
    if required and not (isinstance(info.get("meta"), dict) and "step" in info["meta"]):
        raise CheckpointError(f"checkpoint {path} has no meta record (step, seed, rng): it cannot be resumed; "
                              f"-l loads its weights into a new run")
    meta = info.get("meta", {})
    ok = isinstance(meta, dict) and all(type(meta.get(k, 0)) is int and meta.get(k, 0) >= 0 for k in ("step", "seed"))
    if not ok or not isinstance(meta.get("rng", {}), dict):
        raise CheckpointError(f"checkpoint {path}: its meta record (step, seed, rng) is malformed: {meta!r}"[:300])
    return meta


def load_weights(path: str | os.PathLike, model: Model, strict: bool = True) -> Any:
    """A checkpoint's (.safetensors file's) weights into `model`; strict=False: those that fit (partial_load.py)."""
    if _is_safetensors(path) or not strict:        # strict=False: what fits, and what did not (partial_load.py)
        return _load_safetensors(path, model) if strict else load_matching(
            read_safetensors(path)[1] if _is_safetensors(path) else _weights(read(path)[1]), model)
    info, arrays = read(path)
    try:
        model._check_weights(_weights(arrays), strict=True)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path} does not fit the model: {e}") from None
    _check_config(path, info, model)
    model.set_weights(_weights(arrays))
    return info, arrays


def load(path: str | os.PathLike, model: Model, optimizer: Optimizer | None = None) -> dict[str, Any]:
    """Restore weights and, when given, the optimizer state; returns the checkpoint's meta dict.

    Everything is checked before anything is written: the weights against the model (a wrong
    model is named by its first mismatching layer), then the optimizer state.
    """
    info, arrays = read(path)
    meta, weights = _meta(path, info, required=optimizer is not None), _weights(arrays)
    try:
        model._check_weights(weights, strict=True)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path} does not fit the model: {e}") from None
    _check_config(path, info, model)
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


def load_model(path: str | os.PathLike, **kwargs: Any) -> Model:
    """Rebuild the model a checkpoint describes and load its weights; kwargs go to Model.

    The config is validated and every tensor checked against it before anything is allocated; a file from
    before the input contract gets the Normalize its training applied (graph.config.with_preprocessing).
    """
    from ..data.loader import MNIST_MEAN, MNIST_STD
    from ..graph import Model
    from ..graph.config import with_preprocessing
    if _is_safetensors(path):
        config, _ = read_safetensors(path)
        try:
            model = Model.from_config(with_preprocessing(config, MNIST_MEAN, MNIST_STD), **kwargs)
        except ValueError as e:
            raise CheckpointError(f"weights {path}: {e}") from None
        _load_safetensors(path, model)
        return model
    info, arrays = read(path)
    try:
        # a missing or malformed config is from_config's ValueError, named below
        return Model.from_config(with_preprocessing(info.get("model"), MNIST_MEAN, MNIST_STD),
                                 weights=_weights(arrays), **kwargs)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {path}: {e}") from None


# -- .safetensors weights (python -m minidl.export --safetensors) ---------------------------------
SAFETENSORS_FORMAT = "minidl-safetensors-1"


def _is_safetensors(path):
    return os.fspath(path).endswith(".safetensors")


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(model config, {PyTorch name: array}) of a .safetensors file written by minidl.export.

    Its tensors carry the PyTorch twin's names (minidl.checkpoint.torch_names); its metadata the architecture.
    """
    path = os.fspath(path)
    _check_readable(path, "weights", CheckpointError)
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
    except Exception as e:  # noqa: BLE001 (a crafted file fails in any way: named, never a traceback)
        raise CheckpointError(f"weights {path} is not a readable .safetensors file: {type(e).__name__}: {e}") from None
    if meta.get("format") != SAFETENSORS_FORMAT or not isinstance(config, dict):
        raise CheckpointError(f"weights {path}: no minidl model in its metadata (format "
                              f"{meta.get('format')!r}); written by something other than minidl.export")
    for k, a in tensors.items():
        if a.dtype.kind != "f" and not k.endswith("num_batches_tracked"):      # PyTorch's BN step counter
            raise CheckpointError(f"weights {path}: tensor {k} is {a.dtype}, expected floating point")
    check_finite(tensors, f"weights {path}")
    return config, tensors


def _load_safetensors(path, model):
    from .torch_names import from_torch
    config, tensors = read_safetensors(path)
    try:
        weights = from_torch(tensors, model)
        model._check_weights(weights, strict=True)
    except ValueError as e:
        raise CheckpointError(f"weights {path} do not fit the model: {e}") from None
    _check_config(path, {"model": config}, model, "weights")
    model.set_weights(weights)
    return {"format": SAFETENSORS_FORMAT, "model": config}, tensors
