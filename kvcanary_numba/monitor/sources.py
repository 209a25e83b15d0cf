"""The monitor's real-KV sources: each as last checked, the per-step test that it still is, and rebinding.

A source names memory the engine owns, and that memory can move: a JAX pool is a new
buffer after every functional update, a donated one is the same buffer under a new
``jax.Array``, a NumPy or CuPy array can be reshaped in place, a PyTorch tensor given
other storage, a frozen field overwritten with ``object.__setattr__``. The monitor
learns of a move in one of two ways, and treats both alike:

- the engine says so: :meth:`SourceWatch.rebind` (``CanaryMonitor.rebind_sources``)
  with new :class:`~kvcanary_numba.RealKvSource` objects;
- the hooks see it: before every launch that folds live KV (``post_forward``, a
  sweep) :meth:`SourceWatch.unchanged` compares each source with what was checked
  (the same source and tensor objects, the same fields, the tensor's layout key:
  :func:`~kvcanary_numba.fast.bound.layout_key`), and on a difference
  :meth:`SourceWatch.recheck` validates the sources as they are now.

Either way every source is validated in full before anything changes (its own rules,
KVC-R011 for one that broke them after it was built; covering the group's slots,
KVC-R007; on the monitor's device, KVC-C007) and must fold what the one it replaces
folded (as many sources per half, as many bytes each: KVC-M023), or the fingerprints
stored so far would all stop matching. What a rebind asks of the launch paths is its
:class:`Change`: ``same`` (new objects over the same memory and geometry: packed
launches and a captured graph stay valid), ``moved`` (same geometry, other pointers:
packed launches are re-pointed, a graph is dropped) or ``reshaped`` (other geometry:
prepared phases are recorded again, a graph is dropped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._validate import resolve_backend
from ..constants import PARTIAL_READ_BYTES, RealKvHashMode
from ..context import RealKvSource, check_real_kv_sources
from ..errors import error
from ..fast.bound import holds_test, safe_layout
from .groups import GroupState

__all__ = ["Change", "SourceWatch"]

SAME, MOVED, RESHAPED = "same", "moved", "reshaped"
_ORDER = (SAME, MOVED, RESHAPED)


@dataclass(frozen=True, slots=True)
class Change:
    """What a rebind asks of the launch paths.

    Attributes
    ----------
    kind : {"same", "moved", "reshaped"}
        The largest change of any source (see the module docstring).
    moves : tuple of (old, new)
        Tensors to re-point packed launches from and to (``new`` may be ``old`` moved in place).
    """

    kind: str
    moves: tuple = ()


#: What of a source the per-step test compares: the tensor object (and its layout key), the fields.
_FIELDS = ("tensor", "page_size", "num_bytes_per_token", "read_bytes")


class _Seen:
    """One source as last checked: the objects, the fields, the tensor's layout, and the per-step test
    (:func:`~kvcanary_numba.fast.bound.holds_test`: identities and the tensor's layout key)."""

    __slots__ = ("fields", "holds", "layout", "source", "tensor")

    def __init__(self, source: RealKvSource, layout: Any = None):
        self.source, self.tensor = source, source.tensor
        self.fields = (source.page_size, source.num_bytes_per_token, source.read_bytes)
        self.holds = holds_test(_FIELDS, (source.tensor, *self.fields))
        self.layout = safe_layout(source.tensor) if layout is None else layout

    def change(self, source: RealKvSource, layout: Any) -> str:
        """How ``source`` (checked; its tensor's ``layout``) differs from this one as seen: a :class:`Change` kind."""
        fields = (source.page_size, source.num_bytes_per_token, source.read_bytes)
        described = isinstance(layout, tuple) and isinstance(self.layout, tuple)
        if fields != self.fields or not described or layout[1:] != self.layout[1:]:
            return RESHAPED
        return SAME if layout[0] == self.layout[0] else MOVED


class SourceWatch:
    """The sources of every group of a monitor as last checked (see the module docstring).

    Parameters
    ----------
    groups : list of GroupState
        The monitor's groups (their TAIL endpoints' sources are watched).
    placement : ArrayInfo
        Where the monitor's arrays live (sources must live there: KVC-C007).
    mode : RealKvHashMode
        The monitor's hash mode (how many bytes a source folds per slot).
    """

    def __init__(self, groups: list[GroupState], *, placement: Any, mode: RealKvHashMode):
        self.groups, self.placement, self.mode = groups, placement, RealKvHashMode(mode)
        self._seen = {id(g): self._record(g) for g in groups}
        self._all = self._flat()

    @staticmethod
    def _record(group: GroupState) -> dict[str, list[_Seen]]:
        return {half: [_Seen(s) for s in sources] for half, sources in group.sources.items()}

    def _flat(self) -> list[tuple]:
        return [
            (seen.holds, seen.source) for by_half in self._seen.values() for half in by_half.values() for seen in half
        ]

    def unchanged(self) -> bool:
        """Whether every source is as last checked (the objects, fields and layout keys): the hooks'
        per-step test, a few identity and tuple comparisons per source."""
        for holds, source in self._all:
            if not holds(source):
                return False
        return True

    def group(self, function: str, kind: Any) -> GroupState:
        """The group of ``kind`` (``"full"`` or ``"swa"``; KVC-C009 for one the monitor lacks)."""
        kinds = tuple(g.kind for g in self.groups)
        if kind not in kinds:
            raise error("KVC-C009", function=function, argument="group", expected=kinds, got=kind)
        return self.groups[kinds.index(kind)]

    def rebind(self, function: str, group: GroupState, k_sources: Any, v_sources: Any) -> Change:
        """Validate ``k_sources`` / ``v_sources`` for ``group`` in full, then fold them (nothing changes
        when a check fails). Returns what the launch paths must do (:class:`Change`)."""
        given = {"K": k_sources, "V": v_sources}
        new = {half: self._checked(function, group, half, given[half]) for half in ("K", "V")}
        return self._use(group, {half: new[half] for half in group.sources})

    def recheck(self, function: str) -> Change | None:
        """None while :meth:`unchanged`; else validate every group's sources as they are now, then follow them.

        Raises
        ------
        KvCanaryError
            KVC-R011 for a source that broke its rules; KVC-R007, KVC-C007, KVC-M023 as :meth:`rebind`.
            Nothing is changed: the next hook checks again.
        """
        if self.unchanged():
            return None
        checked = [
            (g, {half: self._checked(function, g, half, sources) for half, sources in g.sources.items()})
            for g in self.groups
        ]
        changes = [self._use(g, sources) for g, sources in checked]
        kind = max((c.kind for c in changes), key=_ORDER.index)
        return Change(kind, tuple(move for c in changes for move in c.moves))

    def _checked(self, function: str, group: GroupState, half: str, sources: Any) -> tuple[RealKvSource, ...]:
        where = f"{function} ({group.kind}.{half.lower()}_sources)"
        _, infos = check_real_kv_sources(where, sources, self.mode, num_slots=group.group.num_slots)
        resolve_backend(where, "auto", [("the monitor's buffers", self.placement), *infos])
        seen = self._seen[id(group)].get(half, [])
        if len(sources) != len(seen):
            raise error(
                "KVC-M023",
                function=where,
                problem=f"holds {len(sources)} sources",
                expected=f"{len(seen)}, the group's",
            )
        for index, (source, old) in enumerate(zip(sources, seen)):
            now, before = self._folded(source.read_bytes), self._folded(old.fields[2])
            if now != before:
                raise error(
                    "KVC-M023",
                    function=where,
                    problem=f"source {index} folds {now} bytes per slot",
                    expected=f"{before}, its predecessor's",
                )
        return tuple(sources)

    def _folded(self, read_bytes: int) -> int:
        if self.mode == RealKvHashMode.NONE:
            return 0
        return PARTIAL_READ_BYTES if self.mode == RealKvHashMode.PARTIAL else int(read_bytes)

    def _use(self, group: GroupState, sources: dict[str, tuple]) -> Change:
        seen, now = self._seen[id(group)], {}
        kinds, moves = [SAME], []
        for half, new in sources.items():
            now[half] = []
            for old, source in zip(seen[half], new):
                layout = safe_layout(source.tensor)
                kind = old.change(source, layout)
                kinds.append(kind)
                if source.tensor is not old.tensor or kind != SAME:
                    moves.append((old.tensor, source.tensor))
                now[half].append(_Seen(source, layout))
        group.use_sources(sources)
        self._seen[id(group)] = now
        self._all = self._flat()
        return Change(max(kinds, key=_ORDER.index), tuple(moves))
