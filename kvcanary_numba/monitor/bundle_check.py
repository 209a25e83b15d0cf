"""A bundle's contents against its schema: the config's keys, types and ranges, and what the arrays
must agree on, so that a replay never runs on a bundle it would misread.

What a bundle the monitor wrote always satisfies (:func:`.bundle.collect_bundle`):

- the config has exactly the format's keys (``digest`` optional), each of its type and range;
- rows ``[n, 8]`` and row_steps ``[n]``; entries ``[m, 5]`` and entry_origin ``[m]`` (0 or 1);
  records ``[k, 6]``, kv ``[k, 4, b]`` and kv_lengths ``[k, 4]``;
- every launch tag is a known one, of a group the config counts slots for;
- rows carry known fail bits (at least one) and were read back by the bundle's step;
- records name in-range slots, each once per tag; every in-range slot or predecessor an entry
  names has its record; every row a replay can verify has an entry for its slot;
- kv lengths are 0 or a multiple of 16 up to ``b`` (16 in PARTIAL mode, 0 in NONE mode).

A bundle that breaks any of these is refused with KVC-M033 (the digest: KVC-M032).
"""

from __future__ import annotations

import json

import numpy as np

from .._runtime import INT32_MAX
from ..constants import (
    FAIL_PREV_RANGE,
    FAIL_WRITE_POSITION,
    FAIL_WRITE_RANGE,
    FAIL_WRITE_TOKEN,
    NUM_LAUNCH_TAGS,
    PARTIAL_READ_BYTES,
    REAL_KV_ALIGN_BYTES,
    CanaryLaunchTag,
    FailReason,
    RealKvHashMode,
)
from ..errors import error
from .bundle_file import ARRAY_FORMAT, BUNDLE_FORMAT, BUNDLE_KEYS, bundle_digest

__all__ = ["check_bundle_dict", "check_contents", "decode_config"]

_INT64_MAX = (1 << 63) - 1
_KNOWN_BITS = sum(int(b) for b in FailReason)
_WRITE_BITS = int(FAIL_WRITE_TOKEN) | int(FAIL_WRITE_POSITION)
#: Group (FULL, SWA) of each launch tag, by value.
_TAG_GROUPS = np.array([CanaryLaunchTag(t).name.rsplit("_", 1)[-1] for t in range(NUM_LAUNCH_TAGS)])


def _is_int(value, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


#: Config key -> (what it must be, the check).
_CONFIG = {
    "format": ("the format number", lambda v: _is_int(v, 0, _INT64_MAX)),
    "kvcanary_numba": ("a version string", lambda v: isinstance(v, str) and 0 < len(v) <= 64),
    "step": ("an int in [0, 2**63 - 1]", lambda v: _is_int(v, 0, _INT64_MAX)),
    "device": ("'cpu' or 'cuda'", lambda v: v in ("cpu", "cuda")),
    "real_kv_hash_mode": ("0, 1 or 2 (RealKvHashMode)", lambda v: _is_int(v, 0, 2)),
    "check_verify_expected_token": ("a bool", lambda v: type(v) is bool),
    "num_slots": (
        "a dict of FULL (and SWA) to an int in [1, 2**31 - 1]",
        lambda v: (
            type(v) is dict
            and "FULL" in v
            and set(v) <= {"FULL", "SWA"}
            and all(_is_int(n, 1, INT32_MAX) for n in v.values())
        ),
    ),
}
_OPTIONAL = {
    "digest": ("a SHA-256 hex string", lambda v: isinstance(v, str) and len(v) == 64),
    "rank": ("an int in [0, 2**31 - 2]", lambda v: _is_int(v, 0, INT32_MAX - 1)),
}


class _Check:
    """The checks of one bundle (``where``: its path, or "the bundle dict"); refusals are KVC-M033."""

    def __init__(self, function: str, where: str):
        self.function, self.where = function, where

    def at(self, reason: str) -> dict:
        """The fields of a refusal's message."""
        return dict(function=self.function, path=self.where, reason=reason)

    def require(self, ok, reason: str) -> None:
        if not bool(ok):
            raise error("KVC-M033", **self.at(reason))


def decode_config(function: str, where: str, config) -> dict:
    """The config string of a bundle file as a dict (KVC-M033 when it is not a JSON object)."""
    check = _Check(function, where)
    try:
        decoded = json.loads(str(config[()]) if isinstance(config, np.ndarray) else str(config))
    except (ValueError, RecursionError):
        decoded = None
    check.require(isinstance(decoded, dict), "config is not a JSON object")
    return decoded


def _check_config(check: _Check, config: dict) -> None:
    if config.get("format") != BUNDLE_FORMAT:  # first: a newer bundle is named as such
        got = repr(config.get("format"))[:80]
        raise error("KVC-M020", **check.at(f"format {got}, this version reads {BUNDLE_FORMAT}"))
    missing = [k for k in _CONFIG if k not in config]
    check.require(not missing, f"config lacks {', '.join(missing)}")
    unknown = [k for k in config if k not in _CONFIG and k not in _OPTIONAL]
    if unknown:
        raise error("KVC-M033", **check.at(f"config has unknown key {unknown[0]!r}"[:300]))
    for key, value in config.items():
        what, ok = {**_CONFIG, **_OPTIONAL}[key]
        check.require(ok(value), f"config {key} must be {what}, got {value!r}"[:300])


def _tags(check: _Check, name: str, tags: np.ndarray, groups: dict) -> None:
    check.require(
        ((tags >= 0) & (tags < NUM_LAUNCH_TAGS)).all(), f"{name} name a launch tag outside [0, {NUM_LAUNCH_TAGS})"
    )
    missing = {str(_TAG_GROUPS[t]) for t in np.unique(tags)} - set(groups)
    check.require(not missing, f"{name} name tags of group(s) {sorted(missing)} the config has no slots for")


def _keys(tags: np.ndarray, slots: np.ndarray) -> np.ndarray:
    return slots * NUM_LAUNCH_TAGS + tags  # slots in range are below 2**31: no overflow


def check_contents(function: str, where: str, arrays: dict, config: dict, *, digest: bool) -> None:
    """Refuse a bundle whose config or arrays break the schema (module docstring).

    Parameters
    ----------
    arrays : dict of str to numpy.ndarray
        The bundle's arrays (config aside), of the format's dtypes and dimensions.
    config : dict
        The decoded config.
    digest : bool
        Compare the config's digest (when it has one) with the arrays: a file's check.

    Raises
    ------
    KvCanaryError
        KVC-M020 (another format), KVC-M032 (digest), KVC-M033.
    """
    check = _Check(function, where)
    check.require(isinstance(config, dict), "config is not a dict")
    _check_config(check, config)
    rows, steps, entries, origin = arrays["rows"], arrays["row_steps"], arrays["entries"], arrays["entry_origin"]
    records, kv, lengths = arrays["records"], arrays["kv"], arrays["kv_lengths"]
    shapes = {k: tuple(a.shape) for k, a in arrays.items()}
    n, m, k = rows.shape[0], entries.shape[0], records.shape[0]
    want = {
        "rows": (n, 8),
        "row_steps": (n,),
        "entries": (m, 5),
        "entry_origin": (m,),
        "records": (k, 6),
        "kv": (k, 4, kv.shape[2]),
        "kv_lengths": (k, 4),
    }
    for key, shape in want.items():
        check.require(shapes[key] == shape, f"{key} has shape {shapes[key]}, the other arrays need {shape}")
    groups = config["num_slots"]
    _tags(check, "rows", rows[:, 0], groups)
    _tags(check, "entries", entries[:, 0], groups)
    _tags(check, "records", records[:, 0], groups)
    bits = rows[:, 7]
    check.require(((bits > 0) & (bits & ~_KNOWN_BITS == 0)).all(), "rows carry no fail bit or an unknown one")
    check.require(((steps >= 0) & (steps <= config["step"])).all(), "row_steps are outside [0, step]")
    check.require(np.isin(origin, (0, 1)).all(), "entry_origin holds values other than 0 and 1")
    sizes = np.array([groups.get(g, 0) for g in _TAG_GROUPS], dtype=np.int64)
    slots = records[:, 1]
    check.require(((slots > 0) & (slots < sizes[records[:, 0]])).all(), "records name slots outside their buffer")
    keys = _keys(records[:, 0], slots)
    check.require(np.unique(keys).shape[0] == k, "records name a slot twice")
    for column, what in ((1, "slot"), (3, "predecessor")):
        named = entries[:, column]
        inside = (named > 0) & (named < sizes[entries[:, 0]])
        has = np.isin(_keys(entries[inside, 0], named[inside]), keys)
        check.require(has.all(), f"entries name an in-range {what} without its record")
    fr = bits
    skipped = ((fr & (_WRITE_BITS | int(FAIL_WRITE_RANGE))) != 0) | ((fr == int(FAIL_PREV_RANGE)) & (rows[:, 2] < 0))
    needs = ~skipped | (((fr & _WRITE_BITS) != 0) & (rows[:, 1] > 0))
    for tag in np.unique(rows[needs, 0]):  # per tag: slots compared as int64 arrays, whatever their range
        wanted = rows[needs & (rows[:, 0] == tag), 1]
        lost = wanted[~np.isin(wanted, entries[entries[:, 0] == tag, 1])]
        if lost.size:
            reason = f"a row a replay verifies has no entry (tag {int(tag)}, slot {int(lost[0])})"
            raise error("KVC-M033", **check.at(reason))
    width = kv.shape[2]
    ok = (lengths >= 0) & (lengths <= width) & (lengths % REAL_KV_ALIGN_BYTES == 0)
    check.require(ok.all(), f"kv_lengths outside [0, {width}] or not multiples of {REAL_KV_ALIGN_BYTES}")
    mode = RealKvHashMode(config["real_kv_hash_mode"])
    if mode == RealKvHashMode.NONE:
        check.require(not lengths.any(), "kv_lengths are set while real_kv_hash_mode is NONE")
    elif mode == RealKvHashMode.PARTIAL:
        check.require(np.isin(lengths, (0, PARTIAL_READ_BYTES)).all(), "kv_lengths other than 16 in PARTIAL mode")
    if digest and "digest" in config and bundle_digest(arrays, config) != config["digest"]:
        raise error("KVC-M032", **check.at("the arrays do not match the config's digest (edited or damaged)"))


def check_bundle_dict(function: str, bundle) -> None:
    """Refuse a bundle dict (as :func:`.bundle.load_bundle` returns, maybe edited) that breaks the schema.

    Raises
    ------
    KvCanaryError
        KVC-M033 (keys, array types, dimensions, contents), KVC-M020 (another format).
    """
    check = _Check(function, "the bundle dict")
    check.require(isinstance(bundle, dict), f"a {type(bundle).__name__}, not a dict")
    check.require(set(bundle) == set(BUNDLE_KEYS), f"keys {sorted(map(str, bundle))}, not {list(BUNDLE_KEYS)}")
    for key in BUNDLE_KEYS[:-1]:
        descr, ndim = ARRAY_FORMAT[key]
        a = bundle[key]
        ok = isinstance(a, np.ndarray) and a.dtype == np.dtype(descr) and a.ndim == ndim
        check.require(ok, f"{key} must be a {ndim}-D NumPy array of {np.dtype(descr)}")
    arrays = {key: bundle[key] for key in BUNDLE_KEYS[:-1]}
    check_contents(function, "the bundle dict", arrays, bundle["config"], digest=False)
