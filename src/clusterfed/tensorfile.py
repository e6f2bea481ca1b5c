"""Safetensors files with byte-identical output for identical content.

``safetensors`` keeps the ``__metadata__`` of a file in a hash map, so two writes of
the same tensors and metadata can order its keys differently: the bytes, and DVC's
hash of the output, change although nothing did. :func:`save_tensors` writes the
header with the metadata keys sorted; everything else is the library's own layout.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from safetensors.torch import save

from clusterfed.atomic_write import write_atomically


def save_tensors(tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` to ``path`` (safetensors format, metadata keys in sorted order).

    Entries that share storage (a state holding one tensor under two names) are written
    as separate copies, which safetensors otherwise refuses; a file holds values, not
    aliasing."""
    blob = save(_unshared({k: v.detach().cpu().contiguous() for k, v in tensors.items()}), metadata=metadata)
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    if "__metadata__" in header:
        header = {"__metadata__": dict(sorted(header.pop("__metadata__").items())), **header}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes with spaces

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            f.write(blob[8 + n :])

    write_atomically(path, write)


def _unshared(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` with every entry whose storage an earlier entry uses replaced by a copy."""
    seen: set[int] = set()
    out = {}
    for k, v in tensors.items():
        ptr = v.untyped_storage().data_ptr()
        out[k] = v.clone() if ptr in seen and v.numel() else v
        seen.add(ptr)
    return out
