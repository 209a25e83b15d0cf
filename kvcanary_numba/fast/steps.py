"""A monitor's per-step launches on a GPU, prepared once per batch shape.

An eager step goes through the launch functions every step: the public ones for
the scatter and the plans (every argument validated, every kernel argument
re-wrapped) and the endpoint glue for verify and write (``fast/endpoints.py``, on
the batch the hooks validated): seven launches per decode step for a FULL pool
with K and V. :class:`PreparedSteps` does that once per batch *shape*, from the
monitor's step plan (:class:`StepPlan`, implemented by
``kvcanary_numba.monitor.steps.EagerSteps``):

1. the first step with a new combination of batch shapes runs the plan's phases
   under :func:`~.recording.recording` (validated as in an eager step, nothing
   launched) and keeps the result as :class:`~.prepared.PreparedLaunch` objects,
   one :class:`PreparedPhase` for HEAD (inputs, plans, verify, write) and one for TAIL;
2. every step then checks only the engine's per-step arrays whose Python object
   changed (dtype, contiguity, device; same shapes by construction), re-packs the
   pointers of those that moved, and launches.

The per-step input work runs on the device as the HEAD phase's first launches (the
plan's ``launch_inputs``): with the expected-token check on, one launch scatters the
tokens and writes the valid lengths, and each SWA group's slots are translated by
one launch; the eager path makes a public scatter call and CuPy array operations
instead (~10 us of host time each). A *free* role (the flat token list) may change
length every step: it is rebound, never a reason to record again.

:mod:`.capture` goes one step further: both phases of one fixed batch are captured
into two CUDA graphs and replayed per step.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from operator import attrgetter
from typing import Any, Protocol

from .._runtime import CUDA_IMPORTS
from .._validate import inspect_array
from ..launch._launch import LaunchSpec, View, array_layout, current_stream
from . import driver as _driver, native as _native
from .bound import BoundArrays
from .prepared import PreparedLaunch
from .recording import recording
from .table import LaunchTable

__all__ = ["PreparedPhase", "PreparedSteps", "StepPlan", "compile_monitor_kernels"]

_FN = "CanaryMonitor.pre_forward"  # the hook whose batch the kinds describe (in error messages)


class StepPlan(Protocol):
    """What :class:`PreparedSteps` asks of a monitor's step plan (``monitor.steps.EagerSteps``).

    ``groups`` and ``check_tokens`` say which kernels a step launches
    (:func:`compile_monitor_kernels`); ``batch_roles`` are the batch fields the
    launches read and ``free_roles`` those of them whose length may change from
    step to step. The methods issue one phase's launches each, reading nothing on
    the host, on a batch the monitor checked.
    """

    groups: list
    check_tokens: bool
    batch_roles: tuple[str, ...]
    free_roles: tuple[str, ...]

    def prepare_inputs(self, batch, *, eager: bool = True) -> tuple[Any, Any]: ...

    def launch_inputs(self, batch, pool, lens) -> None: ...

    def head(self, batch, pool, lens) -> None: ...

    def tail(self, batch) -> None: ...

    def roles(self, batch, lens) -> dict[str, Any]: ...


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
    free : tuple of str
        Roles whose length may change every step (their arrays are rebound, not keyed).

    Attributes
    ----------
    free : tuple of str
        The free roles this phase has arguments of.

    Raises
    ------
    RuntimeError
        When an argument the glue viewed from a per-call array (not
        ``persistent``) has no role: replays would keep its first pointer.
    """

    def __init__(self, records: list[LaunchSpec], roles: dict[str, Any], free: tuple[str, ...] = ()):
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
                    raise RuntimeError(
                        f"prepared phase: argument {index} of {record.signature} views a per-call "
                        "array that is not a role: every step would reuse its first pointer"
                    )
        self.free = tuple(name for name in free if name in self.bindings)
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

    def bound(self, name: str) -> Any:
        """The array role ``name`` is bound to now (None: the phase has no argument of it)."""
        return self._bound.get(name)

    def launch(self, stream: int | None = None) -> None:
        self.table.launch(stream)


def _key(asserted: bool, roles: dict[str, Any], free: tuple[str, ...]) -> tuple:
    arrays = list(roles.values())
    ids = [None if a is None else id(a) for a in arrays]
    alias = tuple(-1 if i is None else ids.index(i) for i in ids)
    # Not an array (no shape): a key of its own; recording then raises the validated path's error.
    shapes = tuple(
        None if a is None else "free" if name in free else tuple(getattr(a, "shape", (-1,)))
        for name, a in roles.items()
    )
    return asserted, shapes, alias


def compile_monitor_kernels(plan) -> int:
    """Compile the kernel variants every step of ``plan`` launches (not the write-input-assert ones).

    ``plan`` is anything with a monitor's ``groups`` and ``check_tokens`` (the step plan, or
    the monitor). A phase whose endpoints fuse (``fast/endpoints.py``: K and V folding as many
    sources) launches the endpoint kernels, any other the plain ones; long (prefill-shaped)
    steps run ``chain_publish`` and one tiled write per phase (fused) or per endpoint (plain).
    Returns the number of (kernel, signature) pairs compiled.
    """
    with CUDA_IMPORTS:  # a GPU monitor's first import of numba.cuda: one thread at a time
        from ..kernels import plan as plan_kernels, verify
        from .endpoints import fused_count, source_count
        from .kernels import chain, endpoints, scatter_lens, tiled_endpoints, translate, write_shared, write_tiled

    def compile_eagerly(module, names=None) -> int:
        count = 0
        for name in module.KERNELS if names is None else names:
            for signature in module.SIGNATURES[name]:
                _driver.bound_kernel(module.KERNELS[name], signature)
                count += 1
        return count

    plain, fused = set(), set()  # real-KV source counts (variants) of plain and of fused launches
    for g in plan.groups:
        for phase in (g.head, g.tail):
            contexts = [endpoint.context for endpoint in phase]
            (fused if fused_count(contexts) else plain).update(source_count(c) for c in contexts)
    check = plan.check_tokens
    count = compile_eagerly(plan_kernels)
    count += compile_eagerly(verify, [verify.kernel_name(check, n) for n in sorted(plain)])
    # A plain (unfused) phase's writes share the step's chain: the fast wing's write_shared kernel.
    count += compile_eagerly(write_shared, [write_shared.kernel_name(False, n) for n in sorted(plain)])
    count += compile_eagerly(
        endpoints,
        [name for n in sorted(fused) for name in (endpoints.verify_name(check, n), endpoints.write_name(False, n))],
    )
    count += compile_eagerly(chain, ["chain_publish"])
    if check:  # the HEAD phase's token scatter and valid lengths
        count += compile_eagerly(scatter_lens)
    if any(g.lut is not None for g in plan.groups):  # and its SWA slot translation
        count += compile_eagerly(translate)
    count += compile_eagerly(tiled_endpoints, [tiled_endpoints.kernel_name(False, n) for n in sorted(fused)])
    return count + compile_eagerly(write_tiled, [write_tiled.kernel_name(False, n) for n in sorted(plain)])


class PreparedSteps:
    """Prepared per-step launches of one monitor's step plan (see the module docstring).

    Parameters
    ----------
    plan : StepPlan
        The monitor's step plan; only its public methods and attributes are used.
    max_shapes : int
        Batch-shape combinations kept prepared (least recently used dropped).
    compile : bool
        Compile every kernel variant a step launches, and the compiled launch loop, now
        (on a GPU: a module load is not allowed later, inside graph capture). False
        under the simulator, which compiles nothing.

    Attributes
    ----------
    prepared : int
        Phase pairs recorded so far (one per new batch shape).
    """

    def __init__(self, plan: StepPlan, *, max_shapes: int = 32, compile: bool = True):
        self.plan, self.max_shapes = plan, max_shapes
        self.batch_roles, self.free_roles = tuple(plan.batch_roles), tuple(plan.free_roles)
        # One C call for the fixed-shape roles' arrays: what BoundArrays compares every step.
        self._fields = attrgetter(*(r for r in self.batch_roles if r not in self.free_roles))
        if compile:
            compile_monitor_kernels(plan)
            _native.compiled_launcher()  # the phases' launch loop: compiled (or loaded) now, not in a step
        self._phases: OrderedDict[tuple, tuple[PreparedPhase, PreparedPhase]] = OrderedDict()
        self._step: PreparedPhase | None = None  # the TAIL phase post() launches (None: the validated path)
        self._planned = None  # the validated path's batch fields as of pre()
        self._last: BoundArrays | None = None  # the arrays the phases were last bound to, and those phases
        self._holders: dict[int, list] = {}  # id(long-lived array) -> launches viewing it (:meth:`repoint`)
        self.prepared = 0

    @property
    def phase_pairs(self) -> list[tuple[PreparedPhase, PreparedPhase]]:
        """The (HEAD, TAIL) phases kept, least recently used first."""
        return list(self._phases.values())

    @property
    def bound(self) -> BoundArrays | None:
        """The arrays and phases of the last step that bound them (None after the validated path)."""
        return self._last

    def repoint(self, moves) -> None:
        """Aim every prepared launch at moved long-lived arrays (the monitor's real-KV sources).

        ``moves`` lists ``(old, new)`` arrays where ``new`` has the geometry ``old`` had when the
        phases were recorded (shape, strides, dtype) and may live elsewhere (another pointer), or be
        ``old`` itself moved in place: each view of ``old`` is aimed at ``new`` and its pointer re-packed
        (a launch table sees it). The launches then keep ``new`` alive and drop ``old``. A pending
        TAIL phase (between :meth:`pre` and :meth:`post`) launches on ``new``.
        """
        for old, new in moves:
            holders = self._holding(old)
            for launch, indices in holders:
                launch.repoint(old, new, indices)
            if new is not old:
                del self._holders[id(old)]
                self._holders.setdefault(id(new), []).extend(holders)

    def _holding(self, array) -> list:
        """(launch, argument indices) of every prepared launch viewing ``array``: found once, then kept
        (and carried to the array a repoint aims them at) until a recording or :meth:`forget`."""
        hit = self._holders.get(id(array))
        if hit is None:
            launches = [launch for phases in self._phases.values() for phase in phases for launch in phase.launches]
            found = [(launch, launch.viewing(array)) for launch in launches]
            hit = self._holders[id(array)] = [(launch, indices) for launch, indices in found if indices]
        return hit

    def forget(self) -> None:
        """Drop every prepared phase: long-lived arrays they were recorded with changed geometry. The
        next :meth:`pre` records its batch shape again; a pending TAIL phase is dropped too (the
        caller runs that step's TAIL another way)."""
        self._phases.clear()
        self._holders.clear()
        self._last = self._step = self._planned = None

    def record(self, batch) -> tuple[PreparedPhase, PreparedPhase]:
        """The phases of ``batch``'s shapes, recorded now if new (inputs left to the device)."""
        pool, lens = self.plan.prepare_inputs(batch, eager=False)
        return self._phases_of(batch, pool, lens, self.plan.roles(batch, lens))

    def _phases_of(self, batch, pool, lens, roles) -> tuple[PreparedPhase, PreparedPhase]:
        key = _key(batch.expected_input_tokens is not None, roles, self.free_roles)
        hit = self._phases.get(key)
        if hit is not None:
            self._phases.move_to_end(key)
            return hit
        plan, free = self.plan, self.free_roles
        with recording() as head:
            plan.launch_inputs(batch, pool, lens)  # token scatter and lengths, SWA slots: on the device
            plan.head(batch, pool, lens)  # validates everything, launches nothing
        with recording() as tail:
            plan.tail(batch)
        hit = self._phases[key] = (PreparedPhase(head.launches, roles, free), PreparedPhase(tail.launches, roles, free))
        self._holders.clear()  # the new launches view long-lived arrays too
        self.prepared += 1
        if len(self._phases) > self.max_shapes:
            self._phases.popitem(last=False)
        return hit

    def pre(self, batch) -> None:
        """HEAD phase of ``batch``, a batch the monitor checked.

        A step whose batch arrays are the objects of the last bound step (or views of
        the same memory, :class:`~.bound.BoundArrays`), with the same shapes, launches
        the phases bound then: no key, no role dict, no rebinding, no input views. The
        other roles follow from those shapes (the valid lengths and an SWA group's slots
        are views of the monitor's buffers of ``bs`` and ``num_tokens`` entries: the
        same pointers and shapes as when bound).
        """
        fields = self._fields(batch)
        last = self._last
        if last is None or not last.holds(fields):
            last = self._bind(batch, fields)
            if last is None:
                return
        for phase, name in last.free:  # the flat token list: its own length every step
            if not phase.bind_one(name, getattr(batch, name)):
                self._validated(batch)
                return
        last.head.launch(current_stream())  # one stream lookup per phase, not per launch
        self._step = last.tail

    def _bind(self, batch, fields: tuple) -> BoundArrays | None:
        """The phases of ``batch``'s shapes bound to its arrays (None: the validated path ran)."""
        self._last = None  # until both phases are bound: a failed bind leaves them half-rebound
        pool, lens = self.plan.prepare_inputs(batch, eager=False)  # HEAD's first launches fill them
        roles = self.plan.roles(batch, lens)
        head, tail = self._phases_of(batch, pool, lens, roles)
        if not (head.bind(roles) and tail.bind(roles)):
            self._validated(batch)
            return None
        free = tuple((phase, name) for phase in (head, tail) for name in phase.free)
        self._last = BoundArrays(fields, head, tail, free)
        return self._last

    def _validated(self, batch) -> None:
        """This step's HEAD phase through the validated public functions (which raise the error of
        an array the phases could not be bound to); TAIL follows on the same arrays."""
        self._last = None
        self._step, self._planned = None, copy.copy(batch)
        plan = self.plan
        plan.head(batch, *plan.prepare_inputs(batch))  # with the eager token scatter

    def post(self) -> None:
        """TAIL phase of the batch given to :meth:`pre`."""
        if self._step is None:
            self.plan.tail(self._planned)
            return
        self._step.launch(current_stream())
