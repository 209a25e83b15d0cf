"""Monitors of a job of several ranks, simulated in one process: each rank's verdict word, the merge an
all-reduce would do, and ``apply_verdict`` stopping every rank at the same call when one rank's KV is
corrupted; clean runs never stop. The NumPy path here, the kernels under the simulator below."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
from launch_fakes import CaiArray
from monitor_helpers import DECODE, PREFILL, Driver

from kvcanary_numba import FailReason, KvCanaryError
from kvcanary_numba.constants import VERDICT_LANES, VERDICT_PLAN_OVERFLOW, VERDICT_SEQ
from kvcanary_numba.engine import EngineConfig, ToyEngine
from kvcanary_numba.monitor import CanaryVerdictError, CanaryViolationError, merge_verdicts
from kvcanary_numba.monitor.bundle import load_bundle
from kvcanary_numba.monitor.replay import explain_bundle
from kvcanary_numba.monitor.status import FIRST_PLAN_WORD
from kvcanary_numba.monitor.verdict import PLAN_LANE_STRIDE

RANKS = 3


def _engines(faulty: int | None, fault_step: int, *, seed: int = 5, **monitor) -> list[ToyEngine]:
    """RANKS toy engines with the same workload (lockstep ranks); ``faulty`` gets one KV byte flip."""
    engines = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the blind-spot warning of engines without the token check
        for rank in range(RANKS):
            faults = {"kv_byte_flip": fault_step} if rank == faulty else ()
            engine = ToyEngine(EngineConfig(seed=seed), faults=faults)
            engine.attach_monitor(verdict=True, rank=rank, health_interval=0, **monitor)
            engines.append(engine)
    return engines


def _run(engines, steps: int) -> tuple[dict[int, tuple[int, CanaryVerdictError]], list]:
    """Step every rank, merge the words, apply the merged word on every rank; stop at the first stop.

    Returns {rank: (loop step, error)} of the ranks that raised, and the merged verdicts per step.
    """
    stopped, verdicts = {}, []
    for t in range(steps):
        for engine in engines:
            engine.step()
        merged = merge_verdicts([engine.monitor.verdict.word for engine in engines])
        for rank, engine in enumerate(engines):
            try:
                verdicts.append(engine.monitor.apply_verdict(merged))
            except CanaryVerdictError as exc:
                stopped[rank] = (t, exc)
        if stopped:
            break
    return stopped, verdicts


def test_clean_ranks_never_stop_and_every_word_is_clean():
    engines = _engines(None, 0, mode="raise")
    stopped, verdicts = _run(engines, 24)
    assert stopped == {}
    assert len(verdicts) == 24 * RANKS and not any(v.stop or v.plan_overflow or v.ring_full for v in verdicts)
    assert [v.seq for v in verdicts[::RANKS]] == list(range(1, 25))  # one word per TAIL phase


def test_a_fault_on_one_rank_stops_every_rank_at_the_same_call():
    engines = _engines(1, 6, mode="raise")
    stopped, _ = _run(engines, 30)
    assert sorted(stopped) == list(range(RANKS))
    (when,) = {t for t, _ in stopped.values()}
    fault = engines[1].faults[0]
    assert when >= fault.step  # the step the flip happened, or a later one that verified the slot
    for rank, (_, exc) in stopped.items():
        assert exc.rank == rank and exc.verdict.rank == 1 and exc.verdict.new_rows >= 1
        assert exc.verdict.fail_bits & FailReason.VERIFY_REAL_KV_HASH_MISMATCH
        assert isinstance(exc, CanaryViolationError)  # an engine's existing handler catches it
        assert str(exc).startswith(f"kv-canary rank {rank}: every rank stops after {exc.step} step(s)")
        if rank == 1:  # only the corrupted rank has rows of its own: the flipped slot's
            assert exc.violations and {v.slot_idx for v in exc.violations} == set(fault.slots)
        else:
            assert exc.violations == [] and engines[rank].monitor.violations == []
    assert len({exc.step for _, exc in stopped.values()}) == 1


def test_in_mode_log_every_rank_warns_and_keeps_serving(caplog):
    engines = _engines(2, 5, mode="log")
    with caplog.at_level(logging.WARNING, logger="kvcanary_numba.monitor"):
        stopped, verdicts = _run(engines, 14)
    assert stopped == {}
    stops = [v for v in verdicts if v.stop]
    assert stops and len(stops) % RANKS == 0  # every rank saw each stopping word
    for rank in range(RANKS):
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"kv-canary rank {rank}: step")]
        assert len(said) == len(stops) // RANKS and all("highest rank with rows: 2" in m for m in said)


def test_a_verdict_monitor_never_raises_from_end_step():
    d = Driver(mode="raise", verdict=True, rank=0)
    d.step(PREFILL)
    d.k[3, 0] ^= 1
    d.step(DECODE)  # the row is read back here: a monitor without a verdict would raise
    assert d.rows() and d.monitor.verdict.word[2] == 1
    with pytest.raises(CanaryVerdictError):
        d.monitor.apply_verdict(d.monitor.verdict.word.copy())
    d.step({1: [(105, 7)]})  # raised once: later stops are logged
    d.k[4, 0] ^= 1
    d.step({1: [(106, 8)]})
    assert d.monitor.apply_verdict(d.monitor.verdict.word.copy()).stop


def test_a_failed_health_check_stops_every_rank_one_word_later(caplog):
    drivers = [Driver(mode="raise", verdict=True, rank=r, health_interval=1, health_warmup_steps=0) for r in range(2)]
    steps = [PREFILL, DECODE, {1: [(105, 7)]}, {1: [(106, 8)]}]
    outcome = []
    with caplog.at_level(logging.ERROR, logger="kvcanary_numba.monitor"):
        for t, new in enumerate(steps):
            if t == 1:  # rank 1's device lost launches: its counters fall behind the host's
                drivers[1].monitor.status.kernel_run_counters[:] = 0
            for d in drivers:
                d.step(new)
            merged = merge_verdicts([d.monitor.verdict.word for d in drivers])
            for d in drivers:
                try:
                    d.monitor.apply_verdict(merged)
                except CanaryVerdictError as exc:
                    outcome.append((t, exc.rank, exc.verdict.stalled, exc.verdict.new_rows))
    # The check at the end of step 1 raises the flag; the word of step 2 carries it, to every rank.
    assert outcome == [(2, 0, True, 0), (2, 1, True, 0)]
    assert any("did not keep up" in r.getMessage() for r in caplog.records)  # rank 1's own report, logged


def test_the_verdict_reads_each_groups_plan_lane_and_sees_an_overflow():
    d = Driver(verdict=True, swa_window=2)
    lanes = d.monitor.verdict.arguments["status_lanes"]
    for g, plan_lanes in enumerate(d.monitor.status.plan_lanes):
        plan_lanes[0] = 1000 + g  # the enable lane of group g, as the plans see it
        assert lanes[2 * FIRST_PLAN_WORD + PLAN_LANE_STRIDE * g] == 1000 + g
    small = Driver(verdict=True, verify_capacity=1)
    small.step(PREFILL)
    assert small.monitor.verdict.word[VERDICT_PLAN_OVERFLOW] == 0
    small.step(DECODE)  # three prefix entries to verify, room for one
    assert small.monitor.verdict.word[VERDICT_PLAN_OVERFLOW] == 1


def test_verdict_arguments_are_checked():
    for options, code in (
        (dict(rank=-1), "KVC-C011"),
        (dict(rank=True), "KVC-C011"),
        (dict(rank="0"), "KVC-C011"),
        (dict(verdict=1), "KVC-C010"),
    ):
        with pytest.raises(KvCanaryError) as caught:
            Driver(**options)
        assert caught.value.code == code, options
    d = Driver()
    d.step(PREFILL)
    with pytest.raises(KvCanaryError) as caught:
        d.monitor.apply_verdict(np.zeros(VERDICT_LANES, dtype=np.int32))
    assert caught.value.code == "KVC-M050"
    v = Driver(verdict=True)
    v.step(PREFILL)
    word = v.monitor.verdict.word.copy()
    for merged, code in (
        (word.astype(np.int64), "KVC-C002"),
        (word[:4], "KVC-C004"),
        (word.reshape(4, 4), "KVC-C003"),
        (np.zeros(VERDICT_LANES, dtype=np.int32), "KVC-M051"),
        (CaiArray((VERDICT_LANES,), "<i4"), "KVC-C007"),  # a CUDA word for a monitor on the host
    ):
        with pytest.raises(KvCanaryError) as caught:
            v.monitor.apply_verdict(merged)
        assert caught.value.code == code
    assert v.monitor.verdict.word[VERDICT_SEQ] == 1 and v.monitor.apply_verdict(word).seq == 1


def test_reports_and_bundles_name_the_rank(tmp_path, caplog):
    d = Driver(mode="raise", rank=2, bundle_dir=tmp_path)
    d.step(PREFILL)
    d.k[3, 0] ^= 1
    with pytest.raises(CanaryViolationError) as caught:
        d.step(DECODE)
    assert str(caught.value).startswith("kv-canary rank 2: 1 violation(s) detected") and caught.value.rank == 2
    (path,) = d.monitor.bundles
    assert path.name.startswith("kvcanary-step000001-rank2-")
    assert load_bundle(path)["config"]["rank"] == 2
    assert explain_bundle(path).startswith("bundle of step 1 of rank 2 (cpu run")
    logged = Driver(mode="log", rank=4)
    logged.step(PREFILL)
    logged.k[3, 0] ^= 1
    with caplog.at_level(logging.WARNING, logger="kvcanary_numba.monitor"):
        logged.step(DECODE)
    assert any(r.getMessage().startswith("rank 4: kv_canary violation") for r in caplog.records)
    alone = Driver(mode="raise", bundle_dir=tmp_path / "one")
    alone.step(PREFILL)
    alone.k[3, 0] ^= 1
    with pytest.raises(CanaryViolationError) as caught:
        alone.step(DECODE)
    assert str(caught.value).startswith("kv-canary: 1 violation(s)") and caught.value.rank is None
    (path,) = alone.monitor.bundles
    assert "rank" not in load_bundle(path)["config"] and path.name.startswith("kvcanary-step000001-0")


@pytest.mark.parametrize("rank", [-1, 2**31 - 1, "2", 2.0, True])
def test_a_bundle_whose_rank_is_no_rank_is_refused(tmp_path, rank):
    from bundle_damage import repack

    d = Driver(mode="log", rank=3, bundle_dir=tmp_path)
    d.step(PREFILL)
    d.k[3, 0] ^= 1
    d.step(DECODE)
    (path,) = d.monitor.bundles
    arrays = load_bundle(path)
    edited = tmp_path / "edited.npz"
    edited.write_bytes(repack(arrays, config={**arrays["config"], "rank": 3}))  # as written: loads
    assert load_bundle(edited)["config"]["rank"] == 3
    edited.write_bytes(repack(arrays, config={**arrays["config"], "rank": rank}))  # digest made anew
    with pytest.raises(KvCanaryError) as caught:
        load_bundle(edited)
    assert caught.value.code == "KVC-M033" and "rank" in str(caught.value)


@pytest.mark.simulator
@pytest.mark.parametrize("prepared", [False, True], ids=["eager", "prepared"])
def test_on_the_kernels_a_fault_on_one_rank_stops_both_at_the_same_call(prepared):
    from kvcanary_numba.launch import _launch

    if not _launch.ON_SIMULATOR:
        pytest.skip("drives NumPy arrays through the kernels (simulator)")
    engines = _engines(0, 3, seed=3, mode="raise", backend="cuda", prepared=prepared)[:2]
    stopped, verdicts = _run(engines, 10)
    assert sorted(stopped) == [0, 1] and stopped[0][0] == stopped[1][0]
    assert stopped[1][1].violations == [] and stopped[0][1].violations
    assert not any(v.stop for v in verdicts)  # every word before the stopping one was clean
