"""Bad input is rejected at construction with a coded error: sources, groups, chains (issue 14).

Sizes and the toy engine: test_reliability_sizes.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import raises_code

from kvcanary_numba import CanaryContext, KvCanaryError, RealKvHashMode, RealKvSource, compute_real_kv_hash
from kvcanary_numba.monitor import CanaryMonitor, KvGroup, SlotChain, StepBatch
from kvcanary_numba.reference.fingerprint import compute_real_kv_hash as reference_hash


def _source(tensor, page_size=1, nbt=32, rb=32):
    return RealKvSource(tensor=tensor, page_size=page_size, num_bytes_per_token=nbt, read_bytes=rb)


def _hash(sources, slots, mode=RealKvHashMode.ALL):
    out = np.full(len(slots), -7, dtype=np.int64)
    compute_real_kv_hash(
        real_kv_sources=sources,
        real_kv_hash_mode=mode,
        slot_indices=np.array(slots, np.int64),
        out=out,
        backend="numpy",
    )
    return out


# --- RealKvSource geometry -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "page_size, nbt", [(2, np.int64(2**62)), (np.int64(2**60), 16), (np.int64(2**62), 32), (2**33, 2**31 * 16)]
)
def test_geometry_products_are_exact_so_they_cannot_wrap_past_the_row(page_size, nbt):
    # int64 products of these wrap to 0 or a negative number; the row holds 128 bytes.
    with raises_code("KVC-R006"):
        RealKvSource(tensor=np.zeros((4, 128), np.uint8), page_size=page_size, num_bytes_per_token=nbt, read_bytes=16)


def test_the_reported_segfault_input_is_rejected_before_any_read():
    with raises_code("KVC-R006"):
        src = RealKvSource(
            tensor=np.zeros((4, 128), np.uint8), page_size=2, num_bytes_per_token=np.int64(2**62), read_bytes=32
        )
        _hash((src,), [0, 7])


def test_numpy_integers_are_accepted_and_stored_as_python_ints():
    kv = np.arange(4 * 64, dtype=np.uint8).reshape(4, 64)
    src = RealKvSource(tensor=kv, page_size=np.int32(2), num_bytes_per_token=np.uint64(32), read_bytes=np.int64(16))
    assert [type(v) for v in (src.page_size, src.num_bytes_per_token, src.read_bytes)] == [int, int, int]
    plain = _source(kv, page_size=2, nbt=32, rb=16)
    np.testing.assert_array_equal(_hash((src,), [0, 1, 7]), _hash((plain,), [0, 1, 7]))


@pytest.mark.parametrize(
    "field, code", [("page_size", "KVC-R001"), ("num_bytes_per_token", "KVC-R002"), ("read_bytes", "KVC-R003")]
)
@pytest.mark.parametrize("value", [True, np.bool_(True), 32.0, np.float64(32), "32", None])
def test_bools_floats_and_strings_are_not_geometry(field, code, value):
    kw = dict(tensor=np.zeros((4, 64), np.uint8), page_size=1, num_bytes_per_token=32, read_bytes=32)
    kw[field] = value
    with raises_code(code):
        RealKvSource(**kw)


def test_reversed_and_object_tensors_are_rejected():
    with raises_code("KVC-R005"):
        _source(np.zeros((8, 32), np.uint8)[::-1])
    with raises_code("KVC-R010"):
        _source(np.zeros((8, 4), dtype=object))


def test_broadcast_rows_fingerprint_like_the_materialised_tensor():
    row = np.arange(32, dtype=np.uint8)
    broadcast = _source(np.broadcast_to(row, (6, 32)))
    copied = _source(np.ascontiguousarray(np.broadcast_to(row, (6, 32))))
    np.testing.assert_array_equal(_hash((broadcast,), [0, 3, 5]), _hash((copied,), [0, 3, 5]))
    assert _hash((copied,), [0])[0] != 0


def test_an_empty_tensor_is_accepted_whatever_its_strides():
    empty = np.lib.stride_tricks.as_strided(np.zeros(32, np.uint8), shape=(0, 32), strides=(0, 0))
    src = _source(empty)
    assert src.slots_covered == 0
    assert list(_hash((src,), [0, 1])) == [0, 0]  # past the rows: reads nothing


# --- groups: every source checked when the group is built -------------------------------------------------


def test_group_with_a_source_that_covers_too_few_slots_is_rejected_at_construction():
    # Accepted before, it made post_forward raise KVC-R007 and every later call KVC-M005.
    short = _source(np.zeros((15, 32), np.uint8))
    with raises_code("KVC-R007") as excinfo:
        KvGroup(kind="full", num_slots=16, k_sources=(short,))
    assert "k_sources" in str(excinfo.value) and "fewer than num_slots = 16" in str(excinfo.value)
    with raises_code("KVC-R007") as excinfo:
        KvGroup(kind="full", num_slots=16, k_sources=(_source(np.zeros((16, 32), np.uint8)),), v_sources=(short,))
    assert "v_sources" in str(excinfo.value)


@pytest.mark.parametrize(
    "sources, code",
    [(None, "KVC-R009"), ("kv", "KVC-R009"), ((np.zeros((16, 32)),), "KVC-R009"), ({"k": 1}, "KVC-R009")],
)
def test_group_sources_must_be_a_tuple_of_sources(sources, code):
    with raises_code(code):
        KvGroup(kind="full", num_slots=16, k_sources=sources)


def test_group_of_five_sources_is_rejected():
    with raises_code("KVC-R008"):
        KvGroup(kind="full", num_slots=16, k_sources=(_source(np.zeros((16, 32), np.uint8)),) * 5)


def test_group_arrays_must_live_where_the_monitor_allocates():
    class HostPosingAsCuda:
        def __init__(self, a):
            self.shape, self.dtype = a.shape, a.dtype
            self.__cuda_array_interface__ = {
                "shape": a.shape,
                "typestr": a.dtype.str,
                "data": (a.ctypes.data, False),
                "strides": None,
                "version": 3,
            }

    lut = np.arange(17, dtype=np.int64)
    full = KvGroup(kind="full", num_slots=16)
    swa = KvGroup(kind="swa", num_slots=16, swa_window_size=2, full_to_swa_index_mapping=HostPosingAsCuda(lut))
    with raises_code("KVC-C007"):
        CanaryMonitor(full=full, swa=swa, write_req_capacity=2)


@pytest.mark.parametrize("num_slots", [2**31, 2**63, np.uint64(2**63), 1.5, True])
def test_group_size_has_an_upper_bound(num_slots):
    with raises_code("KVC-C011"):
        KvGroup(kind="full", num_slots=num_slots)


# --- StepBatch ------------------------------------------------------------------------------------------------


def _batch(**changes):
    i64 = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    fields = dict(
        req_pool_indices=i64([1]),
        prefix_lens=i64([0]),
        extend_seq_lens=i64([2]),
        req_to_token=np.zeros((2, 4), np.int32),
        input_ids=i64([5, 6]),
        positions=i64([0, 1]),
        out_cache_loc=i64([1, 2]),
    )
    fields.update(changes)
    return StepBatch(**fields)


@pytest.mark.parametrize(
    "field, value, code",
    [
        ("positions", np.zeros(2, np.int16), "KVC-C002"),
        ("positions", np.zeros(2, ">i8"), "KVC-C002"),
        ("req_to_token", np.zeros((2, 4), np.int64), "KVC-C002"),
        ("input_ids", np.int64(3), "KVC-C001"),
        ("input_ids", np.zeros((), np.int64), "KVC-C003"),
        ("out_cache_loc", np.zeros(3, np.int64), "KVC-C004"),
        ("prefix_lens", [0], "KVC-C001"),
        ("token_offsets", np.zeros(3, np.int64), "KVC-S001"),
        ("expected_input_tokens", np.zeros(2, np.int64), "KVC-M011"),
    ],
)
def test_step_batch_checks_every_field_at_construction(field, value, code):
    with raises_code(code):
        _batch(**{field: value})


def test_byte_swapped_dtypes_are_named_as_such():
    with pytest.raises(KvCanaryError, match="got >i8") as excinfo:
        _batch(positions=np.zeros(2, ">i8"))
    assert excinfo.value.code == "KVC-C002"


# --- sweep chains ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "slots",
    [
        [1.5, 2.5],
        np.array([1.0, 2.0]),
        [2**64],
        [-(2**63) - 1],
        np.array([2**63], np.uint64),
        np.array([[1, 2]]),
        None,
        "ab",
        [True, False],
        [[1], [2, 3]],
    ],
)
def test_chain_slots_must_be_int64_slot_indices(slots):
    with raises_code("KVC-M010"):
        SlotChain(slots=slots)


@pytest.mark.parametrize(
    "kw",
    [
        dict(start_position=-1),
        dict(start_position=1.0),
        dict(start_position=2**63),
        dict(prev_slot="x"),
        dict(prev_slot=2**70),
        dict(prev_slot=1.0),
    ],
)
def test_chain_positions_and_predecessor_are_int64(kw):
    with raises_code("KVC-C011"):
        SlotChain(slots=[1, 2], **kw)


def test_chain_keeps_its_own_copy_of_the_slots():
    slots = [3, 4, 5]
    chain = SlotChain(slots=slots)
    slots[0] = 99
    assert chain.slots.dtype == np.int64 and list(chain.slots) == [3, 4, 5]
    assert list(SlotChain(slots=[]).slots) == []


@pytest.mark.parametrize("chains", [None, (SlotChain(slots=[s]) for s in (1, 2)), SlotChain(slots=[1]), "ab"])
def test_sweep_takes_a_list_or_tuple_of_chains(chains):
    m = CanaryMonitor(full=KvGroup(kind="full", num_slots=16), write_req_capacity=2, health_interval=0)
    with raises_code("KVC-M009"):
        m.sweep(chains)
    assert m.sweeps == 0


def test_reference_fingerprint_agrees_on_a_strided_source():
    kv = np.arange(8 * 64, dtype=np.uint8).reshape(8, 64)[:, :32]  # rows strided by 64 bytes
    src = _source(kv)
    out = np.zeros(3, np.int64)
    reference_hash(
        real_kv_sources=(src,),
        real_kv_hash_mode=RealKvHashMode.ALL,
        slot_indices=np.array([0, 4, 7], np.int64),
        out=out,
    )
    np.testing.assert_array_equal(out, _hash((_source(np.ascontiguousarray(kv)),), [0, 4, 7]))


def test_context_sources_must_cover_its_slots_at_allocation():
    with raises_code("KVC-R007"):
        CanaryContext.allocate(num_slots=16, real_kv_sources=(_source(np.zeros((8, 32), np.uint8)),))
    with raises_code("KVC-R008"):
        CanaryContext.allocate(num_slots=4, real_kv_sources=(_source(np.zeros((8, 32), np.uint8)),) * 5)
    ctx = CanaryContext.allocate(num_slots=8, real_kv_sources=[_source(np.zeros((8, 32), np.uint8))])
    assert isinstance(ctx.real_kv_sources, tuple) and ctx.real_kv_hash_mode == RealKvHashMode.NONE


@pytest.mark.parametrize("stride", [0, 16, 36])
def test_allocate_names_slot_stride_bytes_for_a_bad_stride(stride):
    # The buffer does not exist yet: the message must name the argument the caller passed.
    with raises_code("KVC-C012") as excinfo:
        CanaryContext.allocate(num_slots=4, slot_stride_bytes=stride)
    assert "slot_stride_bytes" in str(excinfo.value) and f"got {stride} bytes" in str(excinfo.value)
