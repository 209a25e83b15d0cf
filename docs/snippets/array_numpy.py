"""NumPy arrays: the CPU path (concepts/array-libraries.md)."""

from array_step import EXPECTED, ring, two_steps

# --8<-- [start:numpy]
ctx = two_steps(lambda a: a.copy())  # NumPy in, NumPy references run
print(ring(ctx, lambda a: a))
# --8<-- [end:numpy]
assert ring(ctx, lambda a: a) == EXPECTED
