"""Forward of the fused linear -> log-prob op: z = h·Wᵀ / T streamed in (tokens x vocab) tiles.

Each program owns one block of tokens and one contiguous slice of the vocabulary (a "split"). It keeps,
per token row, the online statistics of its slice, relative to the running max m:
    s = Σ exp(z - m)            (sum of exponentials)
    u = Σ exp(z - m)·(z - m)    (entropy numerator; only with WITH_ENTROPY)
    zy = z[target]              (0 when the target is outside the slice)
and writes them to partial buffers [n_splits, N]. A second tiny kernel merges the splits into
logprob = (zy - m) - log s, lse = m + log s and entropy H = log s - u/s. Keeping u relative to the max avoids the
cancellation of lse - Σp·z when logits are large (|z| ~ 1e4).

With HAS_TEACHER, a second hidden matrix (teacher rows, same targets) is multiplied with every loaded W tile
too, so W is read once for both contexts. Teacher rows get lse and target logit only (no entropy).

Program order (1-D grid, no 65,535 limit on any axis): programs come in groups of `group_n` token blocks x
all splits. One group is about one wave of the GPU, so the programs running together read `group_n` blocks of
hidden rows and `n_splits` W tiles at a time, and both stay in L2. Token-block-major order would have every
concurrent program stream its own hidden block from HBM once per vocabulary tile (memory-bound at d ~ 4k).
"""

import triton
import triton.language as tl


@triton.jit
def linear_logprob_fwd_kernel(
    h_ptr, ht_ptr, w_ptr, y_ptr,
    m_ptr, s_ptr, u_ptr, zy_ptr,           # student partials, each [n_splits, N] fp32
    mt_ptr, st_ptr, zyt_ptr,               # teacher partials (unused without HAS_TEACHER)
    N, V, D, n_splits, group_n,
    stride_hn, stride_hd, stride_htn, stride_htd, stride_wv, stride_wd,
    inv_temp,
    HAS_TEACHER: tl.constexpr, WITH_ENTROPY: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    per_group = group_n * n_splits
    first_block = (pid // per_group) * group_n
    group_size = tl.minimum(tl.cdiv(N, BLOCK_N) - first_block, group_n)
    pid_n = first_block + (pid % per_group) % group_size  # token block
    pid_s = (pid % per_group) // group_size  # vocabulary split
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    y = tl.load(y_ptr + rows, mask=row_ok, other=-1).to(tl.int32)  # 32-bit compares: fewer registers
    # 64-bit row offsets: N·d passes 2^31 long before N reaches 1M.
    h_rows = h_ptr + rows.to(tl.int64)[:, None] * stride_hn
    ht_rows = ht_ptr + rows.to(tl.int64)[:, None] * stride_htn

    n_vtiles = tl.cdiv(V, BLOCK_V)
    tiles_per_split = tl.cdiv(n_vtiles, n_splits)
    v_begin = pid_s * tiles_per_split * BLOCK_V
    v_end = tl.minimum(v_begin + tiles_per_split * BLOCK_V, V)

    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_N], tl.float32)
    u = tl.zeros([BLOCK_N], tl.float32)
    zy = tl.zeros([BLOCK_N], tl.float32)
    mt = tl.full([BLOCK_N], float("-inf"), tl.float32)
    st = tl.zeros([BLOCK_N], tl.float32)
    zyt = tl.zeros([BLOCK_N], tl.float32)

    for v0 in range(v_begin, v_end, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        w_rows = w_ptr + cols.to(tl.int64)[:, None] * stride_wv
        acc = tl.zeros([BLOCK_N, BLOCK_V], tl.float32)
        acc_t = tl.zeros([BLOCK_N, BLOCK_V], tl.float32)
        for k0 in range(0, D, BLOCK_D):
            ks = k0 + tl.arange(0, BLOCK_D)
            k_ok = ks < D
            w = tl.load(w_rows + ks[None, :] * stride_wd,
                        mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            h = tl.load(h_rows + ks[None, :] * stride_hd,
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            acc = tl.dot(h, tl.trans(w), acc, input_precision=DOT_PRECISION)
            if HAS_TEACHER:
                ht = tl.load(ht_rows + ks[None, :] * stride_htd,
                             mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                acc_t = tl.dot(ht, tl.trans(w), acc_t, input_precision=DOT_PRECISION)

        # Padded vocabulary columns must not count: exp(0) = 1 per padded column otherwise.
        z = tl.where(col_ok[None, :], acc * inv_temp, float("-inf"))
        m_new = tl.maximum(m, tl.max(z, axis=1))
        alpha = tl.exp(m - m_new)  # 0 on the first tile (m = -inf)
        e = tl.exp(z - m_new[:, None])
        if WITH_ENTROPY:
            ez = tl.where(col_ok[None, :], e * (z - m_new[:, None]), 0.0)
            shift = tl.where(m > float("-inf"), m - m_new, 0.0)  # -inf·0 guard
            u = alpha * (u + shift * s) + tl.sum(ez, axis=1)
        s = s * alpha + tl.sum(e, axis=1)
        m = m_new
        is_target = cols[None, :] == y[:, None]
        zy += tl.sum(tl.where(is_target, z, 0.0), axis=1)

        if HAS_TEACHER:
            zt = tl.where(col_ok[None, :], acc_t * inv_temp, float("-inf"))
            mt_new = tl.maximum(mt, tl.max(zt, axis=1))
            st = st * tl.exp(mt - mt_new) + tl.sum(tl.exp(zt - mt_new[:, None]), axis=1)
            mt = mt_new
            zyt += tl.sum(tl.where(is_target, zt, 0.0), axis=1)

    out = pid_s * N + rows
    tl.store(m_ptr + out, m, mask=row_ok)
    tl.store(s_ptr + out, s, mask=row_ok)
    tl.store(zy_ptr + out, zy, mask=row_ok)
    if WITH_ENTROPY:
        tl.store(u_ptr + out, u, mask=row_ok)
    if HAS_TEACHER:
        tl.store(mt_ptr + out, mt, mask=row_ok)
        tl.store(st_ptr + out, st, mask=row_ok)
        tl.store(zyt_ptr + out, zyt, mask=row_ok)


@triton.jit
def _merge_lse(m_ptr, s_ptr, rows, row_ok, N, n_splits, BLOCK: tl.constexpr):
    """Global max M and Σ s_i·exp(m_i - M) over the splits of each row."""
    big_m = tl.full([BLOCK], float("-inf"), tl.float32)
    for i in range(0, n_splits):
        big_m = tl.maximum(big_m, tl.load(m_ptr + i * N + rows, mask=row_ok, other=float("-inf")))
    big_m = tl.where(row_ok, big_m, 0.0)
    total = tl.zeros([BLOCK], tl.float32)
    for i in range(0, n_splits):
        m_i = tl.load(m_ptr + i * N + rows, mask=row_ok, other=float("-inf"))
        s_i = tl.load(s_ptr + i * N + rows, mask=row_ok, other=0.0)
        total += s_i * tl.exp(m_i - big_m)  # an empty split has m_i = -inf, s_i = 0
    return big_m, total


@triton.jit
def linear_logprob_reduce_kernel(
    m_ptr, s_ptr, u_ptr, zy_ptr, mt_ptr, st_ptr, zyt_ptr, y_ptr,
    logprob_ptr, entropy_ptr, lse_ptr, teacher_logprob_ptr,
    N, n_splits, ignore_index,
    HAS_TEACHER: tl.constexpr, WITH_ENTROPY: tl.constexpr, BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    row_ok = rows < N
    ignored = tl.load(y_ptr + rows, mask=row_ok, other=ignore_index) == ignore_index

    big_m, total = _merge_lse(m_ptr, s_ptr, rows, row_ok, N, n_splits, BLOCK)
    log_total = tl.log(total)
    lse = big_m + log_total
    zy = tl.zeros([BLOCK], tl.float32)
    for i in range(0, n_splits):
        zy += tl.load(zy_ptr + i * N + rows, mask=row_ok, other=0.0)
    tl.store(lse_ptr + rows, lse, mask=row_ok)
    # (zy - M) - log S rather than zy - lse: no rounding of M + log S at |z| ~ 1e4.
    tl.store(logprob_ptr + rows, tl.where(ignored, 0.0, (zy - big_m) - log_total), mask=row_ok)

    if WITH_ENTROPY:
        # Σ_i exp(m_i - M)·(u_i + (m_i - M)·s_i) is Σ exp(z - M)·(z - M) over the whole vocabulary.
        u_tot = tl.zeros([BLOCK], tl.float32)
        for i in range(0, n_splits):
            m_i = tl.load(m_ptr + i * N + rows, mask=row_ok, other=float("-inf"))
            s_i = tl.load(s_ptr + i * N + rows, mask=row_ok, other=0.0)
            u_i = tl.load(u_ptr + i * N + rows, mask=row_ok, other=0.0)
            live = m_i > float("-inf")
            scale = tl.where(live, tl.exp(m_i - big_m), 0.0)
            u_tot += scale * (u_i + tl.where(live, m_i - big_m, 0.0) * s_i)
        entropy = log_total - u_tot / total
        tl.store(entropy_ptr + rows, tl.where(ignored, 0.0, entropy), mask=row_ok)

    if HAS_TEACHER:
        big_mt, total_t = _merge_lse(mt_ptr, st_ptr, rows, row_ok, N, n_splits, BLOCK)
        zyt = tl.zeros([BLOCK], tl.float32)
        for i in range(0, n_splits):
            zyt += tl.load(zyt_ptr + i * N + rows, mask=row_ok, other=0.0)
        teacher = (zyt - big_mt) - tl.log(total_t)
        tl.store(teacher_logprob_ptr + rows, tl.where(ignored, 0.0, teacher), mask=row_ok)
