"""Every layer minidl.layers exports is listed where a user looks for it: the README's layer list, the
layer table of docs/custom-nets.md and the API reference (docs/api/model.md)."""
import pathlib
import re

from minidl import layers as L

ROOT = pathlib.Path(__file__).resolve().parents[1]
# exported for the graph and for a user's own layers, but not layers one puts in a net
NOT_LAYERS = {"Input", "Node", "Layer", "Need", "Parameter", "Cast"}


def test_every_layer_is_in_the_readme_the_layer_table_and_the_api_reference():
    readme = (ROOT / "README.md").read_text()
    listed = re.search(r"Layers are (.*?)\n\(", readme, re.S).group(1)
    table = (ROOT / "docs" / "custom-nets.md").read_text().split("## What each layer computes")[1]
    api = (ROOT / "docs" / "api" / "model.md").read_text()
    for name in sorted(set(L.__all__) - NOT_LAYERS):
        cls = getattr(L, name)
        assert f"`{name}`" in listed, f"README's layer list lacks {name}"
        assert re.search(rf"^\|.*`{name}[(`]", table, re.M), f"docs/custom-nets.md's layer table lacks {name}"
        assert f"::: {cls.__module__}.{name}\n" in api, f"docs/api/model.md lacks {name}"
