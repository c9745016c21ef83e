"""torchvision's ResNet-18/34/50/101/152 weights into the zoo's ResNet (minidl.models.resnet).

The two are one architecture (stem conv 7x7/2 + BN + ReLU + max-pool 3x3/2; basic or bottleneck
blocks with the stride on the 3x3 conv and a 1x1 conv + BN projection where the shape changes;
global average pooling; fc), so loading is a name map, the shapes checked:

    conv1, bn1                      -> the stem's conv2d, fbn
    layerS.I.downsample.0, .1       -> the block's shortcut conv2d, fbn (minidl builds it first)
    layerS.I.convJ, bnJ             -> the block's branch, in order
    fc                              -> dense

Parameter by parameter: a conv's or fc's weight and bias are minidl's w and b (the same layouts,
(K, C, kH, kW) and (units, features)); a BatchNorm2d's weight, bias, running_mean, running_var are
gamma, beta and the running statistics (checkpoint/torch_names.py's table); num_batches_tracked has no
counterpart and is skipped. The zoo's layers are read in graph order, which is torchvision's module
order but for the shortcut, listed first in each block.
"""
from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from ..checkpoint.torch_names import BN_COUNTER, PARAMS

if TYPE_CHECKING:
    from ..graph.model import Model

_LAYER = re.compile(r"layer(\d)\.(\d+)\.")


def torchvision_names(state_dict: Mapping[str, Any]) -> list[tuple[str, str]]:
    """[(torchvision module, its kind: 'conv2d', 'batchnorm' or 'dense')] of a ResNet state dict, in the
    zoo's graph order; the block type and the blocks per stage are read from the keys."""
    keys = set(state_dict)
    bottleneck = any(k.endswith(".conv3.weight") for k in keys)
    blocks = [1 + max((int(m.group(2)) for k in keys if (m := _LAYER.match(k)) and m.group(1) == str(s)), default=-1)
              for s in range(1, 5)]
    if "conv1.weight" not in keys or "fc.weight" not in keys or min(blocks) < 1:
        raise ValueError("not a torchvision ResNet state dict: expected conv1.weight, layer1.0 ... layer4.0 and "
                         f"fc.weight, got {len(keys)} keys starting {sorted(keys)[:3]}")
    names = [("conv1", "conv2d"), ("bn1", "batchnorm")]
    for s, n in enumerate(blocks, 1):
        for i in range(n):
            stem = f"layer{s}.{i}."
            if f"{stem}downsample.0.weight" in keys:
                names += [(stem + "downsample.0", "conv2d"), (stem + "downsample.1", "batchnorm")]
            for j in range(1, 4 if bottleneck else 3):
                names += [(f"{stem}conv{j}", "conv2d"), (f"{stem}bn{j}", "batchnorm")]
    return names + [("fc", "dense")]


def _read(state_dict_or_path: Any) -> dict[str, np.ndarray]:
    """{key: float NumPy array} of a state dict, or of a .pth/.pt (torch.load) or .safetensors file."""
    if isinstance(state_dict_or_path, (str, os.PathLike)):
        path = os.fspath(state_dict_or_path)
        if path.endswith(".safetensors"):
            from safetensors.numpy import load_file
            sd: Any = load_file(path)
        else:
            try:
                import torch
            except ImportError:
                raise ImportError(f"reading {path} needs PyTorch (torch.load); pass a state dict of NumPy "
                                  f"arrays or a .safetensors file instead") from None
            sd = torch.load(path, map_location="cpu", weights_only=True)
            sd = sd.get("state_dict", sd) if isinstance(sd, dict) else sd
    else:
        sd = state_dict_or_path
    if not isinstance(sd, Mapping):
        raise TypeError(f"expected a state dict (a mapping of names to tensors), got {type(sd).__name__}")
    return {k: np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v) for k, v in sd.items()}


def load_torchvision_resnet(model: Model, state_dict_or_path: Mapping[str, Any] | str | os.PathLike) -> Model:
    """Copy a torchvision ResNet's weights into `model`, a zoo ResNet of the same depth; returns `model`.

    state_dict_or_path: `torchvision.models.resnet18().state_dict()` (tensors or NumPy arrays), or a
    file: .pth/.pt (read with torch.load) or .safetensors. Build the model as torchvision's:
    `models.resnet(18, input_shape=(3, H, W), classes=1000, preprocess=False)` (any H, W; with
    preprocess=True the model normalises by MNIST's mean and std first, which torchvision's does not).
    Every name and shape is checked before anything is copied; a mismatch is one ValueError naming it.
    """
    sd: dict[str, np.ndarray] = _read(state_dict_or_path)
    names = torchvision_names(sd)
    layers = [n.layer for n in model.nodes if n.kind in ("conv2d", "batchnorm", "dense")]
    if len(layers) != len(names):
        raise ValueError(f"{model.name} has {len(layers)} conv, BN and dense layers, the torchvision ResNet "
                         f"{len(names)}: build the zoo ResNet of the same depth")
    weights, used = {}, {k for k in sd if k.endswith(BN_COUNTER)}
    for layer, (tv, kind) in zip(layers, names):
        if layer.kind != kind:
            raise ValueError(f"{model.name}: layer {layer.name} is {layer.kind}, torchvision's {tv} is {kind}")
        for ours, theirs in PARAMS[kind].items():
            if ours not in layer.params:
                continue                                   # a conv without bias
            key, want = f"{tv}.{theirs}", layer.params[ours].shape
            if key not in sd:
                raise ValueError(f"the state dict has no {key} for {model.name}'s {layer.name}/{ours} {want}")
            if sd[key].shape != want:
                raise ValueError(f"{key} has shape {sd[key].shape}, {model.name}'s {layer.name}/{ours} {want}"
                                 + (" (build the model with classes=" + str(sd[key].shape[0]) + ")"
                                    if kind == "dense" else ""))
            weights[f"{layer.name}/{ours}"] = sd[key]
            used.add(key)
    extra = sorted(set(sd) - used)
    if extra:
        raise ValueError(f"the state dict has {len(extra)} keys {model.name} has no place for, e.g. {extra[0]}")
    model.set_weights(weights)
    return model
