"""`python -m minidl.train`: the door of minidl/cli/train.py, the train command (`minidl train`)."""
import sys

from minidl.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
