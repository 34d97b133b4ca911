"""`trainctl runs watch`: what it prints of a run's events."""

from __future__ import annotations

from trainctl.service.cli.watch import validation_line


def test_runs_watch_shows_bits_per_byte_where_the_validation_knows_it() -> None:
    known = {"kind": "val", "step": 100, "val_loss": 1.5, "val_bits_per_byte": 0.9876}

    assert validation_line(known) == "step 100: val_loss 1.5000, bits/byte 0.9876"
    assert validation_line({"kind": "val", "val_loss": 2.0}) == "val_loss 2.0000"
