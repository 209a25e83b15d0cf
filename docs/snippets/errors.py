"""Catching a rejected input and looking up its catalogue entry (errors/index.md)."""

from kvcanary_numba import KvCanaryError, VerifyPlan
from kvcanary_numba.errors import lookup

# --8<-- [start:catch]
try:
    VerifyPlan.allocate(verify_capacity=0)
except KvCanaryError as exc:  # a ValueError (dtype problems: also a TypeError)
    print(exc.code)  # KVC-C011
    print(exc)  # "... got 0 [KVC-C011] Run 'kvcanary explain KVC-C011'
    #  or see https://.../errors/KVC-C011/"
    print(exc.entry.solutions)  # the catalogue entry travels with the exception
    caught = exc
# --8<-- [end:catch]
assert caught.code == "KVC-C011"
assert str(caught).endswith(
    f"Run 'kvcanary explain KVC-C011' or see {caught.entry.url}"
)
assert isinstance(caught, ValueError)

# --8<-- [start:lookup]
entry = lookup("kvc-p001")  # case-insensitive
print(entry.title)  # write_offsets is empty
print(entry.url)  # .../errors/KVC-P001/
print(entry.after)  # the fixed code
# --8<-- [end:lookup]
assert entry.code == "KVC-P001"
assert entry.url.endswith("/errors/KVC-P001/")
