"""Every layer minidl.layers exports is listed where a user looks for it: the layer table of
docs/custom-nets.md (the README points there) and the API reference (docs/api/model.md, which renders
the activations' module whole, so a new activation is in it by being in the module's __all__)."""
import pathlib
import re

from minidl import layers as L

ROOT = pathlib.Path(__file__).resolve().parents[1]
# exported for the graph and for a user's own layers, but not layers one puts in a net
NOT_LAYERS = {"Input", "Node", "Layer", "Need", "Parameter", "Cast"}


def test_every_layer_is_in_the_layer_table_and_the_api_reference():
    table = (ROOT / "docs" / "custom-nets.md").read_text().split("## What each layer computes")[1]
    api = (ROOT / "docs" / "api" / "model.md").read_text()
    for name in sorted(set(L.__all__) - NOT_LAYERS):
        cls = getattr(L, name)
        assert re.search(rf"^\|.*`{name}[(`]", table, re.M), f"docs/custom-nets.md's layer table lacks {name}"
        assert f"::: {cls.__module__}.{name}\n" in api or f"::: {cls.__module__}\n" in api, \
            f"docs/api/model.md lacks {name}"
