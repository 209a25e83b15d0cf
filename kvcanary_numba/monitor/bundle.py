"""Replayable violation bundles: what a violation saw, in one ``.npz`` any machine can re-verify.

A bundle holds host NumPy arrays only (no CuPy, no device pointers), so bundles
of GPU and CPU runs are interchangeable:

============  ====================  ================================================================
key           dtype, shape          what
============  ====================  ================================================================
rows          int64 [n, 8]          the violation rows, as read back
row_steps     int64 [n]             monitor step that read each row back
entries       int64 [m, 5]          verify entries that replay the rows: tag, slot, expected
                                    position, predecessor slot, expected token (-1 = unchecked)
entry_origin  int64 [m]             0: the step's verify / sweep plan; 1: built from a row (a write
                                    row, or a plan already overwritten: predecessor 0 = not checked)
records       int64 [k, 6]          tag, slot, and the slot's 4 record fields (token, position,
                                    prev_hash, real_kv_hash) of the buffer the tag verifies
kv            uint8 [k, 4, b]       the real-KV bytes each source folds for that slot
kv_lengths    int64 [k, 4]          bytes of each source (0 = no such source)
config        str (JSON)            format version, step, device, (rank,) hash mode, group slot counts,
                                    the SHA-256 digest of the arrays and the rest of the config
============  ====================  ================================================================

The digest makes an edited or damaged copy a refusal rather than a replay. Replay (:mod:`.replay`) rebuilds a
small canary buffer of the recorded slots and runs verify on the NumPy path over
the entries. Reading checks the file before trusting it (:mod:`.bundle_file`) and
its contents against the schema (:mod:`.bundle_check`). Writing never raises into
the engine's loop (:class:`Aftercare`): a bundle that cannot be written is a
:class:`BundleWriteWarning` and a count in ``stats()``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sys
import warnings

import numpy as np

from .._validate import check_int
from ..constants import EXPECTED_TOKEN_UNCHECKED, MAX_REAL_KV_SOURCES, PARTIAL_READ_BYTES, RealKvHashMode
from ..errors import error
from .bundle_check import check_contents, decode_config
from .bundle_file import BUNDLE_FORMAT, BUNDLE_KEYS, MAX_BUNDLE_BYTES, bundle_digest, read_bundle_arrays
from .triage import Rechecker, read_slots, slot_view

__all__ = [
    "BUNDLE_FORMAT",
    "BUNDLE_KEYS",
    "MAX_BUNDLE_BYTES",
    "Aftercare",
    "BundleWriteWarning",
    "collect_bundle",
    "dump_bundle",
    "load_bundle",
]

_WRITE_BITS = 8 | 16
_WRITE_RANGE = 256
_SEED_RANGE = 128  # alone and at position -1: the write kernel's out-of-range seed row


def _host(xp, array) -> np.ndarray:
    return np.asarray(array if xp is np else xp.asnumpy(array))


def _plan_entries(monitor, state, stage: str) -> np.ndarray:
    """The active entries of the plan a stage verified: int64 [n, 4] (slot, position, prev, token)."""
    plan = state.sweep_plan if stage == "SWEEP" else state.verify_plan
    n = min(max(int(_host(monitor.xp, plan.verify_num_valid)[0]), 0), plan.verify_capacity)
    cols = (
        plan.verify_slot_indices,
        plan.verify_expected_positions,
        plan.verify_prev_slot_indices,
        plan.verify_expected_tokens,
    )
    return np.stack([_host(monitor.xp, c[:n]) for c in cols], axis=1).astype(np.int64)


def _entries_of(monitor, tag_rows, view) -> tuple[list, list]:
    """Entries (and origins) that replay one tag's rows."""
    state, endpoint, _ = view
    plan = _plan_entries(monitor, state, endpoint.tag.name.split("_")[0])
    entries, origins = [], []
    for v in tag_rows:
        if v.fail_reason & (_WRITE_BITS | _WRITE_RANGE) or (v.fail_reason == _SEED_RANGE and v.position < 0):
            if v.fail_reason & _WRITE_BITS and v.slot_idx > 0:  # the slot against what the oracle expected
                entries.append((v.slot_idx, v.expected_aux, 0, v.expected_token))
                origins.append(1)
            continue  # a clipped range or a bad seed names no slot a verify could look at
        hits = plan[plan[:, 0] == v.slot_idx]
        if hits.shape[0]:
            # Each entry with its own expected token: one slot can sit at several positions of a
            # plan (a shared prefix, a trampled page table), each with its own token. The row says
            # whether the launch checked tokens at all.
            unchecked = v.expected_token == EXPECTED_TOKEN_UNCHECKED
            entries += [(*e[:3], EXPECTED_TOKEN_UNCHECKED if unchecked else e[3]) for e in hits]
            origins += [0] * hits.shape[0]
        else:
            entries.append((v.slot_idx, v.position, 0, v.expected_token))
            origins.append(1)
    return entries, origins


def _slot_bytes(monitor, endpoint, slots) -> tuple[np.ndarray, np.ndarray]:
    """The bytes each source folds for each slot: uint8 [k, 4, b] and lengths int64 [k, 4]."""
    ctx = endpoint.context
    mode = ctx.real_kv_hash_mode
    sources = ctx.real_kv_sources if mode != RealKvHashMode.NONE else ()
    lengths = [PARTIAL_READ_BYTES if mode == RealKvHashMode.PARTIAL else int(s.read_bytes) for s in sources]
    out = np.zeros((len(slots), MAX_REAL_KV_SOURCES, max(lengths, default=0)), dtype=np.uint8)
    lens = np.zeros((len(slots), MAX_REAL_KV_SOURCES), dtype=np.int64)
    for j, (src, n) in enumerate(zip(sources, lengths)):
        table = src.bytes_view()
        for i, s in enumerate(slots):
            row, col = divmod(int(s), int(src.page_size))
            if row < table.shape[0]:
                col *= int(src.num_bytes_per_token)
                out[i, j, :n] = _host(monitor.xp, table[row, col : col + n])
                lens[i, j] = n
    return out, lens


def collect_bundle(monitor, violations, step: int) -> dict[str, np.ndarray]:
    """The bundle arrays of ``violations`` (rows of one readback) from the monitor's current state."""
    rows = np.array(
        [
            [
                v.kernel_kind,
                v.slot_idx,
                v.position,
                v.stored_token,
                v.expected_token,
                v.stored_chain_hash,
                v.expected_aux,
                v.fail_reason,
            ]
            for v in violations
        ],
        dtype=np.int64,
    ).reshape(-1, 8)
    entries, origins, records, kv, kv_lengths = [], [], [], [], []
    for tag in dict.fromkeys(v.kernel_kind for v in violations):
        tag_rows = [v for v in violations if v.kernel_kind == tag]
        view = slot_view(monitor, tag_rows[0])
        if view is None:
            continue
        found, origin = _entries_of(monitor, tag_rows, view)
        entries += [(tag, *e) for e in found]
        origins += origin
        size = view[2].shape[0]
        slots = sorted({int(s) for e in found for s in e[:3:2] if 0 < s < size})
        if slots:
            recs, _ = read_slots(monitor, view[1], slots)
            records += [(tag, s, *r) for s, r in zip(slots, recs)]
            data, lens = _slot_bytes(monitor, view[1], slots)
            kv.append(data)
            kv_lengths.append(lens)
    width = max((a.shape[2] for a in kv), default=0)
    kv_all = np.zeros((len(records), MAX_REAL_KV_SOURCES, width), dtype=np.uint8)
    at = 0
    for a in kv:
        kv_all[at : at + a.shape[0], :, : a.shape[2]] = a
        at += a.shape[0]
    from .. import __version__  # the package imports this module while it initialises

    config = {
        "format": BUNDLE_FORMAT,
        "kvcanary_numba": __version__,
        "step": int(step),
        "device": monitor.device,
        "real_kv_hash_mode": int(monitor.real_kv_hash_mode),
        "check_verify_expected_token": monitor.check_tokens,
        "num_slots": {g.kind.upper(): int(g.group.num_slots) for g in monitor.groups},
    }
    if getattr(monitor, "rank", None) is not None:  # a job of several ranks (a job of one writes none)
        config["rank"] = monitor.rank
    arrays = dict(
        rows=rows,
        row_steps=np.array([v.step for v in violations], dtype=np.int64),
        entries=np.array(entries, dtype=np.int64).reshape(-1, 5),
        entry_origin=np.array(origins, dtype=np.int64),
        records=np.array(records, dtype=np.int64).reshape(-1, 6),
        kv=kv_all,
        kv_lengths=np.concatenate(kv_lengths) if kv_lengths else np.zeros((0, MAX_REAL_KV_SOURCES), np.int64),
    )
    config["digest"] = bundle_digest(arrays, config)
    return {**arrays, "config": np.array(json.dumps(config, sort_keys=True))}


def _write_arrays(file, arrays: dict) -> None:
    """Write ``arrays`` as an ``.npz`` into the open binary ``file`` (tests replace it to fill the disk)."""
    np.savez_compressed(file, **arrays)


def dump_bundle(monitor, violations, directory: pathlib.Path, step: int) -> pathlib.Path:
    """Write the bundle of ``violations`` to ``directory/kvcanary-step<step>[-rank<r>]-<i>.npz``; returns the path
    (the rank keeps the bundles of several ranks apart in one directory).

    The file is written under a hidden name and renamed when complete, so a reader never sees
    half a bundle; a write that fails (OSError: no space, no permission, no directory) leaves
    nothing behind and raises.
    """
    arrays = collect_bundle(monitor, violations, step)
    i, rank = 0, getattr(monitor, "rank", None)
    tag = f"step{step:06d}" if rank is None else f"step{step:06d}-rank{rank}"
    while (path := directory / f"kvcanary-{tag}-{i}.npz").exists():
        i += 1
    partial = directory / f".{path.name}.partial"
    try:
        with open(partial, "wb") as f:
            _write_arrays(f, arrays)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
    return path


def check_bundle_dir(function: str, bundle_dir) -> pathlib.Path | None:
    """The monitor's ``bundle_dir`` as a directory (created when missing); KVC-M022 when unusable."""
    if bundle_dir is None:
        return None
    path = pathlib.Path(bundle_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise error("KVC-M022", function=function, path=str(path), reason=exc.strerror or type(exc).__name__) from exc
    return path


def load_bundle(path, *, max_bytes: int = MAX_BUNDLE_BYTES) -> dict:
    """Read a bundle: its arrays and the decoded config (``"config"`` -> dict), checked before use.

    Parameters
    ----------
    path : str or path
        A regular file written by :func:`dump_bundle`.
    max_bytes : int
        Largest file, and largest total of its arrays once inflated, to read (1 GiB by default).

    Raises
    ------
    KvCanaryError
        KVC-M020 (missing, empty, not an ``.npz``, members missing or unexpected, pickles,
        another format), KVC-M030 (a FIFO, directory or device), KVC-M031 (over ``max_bytes``),
        KVC-C011 (``max_bytes`` not a positive int),
        KVC-M032 (truncated, damaged, or not matching its digest), KVC-M033 (config or arrays
        outside the schema: :mod:`.bundle_check`).
    """
    fn = "load_bundle"
    arrays = read_bundle_arrays(fn, path, max_bytes=check_int(fn, "max_bytes", max_bytes, low=1))
    config = decode_config(fn, str(path), arrays.pop("config"))
    check_contents(fn, str(path), arrays, config, digest=True)
    return {**arrays, "config": config}


class BundleWriteWarning(RuntimeWarning):
    """A violation bundle could not be written (directory gone or not writable, disk full).

    Issued once per monitor, at the first failure; ``stats()["bundle_failures"]`` counts every
    one. Detection goes on: the step's violations are reported as without ``bundle_dir``.
    """


class Aftercare:
    """What a monitor does with each readback beyond reporting: re-check last readback's rows, dump bundles.

    Parameters
    ----------
    bundle_dir : path or None
        Where bundles go (already checked by :func:`check_bundle_dir`); None writes none.

    Attributes
    ----------
    bundles : list of pathlib.Path
        The bundles written.
    bundle_failures : int
        Bundles that could not be written (each failure once; the first is a :class:`BundleWriteWarning`).
    """

    def __init__(self, bundle_dir: pathlib.Path | None):
        self.rechecker, self.bundle_dir, self.bundles = Rechecker(), bundle_dir, []
        self.bundle_failures = 0

    def stats(self) -> dict:
        """``bundles_written`` and ``bundle_failures``, for the monitor's ``stats()``."""
        return {"bundles_written": len(self.bundles), "bundle_failures": self.bundle_failures}

    def quiet_index(self, pump, step: int) -> int:
        """:meth:`ViolationPump.quiet_index`, or -1 while rows wait for their re-check."""
        return -1 if self.rechecker.pending else pump.quiet_index(step)

    def process(self, monitor, snapshot, step: int) -> None:
        """Re-check the rows of the previous readback, then let the pump decode and report this one;
        the new rows are tracked for the next re-check and bundled (also when the pump raises)."""
        if snapshot is None:  # nothing read back (CPU flush, GPU step 0): no step passed for a re-check
            return
        if self.rechecker.pending:
            self.rechecker.run(monitor, step)
        found = monitor.pump.violations  # extended in place by the pump
        start = len(found)
        try:
            monitor.pump.process(snapshot)
        except BaseException:
            self._keep(monitor, found, start, snapshot.step, raising=True)
            raise
        self._keep(monitor, found, start, snapshot.step, raising=False)

    def _keep(self, monitor, found: list, start: int, step: int, *, raising: bool) -> None:
        """Track the rows the pump added (every step runs this: nothing is built when none is new)."""
        if len(found) <= start:
            return
        new = found[start:]
        self.rechecker.track(start, start + len(new))
        if self.bundle_dir is None:
            return
        try:
            self.bundles.append(dump_bundle(monitor, new, self.bundle_dir, step))
        except Exception as exc:  # noqa: BLE001 - a bundle is evidence, never a reason to stop detecting
            self.bundle_failures += 1
            if self.bundle_failures == 1:
                self._warn(exc, step, raising=raising)

    def _warn(self, exc: Exception, step: int, *, raising: bool) -> None:
        reason = getattr(exc, "strerror", None) or f"{type(exc).__name__}: {exc}"
        message = (
            f"kv-canary: the violation bundle of step {step} could not be written to {self.bundle_dir} "
            f"({reason}); detection goes on, stats()['bundle_failures'] counts the bundles lost"
        )
        try:
            warnings.warn(message, BundleWriteWarning, stacklevel=_engine_frame())
        except BundleWriteWarning:  # warnings are errors here: unless a violation is being raised
            if not raising:
                raise


def _engine_frame() -> int:
    """``stacklevel`` of the first caller outside this package (the engine's line that ran the hook),
    however many package frames (hooks, the thread guard) lie between."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame, level = sys._getframe(2), 2  # the caller of the function that asks
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level
