"""The kernel families a backend holds, typed: `Kernels`, what `device.kernels` is, one field a family.

Each field is annotated with its family's Protocol (minidl/kernels/contract.py), so a type checker and
a reader's tools follow a call such as `device.kernels.conv.conv2d_fprop` to `Conv.conv2d_fprop`, and
with its `Family`: the dtypes the library calls it in and the functions a backend may lack. A family a
backend may lack whole is `X | None` (None there; callers ask `Device.has`). `FAMILIES` and
`KERNEL_FAMILIES` are read from these annotations, so the list of families is written once: a new family
is a line here, a Protocol in the contract and a module a backend (Backend.families loads them by name).
"""
from __future__ import annotations

from typing import Annotated, Any, NamedTuple, get_args, get_type_hints

from .contract import (HALF, WIDE, Activation, Augment, Cast, Communicator, Conv, Dense, Direct, Dropout, Lrn,
                       Merge, Norm, Optim, Pad, Pool, Softmax)


class Family(NamedTuple):
    """What the contract says of a family besides its functions; written in `Kernels`' annotations."""
    dtypes: tuple[str, ...] | None     # what the library calls it in; None: it converts between dtypes
    extras: tuple[str, ...] = ()       # functions a backend may lack (Device.has(family, function))
    protocol: type = object            # its Protocol: the annotation's type (FAMILIES fills it in)
    optional: bool = False             # a backend may lack the whole family: annotated `X | None` (Device.has)
    loaded: bool = True                # a field of Kernels; False: loaded on demand (Device.communicator)


class Kernels:
    """A backend's kernel families by name (Backend.families builds it): device.kernels.<family>."""
    conv: Annotated[Conv, Family(HALF, ("conv2d_bias_relu_fprop", "conv2d_bias_add_act_fprop"))]
    dense: Annotated[Dense, Family(HALF)]
    activation: Annotated[Activation, Family(HALF, ("leaky_relu_fprop", "leaky_relu_bprop", "sigmoid_fprop",
                                                    "sigmoid_bprop", "tanh_fprop", "tanh_bprop"))]
    merge: Annotated[Merge, Family(HALF)]
    pad: Annotated[Pad, Family(HALF)]
    pool: Annotated[Pool, Family(HALF)]
    norm: Annotated[Norm, Family(WIDE)]
    lrn: Annotated[Lrn, Family(WIDE)]
    dropout: Annotated[Dropout, Family(HALF)]
    softmax: Annotated[Softmax, Family(WIDE)]
    optim: Annotated[Optim, Family(WIDE, ("sgd_update", "momentum_update", "adam_update", "rmsprop_update"))]
    direct: Annotated[Direct | None, Family(("float32",), ("chain_blocks", "choose_conv"))]
    augment: Annotated[Augment, Family(HALF, ("shift_draws", "flip_draws"))]
    cast: Annotated[Cast, Family(None)]

    def __init__(self, **families: Any) -> None:
        """Kernels(conv=module, ...): every family the contract requires, the optional ones where present."""
        missing = [n for n in KERNEL_FAMILIES if families.get(n) is None and not FAMILIES[n].optional]
        unknown = sorted(set(families) - set(KERNEL_FAMILIES))
        if missing or unknown:
            said = [f"{what} {', '.join(names)}" for what, names in (("no", missing), ("unknown", unknown)) if names]
            raise TypeError(f"kernel families: {'; '.join(said)} (minidl/kernels/families.py: Kernels names them, "
                            f"each required but the optional ones)")
        self.__dict__.update({n: families.get(n) for n in KERNEL_FAMILIES})

    def __repr__(self) -> str:
        names = (f"{n}={getattr(v, '__name__', v)}" for n, v in vars(self).items())
        return f"Kernels({', '.join(names)})"


def _family(hint: Any) -> Family:
    """A field's Family, its Protocol and whether it is optional read from its type, `Annotated[X | None, ...]`."""
    kind, family = get_args(hint)
    optional = type(None) in get_args(kind)
    protocol = next(a for a in get_args(kind) if a is not type(None)) if optional else kind
    return family._replace(protocol=protocol, optional=optional)


FAMILIES = {**{name: _family(hint) for name, hint in get_type_hints(Kernels, include_extras=True).items()},
            "collectives": Family(None, protocol=Communicator, loaded=False)}
KERNEL_FAMILIES = tuple(name for name, f in FAMILIES.items() if f.loaded)
HOOKS = ("dtype_problem",)             # functions any family may define: dtype_problem(dtype) -> reason or None
