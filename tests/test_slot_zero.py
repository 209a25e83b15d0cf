"""Slot 0, SGLang's padding slot: never verified, so a real token written there is unprotected.

What the kernels do with slot 0 is specified (and tested with the vectors); here: that the
blindness is real (a corrupted slot 0 is never reported), and that the public write and the
monitor say so once when a real request's token is stored there, reading host arrays only.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest
from canary_helpers import FakeCudaArray, make_context, write_args, write_plan
from monitor_helpers import Driver, monitor_records

import kvcanary_numba as kc
from kvcanary_numba import write as core_write
from kvcanary_numba.monitor import StepBatch

WRITES = {"fast": kc.launch_canary_write_kernel, "core": core_write.launch_canary_write_kernel}


@pytest.fixture
def fresh_process(monkeypatch):
    """As in a fresh process: the warning not shown yet."""
    monkeypatch.setattr(core_write, "_slot_zero_warned", False)


@contextlib.contextmanager
def no_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails
        yield


@pytest.mark.parametrize(("slot", "caught"), [(0, False), (3, True)])
def test_a_corrupted_slot_zero_is_never_reported(slot, caught):
    """Why the warning exists: verify skips slot 0, so damage there goes unseen (slot 3: caught)."""
    d = Driver(has_v=False)
    d.step({1: [(101, slot), (102, 4)]})  # the engine allocated this slot to a real token
    for buffer in d.monitor.groups[0].buffers.values():
        monitor_records(buffer)[slot, :3] += 1  # its record corrupted (token, position, prev_hash)
    d.k[slot, 0] ^= 0xFF  # and its KV bytes
    d.step({1: [(103, 5)]})
    assert bool(d.monitor.violations) is caught


@pytest.mark.parametrize("which", sorted(WRITES))
def test_public_write_warns_once_when_a_request_stores_into_slot_zero(which, fresh_process):
    ctx = make_context(16)
    with pytest.warns(kc.CanarySlotZeroWarning, match="slot 0") as caught:
        WRITES[which](context=ctx, **write_args(write_plan([2, 1], [-1, -1]), [5, 6, 7], [0, 1, 0], [3, 0, 4]))
    assert len(caught) == 1 and caught[0].filename == __file__  # the user's line
    assert "launch_canary_write_kernel" in str(caught[0].message)
    with no_warnings():
        WRITES[which](context=ctx, **write_args(write_plan([1], [-1]), [5], [0], [0]))  # once per process


@pytest.mark.parametrize("which", sorted(WRITES))
def test_entries_outside_the_plans_requests_and_swa_slots_do_not_warn(which, fresh_process):
    with no_warnings():
        # Padded tokens past the plan's ranges (padding rows have no entries) may point at slot 0.
        ctx = make_context(16)
        WRITES[which](context=ctx, **write_args(write_plan([2, 0], [-1, -1]), [5, 6, 0, 0], [0, 1, 0, 0], [3, 4, 0, 0]))
        # A request beyond write_num_valid_reqs is not walked.
        WRITES[which](context=ctx, **write_args(write_plan([1, 1], [-1, -1], num_valid=1), [5, 6], [0, 0], [3, 0]))
        # An SWA context: the LUT maps out-of-window tokens to 0 on purpose.
        swa = make_context(16, kind=kc.CanaryLaunchTag.TAIL_K_SWA)
        WRITES[which](context=swa, **write_args(write_plan([2], [-1]), [5, 6], [0, 1], [0, 3]))
    assert core_write._slot_zero_warned is False


def test_device_arrays_are_not_read(fresh_process):
    plan = write_plan([1], [-1])
    assert core_write.slot_zero_written(np.zeros(1, np.int64), plan.write_offsets, plan.write_num_valid_reqs)
    device = FakeCudaArray(np.zeros(1, np.int64))  # reading it would need a device sync
    assert not core_write.slot_zero_written(device, plan.write_offsets, plan.write_num_valid_reqs)


def test_the_memo_still_sees_new_values(fresh_process):
    """The fast wing's memo skips validation on a repeated snapshot; the slot-0 check reads values."""
    ctx = make_context(16)
    kwargs = write_args(write_plan([1], [-1]), [5], [0], [3])
    kc.launch_canary_write_kernel(context=ctx, **kwargs)
    kc.launch_canary_write_kernel(context=ctx, **kwargs)  # a memo hit
    kwargs["out_cache_loc"][0] = 0  # refilled in place: same snapshot, new value
    with pytest.warns(kc.CanarySlotZeroWarning):
        kc.launch_canary_write_kernel(context=ctx, **kwargs)


def test_the_monitor_warns_once_for_a_real_request_and_never_for_padding(fresh_process):
    d = Driver(has_v=False)
    with no_warnings():
        d.step({1: [(101, 3)]})
        padded = d.batch({1: [(102, 4)]})
        padded = StepBatch(  # a padding row (req_pool_indices 0) and its padded token, into slot 0
            **{
                "req_to_token": padded.req_to_token,
                "req_pool_indices": np.asarray([1, 0]),
                "prefix_lens": np.asarray([1, 0]),
                "extend_seq_lens": np.asarray([1, 1]),
                "input_ids": np.asarray([102, 0]),
                "positions": np.asarray([1, 0]),
                "out_cache_loc": np.asarray([4, 0]),
            }
        )
        with d.monitor.forward(padded):
            pass
        d.monitor.end_step()
        d.requests[1].append((102, 4))
    with pytest.warns(kc.CanarySlotZeroWarning, match="CanaryMonitor.pre_forward") as caught:
        d.step({1: [(103, 0)]})
    assert len(caught) == 1
    with no_warnings():
        d.step({2: [(201, 0)]})  # said once
