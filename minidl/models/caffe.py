"""The small nets of the cuDNN-vs-PyTorch study: SimpleNet, Caffe's LeNet, ReLUNet and LargeNet.

All take 28x28 MNIST digits, start with Normalize of MNIST's mean and std, so they take images
(docs/input.md; preprocess=False: without it, reading the [0, 1] images as they are), and
end in a Softmax (the passes drop it for training).
Caffe's LeNet has no activation after its convolutions; ReLUNet is the same net with a ReLU after
each. Weights Glorot-uniform (Caffe's "xavier" filler), biases zero.
"""
from __future__ import annotations

from typing import Any

from .. import layers as L
from ..graph import Model, Sequential
from ._input import preprocessing

W_INIT = "glorot_uniform"


def _conv(filters, ksize, relu):
    """conv filters@ksize x ksize (no padding) [-> ReLU] -> max-pool 2."""
    conv = [L.Conv2D(filters, ksize, w_init=W_INIT)]
    return conv + ([L.ReLU()] if relu else []) + [L.MaxPool2D(2)]


def _head(hidden, classes):
    """Flatten -> [dense hidden -> ReLU] -> dense classes -> Softmax."""
    mid = [L.Dense(hidden, w_init=W_INIT), L.ReLU()] if hidden else []
    return [L.Flatten(), *mid, L.Dense(classes, w_init=W_INIT), L.Softmax()]


def simplenet(input_shape: tuple[int, ...] = (1, 28, 28), classes: int = 10, preprocess: bool = True,
              **model_kwargs: Any) -> Model:
    """conv 20@5x5, max-pool 2, dense 2880 -> classes.   x (N, 1, 28, 28) -> (N, classes); 29,330 params."""
    model_kwargs.setdefault("name", "simplenet")
    return Sequential([*preprocessing(preprocess), *_conv(20, 5, False), *_head(0, classes)], input_shape,
                      **model_kwargs)


def lenet_caffe(input_shape: tuple[int, ...] = (1, 28, 28), classes: int = 10, relu: bool = False,
                preprocess: bool = True, **model_kwargs: Any) -> Model:
    """Caffe's LeNet: conv 20@5x5, pool, conv 50@5x5, pool, dense 800 -> 500, ReLU, dense 500 -> classes.

    x (N, 1, 28, 28) -> (N, classes); 431,080 params. relu=True adds a ReLU after each conv (ReLUNet).
    """
    model_kwargs.setdefault("name", "relunet" if relu else "lenet_caffe")
    layers = [*preprocessing(preprocess), *_conv(20, 5, relu), *_conv(50, 5, relu), *_head(500, classes)]
    return Sequential(layers, input_shape, **model_kwargs)


def relunet(input_shape: tuple[int, ...] = (1, 28, 28), classes: int = 10, preprocess: bool = True,
            **model_kwargs: Any) -> Model:
    """Caffe's LeNet with a ReLU after each conv.   x (N, 1, 28, 28) -> (N, classes)."""
    return lenet_caffe(input_shape, classes, relu=True, preprocess=preprocess, **model_kwargs)


def largenet(input_shape: tuple[int, ...] = (1, 28, 28), classes: int = 10, preprocess: bool = True,
             **model_kwargs: Any) -> Model:
    """conv 20@3x3, pool, conv 50@3x3, pool, conv 70@3x3, pool, dense 70 -> 500, ReLU, 500 -> classes.

    x (N, 1, 28, 28) -> (N, classes); spatially 28 -> 26 -> 13 -> 11 -> 5 -> 3 -> 1. As in Caffe's
    LeNet, no activation after the convs (the max-pools are the non-linearity there).
    """
    model_kwargs.setdefault("name", "largenet")
    layers = [*preprocessing(preprocess), *_conv(20, 3, False), *_conv(50, 3, False), *_conv(70, 3, False),
              *_head(500, classes)]
    return Sequential(layers, input_shape, **model_kwargs)
