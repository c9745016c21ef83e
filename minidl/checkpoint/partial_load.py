"""load_weights(strict=False): the weights a file and a model share by name and shape (fine-tuning into a
new head), and what was left out, as torch's load_state_dict(strict=False) reports it."""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from .torch_names import counters, torch_names

if TYPE_CHECKING:
    from ..graph.model import Model


class IncompatibleKeys(NamedTuple):
    """What load_weights(strict=False) left out, as torch's load_state_dict returns it: the model's
    names the file lacks (`missing`), the file's names the model lacks (`unexpected`), and names both
    have with other shapes (`mismatched`, 'name: file (shape) vs model (shape)'; a new head's)."""
    missing: list[str]
    unexpected: list[str]
    mismatched: list[str]


def load_matching(named: dict[str, np.ndarray], model: Model) -> IncompatibleKeys:
    """Load the arrays of `named` whose names and shapes the model has; say what was left out. The names
    are minidl's ('layer/param', a checkpoint's) or, where none has a '/', PyTorch's (a .safetensors file's)."""
    extra: list[str] = []
    if not any("/" in k for k in named):      # PyTorch's: those the model has by name, the rest unexpected
        back, counted = {v: k for k, v in torch_names(model).items()}, set(counters(model))
        extra = [k for k in named if k not in back and k not in counted]
        named = {back[k]: a for k, a in named.items() if k in back}
    params = model.params
    unexpected = sorted(set(named) - set(params)) + sorted(extra)
    mismatched = sorted(f"{k}: file {tuple(np.shape(a))} vs model {params[k].shape}" for k, a in named.items()
                        if k in params and tuple(np.shape(a)) != params[k].shape)
    fits = {k: a for k, a in named.items() if k in params and tuple(np.shape(a)) == params[k].shape}
    model.set_weights(fits, strict=False)       # names and shapes fit: a ValueError only for a dtype
    return IncompatibleKeys(sorted(set(params) - set(fits)), unexpected, mismatched)
