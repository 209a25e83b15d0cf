"""StepBatch: the metadata of one forward step, as the monitor's hooks take it.

The request arrays and the token arrays may be int32 or int64 (SGLang accepts both in a
ForwardBatch); the kernels read int64, so :class:`BatchChecks` hands the launches a batch
whose int32 fields are int64 copies in buffers the monitor allocates once (:class:`Widened`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from .. import _overlap
from .._validate import check_array, inspect_array, resolve_backend
from ..errors import error
from ..fast.bound import holds_test
from ..plan_offsets import check_lut_head
from ..write import check_index_array, warn_slot_zero
from .groups import check_type

_PRE_FORWARD = "CanaryMonitor.pre_forward"

__all__ = ["INDEX_FIELDS", "BatchChecks", "StepBatch", "Widened", "host_indices", "slot_zero_written"]


@dataclass(slots=True, kw_only=True)
class StepBatch:
    """One step's batch, in the engine's own (NumPy or CuPy) arrays; nothing is copied.

    New tokens are packed request-major in batch order: request ``r`` owns
    entries ``[sum(extend_seq_lens[:r]), sum(extend_seq_lens[:r + 1]))`` of the
    token arrays.

    Slots: KV slot 0 is SGLang's padding slot (padding rows and padded tokens point there) and
    is never verified, so an engine allocates its KV slots from 1; the monitor warns once
    (:class:`~kvcanary_numba.write.CanarySlotZeroWarning`) when a real request's new token
    targets slot 0, seen where ``out_cache_loc`` is host memory (no device read on a GPU).

    Attributes
    ----------
    req_pool_indices : int64 or int32 [bs]
        req_to_token row of each request (0 = padding row).
    prefix_lens : int64 or int32 [bs]
        Tokens whose KV was written before this step (verified this step).
    extend_seq_lens : int64 or int32 [bs]
        New tokens per request (written this step).
    req_to_token : int32 [rows, max_context_len]
        FULL KV slot of every (row, position), already holding this step's new slots.
    input_ids, positions, out_cache_loc : int64 or int32 [num_tokens]
        Token, position and FULL KV slot (1 or more; 0 is the padding slot) of every new token.
    expected_input_tokens, expected_input_positions : int64 [num_tokens] or None
        What an independent oracle says the new tokens and positions should
        be; when given, the write kernels assert them (write-input assert).
    token_ids_flat : int64 [total] or None
        Every request's known tokens (prompt + generated) concatenated, for the
        expected-token check.
    token_offsets : int64 [bs + 1] or None
        Exclusive prefix sums into ``token_ids_flat`` (leading 0).

    Raises
    ------
    KvCanaryError
        At construction, :meth:`check_arrays`'s codes; the monitor's hooks check
        again (cheaply) in case a field was reassigned since.
    """

    req_pool_indices: Any
    prefix_lens: Any
    extend_seq_lens: Any
    req_to_token: Any
    input_ids: Any
    positions: Any
    out_cache_loc: Any
    expected_input_tokens: Any = None
    expected_input_positions: Any = None
    token_ids_flat: Any = None
    token_offsets: Any = None

    def __post_init__(self) -> None:
        self.check_arrays("StepBatch")

    def fields(self) -> tuple:
        """The field objects, in declaration order (what :meth:`check_arrays` looks at)."""
        return _GET_FIELDS(self)

    def check_arrays(self, function: str, *, kind: str | None = None, device: int | None = None) -> list:
        """Check every field (type, dtype, ndim, lengths, contiguity, one device) before any launch.

        Parameters
        ----------
        function : str
            Named in error messages (fields are named ``batch.<field>``).
        kind, device : optional
            The monitor's array kind (``"numpy"`` / ``"cuda"``) and CUDA device:
            every field must live there (KVC-C007).

        Returns
        -------
        list of (str, ArrayInfo)
            Every present field as ``batch.<field>`` and what the checks read of it.

        Raises
        ------
        KvCanaryError
            KVC-C001 … KVC-C007 for a field, KVC-S001 for ``token_offsets``,
            KVC-M011 for one expected-input array without the other.
        """
        infos = _check_fields(function, self)
        resolve_backend(
            function, "auto", infos if kind is None else [("the monitor's buffers", _Placement(kind, device)), *infos]
        )
        return infos

    @property
    def batch_size(self) -> int:
        return int(self.req_pool_indices.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def check_fits(self, function: str, write_req_capacity: int, write_token_capacity: int, check_tokens: bool) -> None:
        """Host-side checks of the batch against the monitor's capacities (no device reads).

        Raises
        ------
        KvCanaryError
            KVC-M002 (too many requests), KVC-M003 (too many tokens), KVC-M008
            (token snapshot missing while the token check is on).
        """
        # Runs at every hook: shapes read directly, the messages built only on failure.
        if self.req_pool_indices.shape[0] > write_req_capacity:
            raise error("KVC-M002", function=function, got=self.batch_size, capacity=write_req_capacity)
        if self.input_ids.shape[0] > write_token_capacity:
            raise error(
                "KVC-M003",
                function=function,
                argument="batch.input_ids",
                got=self.num_tokens,
                capacity=write_token_capacity,
            )
        if check_tokens and (self.token_ids_flat is None or self.token_offsets is None):
            for name in ("token_ids_flat", "token_offsets"):
                if getattr(self, name) is None:
                    raise error("KVC-M008", function=function, argument=f"batch.{name}")


#: Field names in declaration order (request arrays, table, token arrays, oracle, token snapshot).
_FIELDS = (
    "req_pool_indices",
    "prefix_lens",
    "extend_seq_lens",
    "req_to_token",
    "input_ids",
    "positions",
    "out_cache_loc",
    "expected_input_tokens",
    "expected_input_positions",
    "token_ids_flat",
    "token_offsets",
)
_GET_FIELDS = attrgetter(*_FIELDS)  # one C call for the tuple of field objects


#: The fields that may be int32 (SGLang's ForwardBatch takes int32 or int64 for them).
INDEX_FIELDS = ("req_pool_indices", "prefix_lens", "extend_seq_lens", "input_ids", "positions", "out_cache_loc")
_REQUEST_FIELDS = INDEX_FIELDS[:3]


class BatchChecks:
    """A monitor's checks of the batches its hooks get, remembering the batch last checked.

    The array checks are skipped for the batch last checked while its fields are the objects
    checked, each with the layout it had then (shape, strides, dtype, pointer: an array reshaped
    or given other memory in place is checked again), so a batch refilled in place costs a few
    identity and layout tests per hook (the fast wing's generated ``holds_test``), and the sizes
    then still fit the capacities. A call returns the batch to launch on: the one given, or (int32
    fields) its widened twin.

    Attributes
    ----------
    checked : (StepBatch, tuple) or None
        The last batch that passed and its field objects. Set only on success (a rejected
        call changes nothing) and replaced, never mutated: a captured step keys its memo
        on this tuple's identity.
    widened : Widened
        The int64 copies of int32 fields.
    """

    def __init__(self, placement, caps: dict, *, check_tokens: bool, buffers=None):
        self.placement, self.checked, self._holds = placement, None, None
        self.capacities = (caps["write_req_capacity"], caps["write_token_capacity"], check_tokens)
        self.widened = Widened(placement, caps)
        self._slot_zero_seen = self._host_indices = False
        groups = [] if buffers is None else [g.group for g in buffers.groups]
        # The SWA groups' LUTs: a value the plan checks (KVC-P008) is checked here too, before the
        # FULL group's plan and HEAD launches, since the engine may change it in place.
        self.luts = tuple(g.full_to_swa_index_mapping for g in groups if g.full_to_swa_index_mapping is not None)
        self.own = [] if buffers is None else own_arrays(buffers)

    def _shares_none(self, function: str, infos: list) -> None:
        """KVC-C017 when a batch field shares memory with an array the monitor's launches write (its
        ring, status words, canary buffers): found here, before the step's first launch."""
        if self.own:
            _overlap.check(function, self.own + infos)

    def __call__(self, function: str, batch: StepBatch) -> StepBatch:
        """Check ``batch`` (all of it when new, what can change inside its arrays always) and return the
        batch to launch on."""
        seen = self.checked
        fresh = seen is None or seen[0] is not batch or not self._holds(batch)
        if fresh:
            fields, infos = self._check_new(function, batch)
        # Otherwise the fields' objects and shapes are as checked, so their sizes still fit. What the
        # engine may rewrite in place is checked at every hook: the LUTs' heads, and in host arrays
        # a real request's new token in slot 0, looked for once per step.
        for lut in self.luts:
            check_lut_head(function, lut)
        if fresh:  # remembered only once every check passed: a rejected call changes nothing
            self.checked, self._holds = (batch, fields), holds_test(_FIELDS, fields)
            self.widened.use(batch, [name[6:] for name, info in infos if info.dtype == np.int32])
            self._host_indices = host_indices(batch)  # device arrays are not read: that would sync
        if self._host_indices and not self._slot_zero_seen and function == _PRE_FORWARD and slot_zero_written(batch):
            self._slot_zero_seen = True  # said once per monitor (and once per process: warn_slot_zero)
            warn_slot_zero(function)
        return batch if self.widened.twin is None else self.widened.refill(batch)

    def _check_new(self, function: str, batch: StepBatch) -> tuple:
        """Every check of a batch, or of fields, not checked before; (field objects, their infos)."""
        check_type(function, "batch", batch, StepBatch)
        fields = batch.fields()
        infos = batch.check_arrays(function, kind=self.placement.kind, device=self.placement.device)
        self._shares_none(function, infos)
        batch.check_fits(function, *self.capacities)
        return fields, infos


class Widened:
    """int64 copies of a batch's int32 index fields, for the kernels (which read int64).

    The buffers (one per field, sized by the monitor's capacities) are allocated at the first
    batch with an int32 field and kept: a step allocates nothing. :meth:`use` makes the twin of
    a newly checked batch (the same object again for the same batch, so a captured graph keeps
    matching), :meth:`refill` copies the values at every hook, on CuPy's current stream (the
    monitor's launches follow in stream order), and returns the batch to launch on.
    """

    def __init__(self, placement, caps: dict):
        self.placement = placement
        self.sizes = {
            name: caps["write_req_capacity"] if name in _REQUEST_FIELDS else caps["write_token_capacity"]
            for name in INDEX_FIELDS
        }
        self.buffers: dict[str, Any] = {}
        self.source: StepBatch | None = None
        self.twin: StepBatch | None = None
        self.names: tuple[str, ...] = ()

    def use(self, batch: StepBatch, int32_fields) -> None:
        """Make (or update) the twin of ``batch`` whose ``int32_fields`` are views of the buffers."""
        names = tuple(name for name in INDEX_FIELDS if name in int32_fields)
        if not names:
            self.source = self.twin = None
            self.names = ()
            return
        twin = self.twin if self.source is batch else copy.copy(batch)
        for name in _FIELDS:
            value = getattr(batch, name)
            setattr(twin, name, self._buffer(name)[: value.shape[0]] if name in names else value)
        self.source, self.twin, self.names = batch, twin, names

    def refill(self, batch: StepBatch) -> StepBatch:
        """Copy ``batch``'s int32 fields (the batch :meth:`use` saw) into its twin and return the twin
        (called while there is one: :attr:`twin` is not None)."""
        twin = self.twin
        if self.placement.kind == "numpy":
            for name in self.names:
                np.copyto(getattr(twin, name), getattr(batch, name))
        else:
            import cupy

            for name in self.names:
                cupy.copyto(getattr(twin, name), cupy.asarray(getattr(batch, name)))
        return twin

    def _buffer(self, name: str):
        buffer = self.buffers.get(name)
        if buffer is None:
            size = max(self.sizes[name], 1)
            if self.placement.kind == "numpy":
                buffer = np.zeros(size, dtype=np.int64)
            else:
                import cupy

                with cupy.cuda.Device(self.placement.device):
                    buffer = cupy.zeros(size, dtype=np.int64)
            self.buffers[name] = buffer
        return buffer


def own_arrays(buffers) -> list:
    """(name, ArrayInfo) of the arrays a monitor's launches write, each marked as an output."""
    arrays = [("the monitor's violation ring", buffers.ring), ("the monitor's status words", buffers.status.words)]
    for g in buffers.groups:
        arrays += [
            (f"the monitor's {g.kind} {stage} {half} canary buffer", a) for (stage, half), a in g.buffers.items()
        ]
    out = []
    for name, array in arrays:
        info = inspect_array("CanaryMonitor", name, array)
        info.output = True
        out.append((name, info))
    return out


def host_indices(batch: StepBatch) -> bool:
    """Whether the fields :func:`slot_zero_written` reads are host (NumPy) arrays (tested once per new batch)."""
    array = np.ndarray
    return (
        isinstance(batch.out_cache_loc, array)
        and isinstance(batch.req_pool_indices, array)
        and isinstance(batch.extend_seq_lens, array)
    )


def slot_zero_written(batch: StepBatch) -> bool:
    """Whether a real request's new token targets slot 0, for a batch of :func:`host_indices`
    (its caller's test: reading device arrays would sync). The plan gives padding rows
    (``req_pool_indices`` 0) no entries, so the step's real entries are the first
    ``sum(extend_seq_lens)`` of them."""
    loc, rows, lens = batch.out_cache_loc, batch.req_pool_indices, batch.extend_seq_lens
    if np.count_nonzero(loc) == loc.size:  # no slot 0 at all (nearly every step): a fifth of `(loc == 0).any()`
        return False
    zero = loc == 0
    real = int(np.where(rows != 0, np.maximum(lens, 0), 0).sum())
    return bool(zero[:real].any())


class _Placement:
    """Kind and device of the monitor's own arrays, in the shape resolve_backend compares."""

    __slots__ = ("kind", "device")

    def __init__(self, kind: str, device: int | None):
        self.kind, self.device = kind, device


def _check_fields(function: str, batch: StepBatch) -> list:
    """[(name, ArrayInfo)] of every present field, each checked against the others' lengths."""

    def one(name, dtype, ndim=1, shape=None, shape_of=None):
        info = check_array(
            function, f"batch.{name}", getattr(batch, name), dtype=dtype, ndim=ndim, shape=shape, shape_of=shape_of
        )
        infos.append((f"batch.{name}", info))
        return info.shape

    def index(name, shape=None, shape_of=None):  # int64 or int32
        info = check_index_array(function, f"batch.{name}", getattr(batch, name), shape=shape, shape_of=shape_of)
        infos.append((f"batch.{name}", info))
        return info.shape

    infos: list = []
    (bs,) = index("req_pool_indices")
    index("prefix_lens", shape=(bs,), shape_of="batch.req_pool_indices")
    index("extend_seq_lens", shape=(bs,), shape_of="batch.req_pool_indices")
    one("req_to_token", np.int32, ndim=2)
    (n,) = index("input_ids")
    index("positions", shape=(n,), shape_of="batch.input_ids")
    index("out_cache_loc", shape=(n,), shape_of="batch.input_ids")
    pair = ("expected_input_tokens", "expected_input_positions")
    given = [getattr(batch, name) is not None for name in pair]
    if given[0] != given[1]:
        missing, other = pair if given[1] else pair[::-1]
        raise error("KVC-M011", function=function, argument=f"batch.{missing}", other=f"batch.{other}")
    if given[0]:
        for name in pair:
            one(name, np.int64, shape=(n,), shape_of="batch.input_ids")
    if batch.token_ids_flat is not None:
        one("token_ids_flat", np.int64)
    if batch.token_offsets is not None:
        offsets = check_array(function, "batch.token_offsets", batch.token_offsets, dtype=np.int64, ndim=1)
        if offsets.shape[0] != bs + 1:
            raise error(
                "KVC-S001", function=function, argument="batch.token_offsets", expected=bs + 1, got=offsets.shape[0]
            )
        infos.append(("batch.token_offsets", offsets))
    return infos
