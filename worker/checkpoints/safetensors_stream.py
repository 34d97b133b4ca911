"""Write tensors in the safetensors format to any file object, one tensor at a time.

`safetensors.torch.save_file` writes from Rust straight to a path, so nothing can see the
bytes on their way; `safetensors.torch.save` builds the whole file in memory first. This
writer streams each tensor's own memory into `f.write` (a `HashedFile` hashes it there), with
no copy. The format (https://github.com/huggingface/safetensors): an 8-byte little-endian
header length, a JSON header mapping each name to dtype, shape and [begin, end) byte offsets
into the data that follows, padded with spaces to a multiple of 8, then the data. Files load
with `safetensors.torch.load_file`, which checks all of that.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch

DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


def write_safetensors(
    tensors: dict[str, torch.Tensor], f: Any, metadata: dict[str, str] | None = None
) -> None:
    """Write `tensors` (CPU, each with its own memory) to the binary file object `f`;
    `metadata` is the header's free-form ``__metadata__`` (strings only, as safetensors
    has it)."""
    # Wider elements first (then by name), as safetensors orders them: every tensor then
    # starts at a multiple of its element size, so a memory-mapped load is aligned.
    names = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in names:
        t = tensors[name]
        if t.device.type != "cpu":
            raise ValueError(f"tensor {name!r} is on {t.device}; copy it to the CPU first")
        if t.dtype not in DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {t.dtype}, which safetensors cannot hold")
        size = t.numel() * t.element_size()
        header[name] = {
            "dtype": DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    f.write(struct.pack("<Q", len(raw)) + raw)
    for name in names:
        t = tensors[name].detach().contiguous()
        if t.numel():
            f.write(t.reshape(-1).view(torch.uint8).numpy().data)
