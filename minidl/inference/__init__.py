"""Optimised inference: a trained Model lowered by the inference passes, scheduled, replayed.

    m = minidl.inference.compile(model)            # or compile("checkpoints/lenet5.npz", device="cuda")
    y = m.predict(x)                               # logits (probabilities=True keeps the Softmax)
    m.save("lenet5.artifact.npz"); m = minidl.inference.load("lenet5.artifact.npz")

`compile` copies the model's graph and runs minidl.graph.passes.inference on it (dropout removed,
zero pads and BN folded into the convs, ReLUs fused, the final Softmax dropped unless asked for),
builds the result as a Model of its own on the chosen device, and schedules it into kernel
calls (minidl.inference.schedule). Weights only, in float32 by default.
"""
import os

import numpy as np

from ..backend import get_device
from ..graph import Graph, Model, passes
from .artifact import ArtifactError, read as _read
from .model import InferenceModel, OpTime
from .schedule import CHAIN_MAX_BATCH

__all__ = ["compile", "lower", "load", "InferenceModel", "ArtifactError", "OpTime", "CHAIN_MAX_BATCH"]


def load(path, device=None):
    """An InferenceModel from an artifact written by InferenceModel.save, on `device` (None: 'auto').

    The file is checked first (format, dtype, the graph's config, every tensor's name and shape),
    so a bad file is one ArtifactError naming it, before anything is allocated.
    """
    return InferenceModel(*_read(path, device))


def compile(model_or_checkpoint_path, device=None, probabilities=False, dtype="float32", direct=True):
    """An InferenceModel of a trained Model, or of the model a checkpoint file describes.

    device: 'cpu', 'cuda', 'auto' or a Device; None keeps the model's device ('auto' for a path).
    probabilities: keep a final Softmax (else the model outputs logits).
    direct: schedule the fused direct kernels (conv+ReLU+pool, dense chains, whole small models).
    """
    source = model_or_checkpoint_path
    if isinstance(source, (str, os.PathLike)):
        from ..checkpoint import load_model
        model = load_model(os.fspath(source), device="cpu")          # folding is host work
        device = "auto" if device is None else device
    else:
        model = source
        device = model.device if device is None else device
    lowered, stats = lower(model, device, probabilities, dtype)
    return InferenceModel(lowered, probabilities, stats, direct)


def lower(model, device="cpu", probabilities=False, dtype="float32"):
    """(the inference lowering of `model` as a Model on `device`, what the passes did): the graph
    after minidl.graph.passes.inference, BN folded in float64 and then cast to `dtype`."""
    weights = {k: v.astype(np.float64) for k, v in model.get_weights().items()}
    graph = passes.inference(Graph.of(model, weights=weights), probabilities)
    dev = get_device(device, dtype=dtype)
    dev = dev if dev.dtype == np.dtype(dtype) else dev.with_dtype(dtype)
    lowered = Model.of_graph(graph, dev, name=model.name, weights=graph.weights)
    return lowered, {"layers": len(model.layers), "nodes": len(lowered.nodes), **graph.stats}
