"""python -m minidl.export: a checkpoint's inference graph as ONNX, its weights as .safetensors.

    python -m minidl.export checkpoints/lenet5.npz --onnx lenet5.onnx [--logits]
    python -m minidl.export checkpoints/resnet18.npz --safetensors resnet18.safetensors

--onnx writes the graph minidl.inference.compile runs (BN folded, dropout removed; the final Softmax
kept, so its outputs are Model.predict's, unless --logits), opset 17, float32, a dynamic batch dimension
(minidl.inference.onnx_export); it takes images in [0, 1] (--uint8: uint8 in [0, 255]), as every entry
point does (docs/input.md).
--safetensors writes every parameter and BN statistic under the names the model's PyTorch twin uses
(minidl.checkpoint.torch_names; benchmarks/torch_models.py builds the twins), so a torch state_dict made from
it loads with strict=True; its metadata holds the architecture, so minidl.checkpoint.load_model
reads it back. Both are written through minidl.files' writer (temp file, fsync, rename: a full disk
leaves the previous file whole). Bad flags exit 2 with the usage line; a bad file is one `error:`
line and exit 1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Sequence

from .. import cli, files
from ..checkpoint import SAFETENSORS_FORMAT, load_model
from ..install_hint import install_hint

if TYPE_CHECKING:
    import numpy as np

    from ..graph.model import Model


def save_safetensors(path: str | os.PathLike, model: Model) -> dict[str, np.ndarray]:
    """Write `model`'s weights under its PyTorch twin's names, and its architecture as metadata."""
    try:
        from safetensors.numpy import save
    except ImportError:
        raise ValueError(f"--safetensors needs the safetensors package "
                         f"({install_hint('export', 'safetensors')})") from None
    from ..checkpoint.torch_names import to_torch
    tensors = to_torch(model)
    meta = {"format": SAFETENSORS_FORMAT, "model": json.dumps(model.config()), "names": "pytorch"}
    data = save(tensors, metadata=meta)
    files.write_atomic(path, lambda f: f.write(data), kind_written="safetensors")   # the old file or the new one
    return tensors


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=cli.prog("export"),
                                description="Export a minidl checkpoint as ONNX and/or .safetensors.")
    p.add_argument("checkpoint", help="a checkpoint written by python -m minidl.train (.npz)")
    p.add_argument("--onnx", metavar="PATH", help="write the inference graph as ONNX (opset 17)")
    p.add_argument("--safetensors", metavar="PATH", help="write the weights with PyTorch names")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--probabilities", action="store_true",
                     help="keep the final Softmax in the ONNX graph (the default: Model.predict's outputs)")
    out.add_argument("--logits", action="store_true", help="drop the final Softmax: the ONNX graph outputs logits")
    p.add_argument("--uint8", action="store_true", help="the ONNX input is uint8 images in [0, 255] "
                   "(default: float images in [0, 1])")
    return p


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Every flag checked before the checkpoint is read: a bad one exits 2 with the usage line."""
    if not args.onnx and not args.safetensors:
        p.error("nothing to write: give --onnx PATH and/or --safetensors PATH")
    if (args.probabilities or args.logits) and not args.onnx:
        p.error(f"--{'logits' if args.logits else 'probabilities'} applies to --onnx only")
    if args.uint8 and not args.onnx:
        p.error("--uint8 applies to --onnx only")
    for flag in ("onnx", "safetensors"):
        path = getattr(args, flag)
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            p.error(f"--{flag} {path}: no such folder {folder}")
        # a file of its own kind (files.kinds: never the checkpoint read, nor another kind's file)
        why = files.problem(path, flag, reads=[args.checkpoint]) if path else None
        if why:
            p.error(f"--{flag} {path} {why}")
    why = files.other_kind(args.checkpoint, "checkpoint") if os.path.isfile(args.checkpoint) else None
    if why:               # an artifact holds the lowered graph only: export reads the checkpoint it came from
        p.error(f"{args.checkpoint} {why}: export the checkpoint it was made from")
    if args.onnx and args.safetensors and files.target(args.onnx) == files.target(args.safetensors):
        p.error("--onnx and --safetensors name the same file")
    return args


def run(args: argparse.Namespace) -> None:
    model = load_model(args.checkpoint, device="cpu")
    if args.onnx:
        try:
            from ..inference.onnx_export import OPSET, save_onnx
            import onnx  # noqa: F401  (named in the error below when absent)
        except ImportError:
            raise ValueError(f"--onnx needs the onnx package ({install_hint('export', 'onnx')})") from None
        save_onnx(args.onnx, model, not args.logits, args.uint8)
        print(f"wrote {args.onnx}: {model.name} inference graph, ONNX opset {OPSET}, dynamic batch"
              f"{', logits' if args.logits else ''}{', uint8 input' if args.uint8 else ''}")
    if args.safetensors:
        tensors = save_safetensors(args.safetensors, model)
        print(f"wrote {args.safetensors}: {len(tensors)} tensors with PyTorch names")


def main(argv: Sequence[str] | None = None) -> int:
    from .flags import run_cli          # the command lines' one error handler
    p = parser()
    return run_cli(run, check_args(p, p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
