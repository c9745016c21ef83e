"""python -m minidl COMMAND [ARGS]: the same as the `minidl` console script (minidl/cli/__init__.py)."""
import sys

from minidl.cli import main

sys.exit(main(invoked="python -m minidl"))
