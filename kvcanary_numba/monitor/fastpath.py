"""The monitor's per-step launches on a GPU: prepared launches and CUDA-graph replay.

An eager step goes through the launch functions every step: the public ones
for the scatter and the plans (every argument validated, every kernel argument
re-wrapped) and the monitor's endpoint launches for verify and write
(``launch/endpoints.py``, on the batch the hooks validated): seven launches per
decode step for a FULL pool with K and V. :class:`FastPath` does that once per
batch *shape*:

1. the first step with a new combination of batch shapes runs them under
   :func:`~kvcanary_numba.launch.prepared.recording` (validated as in an eager
   step, nothing launched) and keeps the result as
   :class:`~kvcanary_numba.launch.prepared.PreparedLaunch` objects, one
   :class:`PreparedPhase` for HEAD (plans, verify, write) and one for TAIL;
2. every step then checks only the engine's per-step arrays whose Python
   object changed (dtype, contiguity, device; same shapes by construction),
   re-packs the pointers of those that moved, and launches.

The per-step input work runs on the device as the HEAD phase's first launches
(``_launch_inputs``): with the expected-token check on, one launch scatters the
tokens and writes the valid lengths (``launch.scatter.scatter_tokens_and_lens``),
and each SWA group's slots are translated by one launch
(``launch.translate.translate_slots``); the eager path makes a public scatter
call and CuPy array operations instead (~10 us of host time each). The flat token
list is a role whose length may change every step (``FREE_ROLES``): it is
rebound, never a reason to record again.

:class:`~.capture.CapturedStep` (``monitor/capture.py``) goes one step further: both
phases of one fixed batch are captured into two CUDA graphs (CuPy stream capture) and
replayed per step; :func:`run_pre` picks the graph when the batch matches it.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from operator import attrgetter
from typing import Any, Callable

from .._validate import inspect_array
from ..fast import native as _native
from ..fast.prepared import PreparedLaunch
from ..fast.recording import recording
from ..fast.table import LaunchTable
from ..launch._launch import LaunchSpec, View, array_layout, current_stream
from .batch import identity_test
from .bound import BoundArrays

__all__ = ["FastPath", "PreparedPhase", "compile_monitor_kernels", "run_pre"]

#: StepBatch fields the launches read (the engine's per-step arrays).
BATCH_ROLES = ("req_pool_indices", "prefix_lens", "extend_seq_lens", "req_to_token", "input_ids", "positions",
               "out_cache_loc", "expected_input_tokens", "expected_input_positions", "token_offsets",
               "token_ids_flat")  # fmt: skip
#: Roles whose shape is no part of a phase's key (the launches read their length from the array
#: argument, which rebinding repacks): the flat token list grows every decode step.
FREE_ROLES = ("token_ids_flat",)
_FN = "CanaryMonitor.pre_forward"
_ROLE_FIELDS = attrgetter(*BATCH_ROLES)  # every role (what a captured graph holds)
_BOUND_FIELDS = attrgetter(*(r for r in BATCH_ROLES if r not in FREE_ROLES))  # what BoundArrays compares


#: ``_same_arrays(batch, captured)``: each role's array of ``batch`` is the one in ``captured``
#: (a captured graph holds their pointers).
_same_arrays = identity_test(BATCH_ROLES)


def _same_layout(new: Any, old: Any) -> bool:
    if new is old:
        return True
    if new is None or old is None:
        return False
    try:
        return array_layout(new) == array_layout(old)
    except (AttributeError, KeyError, TypeError):  # not an array: never the captured one
        return False


def _kind(name: str, array: Any) -> tuple:
    info = inspect_array(_FN, f"batch.{name}", array)
    return info.kind, info.dtype, info.c_contiguous, info.device


class PreparedPhase:
    """Prepared launches of one phase and which arguments follow which per-step array.

    Parameters
    ----------
    records : list of LaunchSpec
        The phase's launches, as recorded (with origins).
    roles : dict of str to array or None
        The per-step arrays at recording time, by role name. An argument the
        glue built from one of them is rebound to that role's array each step.

    Raises
    ------
    RuntimeError
        When an argument the glue viewed from a per-call array (not
        ``persistent``) has no role: replays would keep its first pointer.
    """

    def __init__(self, records: list[LaunchSpec], roles: dict[str, Any]):
        self.launches = [PreparedLaunch.from_spec(r) for r in records]
        owner: dict[int, str] = {}
        for name, array in roles.items():
            if array is not None:
                owner.setdefault(id(array), name)  # aliased roles: the key keeps the aliasing fixed
        self.bindings: dict[str, list] = {}
        for launch, record in zip(self.launches, records):
            for index, arg in enumerate(record.args):
                origin = arg if isinstance(arg, View) else None
                name = None if origin is None else owner.get(id(origin.source))
                if name is not None:
                    self.bindings.setdefault(name, []).append((launch, index, origin))
            for index in record.transient_arguments():
                if owner.get(id(record.args[index].source)) is None:
                    raise RuntimeError(f"prepared phase: argument {index} of {record.signature} views a per-call "
                                       "array that is not a role: every step would reuse its first pointer")
        self._bound = {name: roles[name] for name in self.bindings}
        self._kinds = {name: _kind(name, roles[name]) for name in self.bindings}
        self.table = LaunchTable(self.launches)  # on a GPU: one compiled call launches the phase

    def bind(self, roles: dict[str, Any]) -> bool:
        """Point the launches at this step's arrays; False if one differs in kind (dtype,
        contiguity, device) from the recorded one, so the caller must take the validated path."""
        return all(self.bind_one(name, roles[name]) for name in self.bindings)

    def bind_one(self, name: str, array: Any) -> bool:
        """:meth:`bind` for one role (True when the phase has no argument of that role)."""
        old = self._bound.get(name, array)
        if array is old:
            return True
        if _kind(name, array) != self._kinds[name]:
            return False
        layout = array_layout(array)
        for launch, index, origin in self.bindings[name]:
            launch.rebind(index, array, origin, layout)
        self._bound[name] = array
        return True

    def launch(self, stream: int | None = None) -> None:
        self.table.launch(stream)


def _key(asserted: bool, roles: dict[str, Any]) -> tuple:
    arrays = list(roles.values())
    ids = [None if a is None else id(a) for a in arrays]
    alias = tuple(-1 if i is None else ids.index(i) for i in ids)
    # Not an array (no shape): a key of its own; recording then raises the validated path's error.
    shapes = tuple(None if a is None else "free" if name in FREE_ROLES else tuple(getattr(a, "shape", (-1,)))
                   for name, a in roles.items())  # fmt: skip
    return asserted, shapes, alias


def compile_monitor_kernels(monitor) -> int:
    """Compile the kernel variants every step of ``monitor`` launches (not the write-input-assert ones).

    A phase whose endpoints fuse (``launch/endpoints.py``: K and V folding as many sources)
    launches the endpoint kernels, any other the plain ones; long (prefill-shaped) steps
    run ``chain_publish`` and one tiled write per phase (fused) or per endpoint (plain).
    """
    from ..fast.driver import bound_kernel
    from ..fast.endpoints import fused_count, source_count
    from ..fast.kernels import chain, endpoints, scatter_lens, tiled_endpoints, translate, write_tiled
    from ..kernels import plan, verify, write

    def compile_eagerly(module, names=None) -> int:
        count = 0
        for name in module.KERNELS if names is None else names:
            for signature in module.SIGNATURES[name]:
                bound_kernel(module.KERNELS[name], signature)
                count += 1
        return count

    plain, fused = set(), set()  # real-KV source counts (variants) of plain and of fused launches
    for g in monitor.groups:
        for phase in (g.head, g.tail):
            contexts = [endpoint.context for endpoint in phase]
            (fused if fused_count(contexts) else plain).update(source_count(c) for c in contexts)
    check = monitor.check_tokens
    count = compile_eagerly(plan)
    count += compile_eagerly(verify, [verify.kernel_name(check, n) for n in sorted(plain)])
    count += compile_eagerly(write, [write.kernel_name(False, n) for n in sorted(plain)])
    count += compile_eagerly(endpoints, [name for n in sorted(fused) for name in
                                                 (endpoints.verify_name(check, n), endpoints.write_name(False, n))])
    count += compile_eagerly(chain, ["chain_publish"])
    if monitor.check_tokens:  # the HEAD phase's token scatter and valid lengths
        count += compile_eagerly(scatter_lens)
    if any(g.lut is not None for g in monitor.groups):  # and its SWA slot translation
        count += compile_eagerly(translate)
    count += compile_eagerly(tiled_endpoints, [tiled_endpoints.kernel_name(False, n) for n in sorted(fused)])
    return count + compile_eagerly(write_tiled, [write_tiled.kernel_name(False, n) for n in sorted(plain)])


class FastPath:
    """Prepared per-step launches of one monitor (see the module docstring).

    Parameters
    ----------
    monitor : CanaryMonitor
    max_shapes : int
        Batch-shape combinations kept prepared (least recently used dropped).
    """

    def __init__(self, monitor, *, max_shapes: int = 32, compile: bool = True):
        self.monitor, self.max_shapes = monitor, max_shapes
        if compile:
            compile_monitor_kernels(monitor)
            _native.compiled_launcher()  # the phases' launch loop: compiled (or loaded) now, not in a step
        self._phases: OrderedDict[tuple, tuple[PreparedPhase, PreparedPhase]] = OrderedDict()
        self._step: PreparedPhase | None = None  # the TAIL phase post() launches (None: the eager path)
        self._planned = None  # the eager path's batch fields as of pre()
        self._last: BoundArrays | None = None  # the arrays the phases were last bound to, and those phases
        self.prepared = 0  # phases recorded so far (one per new batch shape)

    def roles(self, batch, lens) -> dict[str, Any]:
        roles = {name: getattr(batch, name) for name in BATCH_ROLES}
        roles["valid_lens"] = lens
        roles.update((f"loc{i}", loc) for i, loc in enumerate(self.monitor._locs))
        return roles

    def phases(self, batch, pool, lens, roles) -> tuple[PreparedPhase, PreparedPhase]:
        """The prepared phases of this batch's shapes, recording them on first use."""
        key = _key(batch.expected_input_tokens is not None, roles)
        hit = self._phases.get(key)
        if hit is not None:
            self._phases.move_to_end(key)
            return hit
        m = self.monitor
        with recording() as head:
            m._launch_inputs(batch, pool, lens)  # token scatter and lengths, SWA slots: on the device
            m._launch_plan_head(batch, pool, lens)  # validates everything, launches nothing
        m._batch = batch
        with recording() as tail:
            m._launch_post()
        hit = self._phases[key] = (PreparedPhase(head.launches, roles), PreparedPhase(tail.launches, roles))
        self.prepared += 1
        if len(self._phases) > self.max_shapes:
            self._phases.popitem(last=False)
        return hit

    def pre(self, batch) -> None:
        """HEAD phase of ``batch`` (the monitor's ``_launch_pre``, prepared).

        A step whose batch arrays are the objects of the last bound step (or
        views of the same memory, below), with the same shapes, launches the
        phases bound then: no key, no role dict, no rebinding, no input views.
        The other roles follow from those shapes (the valid lengths and an SWA
        group's slots are views of the monitor's buffers of ``bs`` and
        ``num_tokens`` entries: the same pointers and shapes as when bound).
        """
        m = self.monitor
        fields = _BOUND_FIELDS(batch)
        last = self._last
        if last is not None and last.holds(fields):
            head, tail = last.head, last.tail
        else:
            self._last = None  # until both phases are bound: a failed bind leaves them half-rebound
            pool, lens = m._prepare_inputs(batch, eager=False)  # HEAD's first launches fill them
            roles = self.roles(batch, lens)
            head, tail = self.phases(batch, pool, lens, roles)
            if not (head.bind(roles) and tail.bind(roles)):
                self._validated(batch)
                return
            self._last = BoundArrays(fields, head, tail)
        if m.check_tokens and not head.bind_one("token_ids_flat", batch.token_ids_flat):  # a free role
            self._validated(batch)
            return
        head.launch(current_stream())  # one stream lookup per phase, not per launch
        self._step = tail

    def _validated(self, batch) -> None:
        """This step's HEAD phase through the validated public functions (which raise the error of
        an array the phases could not be bound to); TAIL follows on the same arrays (run_pre)."""
        self._last = None
        self._step, self._planned = None, copy.copy(batch)
        m = self.monitor
        m._launch_plan_head(batch, *m._prepare_inputs(batch))  # with the eager token scatter

    def post(self) -> None:
        """TAIL phase of the batch given to :meth:`pre`."""
        if self._step is None:
            self.monitor._launch_post(self._planned)
            return
        self._step.launch(current_stream())


def run_pre(monitor, batch) -> Callable[[], None]:
    """Run the HEAD phase of ``batch`` the fastest way available; returns the matching TAIL runner.

    Called right after the monitor checked ``batch`` (``_check_batch``): its fields are the
    objects in ``monitor._checked``, which the graph's match may rely on.
    """
    graph = monitor.graph
    if graph is not None and graph.matches(batch, monitor._checked):
        graph.pre()
        return graph.post
    if monitor.fast is not None:
        monitor.fast.pre(batch)
        return monitor.fast.post
    monitor._launch_pre(batch)
    # TAIL stamps what HEAD planned: the arrays of this moment, as the prepared and graph paths
    # (which bind them now) do, even if the engine reassigns a batch field before post_forward.
    planned = copy.copy(batch)
    return lambda: monitor._launch_post(planned)
