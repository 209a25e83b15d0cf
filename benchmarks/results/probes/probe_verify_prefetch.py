"""Session 4 probe: the verify real-KV kernel with L2 (or L1) prefetches issued before the fold for what
`_check_entry` loads after it (the slot's record; the plan's positions and predecessors; the next tile's
slots). Prefetches hold no register, unlike the session-3 "record first" change. Variants are built by
patching kernels/verify.py's source. Run from the repository root: python3 probe_verify_prefetch.py out.json"""
import sys
sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks/results/probes")
from kvcanary_numba import RealKvHashMode
from verify_variants_harness import ALL, NONE, main

LOOP = ("            fold = slot != ZERO and uint64(slot) < uint64(num_slots)\n")
REC = LOOP + "            if fold:\n                prefetch_l2(buf, slot)\n"
PLAN = ("            if i < active:\n                prefetch_l2(expected_positions, i)\n"
        "                prefetch_l2(prev_slots, i)\n")
NEXT = ("            if i + warps * _WARP < active:\n                prefetch_l2(slots, i + warps * _WARP)\n")
PREFETCH = '''
from numba import types as _types
from numba.cuda.extending import intrinsic as _intrinsic
from numba.cuda import cgutils as _cgutils
from llvmlite import ir as _ir


@_intrinsic
def prefetch_l2(typingctx, array, index):
    # Ask the cache for the line of array[index] (row index of a 2-D array); nothing is returned.
    sig = _types.void(array, index)

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        data = context.make_array(array_type)(context, builder, value=args[0])
        indices = [args[1]] + [_ir.Constant(args[1].type, 0)] * (array_type.ndim - 1)
        pointer = _cgutils.get_item_pointer(context, builder, array_type, data, indices, wraparound=False)
        builder.asm(_ir.FunctionType(_ir.VoidType(), [pointer.type]), "prefetch.global.LEVEL [$0];", "l",
                    [pointer], side_effect=True)
        return context.get_dummy_value()

    return sig, codegen

'''
ANCHOR = "\n@cuda.jit(device=True)\ndef record_violation("
IMPORT = (ANCHOR, PREFETCH.replace("LEVEL", "L2") + ANCHOR)
IMPORT_L1 = (ANCHOR, PREFETCH.replace("LEVEL", "L1") + ANCHOR)
PATCHES = {
    "run6": [],
    "pf record": [IMPORT, (LOOP, REC)],
    "pf record+plan": [IMPORT, (LOOP, REC + PLAN)],
    "pf record+plan+next": [IMPORT, (LOOP, REC + PLAN + NEXT)],
    "pf record L1": [IMPORT_L1, (LOOP, REC)],
}


if __name__ == "__main__":
    main(PATCHES, (ALL,), (RealKvHashMode.ALL,))
