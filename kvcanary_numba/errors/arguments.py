"""Codes KVC-C… about devices, backend choice and host scalar arguments, shared by every operation.

Array properties (type, dtype, shape, layout) are in :mod:`.common`.
"""

from __future__ import annotations

from .registry import define

define(
    "KVC-C007",
    title="Arrays on different devices",
    message="{function}: {argument} is a {got} array but {reference} is a {expected} array",
    meaning=(
        "One call runs on one backend: either every array is a NumPy array (CPU path) or every array "
        "is a CUDA array on the same device (GPU path). Mixing would need hidden copies."
    ),
    triggers=(
        "A NumPy metadata array passed together with CuPy plans.",
        "Arrays allocated on two different GPUs.",
    ),
    solutions=("Move the odd array to the device of the others once (cupy.asarray / .get()).",),
    before=(
        "import types\n"
        "\n"
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "# An empty CuPy array as the package sees it: its CUDA array interface (never read)\n"
        "on_gpu = types.SimpleNamespace(shape=(0,), __cuda_array_interface__=dict(\n"
        '    shape=(0,), typestr="<i8", data=(0, False), version=3))\n'
        "empty = np.zeros(0, np.int64)  # on the host, like the plans\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=on_gpu,\n"
        "    prefix_lens=empty, extend_seq_lens=empty,\n"
        "    req_to_token=np.zeros((2, 8), np.int32))"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "import numpy as np\n"
        "\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "empty = np.zeros(0, np.int64)  # every array of a call on one device\n"
        "kc.launch_canary_plan_kernels(\n"
        "    verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=empty,\n"
        "    prefix_lens=empty, extend_seq_lens=empty,\n"
        "    req_to_token=np.zeros((2, 8), np.int32))"
    ),
    defensive="prefix_lens = xp.asarray(prefix_lens)  # xp = cupy when the plans live on a GPU",
    prevention="Allocate plans and contexts with the same device= as the engine's arrays.",
    related=("KVC-C001", "KVC-C008"),
    sglang=("kv-canary: {name} must be on {reference_name}'s device {ref_device}, got {device}",),
)

define(
    "KVC-C008",
    title="Backend unavailable",
    message="{function}: {argument}={got!r} cannot run here: {reason}",
    meaning=(
        "backend='cuda' runs the Numba-CUDA kernels; it needs CUDA arrays on a GPU, or NumPy arrays "
        "under Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1). backend='numpy' runs the NumPy "
        "references and needs NumPy arrays. device='cuda' allocation needs CuPy and a GPU."
    ),
    triggers=(
        "backend='cuda' with NumPy arrays on a machine without the simulator enabled.",
        "backend='numpy' with CuPy arrays.",
        "Allocating with device='cuda' where CuPy is not installed or no GPU is visible.",
        "Running the kernels (CUDA arrays, backend='cuda' or device='cuda') where the numba-cuda package "
        "is not installed: numba's own numba.cuda target is not supported (its simulator restores the "
        "real module under running simulated threads).",
    ),
    solutions=(
        "Leave backend='auto': it follows the array type.",
        "Install the GPU extra (pip install 'kvcanary_numba[gpu]') on a machine with a GPU.",
        "Set NUMBA_ENABLE_CUDASIM=1 before importing numba to run kernels on NumPy arrays.",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)  # NumPy arrays\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        'kc.launch_canary_verify_kernel(context=ctx, plan=plan, backend="cuda")'
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)  # NumPy arrays\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan)  # backend: the arrays'"
    ),
    defensive="device = 'cuda' if kvcanary_numba.gpu_available() else 'cpu'",
    prevention="Run `kvcanary doctor` to see which backends this machine offers.",
    related=("KVC-C007", "KVC-C009"),
    extension=True,
)

define(
    "KVC-C009",
    title="Unknown backend or device name",
    message="{function}: {argument} must be one of {expected}, got {got!r}",
    meaning="backend accepts 'auto', 'numpy' and 'cuda'; device accepts 'cpu' and 'cuda'.",
    triggers=("A typo such as backend='gpu' or device='cuda:0'.",),
    solutions=("Use one of the listed names.",),
    before=('import kvcanary_numba as kc\n\nkc.VerifyPlan.allocate(verify_capacity=1024, device="gpu")'),
    after=(
        "import kvcanary_numba as kc\n"
        "\n"
        'kc.VerifyPlan.allocate(verify_capacity=1024, device="cpu")  # or "cuda" on a GPU'
    ),
    defensive="device = 'cuda' if use_gpu else 'cpu'",
    prevention="Take the device from one configuration value.",
    related=("KVC-C008",),
    extension=True,
)

define(
    "KVC-C010",
    title="Expected a bool",
    message="{function}: {argument} must be a bool, got {got}",
    exception="type",
    meaning=(
        "Switches such as check_verify_expected_token and enable_write_input_assert select compiled "
        "kernel variants; they must be real bools so that 0/1 arrays or None are not mistaken for flags."
    ),
    triggers=("Passing an int, a NumPy bool array or None as a switch.",),
    solutions=("Pass True or False (bool(x) for a NumPy bool scalar).",),
    before=(
        "import kvcanary_numba as kc\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)  # NumPy arrays\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=1)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)  # NumPy arrays\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan, check_verify_expected_token=True)"
    ),
    defensive="check = bool(config.verify_tokens)",
    prevention="Keep switches in a typed configuration object.",
    related=("KVC-C011",),
    sglang=("kv-canary: has_swa_lut must be bool, got {type}",),
)

define(
    "KVC-C011",
    title="Integer argument out of range",
    message="{function}: {argument} must be {expected}, got {got!r}",
    meaning=(
        "Capacities must be positive ints, window sizes and offsets non-negative or within the "
        "documented range, tags and modes members of their enums."
    ),
    triggers=(
        "A capacity of 0 computed from an empty configuration.",
        "A negative swa_window_size.",
        "A kernel_kind outside CanaryLaunchTag.",
    ),
    solutions=("Pass a value in the stated range; use the enums for tags and modes.",),
    before=("import kvcanary_numba as kc\n\nkc.VerifyPlan.allocate(verify_capacity=0)"),
    after=(
        "import kvcanary_numba as kc\n"
        "\n"
        "num_slots = 64\n"
        "kc.VerifyPlan.allocate(verify_capacity=3 * num_slots)  # SGLang's default"
    ),
    defensive="capacity = max(1, 3 * num_kv_slots)",
    prevention="Derive capacities from the pool size once, at start-up.",
    related=("KVC-C010",),
    sglang=(
        "kv-canary: write_req_capacity must be non-negative, got {n}",
        "kv-canary: verify_capacity must be non-negative, got {n}",
        "kv-canary: lut_len must be non-negative, got {n}",
    ),
)

define(
    "KVC-C016",
    title="Not a CUDA stream",
    message="{function}: {argument} must be a CUDA stream (an object with __cuda_stream__, a CuPy, Numba or "
    "PyTorch stream, or an int handle >= 0), got {got}",
    exception="type",
    meaning=(
        "stream= names the CUDA stream the launch is queued on. It is read as a raw stream handle: "
        "an object speaking the CUDA stream protocol (__cuda_stream__ returns (version, handle)), "
        "a library stream object, or the handle itself. None means CuPy's current stream."
    ),
    triggers=(
        "Passing a device, an event or a string as stream=.",
        "A negative int, or a bool, as the handle.",
    ),
    solutions=("Pass the stream object of your array library, or its integer handle.",),
    before=(
        "import kvcanary_numba as kc\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)  # NumPy arrays\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        'kc.launch_canary_verify_kernel(context=ctx, plan=plan, stream="side")'
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)  # NumPy arrays\n"
        "plan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "side_stream = 0  # an int handle (0: the default stream), or a cupy.cuda.Stream\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=plan, stream=side_stream)"
    ),
    defensive="stream = torch.cuda.current_stream()  # or cupy.cuda.get_current_stream()",
    prevention="Keep the engine's stream objects and pass them through unchanged.",
    related=("KVC-C009",),
    extension=True,
)
