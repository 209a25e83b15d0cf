"""PyTorch CUDA tensors on PyTorch's current stream (concepts/array-libraries.md)."""

import importlib.util
import sys

from array_step import EXPECTED, ring, skip_without_gpu, two_steps

skip_without_gpu()
if importlib.util.find_spec("torch") is None:
    print("skipped: PyTorch is not installed")
    sys.exit(0)
# --8<-- [start:torch]
import torch

ctx = two_steps(
    lambda a: torch.from_numpy(a).cuda(), stream=torch.cuda.current_stream()
)
torch.cuda.synchronize()
print(ring(ctx, lambda t: t.cpu().numpy()))
# --8<-- [end:torch]
assert ring(ctx, lambda t: t.cpu().numpy()) == EXPECTED
