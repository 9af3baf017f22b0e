"""Phase timing with NVTX ranges, and the `--profile-steps A:B` window for `nsys --capture-range=cudaProfilerApi`."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def _cuda() -> bool:
    return torch.cuda.is_available()


class PhaseTimer:
    """Accumulates wall time per phase for one step; each phase is also an NVTX range on CUDA."""

    def __init__(self, synchronize: bool = True):
        self.synchronize = synchronize and _cuda()
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if _cuda():
            torch.cuda.nvtx.range_push(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.synchronize:
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - start
            if _cuda():
                torch.cuda.nvtx.range_pop()

    def metrics(self, prefix: str = "time/") -> dict[str, float]:
        return {f"{prefix}{k}": v for k, v in self.seconds.items()}


class ProfileWindow:
    """Brackets the steps of `window` (A through B) with cudaProfilerStart/Stop; does nothing without CUDA.
    A run resumed inside the window starts the capture at its first step."""

    def __init__(self, window: range | None):
        self.window = window
        self.active = False

    def before_step(self, step: int) -> None:
        if self.window is not None and step in self.window and not self.active and _cuda():
            torch.cuda.cudart().cudaProfilerStart()
            self.active = True

    def after_step(self, step: int) -> None:
        if self.active and self.window is not None and step >= self.window[-1]:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            self.active = False


# dense bf16 peak FLOP/s by GPU name fragment (vendor datasheets); MFU is reported only where the GPU is known
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12}


def mfu(n_params: int, tokens_per_s: float) -> float | None:
    """Model FLOP utilization of training tokens (6·params FLOPs each) on the current GPU; None on CPU."""
    if not _cuda():
        return None
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    return 6 * n_params * tokens_per_s / peak if peak else None
