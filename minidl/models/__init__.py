"""The model zoo: LeNet-5, ResNet-18/34/50/101/152 and the cuDNN-vs-PyTorch study's SimpleNet,
Caffe's LeNet, ReLUNet and LargeNet, by name through `get`."""
from __future__ import annotations

import re
from typing import Any, Callable

from ..graph import Model

from .caffe import largenet, lenet_caffe, relunet, simplenet
from .lenet import lenet5
from .resnet import RESNET_DEPTHS, build_resnet, resnet

MODELS: dict[str, Callable[..., Model]] = {                                 # name -> builder
    "lenet": lenet5, "lenet5": lenet5, "resnet": resnet,
    "simplenet": simplenet, "lenet-caffe": lenet_caffe, "lenet_caffe": lenet_caffe,
    "relunet": relunet, "largenet": largenet}


def _resolve(name, depth):
    """(key of MODELS, ResNet depth or None) of get's arguments; a ValueError for a name or depth it lacks."""
    key = str(name).lower()
    m = re.fullmatch(r"resnet-?(\d+)", key)
    if m:
        if depth is not None and int(depth) != int(m.group(1)):
            raise ValueError(f"model {name!r} contradicts depth={depth!r}")
        key, depth = "resnet", int(m.group(1))
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}: expected one of {', '.join(MODELS)} "
                         f"(resnet with depth {', '.join(map(str, RESNET_DEPTHS))})")
    if key == "resnet" and depth is None:          # its value is resnet()'s to check
        raise ValueError(f"resnet needs a depth: one of {', '.join(map(str, RESNET_DEPTHS))}")
    if key != "resnet" and depth is not None:
        raise ValueError(f"{key} takes no depth, got depth={depth!r}")
    return key, depth


def get(name: str, depth: int | None = None, **kw: Any) -> Model:
    """A model by name: get("lenet"), get("resnet", depth=50) or get("resnet50").

    kw go to the builder (input_shape, classes) and on to Model (device, dtype, seed, name).
    """
    key, depth = _resolve(name, depth)
    return resnet(depth, **kw) if key == "resnet" else MODELS[key](**kw)


def names() -> tuple[str, ...]:
    """Every name `get` takes without a depth: MODELS' and resnet18 ... resnet152 (the CLI's --model choices)."""
    return (*MODELS, *(f"resnet{d}" for d in RESNET_DEPTHS))


def tag(name: str, depth: int | None = None) -> str:
    """The one name of what get(name, depth) builds, whichever alias named it: lenet5, resnet50,
    simplenet, lenet-caffe, relunet, largenet (a run's plan and checkpoint file are named by it)."""
    key, depth = _resolve(name, depth)
    return f"resnet{depth}" if key == "resnet" else MODELS[key].__name__.replace("_", "-")


__all__ = ["MODELS", "RESNET_DEPTHS", "build_resnet", "get", "largenet", "lenet5", "lenet_caffe", "names", "relunet",
           "resnet", "simplenet", "tag"]
