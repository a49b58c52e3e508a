"""Decode attention over a KV cache: a PyTorch reference and a Triton split-KV kernel.

One function serves the three cache designs of Zadouri, Strauss, Dao 2025 (arXiv 2505.21487, Sec. 3), with the
interface of FA3's `flash_attn_with_kvcache(q, k_cache, v_cache, qv=..., cache_seqlens=...)` (Shah et al. 2024):

    GQA   : q . k over Hkv key/value heads; qv = None, Dk = Dv.
    MLA   : the absorbed decode of DeepSeek-V2 (arXiv 2405.04434, Sec. 2.1): the latent c (Dv = 512) is the value
            AND the non-rope key, scores = q . k_rope + qv . c, one "KV head" (Hkv = Hk = 1) for every query head.
    GLA-2 : two latent heads of 256 (Hkv = 2), each shared by half of the query heads, and one rope key (Hk = 1).
"""
import math
import os
from contextlib import nullcontext

import torch
import torch.nn.functional as F

try:  # Triton is Linux-only in requirements; the reference must import without it.
    import triton
    import triton.language as tl
except ImportError:
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter, as the tests run it
MAX_LQ = 16  # new tokens per call: a step or speculative drafts; the model runs a prompt through SDPA
COMBINE_BLOCK_D = 64
LOG2E = 1.4426950408889634


def _default_scale(Dk, Dv, qv):
    # As FA3: with qv the score sums two dot products, of Dk + Dv dimensions in all.
    return 1.0 / math.sqrt(Dk + Dv if qv is not None else Dk)


def decode_mask(positions, S):
    """The additive mask (B, 1, Lq, S) float32 of new tokens at positions (B, Lq) int64: 0 where token l of sequence
    b sees cache position s (s <= positions[b, l]), -inf elsewhere."""
    return torch.where(torch.arange(S, device=positions.device) <= positions[:, None, :, None], 0.0, float("-inf"))


def decode_attention_ref(q, k_cache, v_cache, cache_seqlens, qv=None, softmax_scale=None, *, max_seqlen=None):
    """Decode attention through SDPA in float32: the kernel's oracle, and the model's decode path on a CPU. Arguments
    and result as decode_attention's, but cache slots past cache_seqlens must hold finite values (zero-weighted).

    As in the kernel's tile, a group's G = Hq // Hkv query heads times the Lq new tokens are the rows of one SDPA head.
    MLA / GLA: the latent is SDPA's key and value; the rope scores q . k_rope enter as its mask."""
    S = int(cache_seqlens.max()) if max_seqlen is None else max_seqlen  # the cache's valid prefix
    B, Lq, Hq, Dk = q.shape
    Hk, Hkv, Dv = k_cache.shape[2], v_cache.shape[2], v_cache.shape[3]
    G = Hq // Hkv
    scale = _default_scale(Dk, Dv, qv) if softmax_scale is None else softmax_scale

    def rows(x):  # (B, Lq, Hq, D) -> (B, Hkv, G * Lq, D): row k * Lq + l of group g is head g * G + k, token l
        return x.float().transpose(1, 2).reshape(B, Hkv, G * Lq, x.shape[3])

    k, v = (t[:, :S].float().transpose(1, 2) for t in (k_cache, v_cache))  # (B, Hk or Hkv, S, D)
    # New token l sits at position cache_seqlens - Lq + l.
    mask = decode_mask((cache_seqlens - Lq)[:, None] + torch.arange(Lq, device=q.device), S)
    if Lq > 1:  # row k * Lq + l takes token l's row of the mask (one row serves all G heads at Lq = 1)
        mask = mask[:, :, None].expand(B, 1, G, Lq, S).reshape(B, 1, G * Lq, S)
    if qv is None:
        query, key = rows(q), k.expand(B, Hkv, S, Dk)  # a view: one shared key head serves every group
    else:  # scores = q . k_rope + qv . c: the latent is also the non-rope key
        query, key = rows(qv), v
        # One product for all query heads: the shared rope key (Hk = 1) is read once, not copied per group.
        q_rows = (q.float() * scale).transpose(1, 2).reshape(B, Hk, -1, Dk)
        mask = torch.matmul(q_rows, k.transpose(2, 3)).view(B, Hkv, G * Lq, S).add_(mask)
    out = F.scaled_dot_product_attention(query, key, v, attn_mask=mask, scale=scale)  # (B, Hkv, G * Lq, Dv)
    return out.view(B, Hq, Lq, Dv).transpose(1, 2).to(q.dtype)  # (B, Lq, Hq, Dv)


# ---- The Triton kernel: split-KV (Flash-Decoding, Dao et al. 2023). Each program takes the query heads of one KV /
# latent head group (or a block of them) and all Lq new tokens as the rows of one tile, over one slice of the cached
# sequence, with FlashAttention's online softmax; a second kernel combines the slices by their log-sum-exps.

if triton is not None:

    # split_len and n_splits change as a cache grows: Triton compiles no variant for their values (as it would for 1).
    @triton.jit(do_not_specialize=["split_len", "n_splits"])
    def _split_kernel(
        Q, QV, K, V, SEQLENS, O_PART, LSE_PART,
        stride_qb, stride_ql, stride_qh, stride_qvb, stride_qvl, stride_qvh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        scale_log2, split_len, n_splits, Lq, Hq, Hkv, group, heads_per_block, Dk, Dv,
        LQ_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr,
        BLOCK_DV: tl.constexpr, HAS_QV: tl.constexpr, PRECISION: tl.constexpr,
    ):
        # One program: a block of group g's heads, all Lq new tokens, one split of the cache. Each head takes
        # LQ_BLOCK (Lq rounded up to a power of two) rows: at most 5 variants, and r // LQ_BLOCK is a shift.
        hb = tl.program_id(0)
        split = tl.program_id(1)
        bg = tl.program_id(2).to(tl.int64)  # int64: offsets reach 2^31 at 32 sequences x 128K tokens x 512 dims
        b = bg // Hkv
        g = bg % Hkv
        seqlen = tl.load(SEQLENS + b)
        # Row r of the tile is (head hb * heads_per_block + r // LQ_BLOCK of the group, new token r % LQ_BLOCK).
        rows = tl.arange(0, BLOCK_M)
        tok = rows % LQ_BLOCK
        head_in_group = hb * heads_per_block + rows // LQ_BLOCK
        row_ok = (tok < Lq) & (rows < heads_per_block * LQ_BLOCK) & (head_in_group < group)
        h = g * group + head_in_group  # int64, as g: every offset below may pass 2^31
        dk = tl.arange(0, BLOCK_DK)
        dv = tl.arange(0, BLOCK_DV)
        dk_ok = dk < Dk
        dv_ok = dv < Dv
        q = tl.load(Q + b * stride_qb + tok[:, None].to(tl.int64) * stride_ql + h[:, None] * stride_qh + dk[None, :],
                    mask=row_ok[:, None] & dk_ok[None, :], other=0.0)
        if HAS_QV:
            qv = tl.load(QV + b * stride_qvb + tok[:, None].to(tl.int64) * stride_qvl + h[:, None] * stride_qvh
                         + dv[None, :], mask=row_ok[:, None] & dv_ok[None, :], other=0.0)
        limit = seqlen - Lq + tok + 1  # new token i sees positions < limit (causal among the new)
        k_base = K + b * stride_kb + g * stride_kh  # stride_kh is 0 when one key head is shared
        v_base = V + b * stride_vb + g * stride_vh
        start = split * split_len
        end = tl.minimum(start + split_len, seqlen)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, log2 units
        l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(score - m_i)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)  # int32 in the masks, int64 in the offsets
            # Mask past the split's end: the loads (even V's: 0 * NaN garbage would poison acc) and the scores.
            pos_ok = pos < end
            k = tl.load(k_base + pos[:, None].to(tl.int64) * stride_ks + dk[None, :],
                        mask=pos_ok[:, None] & dk_ok[None, :], other=0.0)
            v = tl.load(v_base + pos[:, None].to(tl.int64) * stride_vs + dv[None, :],
                        mask=pos_ok[:, None] & dv_ok[None, :], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            if HAS_QV:  # the latent is also the non-rope key: scores = q.k_rope + qv.c
                s += tl.dot(qv, tl.trans(v), input_precision=PRECISION)
            s = tl.where(pos_ok[None, :] & (pos[None, :] < limit[:, None]), s * scale_log2, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            # A row may see nothing in this block (or split); we shift by 0 then so that
            # exp2(-inf - -inf) = NaN never appears.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(s - m_safe[:, None])
            alpha = tl.exp2(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        # A split that saw nothing for a row writes lse = -inf and 0: the combine ignores it.
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        out = acc / l_safe[:, None]
        part = ((b * Lq + tok) * Hq + h) * n_splits + split  # int64 (b, h); O_PART is (B, Lq, Hq, n_splits, Dv)
        tl.store(LSE_PART + part, lse, mask=row_ok)
        tl.store(O_PART + part[:, None] * Dv + dv[None, :], out.to(O_PART.dtype.element_ty),
                 mask=row_ok[:, None] & dv_ok[None, :])

    @triton.jit
    def _combine_kernel(O_PART, LSE_PART, OUT, stride_ob, stride_ol, stride_oh, Hq, Lq, n_splits, Dv,
                        BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
        # One program: one (b, new token, head) row, BLOCK_D features at a time; lse in log2 units, as written.
        row = tl.program_id(0).to(tl.int64)
        s = tl.arange(0, BLOCK_S)
        lse = tl.load(LSE_PART + row * n_splits + s, mask=s < n_splits, other=float("-inf"))
        m = tl.max(lse, 0)
        w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # each split's share of the softmax mass
        w = w / tl.sum(w, 0)
        b = row // (Hq * Lq)
        i = (row // Hq) % Lq
        h = row % Hq
        for d0 in range(0, Dv, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            o = tl.load(O_PART + (row * n_splits + s[:, None]) * Dv + d[None, :],
                        mask=(s[:, None] < n_splits) & (d[None, :] < Dv), other=0.0).to(tl.float32)
            out = tl.sum(w[:, None] * o, 0)
            tl.store(OUT + b * stride_ob + i * stride_ol + h * stride_oh + d,
                     out.to(OUT.dtype.element_ty), mask=d < Dv)


# ---- The launch choice. The autotuner picks the tile length, stages and warps among CONFIGS; we choose the grid:
# head blocks, so that the float32 accumulator (rows x Dv) stays in registers, and splits, so that a small batch
# fills the SMs.

if triton is not None:
    # The 16-token tile is for float32: MLA's 512-wide latent in float32 takes 110 KiB at 32 tokens (more than sm_86's
    # and sm_89's 99 KiB per block) and spills; the autotuner tries all five in either dtype.
    CONFIGS = [triton.Config({"BLOCK_N": n}, num_warps=4, num_stages=s)
               for n, s in ((32, 2), (32, 3), (32, 4), (64, 3), (16, 2))]
    # Keyed by the tile's shape, not the cache length (it grows every step); the interpreter takes the first config.
    _decode_split_kernel = triton.autotune(CONFIGS[:1] if INTERPRET else CONFIGS,
                                           key=["BLOCK_M", "BLOCK_DK", "BLOCK_DV", "HAS_QV"])(_split_kernel)
# A program's float32 accumulator, rows x Dv: 8192 elements are 64 registers a thread at 4 warps. The paper's MLA with
# double heads, 48 query heads on one 512-wide latent, would take 24K: we cut the group into head blocks of 16 heads.
ACC_ELEMS = 8192
SPLIT_ALIGN = 16  # split lengths in multiples of tl.dot's least tile
INTERPRETER_SMS = 132  # CPU tensors under the interpreter split as for an H100 or H200 (132 SMs)


def _split_launch(q, k_cache, v_cache, cache_seqlens, qv, scale, max_len, num_splits=None):
    """The split kernel's launch: (grid, args, meta, o_part, lse_part), its tile config left to the autotuner."""
    B, Lq, Hq, Dk = q.shape
    Hk, Hkv, Dv = k_cache.shape[2], v_cache.shape[2], v_cache.shape[3]
    G = Hq // Hkv
    LQ_BLOCK = triton.next_power_of_2(Lq)  # each head's rows
    BLOCK_DK = max(16, triton.next_power_of_2(Dk))  # tl.dot takes 16 columns or more
    BLOCK_DV = max(16, triton.next_power_of_2(Dv))
    n_head_blocks = triton.cdiv(G, max(1, ACC_ELEMS // (LQ_BLOCK * BLOCK_DV)))
    heads_per_block = triton.cdiv(G, n_head_blocks)  # as even as possible
    BLOCK_M = max(16, triton.next_power_of_2(heads_per_block * LQ_BLOCK))  # tl.dot takes 16 rows or more
    if num_splits is None:  # Flash-Decoding: split each sequence until the programs fill the SMs (one wave)
        num_sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else INTERPRETER_SMS
        num_splits = max(1, num_sms // (B * Hkv * n_head_blocks))
    split_len = triton.cdiv(triton.cdiv(max_len, num_splits), SPLIT_ALIGN) * SPLIT_ALIGN
    n_splits = triton.cdiv(max_len, split_len)
    # Partial outputs in the inputs' dtype (bf16 halves their traffic); their log-sum-exps in float32.
    o_part = torch.empty(B, Lq, Hq, n_splits, Dv, dtype=q.dtype, device=q.device)
    lse_part = torch.empty(B, Lq, Hq, n_splits, dtype=torch.float32, device=q.device)
    qv_arg = q if qv is None else qv  # any tensor: HAS_QV=False never reads it
    args = (q, qv_arg, k_cache, v_cache, cache_seqlens, o_part, lse_part,
            q.stride(0), q.stride(1), q.stride(2), qv_arg.stride(0), qv_arg.stride(1), qv_arg.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2) if Hk == Hkv else 0,
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            scale * LOG2E, split_len, n_splits, Lq, Hq, Hkv, G, heads_per_block, Dk, Dv)
    meta = dict(LQ_BLOCK=LQ_BLOCK, BLOCK_M=BLOCK_M, BLOCK_DK=BLOCK_DK, BLOCK_DV=BLOCK_DV, HAS_QV=qv is not None,
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32")  # 16-bit inputs ignore PRECISION
    return (n_head_blocks, n_splits, B * Hkv), args, meta, o_part, lse_part


def decode_attention(q, k_cache, v_cache, cache_seqlens, qv=None, softmax_scale=None, *, max_seqlen=None,
                     num_splits=None):
    """Decode attention over a KV cache with the Triton split-KV kernel, FA3's `flash_attn_with_kvcache` semantics.

    q (B, Lq, Hq, Dk): the rope query (GQA: the whole query) of Lq <= MAX_LQ new tokens per sequence; k_cache
    (B, S, Hk, Dk), Hk in {1, Hkv}: keys (MLA / GLA: the rope key); v_cache (B, S, Hkv, Dv): values (the latent);
    qv (B, Lq, Hq, Dv) or None: the absorbed query, adds qv . v to the scores; cache_seqlens (B,) int32: valid cached
    tokens, the new ones included (causal among themselves). Query head h uses value head h // (Hq // Hkv).
    max_seqlen: a host-side bound on cache_seqlens; num_splits: slices per sequence (None: enough to fill the GPU)."""
    B, Lq, Hq, Dk = q.shape
    S, Hk = k_cache.shape[1:3]
    Hkv, Dv = v_cache.shape[2:]
    # The kernel reads raw pointers: what it assumes, checked.
    assert triton is not None, "decode_attention needs Triton (Linux); use decode_attention_ref"
    assert q.is_cuda or INTERPRET, "CPU tensors need TRITON_INTERPRET=1 (or decode_attention_ref)"
    assert k_cache.shape == (B, S, Hk, Dk) and v_cache.shape[:2] == (B, S), "q, k_cache, v_cache: (B, L, H, D)"
    assert Hq % Hkv == 0 and Hk in (1, Hkv), "Hq a multiple of Hkv; Hk 1 (one shared key head) or Hkv"
    assert Lq <= MAX_LQ, f"at most MAX_LQ={MAX_LQ} new tokens a call; run a prompt through SDPA"
    assert qv is None or qv.shape == (B, Lq, Hq, Dv), "qv: (B, Lq, Hq, Dv)"
    assert q.is_floating_point() and all(t.dtype == q.dtype for t in (k_cache, v_cache, qv) if t is not None), \
        "one floating dtype"
    assert cache_seqlens.dtype == torch.int32 and cache_seqlens.shape == (B,), "cache_seqlens: (B,) int32"
    assert num_splits is None or (isinstance(num_splits, int) and num_splits >= 1), "num_splits: None or an int >= 1"
    max_len = int(cache_seqlens.max()) if max_seqlen is None else max_seqlen
    assert Lq <= max_len <= S, "max_seqlen (or max(cache_seqlens)) in [Lq, S]"
    assert all(t.stride(-1) == 1 for t in (q, k_cache, v_cache, qv) if t is not None), "features contiguous, as FA3's"
    scale = _default_scale(Dk, Dv, qv) if softmax_scale is None else softmax_scale
    grid, args, meta, o_part, lse_part = _split_launch(q, k_cache, v_cache, cache_seqlens.contiguous(), qv, scale,
                                                       max_len, num_splits)
    n_splits = grid[1]
    out = torch.empty(B, Lq, Hq, Dv, dtype=q.dtype, device=q.device)
    with torch.cuda.device(q.device) if q.is_cuda else nullcontext():  # launch on q's GPU, not the current one
        _decode_split_kernel[grid](*args, **meta)
        _combine_kernel[(B * Lq * Hq,)](o_part, lse_part, out, out.stride(0), out.stride(1), out.stride(2), Hq, Lq,
                                        n_splits, Dv, BLOCK_S=triton.next_power_of_2(n_splits),
                                        BLOCK_D=COMBINE_BLOCK_D)
    return out
