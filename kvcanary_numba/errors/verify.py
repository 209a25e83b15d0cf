"""Codes KVC-V…: see kvcanary_numba.verify (V001 is shared with the write wrapper)."""

from __future__ import annotations

from .registry import define

define(
    "KVC-V001",
    title="Launch argument of the wrong type",
    message="{function}: {argument} must be a {expected}, got {got}",
    exception="type",
    meaning=(
        "launch_canary_verify_kernel and launch_canary_write_kernel take their arrays bundled: "
        "context is a CanaryContext (canary buffer, ring, write index, counters, real-KV sources, "
        "mode, kernel_kind), plan is the VerifyPlan (verify) or the WritePlan (write) filled by the "
        "plan kernels. The bundles fix which array is which, so the launch functions accept nothing "
        "else: not a dict of arrays, not the other kind of plan."
    ),
    triggers=(
        "Passing the WritePlan to launch_canary_verify_kernel, or the VerifyPlan to launch_canary_write_kernel.",
        "Passing a dict or a tuple of arrays instead of a CanaryContext.",
        "Passing None for a plan that was never allocated.",
    ),
    solutions=(
        "Allocate with VerifyPlan.allocate / WritePlan.allocate / CanaryContext.allocate.",
        "Pass verify_plan_out to verify and write_plan_out to write, as the plan step names them.",
        "Build a context around existing arrays with CanaryContext(canary_buf=..., ...) or ctx.replace(...).",
    ),
    before=(
        "import kvcanary_numba as kc\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=wplan)"
    ),
    after=(
        "import kvcanary_numba as kc\n"
        "\n"
        "ctx = kc.CanaryContext.allocate(num_slots=64)\n"
        "vplan = kc.VerifyPlan.allocate(verify_capacity=8)\n"
        "wplan = kc.WritePlan.allocate(write_req_capacity=1)\n"
        "kc.launch_canary_verify_kernel(context=ctx, plan=vplan)  # verify reads the verify plan"
    ),
    defensive="assert isinstance(verify_plan, VerifyPlan) and isinstance(ctx, CanaryContext)",
    prevention="Keep each step's plans in named fields (verify_plan, write_plan) rather than a tuple.",
    related=("KVC-C001", "KVC-W001"),
    sglang=(),
    extension=True,
)
