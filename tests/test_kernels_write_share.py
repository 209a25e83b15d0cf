"""The write chain shared by one step's launches (fast/kernels/share.py, write_shared.py): a consumer's records
are byte-equal to those of a launch that runs its own chain, whatever differs from the
publisher (seed record, tokens, positions, skipped entries); and it really reuses the chain.
Every case runs on both paths: the serial kernel (a batch size that makes the step
decode-shaped) and the tiled one (test_kernels_write_tiled.py has its own cases)."""

from __future__ import annotations

import numpy as np
import pytest
from canary_helpers import HEAD, make_context, record, stamp, write_args, write_plan
from kernel_pairs import KERNEL_DEVICE, to_device, to_host, write

from kvcanary_numba.fast import write as write_glue
from kvcanary_numba.fast.chain import SharedChain, sharing
from kvcanary_numba.hashing import to_signed

pytestmark = pytest.mark.simulator

N = 70  # three chunks of a warp, the last one partial
SEED = 80


@pytest.fixture(params=["serial", "tiled"])
def share(request):
    """``sharing`` on one path: the serial kernel (N requests' worth of tokens: decode-shaped) or tiled."""
    requests = N if request.param == "serial" else None
    return lambda chain, publish: sharing(chain, publish=publish, requests=requests)


def _chain() -> SharedChain:
    chain = SharedChain(np, tokens=N + 8, requests=2)
    chain.published = to_device(chain.published, KERNEL_DEVICE)
    chain.published_seeds = to_device(chain.published_seeds, KERNEL_DEVICE)
    return chain


def _inputs():
    tokens = list(range(1000, 1000 + N))
    positions = list(range(5, 5 + N))
    slots = list(range(1, N + 1))
    return tokens, positions, slots


def _seeded():
    ctx = make_context(96)
    stamp(ctx, SEED, 77, 4, HEAD)
    return ctx


def _publish(share, chain, slots=None):
    tokens, positions, default = _inputs()
    with share(chain, True):
        write(_seeded(), write_plan([N], [SEED]), tokens, positions, default if slots is None else slots)


def test_consumer_reuses_the_published_chain(share):
    # White box: a planted prev_hash in the scratch shows up in the consumer's record,
    # so the consumer did not recompute the chain (byte-equality alone could not tell).
    chain = _chain()
    _publish(share, chain)
    published = to_host(chain.published).copy()
    published[0, 40] = to_signed(0x1234)
    chain.published = to_device(published, KERNEL_DEVICE)
    ctx = to_device(_seeded(), KERNEL_DEVICE)
    with share(chain, False):
        write_glue.launch_canary_write_kernel(
            context=ctx, **to_device_args(write_args(write_plan([N], [SEED]), *_inputs()))
        )
    fields = to_host(ctx.canary_buf).view(np.int64)
    assert fields[41, 2] == 0x1234 and fields[40, 2] != 0x1234


def to_device_args(kwargs: dict) -> dict:
    return {k: to_device(v, KERNEL_DEVICE) for k, v in kwargs.items()}


@pytest.mark.parametrize("change", ["none", "seed record", "token", "position", "skipped", "unskipped"])
def test_consumer_records_equal_their_own_chain(share, change):
    chain = _chain()
    tokens, positions, slots = _inputs()
    _publish(share, chain, [-1 if i == 10 else s for i, s in enumerate(slots)] if change == "unskipped" else None)
    ctx = _seeded()
    if change == "seed record":
        stamp(ctx, SEED, 78, 4, HEAD)  # a different seed state: the consumer's own chain
    elif change == "token":
        tokens[40] += 1  # second chunk: the first chunk reuses, then the chain switches
    elif change == "position":
        positions[64] += 3  # first entry of the last chunk (and the chain-position assert row)
    elif change == "skipped":
        slots[10] = -1
    # "unskipped": the publisher skipped entry 10, this launch stores it
    with share(chain, False):
        write(ctx, write_plan([N], [SEED]), tokens, positions, slots)  # kernels == reference, byte for byte
    assert record(ctx, 69)[1] == positions[68]


def test_reused_chunks_keep_the_last_of_duplicate_slots(share):
    # Within a chunk (entries 3 and 20) and across chunks (entry 50), as the reference does;
    # publisher and consumer see the same inputs, so every chunk is reused.
    chain = _chain()
    tokens, positions, slots = _inputs()
    for i in (3, 20, 50):
        slots[i] = 7
    slots[33] = slots[34] = 0  # padding entries landing in slot 0
    with share(chain, True):
        write(_seeded(), write_plan([N], [SEED]), tokens, positions, slots)
    ctx = _seeded()
    with share(chain, False):
        write(ctx, write_plan([N], [SEED]), tokens, positions, slots)
    assert record(ctx, 7)[0] == tokens[50] and record(ctx, 0)[0] == tokens[34]
