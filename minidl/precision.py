"""Precision policies: which dtype computes, which holds the weights, how the loss is scaled.

A run picks one policy, by name, once (`--precision`, `Trainer(precision=...)`,
`inference.compile(precision=...)`), the way torch.autocast and its GradScaler are set up:

    fp32   everything in float32
    bf16   convolutions, dense layers and activations in bfloat16 (fp32 accumulation); no loss scaling
    fp16   the same in float16, with dynamic loss scaling (minidl.training.loss_scale)

Under every policy the master weights and the optimizer state stay float32 in the flat arena,
and the layers that declare `keeps_fp32` (BN statistics, softmax, LRN) and the loss compute in
float32; the graph pass `minidl.graph.passes.cast` inserts the casts between the two regions.
bfloat16 comes from ml_dtypes (NumPy has none); float16 is NumPy's own.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from ._types import DTypeLike

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT16 = np.dtype(np.float16)
FLOAT32 = np.dtype(np.float32)
HALF = (FLOAT16, BFLOAT16)             # 2-byte storage: computed in float32 where it is read
NAMES = {"fp32": FLOAT32, "bf16": BFLOAT16, "fp16": FLOAT16}
_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


def dtype_of(spec: DTypeLike) -> np.dtype:
    """A NumPy dtype from a name ('bfloat16', 'float16', 'float32', 'fp16', ...) or a dtype."""
    if isinstance(spec, str):
        spec = NAMES.get(_ALIASES.get(spec, spec), spec)
    try:
        return np.dtype(spec)
    except TypeError:
        raise ValueError(f"unknown dtype {spec!r}: expected float32, bfloat16 or float16") from None


def is_float(dtype: DTypeLike) -> bool:
    """Whether `dtype` holds real floating-point numbers (bfloat16 included: NumPy sees a void type)."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype == BFLOAT16


@dataclass(frozen=True)
class LossScale:
    """Dynamic loss scaling (Micikevicius et al., 2018): the loss gradient is multiplied by a scale
    that starts at `init`; a step whose gradients overflow is skipped and the scale multiplied by
    `backoff`; after `interval` clean steps in a row it is multiplied by `growth`. PyTorch's
    GradScaler defaults."""
    init: float = 2.0 ** 16
    growth: float = 2.0
    backoff: float = 0.5
    interval: int = 2000

    def __post_init__(self):
        ok = (self.init > 0 and self.growth >= 1 and 0 < self.backoff < 1
              and isinstance(self.interval, int) and self.interval >= 1)
        if not ok:
            raise ValueError(f"loss scale: need init > 0, growth >= 1, 0 < backoff < 1 and an int interval >= 1, "
                             f"got {self}")


@dataclass(frozen=True)
class Policy:
    """name ('fp32', 'bf16', 'fp16'), the dtype convolutions, dense layers and activations compute
    in, the dtype of the master weights and optimizer state (float32), and the loss scaling (fp16).

    always: compute in `compute` even where the device finds that a model this small gains nothing
    from it (`where_it_pays`); for numerics studies and tests of the half-precision paths.
    """
    name: str
    compute: np.dtype
    param: np.dtype = FLOAT32
    loss_scale: LossScale | None = field(default=None)
    always: bool = False

    @property
    def mixed(self) -> bool:
        """Whether some layers compute in another dtype than the weights are kept in."""
        return self.compute != self.param


def policy(spec: Policy | DTypeLike | None = None, loss_scale: LossScale | None = None,
           always: bool = False) -> Policy:
    """The Policy named by `spec`: 'fp32' (also None), 'bf16', 'fp16' or the dtype names
    'float32', 'bfloat16', 'float16'; a Policy is returned as it is.

    loss_scale: a LossScale for fp16 (default: LossScale()); bf16 and fp32 take none.
    always: half precision even where it does not pay (Policy.always).
    """
    if isinstance(spec, Policy):
        return spec
    name = "fp32" if spec is None else _ALIASES.get(str(spec), str(spec))
    if name not in NAMES:
        raise ValueError(f"unknown precision {spec!r}: expected one of {', '.join(NAMES)}")
    if loss_scale is not None and name != "fp16":
        raise ValueError(f"precision {name} takes no loss scaling (only fp16 does: its range is narrow)")
    if name == "fp16":
        loss_scale = loss_scale or LossScale()
    return Policy(name, NAMES[name], loss_scale=loss_scale, always=always)


def where_it_pays(p: Policy, pays: bool) -> Policy:
    """The policy a model runs under: `p`, or fp32 where half precision does not pay for this model
    on its device (`Device.half_pays`) and `p` does not insist (`always`). A model that small is
    bound by kernel launches, not arithmetic: half precision would add casts and slower kernels
    and save nothing (docs/precision.md)."""
    return p if pays or p.always or not p.mixed else policy("fp32")
