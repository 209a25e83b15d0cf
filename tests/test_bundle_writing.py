"""Writing violation bundles never raises into the engine: a directory that disappears, cannot be
written or fills up is one BundleWriteWarning and a count in stats(); detection goes on, and the
step that found corruption still reports it (mode raise: CanaryViolationError, not OSError)."""

from __future__ import annotations

import errno
import os
import shutil
import warnings

import pytest
from monitor_helpers import DECODE, PREFILL, Driver

from kvcanary_numba.monitor import BundleWriteWarning, CanaryViolationError, bundle as bundle_module
from kvcanary_numba.monitor.bundle import load_bundle

MORE = [{1: [(105, 7)]}, {1: [(106, 8)]}, {1: [(107, 9)]}]


def _flipped(tmp_path, **options) -> Driver:
    d = Driver(bundle_dir=tmp_path / "bundles", **options)
    d.step(PREFILL)
    d.k[4, 0] ^= 0xFF  # every later TAIL verify of slot 4 finds it
    return d


def _full_disk(monkeypatch) -> list:
    """Make every bundle write put a few bytes down, then fail as a full disk does; returns the files tried."""
    tried = []

    def write(file, arrays):
        tried.append(file.name)
        file.write(b"PK\x03\x04 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(bundle_module, "_write_arrays", write)
    return tried


def _steps_warn_once(d: Driver) -> list:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d.step(DECODE)
        for new in MORE:
            d.step(new)
    return [w for w in caught if issubclass(w.category, BundleWriteWarning)]


def test_a_bundle_dir_that_disappears_is_a_warning_and_a_count(tmp_path):
    d = _flipped(tmp_path)
    shutil.rmtree(tmp_path / "bundles")
    found = _steps_warn_once(d)
    assert len(found) == 1 and "could not be written" in str(found[0].message)
    assert found[0].filename.endswith("monitor_helpers.py")  # the line that called end_step (Driver.step)
    stats = d.monitor.stats()
    assert stats["bundle_failures"] == 4 and stats["bundles_written"] == 0 and d.monitor.bundles == []
    assert [v.slot_idx for v in d.monitor.violations] == [4] * 4  # detection went on every step


def test_a_full_disk_leaves_no_partial_file_and_detection_goes_on(tmp_path, monkeypatch):
    d = _flipped(tmp_path)
    tried = _full_disk(monkeypatch)
    found = _steps_warn_once(d)
    assert len(found) == 1 and "No space left on device" in str(found[0].message)
    assert len(tried) == 4 and list((tmp_path / "bundles").iterdir()) == []  # the partial files were removed
    assert d.monitor.stats()["bundle_failures"] == 4 and len(d.monitor.violations) == 4
    monkeypatch.undo()  # space again: the next bundle is written, complete
    d.step({1: [(108, 10)]})
    (path,) = d.monitor.bundles
    assert load_bundle(path)["rows"].shape == (1, 8)
    assert d.monitor.stats()["bundles_written"] == 1 and d.monitor.stats()["bundle_failures"] == 4


def test_an_unwritable_directory_is_a_warning(tmp_path, monkeypatch):
    d = _flipped(tmp_path)

    def refuse(file, arrays):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(bundle_module, "_write_arrays", refuse)
    with pytest.warns(BundleWriteWarning, match="Permission denied"):
        d.step(DECODE)
    assert d.monitor.stats()["bundle_failures"] == 1 and len(d.monitor.violations) == 1


@pytest.mark.parametrize("warnings_as_errors", [False, True])
def test_raise_mode_still_raises_the_violation(tmp_path, monkeypatch, warnings_as_errors):
    d = _flipped(tmp_path, mode="raise")
    _full_disk(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error" if warnings_as_errors else "ignore", BundleWriteWarning)
        with pytest.raises(CanaryViolationError) as info:
            d.step(DECODE)
    assert [v.slot_idx for v in info.value.violations] == [4]
    assert d.monitor.stats()["bundle_failures"] == 1


def test_log_mode_with_warnings_as_errors_raises_the_warning_once(tmp_path, monkeypatch):
    """The engine's own filter decides: an error filter turns the one warning into an exception."""
    d = _flipped(tmp_path)
    _full_disk(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BundleWriteWarning)
        with pytest.raises(BundleWriteWarning):
            d.step(DECODE)
        d.step(MORE[0])  # warned once: later failures are counted only
    assert d.monitor.stats()["bundle_failures"] == 2 and len(d.monitor.violations) == 2


def test_bundles_are_written_whole_under_their_final_name(tmp_path):
    d = _flipped(tmp_path)
    d.step(DECODE)
    names = sorted(p.name for p in (tmp_path / "bundles").iterdir())
    assert names == ["kvcanary-step000001-0.npz"] and d.monitor.stats()["bundles_written"] == 1


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_directory_is_a_warning(tmp_path):
    d = _flipped(tmp_path)
    (tmp_path / "bundles").chmod(0o500)
    try:
        with pytest.warns(BundleWriteWarning, match="Permission denied"):
            d.step(DECODE)
    finally:
        (tmp_path / "bundles").chmod(0o700)
    assert d.monitor.stats()["bundle_failures"] == 1 and len(d.monitor.violations) == 1
