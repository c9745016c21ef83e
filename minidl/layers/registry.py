"""Layer classes by name, for rebuilding a model from its config (checkpoints, artifacts, pickles).

A config names each layer's class and the module that defines it (graph/config.py). A user's class
answers to its module and name, so a user's class named `ReLU` never stands in for minidl's, nor
minidl's for it; minidl's own classes also answer to their bare names (configs from before the module
was recorded, and classes that moved between minidl's modules).
"""
from __future__ import annotations

_classes: dict[tuple[str, str], type] = {}      # (module, class name) -> class


def is_minidl(module: str) -> bool:
    """Whether `module` is one of minidl's own."""
    return module == "minidl" or module.startswith("minidl.")


def register(cls: type) -> None:
    """Make `cls` findable by its module and name (a class defined again, in a notebook, replaces itself)."""
    _classes[(cls.__module__, cls.__name__)] = cls


def defined_in(package: str) -> list[str]:
    """The names of the layer classes the modules of `package` define (minidl.layers exports them all)."""
    return sorted(n for (m, n) in _classes if m.startswith(package + "."))


def find(name: str, module: str | None = None) -> type:
    """The layer class a config names: `name` from `module` (None: a config that did not record it);
    a ValueError saying which class is missing and what to import."""
    if module is not None and (module, name) in _classes:
        return _classes[(module, name)]
    ours = [c for (m, n), c in _classes.items() if n == name and is_minidl(m)]
    theirs = [c for (m, n), c in _classes.items() if n == name and not is_minidl(m)]
    if ours and (module is None or is_minidl(module)):
        return ours[0]
    if len(theirs) == 1 and not (module and is_minidl(module)):    # the user's class, moved to another module
        return theirs[0]
    if len(theirs) > 1:
        where = ", ".join(sorted(f"{c.__module__}.{name}" for c in theirs))
        raise ValueError(f"layer class {name!r}{_of(module)} is not defined, and several others of that name are "
                         f"({where}); import the module that defines the one the model was saved with")
    hint = ("define it (or import the module that defines it) before loading" if module == "__main__" else
            f"import {module}, the module that defines it, before loading" if module else
            "it is not one of minidl's layers: import the module that defines it before loading")
    raise ValueError(f"unknown layer class {name!r}{_of(module)}: {hint}")


def _of(module):
    return "" if module is None else f" (module {module!r}, the script that saved it)" if module == "__main__" \
        else f" (module {module!r})"
