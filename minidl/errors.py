"""DataError, on the ground because rooms on two floors raise it: `data` for a bad or missing data
file or array, and the model's input contract (`layers/input_contract.py`) for images it does not
take. Users catch it as `minidl.data.DataError`."""


class DataError(ValueError):
    """A data file is missing, truncated, corrupt or not what it claims to be; or images outside the
    input contract (docs/input.md)."""
