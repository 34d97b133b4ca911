"""HashedFile and the streaming safetensors writer that checkpoint saves go through, over the
sink a POSIX stage gives them."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from trainctl.store.checkpoints.posix import PosixSink
from trainctl.worker.checkpoints.hashed_file import PARALLEL_MIN, HashedFile
from trainctl.worker.checkpoints.safetensors_stream import write_safetensors


def test_the_digest_and_the_file_hold_every_byte_in_order(tmp_path: Path) -> None:
    # Small writes are buffered, large ones hashed beside the write: mix both, in odd sizes.
    chunks = [os.urandom(n) for n in (1, 7, PARALLEL_MIN + 3, 100, 3 * PARALLEL_MIN, 5)]
    with ThreadPoolExecutor(1) as pool, HashedFile(PosixSink(tmp_path / "f"), pool) as f:
        for chunk in chunks:
            f.write(memoryview(chunk))
        assert f.tell() == sum(map(len, chunks))
    data = b"".join(chunks)
    assert (tmp_path / "f").read_bytes() == data
    assert f.hexdigest() == hashlib.sha256(data).hexdigest()


def test_a_sink_never_overwrites_an_existing_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"keep me")
    with pytest.raises(FileExistsError):
        PosixSink(tmp_path / "f")
    assert (tmp_path / "f").read_bytes() == b"keep me"


def test_torch_save_through_it_loads_back(tmp_path: Path) -> None:
    state: dict[str, Any] = {"m": torch.randn(1500, 1000), "step": 3, "nested": [torch.arange(5)]}
    with ThreadPoolExecutor(1) as pool, HashedFile(PosixSink(tmp_path / "opt.pt"), pool) as f:
        torch.save(state, f)  # type: ignore[arg-type]
    loaded = torch.load(tmp_path / "opt.pt", weights_only=True)
    assert torch.equal(loaded["m"], state["m"]) and loaded["step"] == 3
    assert f.hexdigest() == hashlib.sha256((tmp_path / "opt.pt").read_bytes()).hexdigest()


def test_safetensors_written_by_stream_load_with_safetensors(tmp_path: Path) -> None:
    tensors = {
        "w": torch.randn(64, 32),
        "half": torch.randn(5).bfloat16(),
        "scalar": torch.tensor(3),
        "empty": torch.zeros(0, 3),
        "mask": torch.tensor([True, False, True]),
        "transposed": torch.randn(4, 6).t(),  # not contiguous: packed on the way
        "byte": torch.tensor([1], dtype=torch.uint8),
    }
    with open(tmp_path / "m.safetensors", "wb") as f:
        write_safetensors(tensors, f)
    loaded = load_file(str(tmp_path / "m.safetensors"))
    assert loaded.keys() == tensors.keys()
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t), name
    raw = (tmp_path / "m.safetensors").read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    assert length % 8 == 0
    for name, entry in json.loads(raw[8 : 8 + length]).items():
        begin = entry["data_offsets"][0]
        assert begin % tensors[name].element_size() == 0, f"{name} is not aligned"


def test_safetensors_stream_names_what_it_cannot_write(tmp_path: Path) -> None:
    with open(tmp_path / "m", "wb") as f, pytest.raises(ValueError, match=r"'c'.*complex"):
        write_safetensors({"c": torch.zeros(2, dtype=torch.complex64)}, f)
