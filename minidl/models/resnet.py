"""ResNet-18/34/50/101/152 (He et al., 2016) at any input size, in the C++ trainer's form at 28x28.

Stem: Normalize of MNIST's mean and std (preprocess=False: without it), Pad2D(3), conv 64@7x7 stride 2,
BN, ReLU, max-pool 3 stride 2 pad 1; four stages of residual blocks (widths 64, 128, 256, 512;
stride 2 in the first block of stages 2-4, on the 3x3 conv); global average pooling, Dense, Softmax.
This is torchvision's ResNet (v1.5: the stride on the 3x3 conv), so its weights load at any input
size (minidl.interop). A 28x28 or 32x32 input leaves the last stage 1x1, where the pool is the
identity: there the head is Flatten + Dense as the C++ trainer built it (the same function, the same
weights, its layer names and checkpoints unchanged); a larger input gets GlobalAvgPool2D first.

Layer names follow the C++ trainer's listing: in each block the projection shortcut (if any) comes
first, then the residual branch, then add and relu, because blocks call Add(shortcut, branch)
and the graph orders an Add's first input's layers first.
"""
from __future__ import annotations

from typing import Any, Sequence

from .. import layers as L
from ..graph import Input, Model
from ._input import preprocessing

# depth -> (block, blocks per stage). The C++ trainer built ResNet-50 with (3, 6, 4, 3), a fault; these
# are the paper's counts.
RESNET_DEPTHS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}
WIDTHS = (64, 128, 256, 512)
EXPANSION = {"basic": 1, "bottleneck": 4}


def _conv_bn(x, filters, ksize, stride=1, relu=True, gamma_init="ones"):
    """conv (no bias) -> BN [-> ReLU]; a strided kxk conv (k > 1) gets an explicit Pad2D(k // 2)."""
    padding = ksize // 2
    if stride > 1 and ksize > 1:
        x = L.Pad2D(padding)(x)          # as the C++ trainer: pad explicitly, then a padding-0 conv
        padding = 0
    # bias=False: the BN right after subtracts the batch mean and adds its own beta, so a conv
    # bias would be cancelled and is redundant (the C++ trainer kept one; it changes nothing but the count).
    h = L.BatchNorm2D(gamma_init=gamma_init)(L.Conv2D(filters, ksize, stride=stride, padding=padding, bias=False)(x))
    return L.ReLU()(h) if relu else h


def _shortcut(x, C, C_out, stride):
    """Identity, or a 1x1 conv (stride s) + BN where the block changes the shape."""
    if C == C_out and stride == 1:
        return x
    return _conv_bn(x, C_out, 1, stride, relu=False)


# The last BN of each residual branch starts with gamma = 0 (`last_gamma="zeros"`), so every block
# begins as relu(shortcut(x)) and the deep net trains like a shallow one at first (Goyal et al.,
# 2017, "zero-init residual"); zero_init_residual=False builds it with gamma = 1 as every other BN.


def _basic(x, C, width, stride, last_gamma="zeros"):
    """y = relu(shortcut(x) + BN(conv3x3(relu(BN(conv3x3_s(x))))))."""
    s = _shortcut(x, C, width, stride)
    h = _conv_bn(x, width, 3, stride)
    h = _conv_bn(h, width, 3, relu=False, gamma_init=last_gamma)
    return L.ReLU()(L.Add()(s, h))                       # shortcut first: the C++ trainer's name order


def _bottleneck(x, C, width, stride, last_gamma="zeros"):
    """y = relu(shortcut(x) + BN(conv1x1(relu(BN(conv3x3_s(relu(BN(conv1x1(x))))))))), 4*width out."""
    C_out = EXPANSION["bottleneck"] * width
    s = _shortcut(x, C, C_out, stride)
    h = _conv_bn(x, width, 1)
    h = _conv_bn(h, width, 3, stride)
    h = _conv_bn(h, C_out, 1, relu=False, gamma_init=last_gamma)
    return L.ReLU()(L.Add()(s, h))                       # shortcut first: the C++ trainer's name order


def last_stage_size(input_shape: Sequence[int]) -> tuple[int, int]:
    """(H, W) of the last stage for an input (C, H, W): five halvings, each rounding up (stem conv, max-pool,
    the strided convs of stages 2-4): 28 -> 1, 32 -> 1, 224 -> 7."""
    hw = tuple(int(s) for s in input_shape[-2:])
    for _ in range(5):
        hw = tuple((s + 1) // 2 for s in hw)
    return hw  # type: ignore[return-value]  # two ints


def build_resnet(block: str, blocks: Sequence[int], input_shape: tuple[int, ...] = (1, 28, 28),
                 classes: int = 10, zero_init_residual: bool = True, preprocess: bool = True,
                 global_pool: bool | None = None, **model_kwargs: Any) -> Model:
    """A ResNet of `block` ('basic' or 'bottleneck') with `blocks` per stage (four ints).

    x (N, C, H, W) -> probabilities (N, classes). `resnet(depth)` is the usual entry point;
    this one builds other stage counts (e.g. the C++ trainer's faulty (3, 6, 4, 3) ResNet-50).
    global_pool: None puts GlobalAvgPool2D before the head where the last stage is larger than 1x1
    (at 1x1 it is the identity, and left out); True always; False never (the C++ trainer's head:
    Dense over C*H*W features).
    """
    if block not in EXPANSION:
        raise ValueError(f"unknown ResNet block {block!r}: expected 'basic' or 'bottleneck'")
    blocks = tuple(blocks)
    if len(blocks) != len(WIDTHS) or not all(isinstance(n, int) and n > 0 for n in blocks):
        raise ValueError(f"blocks must be {len(WIDTHS)} positive ints (one per stage), got {blocks!r}")
    unit = _basic if block == "basic" else _bottleneck
    model_kwargs.setdefault("name", "resnet")

    x = h = Input(input_shape)
    for layer in preprocessing(preprocess):
        h = layer(h)
    h = L.MaxPool2D(3, stride=2, padding=1)(_conv_bn(h, 64, 7, stride=2))   # Pad2D(3), conv, BN, ReLU
    C = 64
    for stage, (width, n) in enumerate(zip(WIDTHS, blocks)):
        for i in range(n):
            h = unit(h, C, width, 2 if stage > 0 and i == 0 else 1, "zeros" if zero_init_residual else "ones")
            C = EXPANSION[block] * width
    if global_pool or (global_pool is None and last_stage_size(input_shape) != (1, 1)):
        h = L.GlobalAvgPool2D()(h)
    y = L.Softmax()(L.Dense(classes)(L.Flatten()(h)))
    return Model(x, y, **model_kwargs)


def resnet(depth: int, input_shape: tuple[int, ...] = (1, 28, 28), classes: int = 10, zero_init_residual: bool = True,
           preprocess: bool = True, global_pool: bool | None = None, **model_kwargs: Any) -> Model:
    """ResNet-`depth` for depth in 18, 34 (basic blocks) and 50, 101, 152 (bottleneck blocks).

    x (N, C, H, W) -> probabilities (N, classes). zero_init_residual: each residual branch's last BN
    starts with gamma = 0 (False: 1). preprocess: the model starts with Normalize (MNIST's mean and std),
    so it takes images (docs/input.md); False: normalised floats, as models from before it.
    global_pool: as build_resnet (None: global average pooling at any input size).
    model_kwargs (device, dtype, seed, name) go to Model.

    torchvision's ResNet-`depth` is `resnet(depth, input_shape=(3, 224, 224), classes=1000,
    preprocess=False)`: the same layers and parameter count (11,689,512 for ResNet-18), and
    minidl.interop.load_torchvision_resnet loads its weights.
    """
    if isinstance(depth, str) and depth.isdigit():
        depth = int(depth)
    if isinstance(depth, bool) or depth not in RESNET_DEPTHS:
        raise ValueError(f"unknown ResNet depth {depth!r}: expected one of "
                         f"{', '.join(map(str, RESNET_DEPTHS))}")
    block, blocks = RESNET_DEPTHS[depth]
    model_kwargs.setdefault("name", f"resnet{depth}")
    return build_resnet(block, blocks, input_shape, classes, zero_init_residual, preprocess, global_pool,
                        **model_kwargs)
