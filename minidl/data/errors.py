"""The one exception the data package raises for bad or missing data files (defined on the ground,
minidl/errors.py, since the model's input contract raises it too)."""
from ..errors import DataError

__all__ = ["DataError"]
