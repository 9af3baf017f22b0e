"""Full-vocabulary divergences between a student and a teacher context on one LM head, never forming [N, V] logits
(docs/kernels.md, "Divergence kernels"; launchers in seedfast/ops/triton_divergence.py).

Per token row, z_s = h_s·Wᵀ/T, z_t = h_t·Wᵀ/T (same W tile, two accumulators), log p = z − lse:
    reverse_kl   D = Σ p_s (log p_s − log p_t)                               center = D
    forward_kl   D = Σ p_t (log p_t − log p_s)                               center = 0
    jsd          D = β Σ p_t (log p_t − log M) + (1−β) Σ p_s (log p_s − log M),  M = (1−β) p_s + β p_t
                 center K = Σ p_s (log p_s − log M)

divergence_stats_kernel   one online pass over a vocabulary split: both (max, Σexp) pairs and, for the KLs, the
                          cross term x = Σ e^{z_a − m_a}·((z_a − m_a) − (z_b − m_b)) of the side `a` whose p weighs
                          the sum (a = student for reverse_kl, teacher for forward_kl), rescaled as the maxima grow
divergence_merge_kernel   the splits -> lse_a, lse_b and (with the cross term) KL(a‖b) = X/S_a − log S_a + log S_b
divergence_sums_kernel    with given global normalizers, the value and center sums over this W's rows (jsd's second
                          pass: M needs normalized probabilities; the vocabulary-parallel head's per-shard partials)
divergence_grad_kernel    G = scale·coef·∂D/∂z_s / T of one vocabulary chunk from recomputed logits; the launcher
                          forms dW = Gᵀ·h and dH += G·W with cuBLAS, as the two-pass backward of linear_logprob

Keeping the cross term relative to both running maxima makes it exactly 0 when the two contexts are the same and
avoids cancelling two lse of ~1e4 against each other; jsd's log p − log M likewise (_log_ratios_to_mixture).
"""

import triton
import triton.language as tl

KIND_REVERSE_KL, KIND_FORWARD_KL, KIND_JSD = 0, 1, 2


@triton.jit
def _grouped_block(pid, N, n_splits, group_n, BLOCK_N: tl.constexpr):
    """(token block, vocabulary split) of program `pid`: groups of group_n token blocks x all splits (the forward's
    order, seedfast/kernels/linear_logprob_fwd.py: concurrent programs share hidden blocks and W tiles in L2)."""
    per_group = group_n * n_splits
    first_block = (pid // per_group) * group_n
    group_size = tl.minimum(tl.cdiv(N, BLOCK_N) - first_block, group_n)
    return first_block + (pid % per_group) % group_size, (pid % per_group) // group_size


@triton.jit
def _dual_logits(h_rows, ht_rows, w_rows, row_ok, col_ok, D, stride_hd, stride_htd, stride_wd, inv_temp,
                 DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    """Student and teacher logits of one [BLOCK_N, BLOCK_V] tile, each W tile loaded once for both."""
    acc = tl.zeros([BLOCK_N, BLOCK_V], tl.float32)
    acc_t = tl.zeros([BLOCK_N, BLOCK_V], tl.float32)
    for k0 in range(0, D, BLOCK_D):
        ks = k0 + tl.arange(0, BLOCK_D)
        k_ok = ks < D
        w = tl.trans(tl.load(w_rows + ks[None, :] * stride_wd, mask=col_ok[:, None] & k_ok[None, :], other=0.0))
        h = tl.load(h_rows + ks[None, :] * stride_hd, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        ht = tl.load(ht_rows + ks[None, :] * stride_htd, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(h, w, acc, input_precision=DOT_PRECISION)
        acc_t = tl.dot(ht, w, acc_t, input_precision=DOT_PRECISION)
    return acc * inv_temp, acc_t * inv_temp


@triton.jit
def _log_ratios_to_mixture(delta, beta):
    """(log p_s − log M, log p_t − log M) for δ = log p_t − log p_s, M = (1−β)·p_s + β·p_t: the bounded one of the
    two as −log(1 + c·(e^{−|δ|} − 1)) (c = β for δ <= 0, 1−β above), the other one δ away from it. No overflow, no
    cancellation of |δ| ~ 1e4 against itself, and both exactly 0 at δ = 0."""
    below = delta <= 0.0
    small = -tl.log(1.0 + tl.where(below, beta, 1.0 - beta) * (tl.exp(-tl.abs(delta)) - 1.0))
    return tl.where(below, small, small - delta), tl.where(below, small + delta, small)


@triton.jit
def divergence_stats_kernel(
    h_ptr, ht_ptr, w_ptr,
    ms_ptr, ss_ptr, mt_ptr, st_ptr, x_ptr,      # partials, each [n_splits, N] fp32
    N, V, D, n_splits, group_n,
    stride_hn, stride_hd, stride_htn, stride_htd, stride_wv, stride_wd,
    inv_temp,
    KIND: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_n, pid_s = _grouped_block(tl.program_id(0), N, n_splits, group_n, BLOCK_N)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    h_rows = h_ptr + rows.to(tl.int64)[:, None] * stride_hn
    ht_rows = ht_ptr + rows.to(tl.int64)[:, None] * stride_htn
    n_vtiles = tl.cdiv(V, BLOCK_V)
    tiles_per_split = tl.cdiv(n_vtiles, n_splits)
    v_begin = pid_s * tiles_per_split * BLOCK_V
    v_end = tl.minimum(v_begin + tiles_per_split * BLOCK_V, V)

    ms = tl.full([BLOCK_N], float("-inf"), tl.float32)
    ss = tl.zeros([BLOCK_N], tl.float32)
    mt = tl.full([BLOCK_N], float("-inf"), tl.float32)
    st = tl.zeros([BLOCK_N], tl.float32)
    x = tl.zeros([BLOCK_N], tl.float32)
    for v0 in range(v_begin, v_end, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wv
        zs, zt = _dual_logits(h_rows, ht_rows, w_rows, row_ok, col_ok, D, stride_hd, stride_htd, stride_wd, inv_temp,
                              DOT_PRECISION, BLOCK_N, BLOCK_V, BLOCK_D)
        # Padded vocabulary columns must not count: exp(0) = 1 per padded column otherwise.
        zs = tl.where(col_ok[None, :], zs, float("-inf"))
        zt = tl.where(col_ok[None, :], zt, float("-inf"))
        ms_new = tl.maximum(ms, tl.max(zs, axis=1))
        mt_new = tl.maximum(mt, tl.max(zt, axis=1))
        alpha_s = tl.exp(ms - ms_new)  # 0 on the first tile (m = -inf)
        alpha_t = tl.exp(mt - mt_new)
        es = tl.exp(zs - ms_new[:, None])
        et = tl.exp(zt - mt_new[:, None])
        if KIND != 2:
            # x relative to the new maxima: the old sum moves by the change of (m_a − m_b) per unit of s_a.
            shift = tl.where(ms > float("-inf"), (ms - ms_new) - (mt - mt_new), 0.0)
            diff = (zs - ms_new[:, None]) - (zt - mt_new[:, None])
            if KIND == 0:
                x = alpha_s * (x + shift * ss) + tl.sum(tl.where(col_ok[None, :], es * diff, 0.0), axis=1)
            else:
                x = alpha_t * (x - shift * st) - tl.sum(tl.where(col_ok[None, :], et * diff, 0.0), axis=1)
        ss = ss * alpha_s + tl.sum(es, axis=1)
        st = st * alpha_t + tl.sum(et, axis=1)
        ms = ms_new
        mt = mt_new

    out = pid_s * N + rows
    tl.store(ms_ptr + out, ms, mask=row_ok)
    tl.store(ss_ptr + out, ss, mask=row_ok)
    tl.store(mt_ptr + out, mt, mask=row_ok)
    tl.store(st_ptr + out, st, mask=row_ok)
    if KIND != 2:
        tl.store(x_ptr + out, x, mask=row_ok)


@triton.jit
def _merge(m_ptr, s_ptr, rows, row_ok, N, n_splits, BLOCK: tl.constexpr):
    """Global max M and Σ s_i·exp(m_i − M) over the splits of each row."""
    big_m = tl.full([BLOCK], float("-inf"), tl.float32)
    for i in range(0, n_splits):
        big_m = tl.maximum(big_m, tl.load(m_ptr + i * N + rows, mask=row_ok, other=float("-inf")))
    big_m = tl.where(row_ok, big_m, 0.0)
    total = tl.zeros([BLOCK], tl.float32)
    for i in range(0, n_splits):
        m_i = tl.load(m_ptr + i * N + rows, mask=row_ok, other=float("-inf"))
        s_i = tl.load(s_ptr + i * N + rows, mask=row_ok, other=0.0)
        total += s_i * tl.exp(m_i - big_m)  # an empty split has m_i = -inf, s_i = 0
    return big_m, tl.where(row_ok, total, 1.0)


@triton.jit
def divergence_merge_kernel(
    ma_ptr, sa_ptr, mb_ptr, sb_ptr, x_ptr, lse_a_ptr, lse_b_ptr, kl_ptr,
    N, n_splits,
    HAS_X: tl.constexpr, BLOCK: tl.constexpr,
):
    """lse of both sides and, with HAS_X, KL(a‖b) = X/S_a − log S_a + log S_b, X the cross term over all splits
    relative to the global maxima (M_a, M_b)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < N
    big_a, tot_a = _merge(ma_ptr, sa_ptr, rows, row_ok, N, n_splits, BLOCK)
    big_b, tot_b = _merge(mb_ptr, sb_ptr, rows, row_ok, N, n_splits, BLOCK)
    log_a = tl.log(tot_a)
    log_b = tl.log(tot_b)
    tl.store(lse_a_ptr + rows, big_a + log_a, mask=row_ok)
    tl.store(lse_b_ptr + rows, big_b + log_b, mask=row_ok)
    if HAS_X:
        x = tl.zeros([BLOCK], tl.float32)
        for i in range(0, n_splits):
            ma_i = tl.load(ma_ptr + i * N + rows, mask=row_ok, other=float("-inf"))
            mb_i = tl.load(mb_ptr + i * N + rows, mask=row_ok, other=float("-inf"))
            sa_i = tl.load(sa_ptr + i * N + rows, mask=row_ok, other=0.0)
            x_i = tl.load(x_ptr + i * N + rows, mask=row_ok, other=0.0)
            live = ma_i > float("-inf")
            x += tl.where(live, tl.exp(ma_i - big_a) * (x_i + ((ma_i - big_a) - (mb_i - big_b)) * sa_i), 0.0)
        tl.store(kl_ptr + rows, x / tot_a - log_a + log_b, mask=row_ok)


@triton.jit
def divergence_sums_kernel(
    h_ptr, ht_ptr, w_ptr, lse_ptr, tlse_ptr,
    value_ptr, center_ptr,                      # partials, each [n_splits, N] fp32
    N, V, D, n_splits, group_n,
    stride_hn, stride_hd, stride_htn, stride_htd, stride_wv, stride_wd,
    inv_temp, beta,
    KIND: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_n, pid_s = _grouped_block(tl.program_id(0), N, n_splits, group_n, BLOCK_N)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    h_rows = h_ptr + rows.to(tl.int64)[:, None] * stride_hn
    ht_rows = ht_ptr + rows.to(tl.int64)[:, None] * stride_htn
    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    tlse = tl.load(tlse_ptr + rows, mask=row_ok, other=0.0)
    n_vtiles = tl.cdiv(V, BLOCK_V)
    tiles_per_split = tl.cdiv(n_vtiles, n_splits)
    v_begin = pid_s * tiles_per_split * BLOCK_V
    v_end = tl.minimum(v_begin + tiles_per_split * BLOCK_V, V)

    value = tl.zeros([BLOCK_N], tl.float32)
    center = tl.zeros([BLOCK_N], tl.float32)
    for v0 in range(v_begin, v_end, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wv
        zs, zt = _dual_logits(h_rows, ht_rows, w_rows, row_ok, col_ok, D, stride_hd, stride_htd, stride_wd, inv_temp,
                              DOT_PRECISION, BLOCK_N, BLOCK_V, BLOCK_D)
        ls = zs - lse[:, None]
        lt = zt - tlse[:, None]
        if KIND == 0:
            term = tl.exp(ls) * (ls - lt)
        elif KIND == 1:
            term = tl.exp(lt) * (lt - ls)
        else:
            rs, rt = _log_ratios_to_mixture(lt - ls, beta)
            ks = tl.exp(ls) * rs
            center += tl.sum(tl.where(col_ok[None, :], ks, 0.0), axis=1)
            term = beta * (tl.exp(lt) * rt) + (1.0 - beta) * ks
        value += tl.sum(tl.where(col_ok[None, :], term, 0.0), axis=1)

    out = pid_s * N + rows
    tl.store(value_ptr + out, value, mask=row_ok)
    if KIND == 2:
        tl.store(center_ptr + out, center, mask=row_ok)


@triton.jit
def divergence_grad_kernel(
    h_ptr, ht_ptr, w_ptr, lse_ptr, tlse_ptr, center_ptr, coef_ptr, g_ptr,
    N, D, v_start, v_stop,
    stride_hn, stride_hd, stride_htn, stride_htd, stride_wv, stride_wd, stride_gn,
    inv_temp, scale, beta,
    KIND: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr, GROUP_N: tl.constexpr,
):
    """G [N, chunk] = scale·coef·∂D/∂z_s / T, in G's dtype; rows with coef == 0 get exactly 0 (by selection: their
    hidden state, lse or center may be NaN)."""
    pid = tl.program_id(0)
    n_vtiles = tl.cdiv(v_stop - v_start, BLOCK_V)
    pid_n, pid_v = _grouped_block(pid, N, n_vtiles, GROUP_N, BLOCK_N)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    cols = v_start + pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < v_stop
    h_rows = h_ptr + rows.to(tl.int64)[:, None] * stride_hn
    ht_rows = ht_ptr + rows.to(tl.int64)[:, None] * stride_htn
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wv
    zs, zt = _dual_logits(h_rows, ht_rows, w_rows, row_ok, col_ok, D, stride_hd, stride_htd, stride_wd, inv_temp,
                          DOT_PRECISION, BLOCK_N, BLOCK_V, BLOCK_D)

    lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
    tlse = tl.load(tlse_ptr + rows, mask=row_ok, other=0.0)
    coef = tl.load(coef_ptr + rows, mask=row_ok, other=0.0)
    ls = zs - lse[:, None]
    lt = zt - tlse[:, None]
    ps = tl.exp(ls)
    if KIND == 0:
        center = tl.load(center_ptr + rows, mask=row_ok, other=0.0)
        g = ps * ((ls - lt) - center[:, None])
    elif KIND == 1:
        g = ps - tl.exp(lt)
    else:
        center = tl.load(center_ptr + rows, mask=row_ok, other=0.0)
        rs, _ = _log_ratios_to_mixture(lt - ls, beta)
        g = (1.0 - beta) * ps * (rs - center[:, None])
    valid = row_ok[:, None] & col_ok[None, :]
    g = tl.where(valid & (coef != 0.0)[:, None], g * (coef * (scale * inv_temp))[:, None], 0.0)
    g_out = g_ptr + rows.to(tl.int64)[:, None] * stride_gn + (cols - v_start)[None, :]
    tl.store(g_out, g.to(g_ptr.dtype.element_ty), mask=valid)
