"""Errors raised for rejected input, each with a stable catalogue code.

Raise sites write ``raise error("KVC-P003", function=..., argument=..., ...)``;
the code selects the registry entry whose template becomes the message, and the
message ends with the URL of the code's catalogue page.
"""

from __future__ import annotations

from typing import Any

from .registry import DOCS_URL, OPERATIONS, REGISTRY, ErrorEntry, define, docs_url, message_ending

__all__ = [
    "DOCS_URL",
    "OPERATIONS",
    "REGISTRY",
    "ErrorEntry",
    "KvCanaryError",
    "KvCanaryTypeError",
    "define",
    "docs_url",
    "error",
    "lookup",
    "message_ending",
]


class KvCanaryError(ValueError):
    """Input rejected by kvcanary_numba.

    Attributes
    ----------
    code : str
        Stable catalogue code such as ``"KVC-P003"``.
    entry : ErrorEntry
        The registry entry (meaning, fixes, examples).
    fields : dict
        The values the message was formatted with.
    """

    def __init__(self, code: str, message: str, fields: dict[str, Any]):
        super().__init__(message)
        self.code = code
        self.fields = fields

    @property
    def entry(self) -> ErrorEntry:
        return REGISTRY[self.code]


class KvCanaryTypeError(KvCanaryError, TypeError):
    """A :class:`KvCanaryError` about a dtype or type; also a :class:`TypeError`."""


def lookup(code: str) -> ErrorEntry:
    """Registry entry of ``code`` (case-insensitive); ``KeyError`` if unknown."""
    return REGISTRY[code.strip().upper()]


def error(code: str, **fields: Any) -> KvCanaryError:
    """Build (not raise) the exception for ``code`` with its message filled in.

    Parameters
    ----------
    code : str
        A registered code.
    **fields
        Exactly the fields named by the entry's message template.
    """
    entry = REGISTRY[code]
    missing = set(entry.fields) - set(fields)
    if missing:
        raise RuntimeError(f"{code}: raise site did not supply {sorted(missing)}")
    text = entry.render(fields)
    cls = KvCanaryTypeError if entry.exception == "type" else KvCanaryError
    return cls(code, text, dict(fields))


# Registering modules, one per operation (imported for their side effect).
from . import (  # noqa: E402,F401
    arguments,
    batch,
    buffers,
    common,
    engine,
    fingerprint,
    handoff,
    monitor,
    moves,
    plan,
    plan_inputs,
    ranks,
    scatter,
    sources,
    threads,
    triage,
    verify,
    write,
)
