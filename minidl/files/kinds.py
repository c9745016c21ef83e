"""The kinds of file minidl writes, told by name and by content, so no write replaces another kind.

    why = clash("ck.npz", "metrics")      # "is a minidl checkpoint, not a metrics log: not replaced"

Each kind has the suffixes its name must end in (Keras's `model.save` refuses a name without
`.keras` for the same reason: a name that says one kind and holds another is read wrongly later)
and a test of content that reads a bounded prefix of an existing file: a checkpoint and an
inference artifact are told apart by the format in their JSON record (`__meta__`), a metrics log by
its first line. A file that is empty, missing or of the same kind may be replaced (appended to, for
a metrics log); anything else is another kind's, or an unknown file, and is left as it is.
"""
from __future__ import annotations

import json
import os
import struct
import zipfile

# kind -> (what it is called, the suffixes its name may end in)
KINDS = {
    "checkpoint": ("a minidl checkpoint", (".npz",)),
    "artifact": ("a minidl inference artifact", (".npz",)),
    "onnx": ("an ONNX model", (".onnx",)),
    "safetensors": ("a .safetensors weights file", (".safetensors",)),
    "metrics": ("a metrics log (JSON lines)", (".jsonl", ".ndjson", ".json")),
    "image": ("an image", (".png", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".gif", ".tif", ".tiff", ".webp", ".ps",
                           ".eps", ".pgf", ".raw", ".rgba", ".avif")),
}
# magic bytes -> (kind, what the file is)
_MAGIC = ((b"\x89PNG", "image", "a PNG image"), (b"%PDF", "image", "a PDF document"),
          (b"\xff\xd8\xff", "image", "a JPEG image"), (b"II*\x00", "image", "a TIFF image"),
          (b"MM\x00*", "image", "a TIFF image"), (b"%!PS", "image", "a PostScript file"),
          (b"RIFF", "image", "a WebP image"), (b"GIF8", "image", "a GIF image"), (b"\x1f\x8b", None, "a gzip file"))
_META_BYTES = 64 << 20        # a JSON record larger than this is no minidl file's


def of_format(fmt: object) -> str | None:
    """The kind of a file written by checkpoint.write_npz with the record format `fmt`, or None."""
    return next((k for k in ("checkpoint", "artifact") if str(fmt).startswith(f"minidl-{k}")), None)


def suffix_problem(path: str | os.PathLike, kind: str) -> str | None:
    """Why `path`'s name does not fit a file of `kind` ("a checkpoint's name ends in .npz"), or None."""
    what, suffixes = KINDS[kind]
    name = os.fspath(path)
    if name.lower().endswith(suffixes):
        return None
    ends = suffixes[0] if len(suffixes) == 1 else ", ".join(suffixes[:-1]) + " or " + suffixes[-1]
    return f"is no name for {what}: its name must end in {ends}"


def sniff(path: str | os.PathLike) -> tuple[str | None, str]:
    """(kind or None, what the file looks like in words) of the regular file at `path`; kind is
    "empty" for an empty file. Reads a bounded prefix (and, for a zip, its JSON record only)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64 << 10)
    except OSError as e:
        return None, f"a file that cannot be read ({e.strerror or e})"
    if not head:
        return "empty", "an empty file"
    if head.startswith(b"PK\x03\x04"):
        return _zip_kind(path)
    if len(head) >= 9 and head[8:9] == b"{":
        n = struct.unpack("<Q", head[:8])[0]
        if 2 <= n <= os.path.getsize(path) - 8:
            return "safetensors", KINDS["safetensors"][0]
    for magic, kind, what in _MAGIC:
        if head.startswith(magic):
            return kind, what
    text = _text(head)
    if text is None:
        if head[:1] == b"\x08" and os.fspath(path).endswith(".onnx"):    # ModelProto opens with ir_version
            return "onnx", KINDS["onnx"][0]
        return None, "binary data"
    if text.lstrip().startswith(("<?xml", "<svg")):
        return ("image", "an SVG image") if "<svg" in text else (None, "an XML file")
    first = text.split("\n", 1)[0]
    if _metrics_line(first, complete="\n" in text):
        return "metrics", KINDS["metrics"][0]
    return None, f"a text file (its first line: {first[:40]!r})"


def _text(head):
    try:
        return head.decode("utf-8")
    except UnicodeDecodeError as e:
        return head[:e.start].decode("utf-8") if e.start >= len(head) - 3 else None   # a character cut by the read


def _metrics_line(line, complete):
    """A metrics record (a JSON object with an integer step), or the start of one minidl's writer was
    stopped in (the file's only line, cut short)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return not complete and line.startswith(('{"step": ', '{"eval": '))
    return isinstance(record, dict) and type(record.get("step")) is int


def _zip_kind(path):
    """A zip written by minidl's checkpoint writer: its JSON record's format names the kind."""
    try:
        with zipfile.ZipFile(path) as z:
            info = z.getinfo("__meta__.npy")
            if info.file_size > _META_BYTES:
                return None, "a zip archive"
            raw = z.read(info)
    except (KeyError, OSError, zipfile.BadZipFile, ValueError, RuntimeError):
        return None, "a zip archive (an .npz not written by minidl)"
    start = raw.find(b"\n", raw.find(b"{")) + 1         # past the .npy header
    try:
        fmt = json.loads(raw[start:].decode()).get("format", "")
    except (ValueError, AttributeError, RecursionError):
        return None, "a zip archive (an .npz not written by minidl)"
    kind = of_format(fmt)
    return (kind, KINDS[kind][0]) if kind else (None, f"an .npz of format {str(fmt)[:40]!r}")


def clash(path: str | os.PathLike, kind: str) -> str | None:
    """Why writing a file of `kind` at `path` would destroy something: its name is another kind's, or
    an existing file there is of another kind ("is a minidl checkpoint, not a metrics log: not
    replaced"); None where the write may go ahead."""
    if os.path.isfile(path):
        found, looks = sniff(path)
        if found not in (kind, "empty"):
            return f"is {looks}, not {KINDS[kind][0]}: left as it is (give another name, or remove it first)"
    return suffix_problem(path, kind)
