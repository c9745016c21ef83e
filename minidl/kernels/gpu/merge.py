"""Merging layers on the GPU."""
import cupy as cp


def add_fprop(xs, out=None):
    """y = sum of the arrays in xs (all of one shape)."""
    if len(xs) == 1:
        if out is None:
            return xs[0].copy()
        cp.copyto(out, xs[0])
        return out
    rest = list(xs)
    if any(x is out for x in xs):               # accumulate into the aliased input, never read it overwritten
        rest.remove(next(x for x in xs if x is out))
    else:
        out = cp.add(rest.pop(0), rest.pop(0), out=out)
    for x in rest:
        cp.add(out, x, out=out)
    return out
