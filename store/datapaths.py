"""Where runs may read training data: globs expanded now and confined to the data roots."""

from __future__ import annotations

import glob
import os
from pathlib import Path

from trainctl.store.exceptions import InvalidRequest
from trainctl.store.specs import DataSpec


def resolve_data(data: DataSpec, roots: list[Path]) -> DataSpec:
    """Expand globs now (so a typo is a 422, not a failed run) and confine them to the roots."""
    if data.source in ("synthetic", "stdlib"):
        return data
    return data.model_copy(
        update={
            "paths": [str(p) for p in confine_paths(data.paths, roots, "data.paths")],
            "val_paths": [str(p) for p in confine_paths(data.val_paths, roots, "data.val_paths")],
        }
    )


def confine_paths(patterns: list[str], roots: list[Path], field: str) -> list[Path]:
    if patterns and not roots:
        raise InvalidRequest(
            f"{field}: no data roots are configured (set TRAINCTL_DATA_ROOTS), "
            "so no files may be read"
        )
    real_roots = [Path(os.path.realpath(r)) for r in roots]
    files: list[Path] = []
    for pattern in patterns:
        if "\x00" in pattern:
            raise InvalidRequest(f"{field}: path contains a NUL byte")
        full = pattern if os.path.isabs(pattern) else str(real_roots[0] / pattern)
        matches = sorted(glob.glob(full, recursive=True))
        if not matches:
            raise InvalidRequest(f"{field}: no files match {pattern!r}")
        for m in matches:
            p = Path(m)
            found = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
            for f in found:
                real = Path(os.path.realpath(f))
                if not any(real.is_relative_to(r) for r in real_roots):
                    raise InvalidRequest(
                        f"{field}: {pattern!r} reaches {f}, outside the data roots "
                        f"({', '.join(map(str, real_roots))})"
                    )
                files.append(real)
    return files
