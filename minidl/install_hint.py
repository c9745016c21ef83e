"""The one wording of every "this needs an optional package" hint in minidl.

minidl is installed from its checkout (`pip install .` or `pip install -e .`), not from a package
index, so `pip install 'minidl[plot]'` would fail for its users: the hint names the extra as the
checkout installs it, and the plain packages for those who would rather install just those.
"""
from __future__ import annotations


def install_hint(extra: str, *packages: str) -> str:
    """How to get an optional dependency: extra 'plot', packages 'matplotlib' ->
    "install the plot extra: pip install '.[plot]' in minidl's checkout, or pip install matplotlib"."""
    return (f"install the {extra} extra: pip install '.[{extra}]' in minidl's checkout, "
            f"or pip install {' '.join(packages)}")
