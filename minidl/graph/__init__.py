"""The graph: Model and Sequential over layer nodes, the Graph the passes rewrite, and the passes."""
from ..layers.node import Input, Node
from . import passes
from .ir import Graph
from .model import Model, Sequential

__all__ = ["Input", "Node", "Graph", "Model", "Sequential", "passes"]
