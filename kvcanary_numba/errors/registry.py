"""The error registry: one :class:`ErrorEntry` per stable code.

Each ``kvcanary_numba.errors.<operation>`` module registers the codes of one
operation with :func:`define`; the catalogue pages of the docs are generated
from :data:`REGISTRY`, so messages and documentation cannot drift apart.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from typing import Final

#: Root of the published documentation; error pages live under ``errors/<code>/``.
DOCS_URL: Final[str] = "https://kvcanary-numba.readthedocs.io/en/latest"

#: Code prefix letter -> operation it belongs to (index page grouping).
OPERATIONS: Final[dict[str, str]] = {
    "C": "Arrays and arguments (all operations)",
    "P": "Plan (launch_canary_plan_kernels, launch_plan_offsets_kernel)",
    "W": "Write (launch_canary_write_kernel)",
    "V": "Verify (launch_canary_verify_kernel)",
    "R": "Real-KV sources (RealKvSource, fingerprints)",
    "S": "Expected-token scatter (scatter_req_token_ids)",
    "M": "CanaryMonitor",
    "K": "Moved records (gather, scatter, move, verify records, hand-off digest)",
    "E": "Toy engine and CLI",
}

_CODE_RE = re.compile(r"^KVC-([A-Z])(\d{3})$")


@dataclass(frozen=True, slots=True)
class ErrorEntry:
    """Everything the catalogue says about one error code.

    ``message`` is a :meth:`str.format` template; the fields it names are the
    keyword arguments the raise site must pass to :func:`kvcanary_numba.errors.error`.
    """

    code: str
    title: str
    message: str
    meaning: str
    triggers: tuple[str, ...]
    solutions: tuple[str, ...]
    before: str
    after: str
    defensive: str
    prevention: str
    exception: str = "value"  # "value" -> KvCanaryError, "type" -> KvCanaryTypeError
    related: tuple[str, ...] = ()
    sglang: tuple[str, ...] = ()
    extension: bool = field(default=False)  # True when SGLang has no such check

    @property
    def operation(self) -> str:
        return OPERATIONS[self.code[4]]

    @property
    def url(self) -> str:
        return docs_url(self.code)

    @property
    def ending(self) -> str:
        """What every message of this code ends with: the code, its docs page, the offline command."""
        return message_ending(self.code)

    def render(self, fields: dict) -> str:
        """The full message: the template filled with ``fields``, then :attr:`ending`."""
        return f"{self.message.format(**fields)} {self.ending}"

    @property
    def fields(self) -> tuple[str, ...]:
        """Names of the template fields a raise site must supply."""
        return tuple(name for _, name, _, _ in string.Formatter().parse(self.message) if name)


REGISTRY: dict[str, ErrorEntry] = {}


def docs_url(code: str) -> str:
    """URL of the catalogue page of ``code``."""
    return f"{DOCS_URL}/errors/{code}/"


def message_ending(code: str) -> str:
    """The tail of every message of ``code``, ending with its page's URL (the error catalogue's contract); added here, so no
    raise site or template repeats it."""
    return f"[{code}] Run 'kvcanary explain {code}' or see {docs_url(code)}"


def define(code: str, **kwargs) -> ErrorEntry:
    """Register one catalogue entry (called at import time by the per-operation modules)."""
    match = _CODE_RE.match(code)
    if match is None or match.group(1) not in OPERATIONS:
        raise RuntimeError(f"malformed error code {code!r}")
    if code in REGISTRY:
        raise RuntimeError(f"error code {code} registered twice")
    for key in ("triggers", "solutions", "related", "sglang"):
        if key in kwargs:
            kwargs[key] = tuple(kwargs[key])
    entry = ErrorEntry(code=code, **kwargs)
    if entry.exception not in ("value", "type"):
        raise RuntimeError(f"{code}: exception must be 'value' or 'type'")
    REGISTRY[code] = entry
    return entry
