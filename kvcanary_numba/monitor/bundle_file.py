"""Reading a violation bundle's file without trusting it: every size is checked before it is used.

A bundle (:mod:`.bundle`) is an ``.npz``: a zip archive of one ``.npy`` member per
key. Before anything is inflated or allocated, this module checks, in order:

1. the path names a regular file (a FIFO, directory or device is refused without
   opening it for reading; the file is opened non-blocking and checked again);
2. its size is within ``max_bytes`` and it starts like a zip archive;
3. the zip's end record: at most a few members and a small central directory;
4. the members: exactly the bundle's keys, no encryption, stored or deflated,
   declared sizes within ``max_bytes`` in total;
5. each member's ``.npy`` header (parsed here, never by :func:`numpy.load`): the
   dtype and number of dimensions of the format, C order, and a shape whose bytes
   are exactly what the member declares.

Only then is each array allocated (its size now known and bounded) and read; a
member that ends early, fails its CRC or does not inflate is refused. Pickles
are never read (object dtypes are not among the format's). Codes: KVC-M020 (not a
bundle), KVC-M030 (not a regular file), KVC-M031 (over the size limit), KVC-M032
(damaged).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import pathlib
import re
import stat
import struct
import zipfile
import zlib

import numpy as np

from ..errors import KvCanaryError, error

__all__ = ["BUNDLE_FORMAT", "BUNDLE_KEYS", "MAX_BUNDLE_BYTES", "bundle_digest", "read_bundle_arrays"]

BUNDLE_FORMAT = 1
BUNDLE_KEYS = ("rows", "row_steps", "entries", "entry_origin", "records", "kv", "kv_lengths", "config")
#: Default limit of a bundle's file size and of its arrays' bytes once inflated (``load_bundle(max_bytes=)``).
MAX_BUNDLE_BYTES = 1 << 30
#: dtype (as its ``.npy`` descr) and number of dimensions of each key; config is one JSON string.
ARRAY_FORMAT = {
    "rows": ("<i8", 2),
    "row_steps": ("<i8", 1),
    "entries": ("<i8", 2),
    "entry_origin": ("<i8", 1),
    "records": ("<i8", 2),
    "kv": ("|u1", 3),
    "kv_lengths": ("<i8", 2),
    "config": ("<U", 0),
}
_MAX_CONFIG_CHARS = 1 << 16
_MAX_HEADER_BYTES = 1 << 12  # numpy writes about 128
_MAX_CENTRAL_DIRECTORY = 1 << 16
_ZIP_START, _END, _END64, _LOCATOR64 = b"PK\x03\x04", b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07"
_NPY_MAGIC = b"\x93NUMPY"
_DESCR = re.compile(r"<U([1-9][0-9]{0,5})")
_READ_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    struct.error,
    EOFError,
    OSError,
    OverflowError,
    ValueError,
    NotImplementedError,
    RuntimeError,
)


def bundle_digest(arrays: dict, config: dict) -> str:
    """SHA-256 (hex) of a bundle: every array (key, dtype, shape, bytes, in key order), then the
    config as sorted JSON without its ``digest``."""
    h = hashlib.sha256()
    for key in BUNDLE_KEYS[:-1]:
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}:{a.dtype.str}:{a.shape};".encode())
        h.update(a.reshape(-1).view(np.uint8))
    h.update(json.dumps({k: v for k, v in config.items() if k != "digest"}, sort_keys=True).encode())
    return h.hexdigest()


class _Reader:
    """One bundle file being read; ``at`` gives a refusal's message fields."""

    def __init__(self, function: str, path: pathlib.Path, max_bytes: int):
        self.function, self.path, self.max_bytes = function, path, max_bytes

    def at(self, reason: str) -> dict:
        """The fields of a refusal's message."""
        return dict(function=self.function, path=str(self.path), reason=reason)

    def open(self):
        """The file opened for reading, after checking it is a regular file of an allowed size."""
        try:
            info = os.stat(self.path)  # follows a symlink: its target must be a regular file
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            raise error("KVC-M020", **self.at(f"cannot be read ({reason})")) from None
        self.check_kind(info.st_mode)
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
        try:
            fd = os.open(self.path, flags)  # non-blocking: a FIFO swapped in since the stat cannot hang the open
        except OSError as exc:
            raise error("KVC-M020", **self.at(f"cannot be opened ({exc.strerror or type(exc).__name__})")) from None
        f = os.fdopen(fd, "rb")
        try:
            info = os.fstat(f.fileno())
            self.check_kind(info.st_mode)
            self.check_size(info.st_size)
        except BaseException:
            f.close()
            raise
        return f, info.st_size

    def check_kind(self, mode: int) -> None:
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
            raise error("KVC-M030", **self.at(f"{kind} (mode {stat.filemode(mode)})"))

    def check_size(self, size: int) -> None:
        if size == 0:
            raise error("KVC-M020", **self.at("an empty file"))
        if size > self.max_bytes:
            raise error("KVC-M031", **self.at(f"{size} bytes on disk, over the limit of {self.max_bytes}"))

    def central_directory(self, f, size: int) -> None:
        """Check the zip's end record before zipfile parses it: few members, a small directory."""
        f.seek(0)
        if f.read(4) != _ZIP_START:
            raise error("KVC-M020", **self.at("not a zip archive (an .npz bundle starts with a zip member)"))
        tail_at = max(size - (22 + 0xFFFF), 0)
        f.seek(tail_at)
        tail = f.read()
        at = tail.rfind(_END)
        if at < 0 or len(tail) - at < 22:
            raise error("KVC-M032", **self.at("truncated: the zip archive has no end record"))
        members, directory = struct.unpack_from("<HI", tail, at + 10)
        if members == 0xFFFF or directory == 0xFFFFFFFF:  # zip64: the counts are in the zip64 end record
            members, directory = self._zip64_counts(f, tail, tail_at + at)
        if members > 4 * len(BUNDLE_KEYS) or directory > _MAX_CENTRAL_DIRECTORY:
            raise error("KVC-M020", **self.at(f"a zip archive of {members} members ({directory} directory bytes)"))

    def _zip64_counts(self, f, tail: bytes, end_at: int) -> tuple[int, int]:
        f.seek(max(end_at - 20, 0))
        locator = f.read(20)
        if len(locator) < 20 or locator[:4] != _LOCATOR64:
            raise error("KVC-M032", **self.at("the zip64 end record is missing"))
        (offset,) = struct.unpack_from("<Q", locator, 8)
        f.seek(min(offset, end_at))
        record = f.read(56)
        if len(record) < 56 or record[:4] != _END64:
            raise error("KVC-M032", **self.at("the zip64 end record is damaged"))
        return struct.unpack_from("<QQ", record, 32)

    def members(self, archive: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
        """Key -> member: exactly the bundle's members, readable, declaring at most ``max_bytes`` in all."""
        infos = archive.infolist()
        names = [i.filename for i in infos]
        expected = {f"{k}.npy": k for k in BUNDLE_KEYS}
        if len(set(names)) != len(names):
            raise error("KVC-M032", **self.at("a member name appears twice"))
        unexpected = [n for n in names if n not in expected]
        if unexpected:
            raise error(
                "KVC-M020", **self.at(f"unexpected member {unexpected[0]!r} (a bundle holds {', '.join(BUNDLE_KEYS)})")
            )
        missing = [k for n, k in expected.items() if n not in names]
        if missing:
            raise error("KVC-M020", **self.at(f"missing {', '.join(missing)}"))
        for info in infos:
            if info.flag_bits & 0x1:
                raise error("KVC-M032", **self.at(f"member {info.filename} is encrypted"))
            if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise error(
                    "KVC-M032", **self.at(f"member {info.filename} uses compression method {info.compress_type}")
                )
        declared = sum(i.file_size for i in infos)
        if declared > self.max_bytes:
            raise error(
                "KVC-M031", **self.at(f"members that inflate to {declared} bytes, over the limit of {self.max_bytes}")
            )
        return {expected[i.filename]: i for i in infos}

    def header(self, key: str, member, size: int) -> tuple[np.dtype, tuple, int]:
        """Parse one member's ``.npy`` header: (dtype, shape, data bytes), checked against the format."""
        start = member.read(8)
        width = {b"\x01\x00": 2, b"\x02\x00": 4}.get(start[6:8]) if start[:6] == _NPY_MAGIC else None
        field = member.read(width) if width else b""
        if width is None or len(field) < width:
            raise error("KVC-M032", **self.at(f"member {key} is not an .npy array"))
        length, used = int.from_bytes(field, "little"), 8 + width
        if length > _MAX_HEADER_BYTES:
            raise error("KVC-M032", **self.at(f"member {key} has a {length}-byte .npy header"))
        text = member.read(length)
        try:
            fields = ast.literal_eval(text.decode("latin1"))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            fields = None
        if len(text) < length or not isinstance(fields, dict) or set(fields) != {"descr", "fortran_order", "shape"}:
            raise error("KVC-M032", **self.at(f"member {key} has an unreadable .npy header"))
        descr, order, shape = fields["descr"], fields["fortran_order"], fields["shape"]
        if "O" in str(descr):
            raise error("KVC-M020", **self.at(f"member {key} holds pickled Python objects, which are never read"))
        want, ndim = ARRAY_FORMAT[key]
        shape_ok = isinstance(shape, tuple) and len(shape) == ndim and all(type(n) is int and n >= 0 for n in shape)
        match = _DESCR.fullmatch(descr) if key == "config" and isinstance(descr, str) else None
        if key == "config" and match and int(match.group(1)) > _MAX_CONFIG_CHARS:
            raise error("KVC-M031", **self.at(f"config of {match.group(1)} characters, over {_MAX_CONFIG_CHARS}"))
        if not ((match or descr == want) and order is False and shape_ok):
            got = f"descr {descr!r}, fortran_order {order!r}, shape {shape!r}"
            raise error("KVC-M033", **self.at(f"{key} is stored as {got}; the format has {want}, C order, {ndim}-D"))
        dtype = np.dtype(descr)
        nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if used + length + nbytes != size:
            raise error(
                "KVC-M032",
                **self.at(f"member {key}: its header says {shape} {descr} ({nbytes} bytes), the member holds {size}"),
            )
        return dtype, shape, nbytes

    def array(self, archive: zipfile.ZipFile, key: str, info: zipfile.ZipInfo) -> np.ndarray:
        """One member's array: its header checked, then exactly its bytes read (CRC checked at the end)."""
        try:
            with archive.open(info) as member:
                dtype, shape, nbytes = self.header(key, member, info.file_size)
                data = bytearray(nbytes)  # bounded: counted in the members' declared sizes
                view, done = memoryview(data), 0
                while done < nbytes:
                    n = member.readinto(view[done:])
                    if not n:
                        raise error("KVC-M032", **self.at(f"member {key} ends after {done} of {nbytes} bytes"))
                    done += n
                if member.read(1):
                    raise error("KVC-M032", **self.at(f"member {key} holds more than its header says"))
        except KvCanaryError:
            raise
        except _READ_ERRORS as exc:
            raise error("KVC-M032", **self.at(f"member {key} is damaged ({type(exc).__name__}: {exc})")) from None
        return np.frombuffer(data, dtype=dtype).reshape(shape)


def read_bundle_arrays(function: str, path, *, max_bytes: int = MAX_BUNDLE_BYTES) -> dict[str, np.ndarray]:
    """The arrays of a bundle file (config still a 0-d string array), each read after its checks.

    Raises
    ------
    KvCanaryError
        KVC-M020, KVC-M030, KVC-M031, KVC-M032, KVC-M033 (a member stored with another dtype or shape).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise error("KVC-M020", function=function, path=repr(path)[:80], reason=f"a {type(path).__name__}, not a path")
    reader = _Reader(function, pathlib.Path(path), max_bytes)
    f, size = reader.open()
    with f:
        reader.central_directory(f, size)
        f.seek(0)
        try:
            archive = zipfile.ZipFile(f)
        except _READ_ERRORS as exc:
            raise error("KVC-M032", **reader.at(f"the zip archive is damaged ({type(exc).__name__}: {exc})")) from None
        with archive:
            members = reader.members(archive)
            return {key: reader.array(archive, key, members[key]) for key in BUNDLE_KEYS}
