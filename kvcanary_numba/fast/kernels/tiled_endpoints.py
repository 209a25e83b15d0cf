"""Tiled writes (``write_tiled.py``) of several endpoints of one long step in ONE launch.

A long (prefill-shaped) monitor step stamps its entries from the published chain
(``chain.py`` ``chain_publish``) into the K and the V canary buffers of a
phase with ``write_tiled``: a block per request, so 8 requests keep 8 SMs busy,
and one launch per endpoint ran them one after another. These kernels stamp the
contexts of up to :data:`MAX_ENDPOINTS` endpoints at once, as
``endpoints.py`` does for the decode-shaped write: a flattened grid of
``count * per`` blocks, blocks ``[e * per, (e + 1) * per)`` running endpoint
``e`` (``parts.py``), each part the plain tiled kernel's body
(``write_tiled.make_tiled_body``) on its endpoint's arguments, as a launch of
``per`` blocks of its own. Twice the blocks, the same work per block.

Records, rows, counters and write indices are those of one ``write_tiled``
launch per endpoint (rings in another atomic order: they compare as multisets).
Every check runs per endpoint as before: a request whose seed state in that
endpoint's buffer differs from the published one walks serially, a scratch too
small for the launch walks every request serially (``share.share_role``), the
input and chain-position asserts, "the last entry of a slot wins". The barriers
of a block stay in its part's body: every block runs exactly one endpoint.

Arguments: those of ``endpoints.write_endpoints`` (per-endpoint ``UniTuple`` s,
shared plan and step arrays, the chain scratch, ``per``); the chain roles are
CONSUME (or OWN, to walk every request serially), as for ``write_tiled``. The
body is inlined once per endpoint slot, each copy reading its arguments straight
from the kernel parameters (as in ``endpoints.py``); its shared arrays
are declared once, in the body.

Variants: ``tiled_endpoints_assert{0|1}_src{0..4}``, as ``write_tiled``'s.
"""

from __future__ import annotations

from ...constants import MAX_REAL_KV_SOURCES
from .endpoints import WRITE_SIGNATURE, endpoint_write_kernel
from .write_tiled import make_tiled_body

__all__ = ["KERNELS", "SIGNATURES", "kernel_name"]


def _make(input_assert: bool, nsrc: int):
    return endpoint_write_kernel(make_tiled_body(input_assert, nsrc), kernel_name(input_assert, nsrc))


def kernel_name(input_assert: bool, nsrc: int) -> str:
    """Name of the variant in :data:`KERNELS`."""
    return f"tiled_endpoints_assert{int(bool(input_assert))}_src{int(nsrc)}"


KERNELS = {kernel_name(flag, n): _make(flag, n) for flag in (False, True) for n in range(MAX_REAL_KV_SOURCES + 1)}
#: The arguments of ``endpoints.write_endpoints``.
SIGNATURES = {name: (WRITE_SIGNATURE,) for name in KERNELS}
