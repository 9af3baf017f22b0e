"""Fused per-token loss (docs/algorithms.md, 'Total loss and aggregation'), its derivatives and its metric sums, in
one launch over N tokens.

Per token t (all inputs [N] fp32; w_t are the aggregation weights, 0 for padding):
    ρ      = exp(clamp(ℓθ - ℓold, ±20))     (as seedfast.algo.losses: no inf, no 0·inf in the gradient)
    pg     = max(-A·ρ, -A·clip(ρ, 1-ε_low, 1+ε_high));  for A < 0: min(pg, -A·c)     (dual clip)
    kl     = k1: ℓθ-ℓref | k2: ½(ℓθ-ℓref)² | low_var_kl: clamp(exp(r) - r - 1, -10, 10), r = ℓref-ℓθ
    g      = σ(β·x), x = gap: Δ | entropy: H | soft_or: 1-exp(-(max(H,0) + max(Δ,0)))   (Δ = ℓskill-ℓθ; x stop-grad)
             (soft_or = 1-(1-Ĥ)(1-Δ̂), Ĥ = 1-e^-H, Δ̂ = 1-e^-max(Δ,0): seedfast.algo.losses.soft_or)
    opd    = m·g·(ℓskill - ℓθ)                                                         (m: teacher mask)
    L_t    = w·(pg + c_kl·kl - c_H·H) + λ_opd·w·opd
and a_t = ∂L/∂ℓθ_t, b_t = ∂L/∂H_t = -c_H·w_t (the gate takes no gradient). OPD_MODE picks the form of the teacher
term (seedfast/ops/token_loss.py, the torch reference): OPD_GATE the above; OPD_ADVANTAGE no opd term, A becomes
A + λ_opd·m·clamp(ℓskill - ℓold, ±opd_adv_clip) inside pg (stop-grad; sums Σw·m and Σw·shift); OPD_NONE no teacher
term here (the divergence forms: seedfast.ops.fused_divergence).

Program i handles token blocks i, i + P, i + 2P, ... and writes one row of partials [P, N_STATS] (STAT_NAMES):
the loss, Σw, Σw·clipped, Σw·kl, Σw·H, Σw·m, Σw·m·g, Σw·m·g·(ℓskill-ℓθ), and min/max of ρ over tokens with
w != 0 (the metric sums of seedfast/ops/token_loss.py). The launcher reduces the P rows (deterministic).
"""

import triton
import triton.language as tl

KL_NONE, KL_K1, KL_K2, KL_LOW_VAR = 0, 1, 2, 3
GATE_GAP, GATE_ENTROPY, GATE_SOFT_OR = 0, 1, 2
OPD_GATE, OPD_ADVANTAGE, OPD_NONE = 0, 1, 2
STAT_NAMES = ("loss", "weight", "clip_frac", "kl", "entropy", "teacher_weight", "gate", "opd_term",
              "ratio_min", "ratio_max")
N_STATS = 10  # len(STAT_NAMES): the row width of the partials buffer (literal 10 in the kernel)


@triton.jit
def token_loss_kernel(
    lp_ptr, ent_ptr, old_ptr, ref_ptr, teacher_ptr, tmask_ptr, adv_ptr, w_ptr,
    a_ptr, b_ptr, stats_ptr,
    N,
    clip_low, clip_high, dual_clip, kl_coef, entropy_coef, opd_coef, opd_beta, opd_adv_clip,
    HAS_ENTROPY: tl.constexpr, HAS_DUAL_CLIP: tl.constexpr, KL_KIND: tl.constexpr,
    HAS_OPD: tl.constexpr, HAS_TMASK: tl.constexpr, GATE: tl.constexpr, OPD_MODE: tl.constexpr,
    WRITE_B: tl.constexpr, BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    loss = tl.zeros([BLOCK], tl.float32)
    w_sum = tl.zeros([BLOCK], tl.float32)
    tw_sum = tl.zeros([BLOCK], tl.float32)
    clip_frac = tl.zeros([BLOCK], tl.float32)
    kl_sum = tl.zeros([BLOCK], tl.float32)
    ent_sum = tl.zeros([BLOCK], tl.float32)
    gate_sum = tl.zeros([BLOCK], tl.float32)
    opd_sum = tl.zeros([BLOCK], tl.float32)
    r_min = tl.full([BLOCK], float("inf"), tl.float32)
    r_max = tl.full([BLOCK], float("-inf"), tl.float32)

    for start in range(pid * BLOCK, N, n_prog * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        ok = offs < N
        w = tl.load(w_ptr + offs, mask=ok, other=0.0)
        active = w != 0.0  # padding may hold garbage log-probs: keep it out of every sum
        lp = tl.load(lp_ptr + offs, mask=ok, other=0.0)
        old = tl.load(old_ptr + offs, mask=ok, other=0.0)
        adv = tl.load(adv_ptr + offs, mask=ok, other=0.0)
        if HAS_OPD and OPD_MODE == 1:  # the teacher's shift joins the advantage (no gradient through it)
            teacher = tl.load(teacher_ptr + offs, mask=ok, other=0.0)
            opd_active = active
            if HAS_TMASK:
                opd_active = active & (tl.load(tmask_ptr + offs, mask=ok, other=0.0) != 0.0)
            delta = tl.minimum(tl.maximum(teacher - old, -opd_adv_clip), opd_adv_clip)
            shift = tl.where(opd_active, opd_coef * delta, 0.0)
            adv += shift
            tw_sum += tl.where(opd_active, w, 0.0)
            opd_sum += tl.where(opd_active, w * shift, 0.0)

        log_ratio = lp - old
        in_range = (log_ratio >= -20.0) & (log_ratio <= 20.0)  # outside, the clamp stops the gradient
        ratio = tl.exp(tl.minimum(tl.maximum(log_ratio, -20.0), 20.0))
        pg1 = -adv * ratio
        pg2 = -adv * tl.minimum(tl.maximum(ratio, 1.0 - clip_low), 1.0 + clip_high)
        clipped = pg2 > pg1  # the clipped branch is taken: ρ is outside the band, no gradient
        pg = tl.maximum(pg1, pg2)
        d_pg = tl.where(clipped, 0.0, tl.where(in_range, pg1, 0.0))  # ∂(-A·ρ)/∂ℓθ = -A·ρ
        if HAS_DUAL_CLIP:
            pg3 = -adv * dual_clip
            capped = (adv < 0.0) & (pg > pg3)
            pg = tl.where(capped, pg3, pg)
            d_pg = tl.where(capped, 0.0, d_pg)
        total = pg
        grad = d_pg

        if KL_KIND != 0:
            ref = tl.load(ref_ptr + offs, mask=ok, other=0.0)
            if KL_KIND == 1:
                kl = lp - ref
                d_kl = tl.full([BLOCK], 1.0, tl.float32)
            elif KL_KIND == 2:
                kl = 0.5 * (lp - ref) * (lp - ref)
                d_kl = lp - ref
            else:
                r = ref - lp
                raw = tl.exp(r) - r - 1.0
                kl = tl.minimum(tl.maximum(raw, -10.0), 10.0)
                d_kl = tl.where((raw <= 10.0) & (raw >= -10.0), 1.0 - tl.exp(r), 0.0)
            total += kl_coef * kl
            grad += kl_coef * d_kl
            kl_sum += tl.where(active, w * kl, 0.0)

        ent = tl.zeros([BLOCK], tl.float32)
        if HAS_ENTROPY:
            ent = tl.load(ent_ptr + offs, mask=ok, other=0.0)
            total -= entropy_coef * ent
            ent_sum += tl.where(active, w * ent, 0.0)

        loss += tl.where(active, w * total, 0.0)
        grad = w * grad

        if HAS_OPD and OPD_MODE == 0:
            teacher = tl.load(teacher_ptr + offs, mask=ok, other=0.0)
            gap = teacher - lp
            if GATE == 0:
                x = gap
            elif GATE == 1:
                x = ent
            else:
                x = 1.0 - tl.exp(-(tl.maximum(ent, 0.0) + tl.maximum(gap, 0.0)))
            gate = tl.sigmoid(opd_beta * x)
            m = tl.full([BLOCK], 1.0, tl.float32)
            if HAS_TMASK:
                m = tl.load(tmask_ptr + offs, mask=ok, other=0.0)
            wm = w * m
            opd_active = active & (m != 0.0)
            opd = tl.where(opd_active, wm * gate * gap, 0.0)
            loss += opd_coef * opd
            grad = tl.where(opd_active, grad - opd_coef * wm * gate, grad)
            tw_sum += tl.where(opd_active, wm, 0.0)
            gate_sum += tl.where(opd_active, wm * gate, 0.0)
            opd_sum += opd

        w_sum += tl.where(active, w, 0.0)
        clip_frac += tl.where(active & clipped, w, 0.0)
        r_min = tl.minimum(r_min, tl.where(active, ratio, float("inf")))
        r_max = tl.maximum(r_max, tl.where(active, ratio, float("-inf")))
        tl.store(a_ptr + offs, tl.where(active, grad, 0.0), mask=ok)
        if WRITE_B:
            tl.store(b_ptr + offs, -entropy_coef * w, mask=ok)

    row = stats_ptr + pid * 10
    tl.store(row + 0, tl.sum(loss, axis=0))
    tl.store(row + 1, tl.sum(w_sum, axis=0))
    tl.store(row + 2, tl.sum(clip_frac, axis=0))
    tl.store(row + 3, tl.sum(kl_sum, axis=0))
    tl.store(row + 4, tl.sum(ent_sum, axis=0))
    tl.store(row + 5, tl.sum(tw_sum, axis=0))
    tl.store(row + 6, tl.sum(gate_sum, axis=0))
    tl.store(row + 7, tl.sum(opd_sum, axis=0))
    tl.store(row + 8, tl.min(r_min, axis=0))
    tl.store(row + 9, tl.max(r_max, axis=0))
