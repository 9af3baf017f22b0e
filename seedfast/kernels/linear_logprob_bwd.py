"""Backward of the fused linear -> log-prob op, part 1: the logits gradient of one vocabulary chunk.

For the chunk [v_start, v_start + chunk) it recomputes z = h·Wᵀ / T tile by tile and writes
    g = scale·(a·(onehot(y) - p) + b·(-p·(log p + H))) / T,   p = exp(z - lse)
into G [N, chunk] (input dtype). a, b, lse, H are per-token [N] fp32; ignored tokens (y == ignore_index) get
g = 0 whatever they hold.
`scale` is a power of two with max|g| <= 1 (fp16 safety, docs/kernels.md). The launcher then forms
dW[chunk] = Gᵀ·H / scale (whole token reduction inside one cuBLAS GEMM) and dH += G·W[chunk] / scale (cuBLAS
into an fp32 buffer). Nothing of size N x V is ever stored. This is the two-pass path (8·N·V·d: the forward's
logits are recomputed here); fused_loss uses the single pass of seedfast/kernels/fused_rows.py when its row
block fits the memory budget.
"""

import triton
import triton.language as tl


@triton.jit
def linear_logprob_grad_logits_kernel(
    h_ptr, w_ptr, y_ptr, lse_ptr, ent_ptr, a_ptr, b_ptr, g_ptr,
    N, D, v_start, v_stop,
    stride_hn, stride_hd, stride_wv, stride_wd, stride_gn,
    inv_temp, scale, ignore_index,
    HAS_B: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, GROUP_N: tl.constexpr,
):
    # 1-D grid in groups of GROUP_N token blocks x all vocabulary tiles of the chunk (GEMM "grouped" order:
    # concurrent programs share hidden blocks and W tiles in L2).
    pid = tl.program_id(0)
    n_vtiles = tl.cdiv(v_stop - v_start, BLOCK_V)
    per_group = GROUP_N * n_vtiles
    first_block = (pid // per_group) * GROUP_N
    group_size = tl.minimum(tl.cdiv(N, BLOCK_N) - first_block, GROUP_N)
    pid_n = first_block + (pid % per_group) % group_size
    pid_v = (pid % per_group) // group_size
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = v_start + pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < v_stop
    h_rows = h_ptr + rows.to(tl.int64)[:, None] * stride_hn
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wv

    acc = tl.zeros([BLOCK_N, BLOCK_V], tl.float32)
    for k0 in range(0, D, BLOCK_D):
        ks = k0 + tl.arange(0, BLOCK_D)
        k_ok = ks < D
        h = tl.load(h_rows + ks[None, :] * stride_hd, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_rows + ks[None, :] * stride_wd, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(h, tl.trans(w), acc, input_precision=DOT_PRECISION)

    y = tl.load(y_ptr + rows, mask=row_ok, other=-1).to(tl.int32)  # 32-bit compares: fewer registers
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    a = tl.load(a_ptr + rows, mask=row_ok, other=0.0)
    log_p = acc * inv_temp - lse[:, None]
    p = tl.exp(log_p)
    g = tl.where(cols[None, :] == y[:, None], a[:, None], 0.0) - a[:, None] * p
    if HAS_B:
        b = tl.load(b_ptr + rows, mask=row_ok, other=0.0)
        ent = tl.load(ent_ptr + rows, mask=row_ok, other=0.0)
        g -= b[:, None] * p * (log_p + ent[:, None])
    valid = row_ok[:, None] & col_ok[None, :]
    # Ignored rows are selected out, not multiplied by a = b = 0: a NaN in their hidden state would survive 0·NaN.
    g = tl.where(valid & (y != ignore_index)[:, None], g * (scale * inv_temp), 0.0)
    g_out = g_ptr + rows.to(tl.int64)[:, None] * stride_gn + (cols - v_start)[None, :]
    tl.store(g_out, g.to(g_ptr.dtype.element_ty), mask=valid)
