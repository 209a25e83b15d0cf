"""Code KVC-M026: a CanaryMonitor's hooks serve one host thread at a time (monitor/hooks.py)."""

from __future__ import annotations

from .registry import define

define(
    "KVC-M026",
    title="Monitor used by two threads at once",
    message=(
        "{function}: called from thread {thread!r} while thread {owner!r} is inside this monitor's hooks; "
        "a CanaryMonitor serves one host thread at a time"
    ),
    meaning=(
        "A monitor's step is one sequence of hooks over one set of plans, canary buffers, counters and "
        "readback state. Two threads stepping it at once would interleave two batches over those plans "
        "and report violations that never happened. So a hook (pre_forward, post_forward, the block of "
        "`with monitor.forward(batch):`, end_step, sweep, flush, capture_graph, finish_warmup, "
        "rebind_sources, apply_verdict, the record moves, setting backend) called while another thread "
        "is inside one is refused before it reads or changes anything; the other thread's step goes on. "
        "Handing a monitor from thread to thread between calls is fine, and stats() and violations may "
        "be read from any thread."
    ),
    triggers=(
        "Worker threads of an engine each running steps on one shared monitor.",
        "A watchdog thread calling end_step() or flush() while the engine thread is in a step.",
    ),
    solutions=(
        "Hold one lock around each whole step (pre_forward to end_step) in the engine.",
        "Give each thread (or each KV pool) its own monitor.",
    ),
    before=(
        "import threading\n"
        "\n"
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "full = kc.KvGroup(kind='full', num_slots=64, has_v=False)  # K only\n"
        "monitor = kc.CanaryMonitor(full=full, write_req_capacity=1)\n"
        "rtt = np.array([[0] * 4, [10, 11, 12, 13]], np.int32)\n"
        "def batch():  # a prefill of one request: four tokens into slots 10..13\n"
        "    return kc.StepBatch(req_pool_indices=np.array([1]), prefix_lens=np.array([0]),\n"
        "                        extend_seq_lens=np.array([4]), req_to_token=rtt,\n"
        "                        input_ids=np.arange(101, 105), positions=np.arange(4),\n"
        "                        out_cache_loc=np.arange(10, 14))\n"
        "inside, written = threading.Event(), threading.Event()\n"
        "def engine_step():  # the engine's thread, inside a step's forward\n"
        "    with monitor.forward(batch()):\n"
        "        inside.set()\n"
        "        written.wait(5)\n"
        "threading.Thread(target=engine_step, daemon=True).start()\n"
        "inside.wait(5)\n"
        "monitor.end_step()  # a second thread steps the same monitor"
    ),
    after=(
        "import threading\n"
        "\n"
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "full = kc.KvGroup(kind='full', num_slots=64, has_v=False)  # K only\n"
        "monitor = kc.CanaryMonitor(full=full, write_req_capacity=1)\n"
        "rtt = np.array([[0] * 4, [10, 11, 12, 13]], np.int32)\n"
        "def batch():  # a prefill of one request: four tokens into slots 10..13\n"
        "    return kc.StepBatch(req_pool_indices=np.array([1]), prefix_lens=np.array([0]),\n"
        "                        extend_seq_lens=np.array([4]), req_to_token=rtt,\n"
        "                        input_ids=np.arange(101, 105), positions=np.arange(4),\n"
        "                        out_cache_loc=np.arange(10, 14))\n"
        "step_lock = threading.Lock()\n"
        "def engine_step():\n"
        "    with step_lock:  # one whole step at a time\n"
        "        with monitor.forward(batch()):\n"
        "            pass\n"
        "        monitor.end_step()\n"
        "threads = [threading.Thread(target=engine_step) for _ in range(2)]\n"
        "for t in threads:\n"
        "    t.start()\n"
        "for t in threads:\n"
        "    t.join()"
    ),
    defensive="with step_lock:\n    with monitor.forward(batch):\n        run_forward()\n    monitor.end_step()",
    prevention="Let one thread own the monitor, or serialise whole steps, never single hooks.",
    related=("KVC-M005",),
    extension=True,
)
