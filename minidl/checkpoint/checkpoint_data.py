"""What a checkpoint says about the data it was trained on, and its JSON record read alone.

    info = read_info("checkpoints/lenet5.npz")      # no tensor read
    dataset_of(info)                                 # "mnist", or None for a checkpoint from before

Every checkpoint holds a record `data`: the dataset's name where the run knew it (its meta's
"dataset", else its plan's, as every command-line run has), the model's input shape and its number
of classes. `minidl infer` scores a checkpoint on its own dataset and refuses another; `minidl
train` refuses to replace a checkpoint of a run on another dataset.
"""
from __future__ import annotations

import json
import os
import zipfile
from typing import TYPE_CHECKING, Any

import numpy as np

from ..files.base import CheckpointError, check_readable
if TYPE_CHECKING:
    from ..graph.model import Model

MAX_RECORD = 64 << 20          # bytes: a JSON record larger than this is no minidl file's


def data_record(model: Model, meta: dict[str, Any]) -> dict[str, Any]:
    """The `data` record of a checkpoint of `model` whose run's record is `meta`."""
    plan = meta.get("plan")
    name = meta.get("dataset") or (plan.get("dataset") if isinstance(plan, dict) else None)
    shape, out = model.inputs[0].shape[1:], model.outputs[0].shape
    return {"dataset": name if isinstance(name, str) else None, "input_shape": list(shape),
            "classes": out[1] if len(out) == 2 else None}


def read_info(path: str | os.PathLike, what: str = "checkpoint") -> dict[str, Any]:
    """The JSON record of a file written by write_npz, read alone (no tensor is read); CheckpointError
    names the file when it is none."""
    path = os.fspath(path)
    check_readable(path, what, CheckpointError)
    try:
        with zipfile.ZipFile(path) as z:
            member = z.getinfo("__meta__.npy")
            if member.compress_type != zipfile.ZIP_STORED or member.file_size > MAX_RECORD:
                raise ValueError("its JSON record is compressed or too large")
            with z.open(member) as f:
                info = json.loads(np.lib.format.read_array(f, allow_pickle=False).tobytes())
        if not isinstance(info, dict):
            raise ValueError("its JSON record is not an object")
    except Exception as e:  # noqa: BLE001 (a crafted file fails in any way: named, never a traceback)
        raise CheckpointError(f"{what} {path} is not a readable minidl {what}: {type(e).__name__}: {e}") from None
    return info


def dataset_of(info: dict[str, Any]) -> str | None:
    """The name of the dataset a checkpoint's run trained on (its `data` record, else its plan's), or
    None for a file that does not say (a checkpoint from before, or a run in Python that did not name it)."""
    data, meta = info.get("data"), info.get("meta")
    name = data.get("dataset") if isinstance(data, dict) else None
    if name is None and isinstance(meta, dict):
        plan = meta.get("plan")
        name = meta.get("dataset") or (plan.get("dataset") if isinstance(plan, dict) else None)
    return name if isinstance(name, str) else None
