"""Autotune candidates of every kernel per GPU architecture, and the one small configuration used under
TRITON_INTERPRET=1.

Keys are 90 (sm_90: H100/H200, and newer) and 80 (sm_80/sm_86/sm_89: A100 and Ampere/Ada). Tiles are for
bf16/fp16: tile M >= 64 and num_warps a multiple of 4 so that sm_90 uses wgmma. Every candidate compiles
without register spills and within the shared memory of its architecture: benchmarks/kernel_report.py
compiles each one ahead of time for both architectures (registers, spills, shared memory, wgmma/mma).
sm_80 has fewer candidates because its mma accumulator layout needs more registers in the softmax epilogue.
"""

import triton


def _cfg(num_warps: int, num_stages: int, **blocks: int) -> triton.Config:
    return triton.Config(blocks, num_warps=num_warps, num_stages=num_stages)


# Forward (tokens x vocab tiles, inner loop over d).
FWD_CONFIGS = {
    90: [
        # Hopper's big tile: m64n256k16 wgmma, 8 warps (docs/kernels.md, "Tiles and grids").
        _cfg(8, 3, BLOCK_N=128, BLOCK_V=256, BLOCK_D=64),
        _cfg(8, 3, BLOCK_N=128, BLOCK_V=128, BLOCK_D=64),
        _cfg(8, 4, BLOCK_N=128, BLOCK_V=128, BLOCK_D=32),
        _cfg(4, 4, BLOCK_N=64, BLOCK_V=128, BLOCK_D=64),
        _cfg(8, 3, BLOCK_N=64, BLOCK_V=256, BLOCK_D=64),
    ],
    80: [
        _cfg(8, 3, BLOCK_N=128, BLOCK_V=128, BLOCK_D=32),
        _cfg(8, 3, BLOCK_N=128, BLOCK_V=64, BLOCK_D=64),
    ],
}
# Dual context: two accumulators (student and teacher rows) share each W tile; 128x128 spills.
FWD_DUAL_CONFIGS = {
    90: [
        _cfg(8, 3, BLOCK_N=128, BLOCK_V=64, BLOCK_D=64),
        _cfg(8, 3, BLOCK_N=64, BLOCK_V=128, BLOCK_D=64),
    ],
    80: [
        _cfg(8, 3, BLOCK_N=128, BLOCK_V=64, BLOCK_D=64),
    ],
}
# Backward: logits gradient of one vocabulary chunk (the forward's tile, one accumulator).
# 128x256 is not here: with the b term's epilogue it spills under Triton 3.6 (136 B, the GPU image's version).
_GRAD_LOGITS = [
    _cfg(8, 3, BLOCK_N=128, BLOCK_V=128, BLOCK_D=64, GROUP_N=8),
    _cfg(4, 4, BLOCK_N=64, BLOCK_V=128, BLOCK_D=64, GROUP_N=8),
    _cfg(8, 3, BLOCK_N=64, BLOCK_V=256, BLOCK_D=64, GROUP_N=8),
]
GRAD_LOGITS_CONFIGS = {90: _GRAD_LOGITS, 80: _GRAD_LOGITS}
# The backward's GEMMs (dW = Gᵀ·H, dH += G·W) and the single pass's logits GEMM are cuBLAS (torch.mm / addmm
# with fp32 output), not Triton: docs/kernels.md, "GEMM-grade backward".
# fp32 inputs multiply in fp32 ("ieee": FMA units, no tensor cores): small tiles, few stages, since fp32
# tiles take twice the shared memory. Correctness path, not the fast one.
_FP32 = [_cfg(8, 2, BLOCK_N=64, BLOCK_V=64, BLOCK_D=32)]
_FP32_GRAD_LOGITS = [_cfg(4, 2, BLOCK_N=64, BLOCK_V=64, BLOCK_D=32, GROUP_N=8)]
FP32_CONFIGS = {
    "fwd": {90: _FP32, 80: _FP32},
    "grad_logits": {90: _FP32_GRAD_LOGITS, 80: _FP32_GRAD_LOGITS},
}
# Divergences (seedfast/kernels/divergence.py): two accumulators (student and teacher logits) on each W tile, as the
# dual-context forward, so its tiles: 128x64 (m64n64 wgmma) and 64x128 (m64n128). The statistics and the sums kernels
# share one list; the gradient kernel adds the grouped order.
DIVERGENCE_CONFIGS = {
    90: [
        _cfg(8, 3, BLOCK_N=128, BLOCK_V=64, BLOCK_D=64),
        _cfg(8, 3, BLOCK_N=64, BLOCK_V=128, BLOCK_D=64),
    ],
    80: [
        _cfg(8, 3, BLOCK_N=128, BLOCK_V=64, BLOCK_D=64),
    ],
}
DIVERGENCE_GRAD_CONFIGS = {
    90: [
        _cfg(8, 3, BLOCK_N=128, BLOCK_V=64, BLOCK_D=64, GROUP_N=8),
        _cfg(8, 3, BLOCK_N=64, BLOCK_V=128, BLOCK_D=64, GROUP_N=8),
    ],
    80: [
        _cfg(8, 3, BLOCK_N=128, BLOCK_V=64, BLOCK_D=64, GROUP_N=8),
    ],
}
# fp32 with two accumulators: the single-context fp32 tiles spill on sm_90 (stats 28 B at 64x64x32, 8 warps; G 8 B
# at 4 warps; sums at 8 warps spill 8 B on sm_80): statistics and sums take a 16-deep K step at 4 warps, G 8 warps.
FP32_DIVERGENCE_CONFIGS = {arch: [_cfg(4, 2, BLOCK_N=64, BLOCK_V=64, BLOCK_D=16)] for arch in (90, 80)}
FP32_DIVERGENCE_GRAD_CONFIGS = {arch: [_cfg(8, 2, BLOCK_N=64, BLOCK_V=64, BLOCK_D=32, GROUP_N=8)] for arch in (90, 80)}
REDUCE_BLOCK = 1024
TOKEN_LOSS_BLOCK = 1024
TOKEN_LOSS_NUM_WARPS = 4
# The single pass's row kernels (seedfast/kernels/fused_rows.py) are memory-bound streams over [R, V] fp32:
# wide rows of 16-byte vector loads, a few rows per program.
ROW_STATS = {"BLOCK_R": 4, "BLOCK_V": 1024}
ROW_STATS_NUM_WARPS = 8
GRAD_FROM_LOGITS = {"BLOCK_R": 16, "BLOCK_V": 256}
GRAD_FROM_LOGITS_NUM_WARPS = 8
# Token rows per program group of the forward grid (seedfast/ops/triton_backend.py, choose_n_splits): a wave of
# g token blocks x 132/g vocabulary splits holds g hidden blocks (1 MiB each at d=4096) and 132/g W tiles
# (2 MiB each at BLOCK_V=256) in L2; g = 16 keeps that near its minimum (~33 MiB, within the 50 MiB L2).
FWD_GROUP_TOKEN_BLOCKS = 16


def arch_key(capability: int) -> int:
    """The candidate list for a device of compute capability `capability` (e.g. 90 for 9.0, 86 for 8.6)."""
    return 90 if capability >= 90 else 80


# Under the interpreter the cost is per tile operation, not per element: tiles large enough for few
# iterations, small enough that test shapes (N <= 64, d <= 64, V <= 300) still span several ragged tiles.
INTERPRET_FWD = {"BLOCK_N": 32, "BLOCK_V": 64, "BLOCK_D": 32}
INTERPRET_GRAD_LOGITS = {"BLOCK_N": 32, "BLOCK_V": 64, "BLOCK_D": 32, "GROUP_N": 2}
INTERPRET_ROW_STATS = {"BLOCK_R": 4, "BLOCK_V": 64}
INTERPRET_GRAD_FROM_LOGITS = {"BLOCK_R": 16, "BLOCK_V": 64}
INTERPRET_REDUCE_BLOCK = 32
INTERPRET_DIVERGENCE = {"BLOCK_N": 32, "BLOCK_V": 64, "BLOCK_D": 32}
INTERPRET_DIVERGENCE_GRAD = {"BLOCK_N": 32, "BLOCK_V": 64, "BLOCK_D": 32, "GROUP_N": 2}
INTERPRET_TOKEN_LOSS_BLOCK = 16
