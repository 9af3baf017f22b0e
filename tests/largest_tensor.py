"""The largest tensor any aten op makes while it is active: how the memory tests show that no [N, V] logits tensor
is ever formed (tests/ops/test_ops_memory.py, and under tensor parallelism tests/distributed/)."""

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LargestTensor(TorchDispatchMode):
    """The largest plain tensor any aten op produces (autograd's backward included)."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            # a DTensor reports its global shape but stores its local shard, which its own ops produce as plain
            # tensors (seen here too): count those
            if isinstance(t, torch.Tensor) and not isinstance(t, DTensor):
                self.numel = max(self.numel, t.numel())
        return out
