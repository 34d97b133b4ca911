"""How a delivery is signed, and how a receiver checks it (the scheme Stripe uses;
docs/design/webhooks.md, "Webhooks", "What is sent").

    X-Trainctl-Signature: t=1767225600,v1=5f2b...  (hex HMAC-SHA256)

`v1` is HMAC-SHA256, keyed with the webhook's secret, of `<t>.<raw body>`. A header may carry
several `v1` values; one must match. Standard library only, so that a
receiver can import `verify` from a client install, or copy it (docs/operations.md,
"Notifications").
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-Trainctl-Signature"
DELIVERY_HEADER = "X-Trainctl-Delivery"
EVENT_HEADER = "X-Trainctl-Event"
TOLERANCE_SECONDS = 300
"""How far from its clock a receiver accepts a delivery's timestamp."""


class SignatureError(ValueError):
    """A delivery whose signature does not check out: refuse it."""


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of `<timestamp>.<body>` keyed with `secret`."""
    signed = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The signature header's value for `body`, signed now (or at `timestamp`)."""
    t = int(time.time()) if timestamp is None else timestamp
    return f"t={t},v1={signature(secret, t, body)}"


def verify(
    secret: str,
    body: bytes,
    header: str,
    *,
    tolerance: float = TOLERANCE_SECONDS,
    now: float | None = None,
) -> int:
    """The delivery's timestamp if `header` signs `body` with `secret` within `tolerance`
    seconds of `now`; else `SignatureError`. `body` is the raw request body, unparsed."""
    timestamps, candidates = [], []
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        if key == "t":
            timestamps.append(value)
        elif key == "v1":
            candidates.append(value)
    if len(timestamps) != 1 or not _is_unix_time(timestamps[0]) or not candidates:
        raise SignatureError(f"malformed {SIGNATURE_HEADER}: expected t=<unix time>,v1=<hex>")
    t = int(timestamps[0])
    if abs((time.time() if now is None else now) - t) > tolerance:
        raise SignatureError(f"timestamp {t} is more than {tolerance:g} s from now: a replay?")
    expected = signature(secret, t, body)
    if not any(hmac.compare_digest(expected, c) for c in candidates):
        raise SignatureError("no v1 signature matches: wrong secret, or the body was changed")
    return t


def _is_unix_time(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 12
