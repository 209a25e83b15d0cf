"""Device helpers of the write chain shared by the launches of one monitor step.

The chain of a write (token, position -> prev_hash) depends only on the
step's inputs and on the seed record's chain state, so the HEAD and TAIL, K
and V launches of one step compute the same chain. One launch *publishes*
(role ``PUBLISH``): for every entry it writes the chain state before the
entry, then the inputs it hashed, into ``published`` (int64 [5, tokens]:
prev_hash, expected chain position, token, position, slot), and per request
its seed state into ``published_seeds`` (int64 [2, requests]: seed hash, seed
position). Later launches *consume* it (role ``CONSUME``) and skip the
recurrence, while checking that it applies to them:

- a request whose seed state in the consumer's own buffer differs from the
  published one (a corrupted seed record, say) runs its own chain;
- a chunk whose inputs differ from the published ones (token, position, or
  whether the entry is skipped) switches to its own chain at the first
  difference, starting from the published state before that entry, which is
  still exact because every earlier entry matched.

Records are therefore bit-identical to those of a launch that runs its own
chain. Role ``OWN`` (a launch beside a publisher, or one without a step
scratch) ignores both arrays. Used by ``write_shared.py``, ``write_tiled.py`` and
``chain.py``.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint64

from ...kernels.hashing import MINUS_ONE, ONE, ZERO

__all__ = [
    "CONSUME",
    "OWN",
    "PUBLISH",
    "first_difference",
    "load_published",
    "publish",
    "request_role",
    "same_entry",
    "share_role",
    "switch_state",
]

OWN = np.int64(0)
PUBLISH = np.int64(1)
CONSUME = np.int64(2)
_HASH, _EXPECT, _TOKEN, _POSITION, _SLOT = (np.int64(i) for i in range(5))
#: Rows of ``published`` and ``published_seeds``.
ENTRY_ROWS, SEED_ROWS = 5, 2


@cuda.jit(device=True)
def share_role(role, num_tokens, num_reqs, published, published_seeds):
    """``role``, or ``OWN`` when the scratch arrays are too small for this launch."""
    if role == OWN:
        return OWN
    if published.shape[0] < ENTRY_ROWS or published.shape[1] < num_tokens:
        return OWN
    if published_seeds.shape[0] < SEED_ROWS or published_seeds.shape[1] < num_reqs:
        return OWN
    return role


@cuda.jit(device=True)
def request_role(role, r, running, prev_position, published_seeds, lane):
    """Publishes request ``r``'s seed state (lane 0); True when a consumer may reuse the published chain."""
    if role == PUBLISH:
        if lane == ZERO:
            published_seeds[_HASH, r] = int64(running)
            published_seeds[_EXPECT, r] = prev_position
        return False
    if role == CONSUME:
        return int64(running) == published_seeds[_HASH, r] and prev_position == published_seeds[_EXPECT, r]
    return False


@cuda.jit(device=True)
def load_published(i, hi, reuse, published):
    """(prev_hash, expected position, token, position, slot) published for entry ``i`` (zeros if unused)."""
    if reuse and i < hi:
        return (
            published[_HASH, i],
            published[_EXPECT, i],
            published[_TOKEN, i],
            published[_POSITION, i],
            published[_SLOT, i],
        )
    return ZERO, ZERO, ZERO, ZERO, MINUS_ONE


@cuda.jit(device=True)
def publish(published, i, chain_hash, chain_position, token, position, slot):
    """Column ``i`` of ``published``: the chain state before entry ``i`` and the inputs hashed."""
    published[_HASH, i] = chain_hash
    published[_EXPECT, i] = chain_position
    published[_TOKEN, i] = token
    published[_POSITION, i] = position
    published[_SLOT, i] = slot


@cuda.jit(device=True)
def same_entry(lane, n, slot, token, position, p_token, p_position, p_slot):
    """1 if this lane's entry was hashed as published (or the lane has no entry), else 0."""
    if lane >= n:
        return ONE
    if token == p_token and position == p_position and (slot < ZERO) == (p_slot < ZERO):
        return ONE
    return ZERO


@cuda.jit(device=True)
def first_difference(n, s_same):
    """First entry of the chunk whose inputs differ from the published ones (``n`` if none)."""
    for k in range(n):
        if s_same[k] == ZERO:
            return int64(k)
    return int64(n)


@cuda.jit(device=True)
def switch_state(published, i):
    """(running hash, previous position) of the chain before entry ``i``, as published."""
    return uint64(published[_HASH, i]), published[_EXPECT, i] - ONE
