"""Session 4 probe: the verify kernels reading each record (and the predecessor's chain fields) as two
16-byte vector loads instead of four (three) 8-byte loads: fewer memory instructions per entry for the
same lines. Assumes 16-byte aligned records (the benchmark's stride is 32 bytes). Variants are built by
patching kernels/verify.py's source. Run from the repository root: python3 probe_verify_vector_record.py out.json"""
import sys
sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks/results/probes")
from kvcanary_numba import RealKvHashMode
from verify_variants_harness import ALL, NONE, main

PAIR = '''
from numba import types as _types
from numba.cuda.extending import intrinsic as _intrinsic
from numba.cuda import cgutils as _cgutils
from llvmlite import ir as _ir


@_intrinsic
def record_pair(typingctx, buf, row, col):
    sig = _types.UniTuple(_types.int64, 2)(buf, row, col)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, value=args[0])
        ptr = _cgutils.get_item_pointer(context, builder, signature.args[0], data, [args[1], args[2]], wraparound=False)
        vec_type = _ir.VectorType(_ir.IntType(64), 2)
        vec = builder.load(builder.bitcast(ptr, vec_type.as_pointer()), align=16)
        lo = builder.extract_element(vec, _ir.Constant(_ir.IntType(32), 0))
        hi = builder.extract_element(vec, _ir.Constant(_ir.IntType(32), 1))
        return context.make_tuple(builder, signature.return_type, (lo, hi))

    return sig, codegen


@cuda.jit(device=True)
def _vector_slot_hash(buf, slot):
    token, position = record_pair(buf, slot, ZERO)
    prev_hash, _unused = record_pair(buf, slot, PREV_HASH)
    return mix3(uint64(prev_hash), uint64(token), uint64(position))

'''
ANCHOR = "\n@cuda.jit(device=True)\ndef record_violation("
IMPORT = ("from .hashing import CHAIN_HEAD, MINUS_ONE, ONE, POSITION, PREV_HASH, REAL_KV, TOKEN, ZERO, slot_hash",
          "from .hashing import CHAIN_HEAD, MINUS_ONE, ONE, POSITION, PREV_HASH, REAL_KV, TOKEN, ZERO, slot_hash, mix3")
OWN = ("    stored_token = buf[slot, TOKEN]\n    stored_position = buf[slot, POSITION]\n"
       "    stored_hash = buf[slot, PREV_HASH]\n    stored_real = buf[slot, REAL_KV]\n",
       "    stored_token, stored_position = record_pair(buf, slot, TOKEN)\n"
       "    stored_hash, stored_real = record_pair(buf, slot, PREV_HASH)\n")
PREV = ("        aux = int64(slot_hash(buf, prev))\n", "        aux = int64(_vector_slot_hash(buf, prev))\n")
BASE = [IMPORT, (ANCHOR, PAIR + ANCHOR)]
PATCHES = {"run6": [], "vector record": BASE + [OWN], "vector record + prev": BASE + [OWN, PREV]}


if __name__ == "__main__":
    main(PATCHES, (NONE, ALL), (RealKvHashMode.ALL, RealKvHashMode.NONE))
