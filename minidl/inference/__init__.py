"""Optimised inference: a trained Model lowered by the inference passes, scheduled, replayed.

    m = minidl.inference.compile(model)            # or compile("checkpoints/lenet5.npz", device="cuda")
    y = m.predict(x)                               # model.predict(x)'s outputs (probabilities=False: logits)
    m.save("lenet5.artifact.npz"); m = minidl.inference.load("lenet5.artifact.npz")

`compile` copies the model's graph and runs minidl.graph.passes.inference on it (dropout removed,
zero pads and BN folded into the convs, ReLUs fused, the final Softmax kept unless probabilities=False),
builds the result as a Model of its own on the chosen device, and schedules it into kernel
calls (minidl.inference.schedule). Weights only, in float32 by default; `precision='bf16'` or
'fp16' runs the convolutions, dense layers and activations in that dtype (BN folded in float64
first, then rounded) and saves artifacts in it, at half the size. The compiled model takes the images
Model.predict takes (docs/input.md): uint8 in [0, 255] or floats in [0, 1], (N, H, W) or (N, C, H, W);
a model's Normalize is folded into the first conv where exact (no padding there), else one
elementwise kernel.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import precision as _precision
from ..backend import get_device
from ..graph import Graph, Model, passes
from .artifact import ArtifactError, read as _read
from .model import InferenceModel, OpTime
from .schedule import CHAIN_MAX_BATCH

if TYPE_CHECKING:
    from .._types import DTypeLike
    from ..backend import Device
    from ..precision import Policy

__all__ = ["compile", "lower", "load", "InferenceModel", "ArtifactError", "OpTime", "CHAIN_MAX_BATCH"]


def load(path: str | os.PathLike, device: str | Device | None = None) -> InferenceModel:
    """An InferenceModel from an artifact written by InferenceModel.save, on `device` (None: 'auto').

    The file is checked first (format, dtype, the graph's config, every tensor's name and shape),
    so a bad file is one ArtifactError naming it, before anything is allocated.
    """
    model, probabilities, stats, precision, images = _read(path, device)
    return InferenceModel(model, probabilities, stats, precision=precision, images=images,
                          dataset=_dataset_of(path, "artifact"))


def compile(model_or_checkpoint_path: Model | str | os.PathLike, device: str | Device | None = None,
            probabilities: bool | None = None, dtype: DTypeLike = "float32", direct: bool = True,
            precision: Policy | str | None = None, channels_last: bool | None = None) -> InferenceModel:
    """An InferenceModel of a trained Model, or of the model a checkpoint file describes.

    device: 'cpu', 'cuda', 'auto' or a Device; None keeps the model's device ('auto' for a path).
    probabilities: None or True keep a final Softmax, so predict gives the model's own outputs (what
    Model.predict gives); False drops it: logits (argmax unchanged, one kernel fewer).
    direct: schedule the fused direct kernels (conv+ReLU+pool, dense chains, whole small models).
    precision: 'fp32' (None), 'bf16' or 'fp16': the policy's compute dtype for every layer but
    those that keep float32 (an unfolded BN, a kept Softmax); inputs and outputs stay float32.
    channels_last: convolutions write NHWC activations (None: where the device finds it faster, the
    GPU in bf16/fp16); the direct kernels read NCHW, so a channels-last model runs layer by layer.
    """
    source, dataset = model_or_checkpoint_path, None
    if isinstance(source, (str, os.PathLike)):
        from ..checkpoint import load_model
        model = load_model(os.fspath(source), device="cpu")          # folding is host work
        device = "auto" if device is None else device
        dataset = _dataset_of(source, "checkpoint")
    else:
        model = source
        device = model.device if device is None else device
    policy = _precision.policy(precision)
    probabilities = probabilities is not False
    lowered, stats = lower(model, device, probabilities, dtype, policy, channels_last)
    return InferenceModel(lowered, probabilities, stats, direct and not stats.get("channels_last"), stats["precision"],
                          images=True, dataset=dataset)


def _dataset_of(path: str | os.PathLike, what: str) -> str | None:
    """The dataset a minidl .npz's record names (None: a .safetensors export, or a file that does not say)."""
    from ..checkpoint import checkpoint_data
    if not os.fspath(path).endswith(".npz"):
        return None
    return checkpoint_data.dataset_of(checkpoint_data.read_info(path, what))


def lower(model: Model, device: str | Device = "cpu", probabilities: bool = False, dtype: DTypeLike = "float32",
          policy: Policy | str | None = None, channels_last: bool | None = None) -> tuple[Model, dict[str, Any]]:
    """(the inference lowering of `model` as a Model on `device`, what the passes did): the graph
    after minidl.graph.passes.inference, BN folded in float64 and then cast to `dtype`; under a
    mixed precision `policy` the cast pass after it (weights rounded to its compute dtype)."""
    policy = _precision.policy(policy)
    if policy.mixed and np.dtype(dtype) != policy.param:
        raise ValueError(f"precision {policy.name} runs a {policy.param.name} model, not dtype {np.dtype(dtype).name}")
    weights = {k: v.astype(np.float64) for k, v in model.get_weights().items()}
    dev = get_device(device, dtype=dtype)
    dev = dev if dev.dtype == np.dtype(dtype) else dev.with_dtype(dtype)
    graph = passes.inference(Graph.of(model, weights=weights), probabilities)
    policy, cl = passes.precision_and_layout(graph.nodes, dev, policy, channels_last)    # fp32 where half cannot pay
    if cl:
        graph = passes.channels_last(graph)
    graph = passes.cast(graph, policy.compute, policy.param)
    lowered = Model.of_graph(graph, dev, name=model.name, weights=graph.weights)
    return lowered, {"layers": len(model.layers), "nodes": len(lowered.nodes), "precision": policy.name, **graph.stats}
