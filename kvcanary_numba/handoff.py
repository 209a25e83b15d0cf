"""Comparing hand-off digests: the layout signature, the digests of one side, and the check.

Both sides of a hand-off (a prefill engine and a decode engine, a device pool and its host
copy) compute :func:`~kvcanary_numba.compute_handoff_digest` over the same requests, each
from its own records and live KV, and wrap the result with the layout it was computed under::

    sent = HandoffDigest(signature=HandoffSignature.of(prefill_ctx), digests=prefill_digests)
    landed = HandoffDigest(signature=HandoffSignature.of(decode_ctx), digests=decode_digests)
    intact = check_handoff_digest(sent, landed, on_mismatch="miss")

Digests computed under different layouts (another fingerprint mode, other sources or bytes
per token, another digest version) cannot be compared: the check is skipped with a
:class:`CanaryHandoffWarning` and returns None. Page sizes and slot numbers are not part of
the layout: the digest does not depend on them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._validate import check_array, check_type
from .constants import HANDOFF_DIGEST_VERSION, PARTIAL_READ_BYTES, RealKvHashMode
from .context import CanaryContext
from .errors import error

__all__ = ["MISMATCH_CHOICES", "CanaryHandoffWarning", "HandoffDigest", "HandoffSignature", "check_handoff_digest"]

#: What :func:`check_handoff_digest` does with a digest that differs.
MISMATCH_CHOICES = ("raise", "miss")
_SHOWN = 8  # mismatching runs a KVC-K012 message names


class CanaryHandoffWarning(UserWarning):
    """Two hand-off digests were computed under different layouts; they were not compared."""


@dataclass(frozen=True, slots=True)
class HandoffSignature:
    """The layout a hand-off digest was computed under.

    Attributes
    ----------
    version : int
        Version of the digest's definition (``HANDOFF_DIGEST_VERSION``).
    real_kv_hash_mode : RealKvHashMode
        The fingerprint mode of the live KV folded into the digest.
    sources : tuple of (int, int)
        Per real-KV source folded, in order: ``(num_bytes_per_token, bytes folded per slot)``;
        empty in NONE mode.
    """

    version: int
    real_kv_hash_mode: RealKvHashMode
    sources: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, *contexts: CanaryContext) -> HandoffSignature:
        """The signature of digests computed with ``contexts`` (their sources in order; one mode).

        Raises
        ------
        KvCanaryError
            KVC-V001 for a non-context, KVC-K008 for contexts of different modes or none.
        """
        fn = "HandoffSignature.of"
        for i, context in enumerate(contexts):
            check_type(fn, f"contexts[{i}]", context, CanaryContext)
        modes = sorted({int(c.real_kv_hash_mode) for c in contexts})
        if len(modes) != 1:
            raise error("KVC-K008", function=fn, got=[RealKvHashMode(m).name for m in modes])
        mode = RealKvHashMode(modes[0])
        sources = []
        if mode != RealKvHashMode.NONE:
            for context in contexts:
                for src in context.real_kv_sources:
                    folded = PARTIAL_READ_BYTES if mode == RealKvHashMode.PARTIAL else int(src.read_bytes)
                    sources.append((int(src.num_bytes_per_token), folded))
        return cls(HANDOFF_DIGEST_VERSION, mode, tuple(sources))


@dataclass(frozen=True, slots=True)
class HandoffDigest:
    """One side's digests of the requests of a hand-off.

    Attributes
    ----------
    signature : HandoffSignature
        The layout they were computed under.
    digests : int64 [num_runs]
        One digest per request (NumPy or a CUDA array; read when compared).

    Raises
    ------
    KvCanaryError
        KVC-K010 for a signature that is not a HandoffSignature; the array codes for ``digests``.
    """

    signature: HandoffSignature
    digests: Any

    def __post_init__(self) -> None:
        if not isinstance(self.signature, HandoffSignature):
            raise error("KVC-K010", function="HandoffDigest", got=type(self.signature).__name__)
        check_array("HandoffDigest", "digests", self.digests, dtype=np.int64, ndim=1)

    def host(self) -> np.ndarray:
        """The digests as a NumPy array (a copy from the device, which waits for it)."""
        digests = self.digests
        if isinstance(digests, np.ndarray):
            return digests
        if hasattr(digests, "get"):  # CuPy
            return digests.get()
        if hasattr(digests, "copy_to_host"):  # a Numba device array
            return digests.copy_to_host()
        return np.asarray(digests)


def check_handoff_digest(sent, landed, *, on_mismatch: str = "raise") -> np.ndarray | None:
    """Compare the digests of what was sent with those of what landed, request by request.

    Parameters
    ----------
    sent : HandoffDigest
        The digests of the side the requests left.
    landed : HandoffDigest
        The digests of the side they arrived at: the same requests, in the same order.
    on_mismatch : {"raise", "miss"}
        ``"raise"``: a request whose digests differ raises KVC-K012. ``"miss"``: the mask is
        returned and the caller treats the requests marked False as cache misses (recompute).

    Returns
    -------
    bool [num_runs] or None
        True where the request arrived as it left; None when the signatures differ (not
        compared, a :class:`CanaryHandoffWarning` says why).

    Raises
    ------
    KvCanaryError
        KVC-K009 (not a HandoffDigest), KVC-C009 (``on_mismatch``), KVC-K011 (different
        numbers of requests), KVC-K012 (a digest differs, with ``on_mismatch="raise"``).
    """
    fn = "check_handoff_digest"
    for name, value in (("sent", sent), ("landed", landed)):
        if not isinstance(value, HandoffDigest):
            raise error("KVC-K009", function=fn, argument=name, got=type(value).__name__)
    if on_mismatch not in MISMATCH_CHOICES:
        raise error("KVC-C009", function=fn, argument="on_mismatch", expected=MISMATCH_CHOICES, got=on_mismatch)
    if sent.signature != landed.signature:
        warnings.warn(
            f"kv-canary hand-off: digests of different layouts were not compared (sent {sent.signature}, "
            f"landed {landed.signature})",
            CanaryHandoffWarning,
            stacklevel=2,
        )
        return None
    a, b = sent.host(), landed.host()
    if a.shape != b.shape:
        raise error("KVC-K011", function=fn, expected=a.shape[0], got=b.shape[0])
    intact = a == b
    if on_mismatch == "raise" and not intact.all():
        bad = np.flatnonzero(~intact)
        raise error("KVC-K012", function=fn, count=bad.shape[0], total=a.shape[0], runs=bad[:_SHOWN].tolist())
    return intact
