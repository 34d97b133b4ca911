"""TensorBoard event files read back with tbparse (TensorBoard's own event reader underneath),
for the tests of the tensorboard sink."""

from __future__ import annotations

import struct
from collections import Counter
from pathlib import Path

from tbparse import SummaryReader


def float32(value: float) -> float:
    """A TensorBoard scalar summary holds a float32 (`simple_value`)."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def tensorboard_rows(folder: Path) -> Counter[tuple[str, int, float]]:
    """The scalars of a run's folder, (tag, step, value), as often as written; none before
    the folder or its first scalar exists."""
    if not folder.is_dir():
        return Counter()
    frame = SummaryReader(str(folder)).scalars
    if frame.empty:
        return Counter()
    return Counter(zip(frame["tag"], frame["step"].astype(int), frame["value"], strict=True))
