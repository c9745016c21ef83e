"""The one exception the data package raises for bad or missing data files."""


class DataError(ValueError):
    """A data file is missing, truncated, corrupt or not what it claims to be."""
