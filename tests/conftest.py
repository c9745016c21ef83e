import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
SHARED = ROOT.parent / "shared" / "datasets"
if "MINIDL_DATA" not in os.environ and SHARED.is_dir():
    os.environ["MINIDL_DATA"] = str(SHARED)
