"""`python -m minidl.infer`: the door of minidl/cli/infer.py, the infer command (`minidl infer`)."""
import sys

from minidl.cli.infer import main

if __name__ == "__main__":
    sys.exit(main())
