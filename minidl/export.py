"""`python -m minidl.export`: the door of minidl/cli/export.py, the export command (`minidl export`)."""
import sys

from minidl.cli.export import main

if __name__ == "__main__":
    sys.exit(main())
