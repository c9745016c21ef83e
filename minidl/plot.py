"""`python -m minidl.plot`: the door of minidl/cli/plot.py, the plot command (`minidl plot`)."""
import sys

from minidl.cli.plot import main

if __name__ == "__main__":
    sys.exit(main())
