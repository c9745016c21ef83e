"""`python -m minidl.warmup`: the door of minidl/cli/warmup.py, the warmup command (`minidl warmup`)."""
import sys

from minidl.cli.warmup import main

if __name__ == "__main__":
    sys.exit(main())
