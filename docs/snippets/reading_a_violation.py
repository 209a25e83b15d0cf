"""Triage, a bundle walked through, budgeted verification (concepts/reading-a-violation.md); CPU path."""

import pathlib
import tempfile

from kvcanary_numba.engine import EngineConfig, ToyEngine
from kvcanary_numba.monitor.budget import VerifyBudget
from kvcanary_numba.monitor.bundle import load_bundle
from kvcanary_numba.monitor.replay import explain_bundle, replay_bundle

bundle_dir = pathlib.Path(tempfile.mkdtemp(prefix="kvcanary-bundles-"))

# --8<-- [start:plant]
engine = ToyEngine(EngineConfig(seed=1), faults={"kv_byte_flip": 6})
monitor = engine.attach_monitor(mode="log", bundle_dir=bundle_dir)
engine.run(9)
first = monitor.violations[0]
print(first.describe())
# --8<-- [end:plant]
assert first.diagnosis.category == "data_corruption" and first.persistence in (
    "persistent",
    "transient",
)
(record,) = engine.faults
assert record.caught_by(first)

# --8<-- [start:bundle]
path = monitor.bundles[0]
bundle = load_bundle(path)
print(
    path.name, {k: getattr(v, "shape", v) for k, v in bundle.items() if k != "config"}
)
print(bundle["config"])
# --8<-- [end:bundle]
assert (
    bundle["rows"].shape == (1, 8) and bundle["records"].shape[0] == 2
)  # the slot and its predecessor

# --8<-- [start:inspect]
print(explain_bundle(path))  # what `kvcanary inspect PATH` prints
replay = replay_bundle(path)
assert replay.reproduced(replay.recorded[0])
# --8<-- [end:inspect]

# --8<-- [start:budget]
config = EngineConfig(seed=1, min_new_tokens=12, max_new_tokens=16, num_pages=96)
engine = ToyEngine(config, faults={"kv_byte_flip": 6})
monitor = engine.attach_monitor(
    mode="log", verify_budget=VerifyBudget(period=4, seed=7)
)
engine.run(14)
(record,) = engine.faults
caught = engine.catches()["kv_byte_flip"]
print(
    monitor.stats()["verify_period"],
    "steps at most;",
    "fired at step",
    record.step,
    "caught at step",
    caught[0].step,
)
# --8<-- [end:budget]
assert caught and caught[0].step <= record.step + 4
print("reading-a-violation snippet OK")
