"""Single-pass loss: the row-wise kernels between the three GEMMs of one block of whole vocabulary rows.

The launcher (seedfast/ops/triton_backend.py, fused_forward_backward; design in docs/kernels.md) runs per block
of R tokens:
    Z = h·Wᵀ                      cuBLAS, fp32 output [R, V]           2·R·V·d
    row_stats_kernel              Z -> lse, logprob, entropy            one read of Z
    token loss                    -> a_t, b_t                           (seedfast/kernels/token_loss.py)
    grad_from_logits_kernel       Z -> G = S·(a·(onehot - p) - b·p·(log p + H))/T, 16-bit or in place
    dH = G·W / S,  dW += Gᵀ·h / S   cuBLAS                              4·R·V·d
so the logits of each token are formed once: 6·N·V·d in all. S is a power of two chosen so that max|S·G| <= 1
(fp16 safety: per-token-mean weights make G ~ 1/(N·V), below fp16's smallest subnormal).
"""

import triton
import triton.language as tl


@triton.jit
def row_stats_kernel(
    z_ptr, y_ptr, lse_ptr, logprob_ptr, entropy_ptr,
    R, V, stride_zr, inv_temp, ignore_index,
    WITH_ENTROPY: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Per row of Z [R, V] (logits before the temperature): online max / Σexp / entropy numerator / target."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    y = tl.load(y_ptr + rows, mask=row_ok, other=-1).to(tl.int32)
    z_rows = z_ptr + rows.to(tl.int64)[:, None] * stride_zr
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_R], tl.float32)
    u = tl.zeros([BLOCK_R], tl.float32)
    zy = tl.zeros([BLOCK_R], tl.float32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        ok = row_ok[:, None] & (cols < V)[None, :]
        z = tl.load(z_rows + cols[None, :], mask=ok, other=float("-inf")) * inv_temp
        m_new = tl.maximum(m, tl.max(z, axis=1))
        m_safe = tl.where(m_new > float("-inf"), m_new, 0.0)  # rows past R: all -inf
        alpha = tl.where(m > float("-inf"), tl.exp(m - m_safe), 0.0)
        e = tl.where(ok, tl.exp(z - m_safe[:, None]), 0.0)
        if WITH_ENTROPY:
            ez = tl.where(ok, e * (z - m_safe[:, None]), 0.0)
            shift = tl.where(m > float("-inf"), m - m_safe, 0.0)
            u = alpha * (u + shift * s) + tl.sum(ez, axis=1)
        s = s * alpha + tl.sum(e, axis=1)
        m = m_new
        zy += tl.sum(tl.where(cols[None, :] == y[:, None], z, 0.0), axis=1)
    ignored = y == ignore_index
    log_s = tl.log(tl.where(row_ok, s, 1.0))
    m = tl.where(row_ok, m, 0.0)
    tl.store(lse_ptr + rows, m + log_s, mask=row_ok)
    # (zy - m) - log s rather than zy - lse: no rounding of m + log s at |z| ~ 1e4.
    tl.store(logprob_ptr + rows, tl.where(ignored, 0.0, (zy - m) - log_s), mask=row_ok)
    if WITH_ENTROPY:
        tl.store(entropy_ptr + rows, tl.where(ignored, 0.0, log_s - u / tl.where(row_ok, s, 1.0)), mask=row_ok)


@triton.jit
def grad_from_logits_kernel(
    z_ptr, y_ptr, lse_ptr, ent_ptr, a_ptr, b_ptr, g_ptr,
    R, V, stride_zr, stride_gr, inv_temp, scale, ignore_index,
    HAS_B: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """G = scale·(a·(onehot(y) - p) - b·p·(log p + H))/T from the stored logits; g_ptr may alias z_ptr (fp32:
    every element is read before the same program writes it). Ignored rows (y == ignore_index) get G = 0 exactly,
    by selection: their logits may be NaN (a padded row's hidden state), and a = b = 0 would give 0·NaN = NaN."""
    pid = tl.program_id(0)
    n_vtiles = tl.cdiv(V, BLOCK_V)
    rows = (pid // n_vtiles) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = (pid % n_vtiles) * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = rows < R
    ok = row_ok[:, None] & (cols < V)[None, :]
    z = tl.load(z_ptr + rows.to(tl.int64)[:, None] * stride_zr + cols[None, :], mask=ok, other=0.0)
    y = tl.load(y_ptr + rows, mask=row_ok, other=-1).to(tl.int32)
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    a = tl.load(a_ptr + rows, mask=row_ok, other=0.0)
    log_p = z * inv_temp - lse[:, None]
    p = tl.exp(log_p)
    coef = a[:, None]
    if HAS_B:
        b = tl.load(b_ptr + rows, mask=row_ok, other=0.0)
        ent = tl.load(ent_ptr + rows, mask=row_ok, other=0.0)
        coef += b[:, None] * (log_p + ent[:, None])
    g = tl.where(cols[None, :] == y[:, None], a[:, None], 0.0) - p * coef
    g = tl.where(ok & (y != ignore_index)[:, None], g * (scale * inv_temp), 0.0)
    tl.store(g_ptr + rows.to(tl.int64)[:, None] * stride_gr + cols[None, :], g.to(g_ptr.dtype.element_ty), mask=ok)
