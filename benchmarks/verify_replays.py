"""pytest plugin: every replay of packed launches first re-derives its launches from the glue and must match.

    python3 -m pytest -p benchmarks.verify_replays -m gpu tests/test_launch_replay.py ...

Sets :data:`kvcanary_numba.fast.replay.VERIFY_REPLAYS` for the whole run (``gpu_session.sh
replays``), once the tests' ``conftest.py`` has picked the kernel tier: a replay whose packed
launches went stale then raises instead of launching them. Tests that set the switch
themselves (``monkeypatch``) still do.
"""

from __future__ import annotations


def pytest_sessionstart(session) -> None:
    from kvcanary_numba.fast import replay

    replay.VERIFY_REPLAYS = True


def pytest_report_header(config) -> str:
    return "kvcanary: every replay verified (fast.replay.VERIFY_REPLAYS = True)"
