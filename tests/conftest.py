import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))        # `from tests.helpers import ...` (importlib mode adds no path)
SHARED = ROOT.parent / "shared" / "datasets"
if "MINIDL_DATA" in os.environ:
    # absolute, so subprocesses started in other folders find it too
    os.environ["MINIDL_DATA"] = os.path.abspath(os.environ["MINIDL_DATA"])
elif SHARED.is_dir():
    os.environ["MINIDL_DATA"] = str(SHARED)
