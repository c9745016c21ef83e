"""The parameter arena: a model's parameters in one flat buffer, their gradients in a twin.

`allocate` lays the trainable parameters out in `flat` / `grads` and the non-trainable state (BN
running statistics) in `state_flat`, each tensor on a 256-byte boundary, and gives the layers
views. Under a precision policy the layers computing in bfloat16/float16 work on `Copies` of
their parameters: a second arena in the compute dtype with the master's layout (a channels-last
convolution's filters permuted to K, kH, kW, C within their range), cast from the float32 master at
every forward (one pass over memory, no matter how many layers, and one per permuted filter), its
gradients gathered back into the master's gradient arena after backward. The optimizer, the
checkpoints and the gradient all-reduce see only the float32 arenas.

The master's own filters are laid K, kH, kW, C in place (`lay_krsc`) where a channels-last training lowering
reads them in the master's dtype, so cuDNN need not transpose them at every call. Only the arena's order
changes: a Parameter's `data` is still (K, C, kH, kW), and what leaves the process (weights, the optimizer's
state, `canonical`) is in that order.
"""
from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Collection, Mapping, Sequence

import numpy as np

from .._types import Array
from ..kernels.shapes import cast_filters, filter_view

if TYPE_CHECKING:
    from ..backend import Device
    from ..layers.base import Layer, Parameter

Arenas = tuple[Array, Array, Array]     # (flat, grads, state_flat)

ALIGN_BYTES = 256          # cuDNN's fast engines want aligned pointers


def _layout(params, itemsize):
    """(offsets, end): each tensor starts on an ALIGN_BYTES boundary; the gaps hold zeros."""
    align, offsets, end = max(ALIGN_BYTES // itemsize, 1), [], 0
    for p in params:
        offsets.append(end)
        end += -(-p.size // align) * align
    return offsets, end


def allocate(xp: ModuleType, dtype: np.dtype, params: Sequence[Parameter], krsc: Collection[Parameter] = ()
             ) -> Arenas:
    """(flat, grads, state_flat) in `dtype` for `params`; every Parameter gets its views and offset.

    The gaps between tensors hold zeros with zero gradients, which every optimizer leaves at zero.
    The (K, C, kH, kW) filters in `krsc` lie K, kH, kW, C in their range (a channels-last convolution
    built as such, an inference lowering's: cuDNN would otherwise transpose them at every call).
    """
    permuted = {id(p) for p in krsc}
    trainable = [p for p in params if p.weight]        # frozen weights too: `trainable` may change
    frozen = [p for p in params if not p.weight]
    (t_off, t_end), (f_off, f_end) = _layout(trainable, dtype.itemsize), _layout(frozen, dtype.itemsize)
    flat = xp.zeros(t_end, dtype=dtype)
    grads = xp.zeros_like(flat)
    state_flat = xp.zeros(f_end, dtype=dtype)
    for p, o in zip(trainable, t_off):
        view = (lambda a: filter_view(a, p.shape, True)) if id(p) in permuted else (lambda a: a.reshape(p.shape))
        p.data, p.grad, p.offset = view(flat[o:o + p.size]), view(grads[o:o + p.size]), o
    for p, o in zip(frozen, f_off):
        p.data, p.grad, p.offset = state_flat[o:o + p.size].reshape(p.shape), None, o
    return flat, grads, state_flat


class Copies:
    """Compute-dtype copies of some trainable master parameters, at the master arena's offsets.

    pairs: [(the copy's Parameter, the master's Parameter, channels_last)]; the copies get views into
    `flat` and `grads` (each the master arena's size, in `dtype`). A channels_last (K, C, kH, kW)
    copy lies K, kH, kW, C in its range (channels-last convolutions read such filters faster).
    """

    def __init__(self, device: Device, master_flat: Array, pairs: Sequence[tuple[Parameter, Parameter, bool]],
                 dtype: np.dtype) -> None:
        xp = device.xp
        self.kernels, self.dtype = device.kernels.cast, dtype
        self.flat = xp.zeros(master_flat.shape, dtype=dtype)
        self.grads = xp.zeros(master_flat.shape, dtype=dtype)
        mask = np.zeros(master_flat.shape, dtype=bool)         # where the copies' gradients go as they lie
        permuted = []                                          # (offset, K, C, kH, kW) of the channels_last ones
        for copy, master, cl in pairs:
            o, n = master.offset, master.size
            cl = cl or not master.data.flags.c_contiguous     # a copy lies as a master laid K, kH, kW, C does
            copy.data, copy.grad = (self.kernels.filter_view(a[o:o + n], copy.shape, True) if cl
                                    else a[o:o + n].reshape(copy.shape) for a in (self.flat, self.grads))
            copy.offset = o
            if master.data.flags.c_contiguous and not copy.data.flags.c_contiguous:    # else copied as it lies
                permuted.append((o,) + tuple(copy.shape))
            else:
                mask[o:o + n] = True
        self.mask, self.permuted = xp.asarray(mask), tuple(permuted)

    # One cast-copy each over the whole arenas, then one over the permuted filters (on the GPU a kernel each).
    def refresh(self, master_flat: Array) -> None:
        """The copies from the master weights, rounded to nearest even (before every forward)."""
        self.kernels.cast_copy(self.flat, master_flat)
        if self.permuted:
            self.kernels.cast_filters_krsc(self.flat, master_flat, self.permuted)

    def gather(self, master_grads: Array, lo: int = 0, hi: int | None = None) -> None:
        """The copies' gradients into the master's gradient arena, as float32 (after every backward):
        all of them, or those of elements lo:hi (whole parameters: a range of whole layers)."""
        hi = master_grads.size if hi is None else hi
        self.kernels.cast_copy_where(master_grads[lo:hi], self.grads[lo:hi], self.mask[lo:hi])
        permuted = tuple(f for f in self.permuted if lo <= f[0] < hi)
        if permuted:
            self.kernels.cast_filters_kcrs(master_grads, self.grads, permuted)

    def zero_grad(self) -> None:
        self.grads.fill(0)


def allocate_by_dtype(xp: ModuleType, main: np.dtype, params: Mapping[str, Parameter], dtypes: Mapping[str, np.dtype],
                      krsc: Collection[str] = ()) -> tuple[Arenas, dict[np.dtype, Arenas]]:
    """((flat, grads, state_flat) in `main`, {dtype: the same} for the parameters of layers computing
    in other dtypes): the arenas of a model built afresh. params, dtypes: {key: Parameter}, {key: dtype};
    krsc: the keys of the filters that lie K, kH, kW, C (krsc_keys)."""
    groups: dict[np.dtype, list[Parameter]] = {}
    for k, p in params.items():
        groups.setdefault(dtypes[k], []).append(p)
    filters = [params[k] for k in krsc]
    return (allocate(xp, main, groups.pop(main, []), filters),
            {dt: allocate(xp, dt, ps, filters) for dt, ps in groups.items()})


def krsc_keys(layers: Sequence[Layer]) -> set[str]:
    """The 'layer/param' keys of the filters these layers read lying K, kH, kW, C (their
    `channels_last_params`: a channels-last convolution's)."""
    return {f"{layer.name}/{k}" for layer in layers for k in layer.channels_last_params}


def share(params: Mapping[str, Parameter], dtypes: Mapping[str, np.dtype], krsc: Collection[str],
          model: str, masters: Mapping[str, Parameter], master_flat: Array, device: Device) -> list[Copies]:
    """[Copies] for a lowering of the model `model` (its parameters `params`, computing in `dtypes`, the
    keys `krsc` lying K, kH, kW, C) on the model's arena: `masters`, `master_flat`, on `device`. Each
    parameter must be the model's own Parameter, or a trainable copy of it in another dtype."""
    pairs: dict[np.dtype, list[tuple[Parameter, Parameter, bool]]] = {}
    for k, p in params.items():
        master = masters.get(k)
        if p is master and p.data is not None:
            continue
        if master is None or master.shape != p.shape or dtypes[k] == device.dtype:
            raise ValueError(f"{model}: lowered layer parameter {k} is not one of the model's")
        if not (p.weight and master.weight):
            raise ValueError(f"{model}: {k} is state (running statistics) of a layer computing in "
                             f"{dtypes[k].name}: such a layer must declare keeps_fp32")
        pairs.setdefault(dtypes[k], []).append((p, master, k in krsc))
    return [Copies(device, master_flat, ps, dt) for dt, ps in pairs.items()]


Filters = tuple[tuple[int, ...], ...]     # ((offset, K, C, kH, kW), ...) in an arena


def lay_krsc(params: Sequence[Parameter]) -> None:
    """Lay each (K, C, kH, kW) parameter K, kH, kW, C within its arena range, values and gradients kept, views
    rebound; one laid already, or lying alike both ways (a 1x1 or one-channel filter), is left as it is."""
    for p in params:
        if p.data is None or p.data.ndim != 4 or not p.data.flags.c_contiguous:
            continue
        for attr in ("data", "grad"):
            a = getattr(p, attr)
            laid = filter_view(a.reshape(-1), p.shape, True)
            if laid.flags.c_contiguous:
                break
            laid[...] = a.copy()
            setattr(p, attr, laid)


def laid_krsc(params: Mapping[str, Parameter]) -> Filters:
    """The trainable filters lying K, kH, kW, C in the arena: ((offset, K, C, kH, kW), ...), offset order."""
    return tuple(sorted((p.offset,) + tuple(p.shape) for p in params.values()
                        if p.weight and p.data is not None and p.data.ndim == 4 and not p.data.flags.c_contiguous))


def canonical(a: np.ndarray, filters: Filters, to_arena: bool = False) -> np.ndarray:
    """A host copy of arena-shaped array `a` (the optimizer's state) with `filters` in (K, C, kH, kW) order, as
    checkpoints keep them; to_arena: the other way, as the arena lies."""
    out = np.array(a)
    if filters:
        cast_filters(out, np.asarray(a), filters, to_krsc=to_arena)
    return out
