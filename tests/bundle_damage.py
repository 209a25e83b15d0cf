"""Damaged and crafted violation bundles: a generator for the bundle-reading tests.

Each class of damage is a function ``(rng, base) -> Case``; ``base`` is a real bundle written
by a monitor (:func:`base_bundles`). A :class:`Case` makes its file (bytes, or a FIFO, a
directory ...) and names the codes a reader may answer with; ``may_load`` marks damage that
can miss everything the reader looks at (a flipped timestamp byte): then the bundle must load
*equal to the original*, never as something else.

``python tests/bundle_damage.py [N]`` tabulates what each class gets over N seeds.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pathlib
import shutil
import struct
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Callable

import numpy as np

from kvcanary_numba.constants import CanaryLaunchTag, FailReason, RealKvHashMode
from kvcanary_numba.monitor import Violation
from kvcanary_numba.monitor.bundle import BUNDLE_KEYS, dump_bundle, load_bundle
from kvcanary_numba.monitor.bundle_file import bundle_digest

M020, M030, M031, M032, M033 = "KVC-M020", "KVC-M030", "KVC-M031", "KVC-M032", "KVC-M033"
#: The limit the tests read crafted files with: bombs need only a few MiB to exceed it.
TEST_MAX_BYTES = 1 << 20


@dataclasses.dataclass
class Case:
    """One crafted input: ``make(folder) -> path``; the codes that may refuse it."""

    name: str
    make: Callable[[pathlib.Path], pathlib.Path]
    codes: frozenset
    may_load: bool = False  # the damage may touch nothing the reader checks: then it loads unchanged


def _file(name: str, data: bytes, codes, **kw) -> Case:
    def make(folder: pathlib.Path) -> pathlib.Path:
        path = folder / f"{name.replace(' ', '_')}.npz"
        path.write_bytes(data)
        return path

    return Case(name, make, frozenset(codes), **kw)


# --- bases: bundles a monitor wrote ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Base:
    name: str
    data: bytes  # the file
    arrays: dict  # load_bundle's dict (config decoded)

    def members(self) -> dict[str, bytes]:
        with zipfile.ZipFile(io.BytesIO(self.data)) as z:
            return {i.filename: z.read(i) for i in z.infolist()}


_BASES: list[Base] = []


def base_bundles() -> list[Base]:
    """Three bundles of real monitors (ALL mode with a K byte flipped; PARTIAL; write rows), made once."""
    if not _BASES:
        from monitor_helpers import DECODE, PREFILL, Driver

        folder = pathlib.Path(tempfile.mkdtemp(prefix="kvc-bases-"))
        paths = []
        for name, options in (("all", {}), ("partial", {"real_kv_hash_mode": RealKvHashMode.PARTIAL})):
            d = Driver(bundle_dir=folder / name, **options)
            d.step(PREFILL)
            d.k[4, 0] ^= 0xFF
            d.step(DECODE)
            paths.append((name, d.monitor.bundles[0]))
        d = Driver()
        d.step(PREFILL)
        tag = int(CanaryLaunchTag.HEAD_K_FULL)
        rows = [
            Violation(tag, -1, -1, 0, 9, 0, 3, int(FailReason.WRITE_RANGE_OUT_OF_BOUNDS), step=0),
            Violation(tag, 5, 9, 103, 103, 0, 2, int(FailReason.WRITE_POSITION_MISMATCH), step=0),
        ]
        paths.append(("write", dump_bundle(d.monitor, rows, folder, step=0)))
        _BASES.extend(Base(name, p.read_bytes(), load_bundle(p)) for name, p in paths)
        shutil.rmtree(folder)
    return _BASES


# --- building blocks ------------------------------------------------------------------------


def pack(members: dict[str, bytes], *, compression=zipfile.ZIP_DEFLATED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=compression) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return out.getvalue()


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, np.asarray(array), allow_pickle=True)
    return out.getvalue()


def npy_header(descr: str, fortran: bool, shape: tuple, *, version: int = 1) -> bytes:
    text = repr({"descr": descr, "fortran_order": fortran, "shape": shape}).encode("latin1")
    text += b" " * (63 - (len(text) + 10) % 64) + b"\n"
    size = struct.pack("<H" if version == 1 else "<I", len(text))
    return b"\x93NUMPY" + bytes([version, 0]) + size + text


def repack(arrays: dict, *, digest: bool = True, config: dict | None = None) -> bytes:
    """A bundle of ``arrays`` (load_bundle's dict, maybe edited): the digest recomputed or kept stale."""
    config = dict(arrays["config"] if config is None else config)
    if digest:
        config["digest"] = bundle_digest(arrays, config)
    members = {f"{k}.npy": npy(arrays[k]) for k in BUNDLE_KEYS[:-1]}
    members["config.npy"] = npy(np.array(json.dumps(config)))
    return pack(members)


def _copy(arrays: dict) -> dict:
    return {k: (v.copy() if isinstance(v, np.ndarray) else json.loads(json.dumps(v))) for k, v in arrays.items()}


# --- the classes ------------------------------------------------------------------------------


def empty(rng, base: Base) -> Case:
    return _file("empty", b"", {M020})


def truncated(rng, base: Base) -> Case:
    cut = int(rng.integers(1, len(base.data)))
    return _file(f"truncated at {cut}", base.data[:cut], {M020, M032})


def flipped(rng, base: Base) -> Case:
    data = bytearray(base.data)
    for at in rng.integers(0, len(data), int(rng.integers(1, 5))):
        data[at] ^= int(rng.integers(1, 256))
    return _file("flipped bytes", bytes(data), {M020, M031, M032, M033}, may_load=True)


def swapped(rng, base: Base) -> Case:
    members = base.members()
    a, b = rng.choice(sorted(members), 2, replace=False)
    members[a], members[b] = members[b], members[a]
    return _file(f"swapped {a} and {b}", pack(members), {M032, M033})


def member_set(rng, base: Base) -> Case:
    members = base.members()
    how = rng.choice(["drop", "extra", "duplicate", "rename"])
    key = str(rng.choice(sorted(members)))
    if how == "drop":
        del members[key]
    elif how == "extra":
        members["notes.npy"] = npy(np.zeros(3))
    elif how == "rename":
        members[key.replace(".npy", ".bin")] = members.pop(key)
    if how != "duplicate":
        return _file(f"member set: {how} {key}", pack(members), {M020})
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile's "Duplicate name": the point here
        for name, data in [*members.items(), (key, members[key])]:
            z.writestr(name, data)
    return _file(f"member set: duplicate {key}", out.getvalue(), {M032})


def headers(rng, base: Base) -> Case:
    members = base.members()
    key = str(rng.choice([k for k in members if k != "config.npy"]))
    raw = members[key]
    header_len = 10 + int.from_bytes(raw[8:10], "little")
    descr = "|u1" if key == "kv.npy" else "<i8"
    shape = np.lib.format.read_array_header_1_0(io.BytesIO(raw[8:]))[0] if raw[:6] == b"\x93NUMPY" else (0,)
    edits = {
        "claims 1 TiB": npy_header(descr, False, (1 << 37, 8)[: len(shape)] or (1 << 40,)),
        "other shape": npy_header(descr, False, tuple(n + 1 for n in shape)),
        "int32": npy_header("<i4", False, shape),
        "big-endian": npy_header(">i8", False, shape),
        "float": npy_header("<f8", False, shape),
        "pickled objects": npy_header("|O", False, shape),
        "fortran order": npy_header(descr, True, shape),
        "one more axis": npy_header(descr, False, (*shape, 1)),
        "garbage": b"\x93NUMPY\x01\x00\x10\x00{'descr': ((((\n",
        "huge header": b"\x93NUMPY\x02\x00" + struct.pack("<I", 1 << 30),
        "no magic": b"NOTNUMPY\x00\x00",
    }
    what = str(rng.choice(sorted(edits)))
    members[key] = edits[what] + raw[header_len:]
    return _file(f"header {key}: {what}", pack(members), {M020, M031, M032, M033})


_CONFIG_EDITS: dict[str, Callable[[dict], object]] = {
    "step as a string": lambda c: {**c, "step": str(c["step"])},
    "step negative": lambda c: {**c, "step": -1},
    "step a float": lambda c: {**c, "step": 1.5},
    "step a bool": lambda c: {**c, "step": True},
    "mode 7": lambda c: {**c, "real_kv_hash_mode": 7},
    "device tpu": lambda c: {**c, "device": "tpu"},
    "check as 1": lambda c: {**c, "check_verify_expected_token": 1},
    "num_slots a list": lambda c: {**c, "num_slots": [16]},
    "num_slots 0": lambda c: {**c, "num_slots": {"FULL": 0}},
    "num_slots huge": lambda c: {**c, "num_slots": {"FULL": 1 << 40}},
    "num_slots other group": lambda c: {**c, "num_slots": {"MLA": 16}},
    "key missing": lambda c: {k: v for k, v in c.items() if k != "device"},
    "key added": lambda c: {**c, "extra": 1},
    "format 2": lambda c: {**c, "format": 2},
    "format missing": lambda c: {k: v for k, v in c.items() if k != "format"},
    "a list": lambda c: [c],
    "digest short": lambda c: {**c, "digest": "00"},
    "version a number": lambda c: {**c, "kvcanary_numba": 1},
}
_CONFIG_TEXTS = {
    "not JSON": "{step: 1",
    "deep nesting": "[" * 60_000,
    "huge number": '{"step": ' + "9" * 5000 + "}",
    "too long": json.dumps({"notes": "x" * 100_000}),
}


def config(rng, base: Base) -> Case:
    names = sorted(_CONFIG_EDITS) + sorted(_CONFIG_TEXTS)
    what = str(rng.choice(names))
    members = base.members()
    if what in _CONFIG_TEXTS:
        text = _CONFIG_TEXTS[what]
    else:
        text = json.dumps(_CONFIG_EDITS[what](base.arrays["config"]))
    members["config.npy"] = npy(np.array(text))
    return _file(f"config: {what}", pack(members), {M020, M031, M033})


def _shape_edits(a: dict) -> dict[str, Callable[[], None]]:
    def add(key):
        a[key] = np.concatenate([a[key], np.zeros((1, *a[key].shape[1:]), a[key].dtype)])

    def drop(key):
        if a[key].shape[0]:
            a[key] = a[key][:-1]
        else:
            add(key)

    return {
        "a row without its step": lambda: drop("row_steps"),
        "one more row step": lambda: add("row_steps"),
        "entries without origins": lambda: drop("entry_origin"),
        "records without kv": lambda: add("records"),
        "kv of more records": lambda: add("kv"),
        "kv_lengths of more records": lambda: add("kv_lengths"),
        "rows of 9 fields": lambda: a.__setitem__("rows", np.zeros((a["rows"].shape[0], 9), np.int64)),
        "entries of 4 fields": lambda: a.__setitem__("entries", a["entries"][:, :4].copy()),
        "kv of 3 sources": lambda: a.__setitem__("kv", a["kv"][:, :3].copy()),
    }


def shapes(rng, base: Base) -> Case:
    arrays = _copy(base.arrays)
    edits = _shape_edits(arrays)
    what = str(rng.choice(sorted(edits)))
    edits[what]()
    return _file(f"shapes: {what}", repack(arrays), {M033})


def _value_edits(a: dict) -> dict[str, Callable[[], None]]:
    def set_(key, index, value):
        if a[key].size:
            a[key][index] = value

    records = a["records"]

    def record_twice():
        if records.shape[0] >= 2:
            set_("records", (-1, 1), records[0, 1])
        else:  # one record: the same record twice, with its kv bytes
            for key in ("records", "kv", "kv_lengths"):
                a[key] = np.concatenate([a[key], a[key]])

    def none_mode_with_bytes():
        a["config"]["real_kv_hash_mode"] = 0
        if a["kv"].shape[2] < 16:
            a["kv"] = np.zeros((*a["kv"].shape[:2], 16), np.uint8)
        set_("kv_lengths", (0, 0), 16)

    return {
        "row tag 12": lambda: set_("rows", (0, 0), 12),
        "row tag -1": lambda: set_("rows", (0, 0), -1),
        "row of an SWA tag": lambda: set_("rows", (0, 0), int(CanaryLaunchTag.TAIL_K_SWA)),
        "row without fail bits": lambda: set_("rows", (0, 7), 0),
        "row with an unknown bit": lambda: set_("rows", (0, 7), 1 << 20),
        "row step past the bundle's": lambda: set_("row_steps", 0, a["config"]["step"] + 1),
        "entry origin 2": lambda: set_("entry_origin", 0, 2),
        "entry tag 99": lambda: set_("entries", (0, 0), 99),
        "record slot 0": lambda: set_("records", (0, 1), 0),
        "record slot past the buffer": lambda: set_("records", (0, 1), 1 << 40),
        "record named twice": record_twice,
        "entry slot without a record": lambda: set_("entries", (0, 1), 15),
        "entry predecessor without a record": lambda: set_("entries", (0, 3), 14),
        "row slot without an entry": lambda: set_("rows", (-1, 1), 13),
        "kv length 17": lambda: set_("kv_lengths", (0, 0), 17),
        "kv length past the width": lambda: set_("kv_lengths", (0, 0), a["kv"].shape[2] + 16),
        "kv length negative": lambda: set_("kv_lengths", (0, 0), -16),
        "mode NONE with kv bytes": none_mode_with_bytes,
    }


def values(rng, base: Base) -> Case:
    arrays = _copy(base.arrays)
    edits = _value_edits(arrays)
    what = str(rng.choice(sorted(edits)))
    before = repack(arrays)
    edits[what]()
    data = repack(arrays, digest=bool(rng.integers(0, 2)))
    return _file(f"values: {what}", data, {M032, M033}, may_load=data == before)


def bombs(rng, base: Base) -> Case:
    members = base.members()
    how = str(rng.choice(["zeros", "declared", "lying"]))
    if how == "zeros":  # 8 MiB of zeros: a few KiB deflated, over TEST_MAX_BYTES inflated
        members["kv.npy"] = npy_header("|u1", False, (1 << 17, 4, 16)) + bytes(1 << 23)
        return _file("bomb: zeros", pack(members), {M031})
    data = bytearray(pack(members))
    at = data.rfind(b"PK\x01\x02")  # the last member's central directory entry
    if how == "declared":  # claims 6 GiB inflated
        struct.pack_into("<I", data, at + 24, 0xFFFFFFFF - 1)
        return _file("bomb: declared 4 GiB", bytes(data), {M031, M032})
    struct.pack_into("<I", data, at + 24, 64)  # claims less than the stream inflates to
    return _file("bomb: lying size", bytes(data), {M032})


def _special(name: str, build: Callable[[pathlib.Path], pathlib.Path], codes) -> Case:
    return Case(name, build, frozenset(codes))


def not_regular(rng, base: Base) -> Case:
    def fifo(folder):
        path = folder / "incoming.npz"
        os.mkfifo(path)
        return path

    def link_to_fifo(folder):
        link = folder / "link.npz"
        link.symlink_to(fifo(folder))
        return link

    def dangling(folder):
        link = folder / "gone.npz"
        link.symlink_to(folder / "nothing-here.npz")
        return link

    cases = {
        "FIFO": (fifo, {M030}),
        "symlink to a FIFO": (link_to_fifo, {M030}),
        "directory": (lambda folder: folder, {M030}),
        "device": (lambda folder: pathlib.Path(os.devnull), {M030}),
        "dangling symlink": (dangling, {M020}),
        "missing": (lambda folder: folder / "missing.npz", {M020}),
    }
    what = str(rng.choice(sorted(cases)))
    build, codes = cases[what]
    return _special(what, build, codes)


def foreign(rng, base: Base) -> Case:
    what = str(rng.choice(["log", "other npz", "pickle npz", "npy"]))
    out = io.BytesIO()
    if what == "log":
        return _file("foreign: a log", b"kv_canary violation: launch_tag=HEAD_K_FULL ...\n", {M020})
    if what == "npy":
        return _file("foreign: an .npy", npy(np.zeros(4)), {M020})
    if what == "other npz":
        np.savez(out, weights=np.zeros(4))
    else:
        np.savez(out, **{k: np.array([{"x": 1}], dtype=object) for k in BUNDLE_KEYS})
    return _file(f"foreign: {what}", out.getvalue(), {M020, M033})


CLASSES = {
    "empty": empty,
    "truncated": truncated,
    "flipped bytes": flipped,
    "swapped members": swapped,
    "member set": member_set,
    "npy headers": headers,
    "config": config,
    "shape disagreements": shapes,
    "out-of-range values": values,
    "zip bombs": bombs,
    "not a regular file": not_regular,
    "foreign files": foreign,
}


def tabulate(seeds: int) -> dict[str, dict[str, int]]:
    """Class -> outcome (a code, or ``loaded``: tests/test_bundle_reading.py checks it is the original) -> count,
    over ``seeds`` seeds and every base."""
    from collections import Counter

    from kvcanary_numba.errors import KvCanaryError

    table = {}
    for cls, build in CLASSES.items():
        counts = Counter()
        for seed in range(seeds):
            for base in base_bundles():
                case = build(np.random.default_rng(seed), base)
                folder = pathlib.Path(tempfile.mkdtemp(prefix="kvc-damage-"))
                try:
                    load_bundle(case.make(folder), max_bytes=TEST_MAX_BYTES)
                    counts["loaded"] += 1
                except KvCanaryError as exc:
                    counts[exc.code] += 1
                finally:
                    shutil.rmtree(folder)
        table[cls] = dict(counts)
    return table


if __name__ == "__main__":
    for cls, counts in tabulate(int(sys.argv[1]) if len(sys.argv) > 1 else 20).items():
        print(f"{cls:<22} {sum(counts.values()):>5}  {counts}")
