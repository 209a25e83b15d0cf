"""Reading violation bundles defensively: damaged and crafted files (tests/bundle_damage.py) are
refused with one coded line and exit code 2, never a traceback, a large allocation, a hang or
a verdict; a file the damage missed loads equal to the original.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import threading
import tracemalloc

import numpy as np
import pytest
from bundle_damage import CLASSES, TEST_MAX_BYTES, Case, base_bundles, npy, npy_header, pack, repack
from hypothesis import HealthCheck, given, settings, strategies as st

from kvcanary_numba import cli
from kvcanary_numba.errors import KvCanaryError
from kvcanary_numba.monitor.bundle import MAX_BUNDLE_BYTES, load_bundle
from kvcanary_numba.monitor.replay import explain_bundle, replay_bundle

#: Peak Python and NumPy allocation while reading a crafted file (the files are a few KiB).
_PEAK_BYTES = 16 << 20
_TIMEOUT_S = 30


def _load(path: pathlib.Path, max_bytes: int = TEST_MAX_BYTES):
    """load_bundle in a thread (a hang fails the test instead of stalling it): (bundle or error, peak bytes)."""
    out: list = []

    def run():
        tracemalloc.start()
        try:
            out.append(load_bundle(path, max_bytes=max_bytes))
        except BaseException as exc:  # noqa: BLE001 - handed to the test, which names it
            out.append(exc)
        finally:
            out.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(_TIMEOUT_S)
    if worker.is_alive():
        with contextlib.suppress(OSError):  # a reader blocked on a FIFO: let it go
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"load_bundle({path}) did not return within {_TIMEOUT_S} s")
    return out[0], out[1]


def _inspect(path: pathlib.Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(["inspect", str(path), "--max-bytes", str(TEST_MAX_BYTES)])
    return status, out.getvalue(), err.getvalue()


def _same(a: dict, b: dict) -> bool:
    return a["config"] == b["config"] and all(np.array_equal(a[k], b[k]) for k in a if k != "config")


def check_case(case: Case, base, folder: pathlib.Path) -> str:
    """Read ``case`` with load_bundle and with `kvcanary inspect`; returns the code (or ``loaded``)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = case.make(folder)
    result, peak = _load(path)
    assert peak < _PEAK_BYTES, f"{case.name}: {peak} bytes allocated while reading"
    status, out, err = _inspect(path)
    if isinstance(result, KvCanaryError):
        assert result.code in case.codes, f"{case.name}: {result.code} ({result})"
        assert status == 2 and out == "", case.name
        assert err.count("\n") == 1 and f"[{result.code}]" in err and "Traceback" not in err, err
        return result.code
    assert not isinstance(result, BaseException), f"{case.name}: {type(result).__name__}: {result}"
    assert case.may_load, f"{case.name}: loaded instead of being refused"
    assert _same(result, base.arrays), f"{case.name}: loaded as something other than the original"
    assert status == 0 and out.strip() == explain_bundle(base.arrays).strip()
    return "loaded"


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cls", sorted(CLASSES))
def test_every_class_of_crafted_bundle_is_refused_with_a_code(cls, seed, tmp_path):
    for base in base_bundles():
        case = CLASSES[cls](np.random.default_rng(seed), base)
        check_case(case, base, tmp_path / base.name)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), cls=st.sampled_from(sorted(CLASSES)), which=st.integers(0, 2))
def test_property_crafted_bundles(seed, cls, which, tmp_path_factory):
    base = base_bundles()[which]
    case = CLASSES[cls](np.random.default_rng(seed), base)
    check_case(case, base, tmp_path_factory.mktemp("case"))


def test_bundles_the_monitor_writes_carry_a_digest_and_load():
    for base in base_bundles():
        config = base.arrays["config"]
        assert set(config) == {
            "format",
            "kvcanary_numba",
            "step",
            "device",
            "real_kv_hash_mode",
            "check_verify_expected_token",
            "num_slots",
            "digest",
        }
        assert len(config["digest"]) == 64 and replay_bundle(base.arrays).recorded


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "incoming.npz"
    os.mkfifo(fifo)
    result, _ = _load(fifo)  # no writer ever comes: a reader that opened it would wait for one
    assert isinstance(result, KvCanaryError) and result.code == "KVC-M030" and "a FIFO" in str(result)


def test_a_header_claiming_a_tebibyte_is_refused_before_any_allocation(tmp_path):
    base = base_bundles()[0]
    members = base.members()
    raw = members["rows.npy"]
    members["rows.npy"] = npy_header("<i8", False, (1 << 37, 8)) + raw[10 + int.from_bytes(raw[8:10], "little") :]
    path = tmp_path / "claims.npz"
    path.write_bytes(pack(members))
    result, peak = _load(path, max_bytes=MAX_BUNDLE_BYTES)
    assert isinstance(result, KvCanaryError) and result.code == "KVC-M032" and "(137438953472, 8)" in str(result)
    assert peak < _PEAK_BYTES


def test_a_small_file_declaring_gibibytes_is_refused_before_inflating(tmp_path):
    base = base_bundles()[0]
    members = base.members()
    members["kv.npy"] = npy_header("|u1", False, (1 << 17, 4, 16)) + bytes(1 << 23)  # 8 MiB of zeros
    path = tmp_path / "bomb.npz"
    path.write_bytes(pack(members))
    assert path.stat().st_size < 64 << 10
    result, peak = _load(path, max_bytes=4 << 20)
    assert isinstance(result, KvCanaryError) and result.code == "KVC-M031" and "inflate to" in str(result)
    assert peak < _PEAK_BYTES
    assert _load(path, max_bytes=16 << 20)[0].code == "KVC-M033"  # read within a higher limit: kv is not [k, 4, b]


def test_members_declaring_gibibytes_are_refused_under_the_default_limit(tmp_path):
    data = bytearray(base_bundles()[0].data)
    at = data.rfind(b"PK\x01\x02")  # the last member's central directory entry: its inflated size
    data[at + 24 : at + 28] = (0xFFFFFFFE).to_bytes(4, "little")
    path = tmp_path / "declared.npz"
    path.write_bytes(bytes(data))
    result, peak = _load(path, max_bytes=MAX_BUNDLE_BYTES)
    assert isinstance(result, KvCanaryError) and result.code == "KVC-M031" and peak < _PEAK_BYTES


def test_the_file_size_limit_and_its_argument(tmp_path):
    base = base_bundles()[0]
    path = tmp_path / "b.npz"
    path.write_bytes(base.data)
    with pytest.raises(KvCanaryError) as info:
        load_bundle(path, max_bytes=len(base.data) - 1)
    assert info.value.code == "KVC-M031" and f"{len(base.data)} bytes on disk" in str(info.value)
    inflated = sum(len(m) for m in base.members().values())
    with pytest.raises(KvCanaryError) as info:
        load_bundle(path, max_bytes=inflated - 1)
    assert info.value.code == "KVC-M031" and f"inflate to {inflated} bytes" in str(info.value)
    assert _same(load_bundle(path, max_bytes=inflated), base.arrays)
    for bad in (0, -1, 1.5, "1", True):
        with pytest.raises(KvCanaryError) as info:
            load_bundle(path, max_bytes=bad)
        assert info.value.code == "KVC-C011"


def test_inspect_max_bytes_option(tmp_path, capsys):
    path = tmp_path / "b.npz"
    path.write_bytes(base_bundles()[0].data)
    assert cli.main(["inspect", str(path), "--max-bytes", "100"]) == 2
    assert "[KVC-M031]" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["inspect", str(path), "--max-bytes", "0"])
    assert exit_info.value.code == 2


def test_an_edited_array_with_its_old_digest_is_refused_as_damaged(tmp_path):
    base = base_bundles()[0]
    arrays = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in base.arrays.items()}
    arrays["kv"][1, 0, 0] ^= 0xFF  # undoes the flip: a replay would say "not reproduced"
    path = tmp_path / "edited.npz"
    path.write_bytes(repack(arrays, digest=False))
    with pytest.raises(KvCanaryError) as info:
        load_bundle(path)
    assert info.value.code == "KVC-M032" and "digest" in str(info.value)
    path.write_bytes(repack(arrays, digest=True))  # re-signed: a bundle of what the slot holds now
    assert not replay_bundle(path).replayed


def test_a_bundle_without_a_digest_is_read(tmp_path):
    base = base_bundles()[0]
    config = {k: v for k, v in base.arrays["config"].items() if k != "digest"}
    path = tmp_path / "old.npz"
    path.write_bytes(repack(base.arrays, digest=False, config=config))
    assert load_bundle(path)["config"] == config


def test_an_edited_dict_is_checked_before_its_replay():
    base = base_bundles()[0]
    bundle = {k: (v.copy() if isinstance(v, np.ndarray) else json.loads(json.dumps(v))) for k, v in base.arrays.items()}
    bundle["records"][0, 1] = 99  # a slot past the 16-slot buffer
    with pytest.raises(KvCanaryError) as info:
        replay_bundle(bundle)
    assert info.value.code == "KVC-M033" and "outside their buffer" in str(info.value)
    for broken in ({**base.arrays, "rows": base.arrays["rows"].astype(np.int32)}, {"rows": base.arrays["rows"]}):
        with pytest.raises(KvCanaryError) as info:
            replay_bundle(broken)
        assert info.value.code == "KVC-M033"
    for not_a_path in ([], None, 3):
        with pytest.raises(KvCanaryError) as info:
            replay_bundle(not_a_path)
        assert info.value.code == "KVC-M020" and "not a path" in str(info.value)


def test_a_pickled_member_is_never_read(tmp_path):
    members = base_bundles()[0].members()
    members["rows.npy"] = npy(np.array([{"rows": 1}], dtype=object))
    path = tmp_path / "pickle.npz"
    path.write_bytes(pack(members))
    with pytest.raises(KvCanaryError) as info:
        load_bundle(path)
    assert info.value.code == "KVC-M020" and "pickled Python objects" in str(info.value)
