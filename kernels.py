"""Decode attention over a KV cache: a PyTorch reference and a Triton split-KV kernel.

One function serves the three cache designs of Zadouri, Strauss, Dao 2025 (arXiv 2505.21487, Sec. 3 and the decode
kernel), with the interface of FA3's `flash_attn_with_kvcache(q, k_cache, v_cache, qv=..., cache_seqlens=...)`:

    GQA   : q . k over Hkv key/value heads; qv = None, Dk = Dv.
    MLA   : the absorbed decode of DeepSeek-V2 (arXiv 2405.04434, Sec. 2.1): the latent c (Dv = 512) is the value
            AND the non-rope key, scores = q . k_rope + qv . c, one "KV head" (Hkv = Hk = 1) for every query head.
    GLA-2 : two latent heads of 256 (Hkv = 2), each shared by half of the query heads, and one rope key (Hk = 1).

Decode is mostly memory bound: a cached element takes part in one or two multiply-adds per row of its head group
(its query heads x new tokens), so the FLOPs per byte grow with the rows, and only groups of many heads with several
new tokens pass a GPU's ridge (its peak FLOP/s over its bandwidth; bench/roofline.py draws both). The floor of a call
is the larger of its bytes (the cached K and V of the valid tokens, each read once, + q, qv and the output) / HBM
bandwidth and its FLOPs / tensor-core peak. A GLA-2 head group reads 256 + 64 elements per token where MLA's one
group reads 512 + 64, and under TP-2 a device holds one.

    python bench/gpu_check.py     # on a GPU: the kernel against the reference, and the CUDA tests
    python bench/gpu_build.py     # no GPU: what the compiler makes of the kernel for sm_80/86/89/90 (--arch)
    python bench/kernel_speed.py  # on a GPU: time against the floor
"""
import functools
import math
from contextlib import nullcontext
from typing import NamedTuple

import torch
import torch.nn.functional as F

try:  # Triton is Linux-only in requirements; the reference must import without it.
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:
    triton = None

MAX_LQ = 16  # new tokens per call: a step or speculative drafts; the model runs a prompt through SDPA
COMBINE_BLOCK_D = 64
LOG2E = 1.4426950408889634


def _check_inputs(q, k_cache, v_cache, cache_seqlens, qv, max_seqlen=None):
    """Validate the decode inputs and return an upper bound on cache_seqlens; raises ValueError. max_seqlen None: we
    read cache_seqlens to check its range (on CUDA a host sync). An int: the caller promises cache_seqlens <=
    max_seqlen (a decode loop knows its length); we check shapes, dtypes and devices only."""
    # The messages are built only when raised: a model calls this in every layer of every decode step.
    def shapes():
        return f"q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}"

    def each(attribute):
        named = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "qv": qv}
        return ", ".join(f"{n} {getattr(t, attribute)}" for n, t in named.items() if t is not None)

    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.dim() != 4 or 0 in (*q.shape, *k_cache.shape, *v_cache.shape):
        raise ValueError(f"q, k_cache, v_cache must be 4-D (B, L, H, D) with every dimension >= 1; got {shapes()}")
    B, Lq, Hq, Dk = q.shape
    _, S, Hk, _ = k_cache.shape
    _, _, Hkv, Dv = v_cache.shape
    if k_cache.shape[:2] != v_cache.shape[:2] or k_cache.shape[0] != B:
        raise ValueError(f"q, k_cache, v_cache must share the batch B and the caches one length S; got {shapes()}")
    if k_cache.shape[3] != Dk:
        raise ValueError(f"k_cache head dim {k_cache.shape[3]} != q head dim {Dk}; q is the query of k_cache's width")
    if Hq % Hkv != 0:
        raise ValueError(f"Hq={Hq} query heads must be a multiple of Hkv={Hkv} value heads (one group per value head)")
    if Hk not in (1, Hkv):
        raise ValueError(f"k_cache has Hk={Hk} heads; expected 1 (one key head shared by all groups) or Hkv={Hkv}")
    if qv is not None and qv.shape != (B, Lq, Hq, Dv):
        raise ValueError(f"qv must have shape (B, Lq, Hq, Dv) = {(B, Lq, Hq, Dv)}; got {tuple(qv.shape)}")
    dtype, device = q.dtype, q.device
    if (not dtype.is_floating_point or k_cache.dtype != dtype or v_cache.dtype != dtype
            or (qv is not None and qv.dtype != dtype)):
        raise ValueError(f"q, k_cache, v_cache, qv must share one floating dtype; got {each('dtype')}")
    if cache_seqlens.dtype != torch.int32 or cache_seqlens.shape != (B,):
        raise ValueError(f"cache_seqlens must be int32 of shape ({B},); got {cache_seqlens.dtype} "
                         f"{tuple(cache_seqlens.shape)} (use .to(torch.int32))")
    if (k_cache.device != device or v_cache.device != device or cache_seqlens.device != device
            or (qv is not None and qv.device != device)):
        raise ValueError(f"all inputs must be on one device; got q on {device}, cache_seqlens on "
                         f"{cache_seqlens.device}, {each('device')}")
    if max_seqlen is not None:
        if not isinstance(max_seqlen, int) or not Lq <= max_seqlen <= S:
            raise ValueError(f"max_seqlen must be an int in [Lq, S] = [{Lq}, {S}]; got {max_seqlen!r}")
        return max_seqlen
    lo, hi = (int(x) for x in torch.aminmax(cache_seqlens))  # on CUDA: waits for the GPU
    if lo < Lq or hi > S:
        raise ValueError(f"cache_seqlens must lie in [Lq, S] = [{Lq}, {S}] (cached tokens, the Lq new ones "
                         f"included); got min {lo}, max {hi}")
    return hi


def _default_scale(Dk, Dv, qv):
    # As FA3: with qv the score sums two dot products, of Dk + Dv dimensions in all.
    return 1.0 / math.sqrt(Dk + Dv if qv is not None else Dk)


def decode_mask(positions, S):
    """The additive mask of decode attention for new tokens at positions (B, Lq) int64: (B, 1, Lq, S) float32, 0
    where token l of sequence b sees cache position s (s <= positions[b, l]: it sees itself), -inf elsewhere."""
    return torch.where(torch.arange(S, device=positions.device) <= positions[:, None, :, None], 0.0, float("-inf"))


def decode_attention_ref(q, k_cache, v_cache, cache_seqlens, qv=None, softmax_scale=None, *, max_seqlen=None,
                         mask=None):
    """Decode attention through F.scaled_dot_product_attention in float32: the kernel's oracle, and the model's
    decode path on CPU.

    Args and result as `decode_attention`, but cache slots past cache_seqlens must hold finite values (any: they
    get zero weight, and a KVCache holds zeros or older tokens there): a NaN would leak through SDPA's products,
    where the kernel never reads those slots. mask: decode_mask of the new tokens' positions (cache_seqlens - Lq + l)
    and max_seqlen, from a caller that runs many layers over one cache_seqlens (built here if None).

    As in the kernel's tile, the G = Hq // Hkv query heads of a group (h = g * G + k reads value head g) and the Lq
    new tokens are the rows of one query: SDPA runs Hkv heads of G x Lq rows over the cache where it lies ((B, H, S,
    D) views), on a CPU 2-3x faster at batch 8 than Hq heads of Lq rows (enable_gqa). MLA / GLA: the latent is
    SDPA's key and value, and the rope scores q . k_rope enter through its additive mask. 16-bit inputs are upcast
    to float32 (a copy of the valid cache); float32 ones are read in place.
    """
    S = _check_inputs(q, k_cache, v_cache, cache_seqlens, qv, max_seqlen)
    (B, Lq, Hq, Dk), dtype = q.shape, q.dtype
    Hk, Hkv, Dv = k_cache.shape[2], v_cache.shape[2], v_cache.shape[3]
    G = Hq // Hkv
    scale = _default_scale(Dk, Dv, qv) if softmax_scale is None else softmax_scale

    def rows(x):  # (B, Lq, Hq, D) -> (B, Hkv, G * Lq, D): row k * Lq + l of group g is head g * G + k, token l
        return x.float().transpose(1, 2).reshape(B, Hkv, G * Lq, x.shape[3])

    k, v = (t[:, :S].float().transpose(1, 2) for t in (k_cache, v_cache))  # (B, Hk or Hkv, S, D)
    if mask is None:  # new token l sits at position cache_seqlens - Lq + l
        mask = decode_mask((cache_seqlens - Lq)[:, None] + torch.arange(Lq, device=q.device), S)
    if Lq > 1:  # row k * Lq + l takes token l's row of the mask (one row serves all G heads at Lq = 1)
        mask = mask[:, :, None].expand(B, 1, G, Lq, S).reshape(B, 1, G * Lq, S)
    if qv is None:
        query, key = rows(q), k.expand(B, Hkv, S, Dk)  # a view: one shared key head serves every group
    else:  # scores = q . k_rope + qv . c: the latent is also the non-rope key
        query, key = rows(qv), v
        # One product per key head for all its query heads: the shared rope key (Hk = 1) is read once, not copied
        # per group (at batch 8, 16K that copy made GLA-2 1.7x slower). Rows (B, Hk, Hq / Hk * Lq, S) are (B, Hkv,
        # G * Lq, S) grouped by value head.
        q_rows = (q.float() * scale).transpose(1, 2).reshape(B, Hk, -1, Dk)
        mask = torch.matmul(q_rows, k.transpose(2, 3)).view(B, Hkv, G * Lq, S).add_(mask)
    out = F.scaled_dot_product_attention(query, key, v, attn_mask=mask, scale=scale)  # (B, Hkv, G * Lq, Dv)
    return out.view(B, Hq, Lq, Dv).transpose(1, 2).to(dtype)  # (B, Lq, Hq, Dv)


# ----------------------------------------------------------------------------
# The Triton kernel: split-KV ("flash decoding"). Each program takes the query heads of one KV / latent head group
# (or a block of them) and all Lq new tokens as the rows of one tile, over one slice of the cached sequence, with
# FlashAttention's online softmax; a second kernel combines the slices by their log-sum-exps.

if triton is not None:

    @triton.jit
    def _decode_split_kernel(
        Q, QV, K, V, SEQLENS, O_PART, LSE_PART,
        stride_qb, stride_ql, stride_qh, stride_qvb, stride_qvl, stride_qvh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        scale_log2, split_len, n_splits, Lq, Hq, Hkv, group, heads_per_block, Dk, Dv,
        LQ_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr,
        BLOCK_DV: tl.constexpr, HAS_QV: tl.constexpr, PRECISION: tl.constexpr,
    ):
        # One program: heads [hb * heads_per_block, (hb + 1) * heads_per_block) of group g,
        # all Lq new tokens, cache positions [split * split_len, (split + 1) * split_len).
        # Each head takes LQ_BLOCK (Lq rounded up to a power of two) rows: Lq up to MAX_LQ
        # compiles at most 5 variants, and r // LQ_BLOCK is a shift, not a division.
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
            # Masking loads past seqlen matters even for V: 0 * NaN garbage would poison acc.
            pos_ok = pos < end
            k = tl.load(k_base + pos[:, None].to(tl.int64) * stride_ks + dk[None, :],
                        mask=pos_ok[:, None] & dk_ok[None, :], other=0.0)
            v = tl.load(v_base + pos[:, None].to(tl.int64) * stride_vs + dv[None, :],
                        mask=pos_ok[:, None] & dv_ok[None, :], other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            if HAS_QV:  # the latent is also the non-rope key: scores = q.k_rope + qv.c
                s += tl.dot(qv, tl.trans(v), input_precision=PRECISION)
            s = tl.where(pos[None, :] < limit[:, None], s * scale_log2, float("-inf"))
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


# ----------------------------------------------------------------------------
# The wrapper: it checks the inputs, asks the launch plan (the next section) for the tiles, pipeline stages, head
# blocks and split count that fit this device, and launches the split kernel, then the combine.


def _split_launch(q, k_cache, v_cache, cache_seqlens, qv, scale, max_len, num_splits, limits):
    """The split kernel's launch for one call on a device of these DeviceLimits: (plan, grid, args, kwargs, o_part,
    lse_part). decode_attention launches exactly this; bench/gpu_build.py compiles it from meta tensors per target."""
    B, Lq, Hq, Dk = q.shape
    Hk, Hkv, Dv = k_cache.shape[2], v_cache.shape[2], v_cache.shape[3]
    p = _plan(B, Lq, Hq, Hkv, Hk, Dk, Dv, qv is not None, q.element_size(), max_len, num_splits, limits)
    n_splits = p["n_splits"]
    # Partial outputs in the inputs' dtype (bf16 halves their traffic; the log-sum-exps
    # that weigh them stay float32), float32 for float32 inputs.
    o_part = torch.empty(B, Lq, Hq, n_splits, Dv, dtype=q.dtype, device=q.device)
    lse_part = torch.empty(B, Lq, Hq, n_splits, dtype=torch.float32, device=q.device)
    qv_arg = q if qv is None else qv  # any tensor: HAS_QV=False never reads it
    args = (q, qv_arg, k_cache, v_cache, cache_seqlens, o_part, lse_part,
            q.stride(0), q.stride(1), q.stride(2), qv_arg.stride(0), qv_arg.stride(1), qv_arg.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2) if Hk == Hkv else 0,
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            scale * LOG2E, p["split_len"], n_splits, Lq, Hq, Hkv, Hq // Hkv, p["heads_per_block"], Dk, Dv)
    kwargs = dict({k: p[k] for k in ("LQ_BLOCK", "BLOCK_M", "BLOCK_N", "BLOCK_DK", "BLOCK_DV")}, HAS_QV=qv is not None,
                  PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # 16-bit inputs ignore it
                  num_warps=p["num_warps"], num_stages=p["num_stages"], maxnreg=p["maxnreg"])
    return p, (p["n_head_blocks"], n_splits, B * Hkv), args, kwargs, o_part, lse_part


def decode_attention(q, k_cache, v_cache, cache_seqlens, qv=None, softmax_scale=None, *,
                     max_seqlen=None, num_splits=None, out=None):
    """Decode attention over a KV cache with the Triton split-KV kernel, FA3's `flash_attn_with_kvcache` semantics.

    q (B, Lq, Hq, Dk): the rope query (GQA: the whole query) of Lq <= MAX_LQ new tokens per sequence; k_cache
    (B, S, Hk, Dk), Hk in {1, Hkv}: keys (MLA / GLA: the rope key); v_cache (B, S, Hkv, Dv): values (the latent);
    qv (B, Lq, Hq, Dv) or None: the absorbed query, adds qv . v to the scores; cache_seqlens (B,) int32: valid cached
    tokens, the new ones included (causal among themselves). Query head h uses value head h // (Hq // Hkv), and that
    key head when Hk == Hkv. softmax_scale: 1/sqrt(Dk + Dv) with qv, else 1/sqrt(Dk). max_seqlen: a host-side bound
    on cache_seqlens (given, nothing waits for the GPU); num_splits: None (the plan's) or a positive int, the cache
    slices each sequence is cut into; out receives the result. The launch plan fits the GPU's own limits (its compute
    capability, SMs and shared memory, read once per device; without CUDA, an sm_90's: DEFAULT_LIMITS).
    Returns (B, Lq, Hq, Dv) in q's dtype, accumulated in float32. Raises ValueError on inconsistent inputs, a
    num_splits that is not a positive int, Lq > MAX_LQ (a prompt: use F.scaled_dot_product_attention), a head dim too
    wide for the GPU's shared memory per block (no launch plan fits), or CPU tensors without TRITON_INTERPRET=1;
    RuntimeError without Triton.
    """
    if triton is None:
        raise RuntimeError("decode_attention needs Triton (Linux); use decode_attention_ref instead")
    max_len = _check_inputs(q, k_cache, v_cache, cache_seqlens, qv, max_seqlen)
    B, Lq, Hq, Dk = q.shape
    Dv = v_cache.shape[3]
    if Lq > MAX_LQ:
        raise ValueError(f"decode_attention takes at most MAX_LQ={MAX_LQ} new tokens per sequence; got Lq={Lq}: "
                         "run a prompt (prefill) through F.scaled_dot_product_attention instead")
    if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be None (the launch plan's choice) or a positive int; got {num_splits!r}")
    if q.device.type != "cuda" and not isinstance(_decode_split_kernel, InterpretedFunction):
        raise ValueError("decode_attention needs CUDA tensors; on CPU use decode_attention_ref, "
                         "or set TRITON_INTERPRET=1 before importing triton")
    out = torch.empty(B, Lq, Hq, Dv, dtype=q.dtype, device=q.device) if out is None else out
    if out.shape != (B, Lq, Hq, Dv) or out.dtype != q.dtype or out.device != q.device or out.stride(-1) != 1:
        raise ValueError(f"out must be {q.dtype} of shape {(B, Lq, Hq, Dv)} on {q.device} with unit last stride; "
                         f"got {out.dtype} {tuple(out.shape)} on {out.device}")
    # The pointer arithmetic assumes unit stride along features (and along cache_seqlens).
    q, k_cache, v_cache, qv = (t if t is None or t.stride(-1) == 1 else t.contiguous()
                               for t in (q, k_cache, v_cache, qv))
    scale = _default_scale(Dk, Dv, qv) if softmax_scale is None else softmax_scale
    # The plan is made for this GPU's limits; the interpreter on CPU tensors plans as for an sm_90 GPU.
    limits = device_limits(q.device.index) if q.is_cuda else DEFAULT_LIMITS
    _, grid, args, kwargs, o_part, lse_part = _split_launch(q, k_cache, v_cache, cache_seqlens.contiguous(), qv,
                                                            scale, max_len, num_splits, limits)
    with torch.cuda.device(q.device) if q.is_cuda else nullcontext():  # launch on q's GPU, not the current one
        _decode_split_kernel[grid](*args, **kwargs)
        _combine_kernel[(B * Lq * Hq,)](o_part, lse_part, out, out.stride(0), out.stride(1), out.stride(2), Hq, Lq,
                                        o_part.shape[3], Dv, BLOCK_S=triton.next_power_of_2(o_part.shape[3]),
                                        BLOCK_D=COMBINE_BLOCK_D)
    return out


# ============================================================================
# The launch plan. A first reader may stop here: the reference, the two kernels and the wrapper above are the whole
# algorithm. What follows answers one question for decode_attention, `_plan`: which tile sizes, pipeline stages, head
# blocks and split count should this call launch with on this GPU? It fits the choices to the GPU's limits
# (DeviceLimits: compute capability, SMs, shared memory per block and per SM) and ranks those that fit with a
# performance model of the call, made for an sm_90 GPU: its bytes at HBM bandwidth under Little's law, its FLOPs at
# the peak of the tensor-core instructions it issues. `python bench/gpu_build.py --arch {80,86,89,90}` compiles the
# kernel with these plans ahead of time, on a CPU, and checks that every build fits its target.


class DeviceLimits(NamedTuple):
    """What the plan needs to know of a GPU: its compute capability (major, minor), its SMs, and the most shared memory
    (bytes) one block may take (with the opt-in) and one SM holds. The CUDA C++ Programming Guide's "Technical
    Specifications per Compute Capability" gives the shared memory: 163 and 164 KiB for compute capability 8.0, 99
    and 100 KiB for 8.6 and 8.9, 227 and 228 KiB for 9.0 (a block gets 1 KiB less than the SM: CUDA reserves it)."""
    capability: tuple
    num_sms: int
    smem_per_block: int
    smem_per_sm: int


KIB = 1024
# Without a CUDA device (Triton's interpreter, the CPU tests) we plan for compute capability 9.0 with 132 SMs (an H100
# or H200 SXM): the GPU the performance model below is made for (its bandwidth is the H200's).
DEFAULT_LIMITS = DeviceLimits(capability=(9, 0), num_sms=132, smem_per_block=227 * KIB, smem_per_sm=228 * KIB)
# The capabilities whose builds bench/gpu_build.py compiles and checks: on them the plan fills shared memory with
# pipeline stages. A GPU of any other capability gets SAFE_STAGES, the fewest (below), which its shared memory fits.
PIPELINED_CAPABILITIES = ((8, 0), (8, 6), (8, 9), (9, 0))
# Hopper's wgmma (HGMMA in SASS) exists on compute capability 9.0 only; Triton issues it for tiles of
# WGMMA_MIN_BLOCK_M rows or more (one warpgroup's M). Smaller tiles there, and every tile elsewhere, get the older
# mma.sync (HMMA).
WGMMA_CAPABILITY = (9, 0)
WGMMA_MIN_BLOCK_M = 64

NUM_WARPS = 4  # one warpgroup: the unit of a Hopper wgmma
MIN_BLOCK = 16  # tl.dot needs every dimension >= 16
MAX_BLOCK_N = 128
# A program's fp32 accumulator (BLOCK_M rows x Dv) lives in registers. Through wgmma (HGMMA) 16K elements are 128 a
# thread (of 255), its operands in shared memory; two CTAs of 4 warps still fit an SM's 64K registers (every
# capability here has 64K). mma.sync (HMMA) also holds its operand fragments and the scores in registers: with 16K
# accumulators Triton 3.9's builds take 244-255 registers and some spill (64 x 256 tiles on sm_89; 24 heads in 32
# rows on sm_90), with 8K they take about 140, so we give it 8K. Up to 4K elements (32 a thread) we count on 3 CTAs
# per SM, else on 2.
MAX_ACC_ELEMS = {"HGMMA": 16384, "HMMA": 8192}
SMALL_ACC_ELEMS = 4096
CTAS_PER_SM_SMALL_ACC = 3
CTAS_PER_SM = 2
# Left to itself, ptxas may aim at fewer registers a thread than the planned CTAs per SM leave, and spill (sm_80:
# 128 registers and 8 B of stack for MLA's 16 x 512 tiles at 4 stages; 189 registers and no stack under .maxnreg
# 255). We give each thread what the planned CTAs leave it (Triton's maxnreg, PTX's .maxnreg): a multiple of 8, as
# registers are allocated 256 a warp, up to the 255 a thread may address.
REGS_PER_SM = 65536
MAX_REGS_PER_THREAD = 255
# A stage loads about 16 KiB of K and V, in a power of two of tokens (16 at least: tl.dot's floor): GQA 32 tokens x
# (128 + 128) dims in bf16 = 16 KiB, MLA 16 x (64 + 512) = 18 KiB, GLA-2 16 x (64 + 256) = 10 KiB.
KV_TILE_BYTES = 16 * 1024
# Triton's num_stages = s keeps s - 2 K/V tiles arriving by cp.async while the loop computes on another, in s - 1
# shared-memory buffers (one more where wgmma reads its operand from one). We take as many stages as fit a CTA's
# share of the SM, from MIN_STAGES (one tile in flight) to MAX_STAGES (4 tiles, 40 to 72 KiB in flight).
MIN_STAGES = 3
MAX_STAGES = 6
# SAFE_STAGES = 2 loads a tile, then computes on it: nothing in flight, one buffer, the least shared memory (Triton
# 3.9's num_stages = 1 takes more: 68 KiB against 55 for MLA's 32 x 576 tiles on sm_89). The plan of a GPU of a
# capability we have not checked, and of a tile too wide for MIN_STAGES.
SAFE_STAGES = 2
SMEM_RESERVED_PER_CTA = 1024  # CUDA keeps 1 KiB of an SM's shared memory per resident block (the guide, as above)
# The compiler's own shared memory: the scores P (BLOCK_M x BLOCK_N, in the inputs' dtype) on their way from the
# accumulator's layout to the operand's, and SMEM_SCRATCH more: 1 KiB on sm_90, none on sm_80, sm_86 and sm_89 in
# Triton 3.9's builds of every row of bench/gpu_build.py's tables (its tests hold each target's widest builds to
# shared_bytes' count).
SMEM_SCRATCH = 1024
# Head blocks: a group whose heads x Lq rows overflow MAX_ACC_ELEMS is split into head blocks, each reading the
# group's cache again (passes, meant to hit the 50 MB L2: the head blocks of a tile start together). At batch 1, more
# head blocks than the registers need give more programs per split, so fewer splits and partials: up to MAX_PASSES,
# for a modelled gain above MIN_GAIN (the model counts the repeats as free; a GPU may not).
MAX_PASSES = 4
MIN_GAIN = 0.01
# The memory model: a call moves its bytes (the cache of the valid tokens once, q, qv, the output, and the partials
# written and read back by the combine) at min(HBM bandwidth, bytes in flight / latency), Little's law: streaming
# 4.8 TB/s (an H200's specification) with an assumed 0.8 us latency takes 3.8 MB of K/V loads in flight.
HBM_BYTES_PER_S = 4.8e12
HBM_LATENCY_S = 0.8e-6
# The compute floor (16-bit inputs): the call's FLOPs at the peak of the MMA instructions it issues. An H100 or H200
# SXM does 989 TFLOP/s of dense bf16 (NVIDIA's datasheets: 1979 with 2:4 sparsity) through wgmma (HGMMA), and
# mma.sync (HMMA) reaches about 2/3 of that peak (Shah et al., FlashAttention-3, arXiv 2407.08608, Sec. 2.2).
# bench/gpu_build.py checks each build's SASS against the MMA kind the plan counts on. On other GPUs the plan ranks
# its choices with these sm_90 figures: they order the choices, the GPU's own figures would scale them.
TENSOR_FLOPS_PER_S = {"HGMMA": 989e12, "HMMA": 989e12 * 2 / 3}
# Where a launch fills half the SMs or more, mean over max programs per SM >= MIN_BALANCE.
MIN_BALANCE = 0.9


@functools.cache
def device_limits(index):
    """DeviceLimits of CUDA device `index` (an int), read once per device from torch.cuda.get_device_properties:
    (major, minor), multi_processor_count, shared_memory_per_block_optin and shared_memory_per_multiprocessor."""
    props = torch.cuda.get_device_properties(index)
    return DeviceLimits(capability=(props.major, props.minor), num_sms=props.multi_processor_count,
                        smem_per_block=props.shared_memory_per_block_optin,
                        smem_per_sm=props.shared_memory_per_multiprocessor)


def _pow2(n):
    return max(MIN_BLOCK, triton.next_power_of_2(n))


def call_bytes(B, Lq, Hq, Hk, Hkv, Dk, Dv, has_qv, seqlen, elem_bytes, n_splits):
    """(cache, io, partials): bytes of one call's cached K and V (B sequences of seqlen tokens,
    read once), of q, qv and the output, and of the partial outputs (in the inputs' dtype) and
    their float32 log-sum-exps, written by the split kernel and read back by the combine."""
    return (B * seqlen * (Hk * Dk + Hkv * Dv) * elem_bytes, B * Lq * Hq * (Dk + has_qv * Dv + Dv) * elem_bytes,
            2 * B * Lq * Hq * n_splits * (Dv * elem_bytes + 4))


def call_flops(B, Lq, Hq, Dk, Dv, has_qv, seqlen):
    """FLOPs of one call's two products as the kernel does them, 2 a multiply-add: per row (query head x new token)
    and cached token (B sequences of seqlen), the scores over Dk (+ Dv with qv) and P.V over Dv. Over call_bytes'
    cache bytes that is the arithmetic intensity of Zadouri, Strauss, Dao 2025 (arXiv 2505.21487), Sec. 3."""
    return 2 * B * Lq * Hq * seqlen * (Dk + has_qv * Dv + Dv)


def modelled_seconds(nbytes, flops, mma, programs, ctas_per_sm, kv_bytes_in_flight, num_sms):
    """(model, memory) seconds of a call. memory: nbytes at min(HBM_BYTES_PER_S, bytes in flight / HBM_LATENCY_S),
    where min(programs, num_sms x ctas_per_sm) programs run at once, each with kv_bytes_in_flight bytes of K/V loads
    outstanding. model: never under the compute floor, max(memory, flops / TENSOR_FLOPS_PER_S[mma]), mma "HGMMA" or
    "HMMA": the MMAs and the loads overlap at best."""
    in_flight = min(programs, num_sms * ctas_per_sm) * kv_bytes_in_flight
    memory = nbytes / min(HBM_BYTES_PER_S, in_flight / HBM_LATENCY_S) if in_flight else math.inf
    return max(memory, flops / TENSOR_FLOPS_PER_S[mma]), memory


def shared_bytes(BLOCK_M, BLOCK_N, BLOCK_DK, BLOCK_DV, has_qv, num_stages, mma, elem_bytes):
    """Shared memory of one CTA (bytes) as the builds show it: the q (and qv) tiles of BLOCK_M rows, num_stages - 1
    buffers of a K/V tile of BLOCK_N tokens (one more for wgmma, mma "HGMMA"), the scores' tile and SMEM_SCRATCH."""
    buffers = num_stages - 1 + (1 if mma == "HGMMA" else 0)
    q_tiles = BLOCK_M * (BLOCK_DK + (BLOCK_DV if has_qv else 0)) * elem_bytes
    kv_tile = BLOCK_N * (BLOCK_DK + BLOCK_DV) * elem_bytes
    return q_tiles + buffers * kv_tile + BLOCK_M * BLOCK_N * elem_bytes + SMEM_SCRATCH


def _fit_stages(BLOCK_M, BLOCK_N, BLOCK_DK, BLOCK_DV, has_qv, mma, elem_bytes, ctas_by_registers, limits):
    """(num_stages, ctas_per_sm) of a tile on a GPU of these DeviceLimits, or None if not even SAFE_STAGES fit a
    block. On PIPELINED_CAPABILITIES: for each CTAs per SM up to ctas_by_registers, as many stages as a CTA's share of
    the SM (less CUDA's reserve) holds, up to MAX_STAGES; of those with MIN_STAGES or more, the most K/V tiles in
    flight per SM (Little's law wants bytes in flight), ties to more CTAs (they hide each other's waits). Otherwise
    SAFE_STAGES, and as many CTAs per SM (up to ctas_by_registers) as its shared memory holds."""
    if limits.capability in PIPELINED_CAPABILITIES:
        best = None
        for ctas_per_sm in range(1, ctas_by_registers + 1):
            budget = min(limits.smem_per_block, limits.smem_per_sm // ctas_per_sm - SMEM_RESERVED_PER_CTA)
            stages = MIN_STAGES - 1
            while stages < MAX_STAGES and shared_bytes(BLOCK_M, BLOCK_N, BLOCK_DK, BLOCK_DV, has_qv, stages + 1,
                                                       mma, elem_bytes) <= budget:
                stages += 1
            if stages >= MIN_STAGES and (best is None or ctas_per_sm * (stages - 2) >= best[1] * (best[0] - 2)):
                best = stages, ctas_per_sm
        if best is not None:
            return best
    smem = shared_bytes(BLOCK_M, BLOCK_N, BLOCK_DK, BLOCK_DV, has_qv, SAFE_STAGES, mma, elem_bytes)
    if smem > limits.smem_per_block:
        return None
    return SAFE_STAGES, max(1, min(ctas_by_registers, limits.smem_per_sm // (smem + SMEM_RESERVED_PER_CTA)))


def _mma(BLOCK_M, limits):
    """The tensor-core instruction a tile of BLOCK_M rows gets: "HGMMA" (wgmma) on WGMMA_CAPABILITY from
    WGMMA_MIN_BLOCK_M rows, else "HMMA" (mma.sync)."""
    return "HGMMA" if limits.capability == WGMMA_CAPABILITY and BLOCK_M >= WGMMA_MIN_BLOCK_M else "HMMA"


def _acc_fits(BLOCK_M, BLOCK_DV, limits):
    """Whether a tile's accumulators fit MAX_ACC_ELEMS of its MMA kind; the smallest tile (MIN_BLOCK rows) always
    does: a wider head dim gets it, with spills, rather than no plan."""
    return BLOCK_M == MIN_BLOCK or BLOCK_M * BLOCK_DV <= MAX_ACC_ELEMS[_mma(BLOCK_M, limits)]


def _rows(G, n_head_blocks, LQ_BLOCK):
    """BLOCK_M of a group of G heads in n_head_blocks head blocks: its heads x LQ_BLOCK rows, a power of two."""
    return _pow2(triton.cdiv(G, n_head_blocks) * LQ_BLOCK)


def _max_registers(ctas_per_sm):
    """Registers a thread may take (maxnreg) when ctas_per_sm CTAs of NUM_WARPS warps share an SM's REGS_PER_SM."""
    return min(MAX_REGS_PER_THREAD, REGS_PER_SM // (ctas_per_sm * NUM_WARPS * 32) // 8 * 8)


def _split_choices(units, n_blocks, ctas_per_sm, num_sms, kv_bytes_in_flight):
    """Split counts worth modelling with `units` (batch x KV head x head block) programs each:
    none; the most under half the SMs, up to what fills HBM's bytes in flight (more only add
    partials); and for 1 to ctas_per_sm waves, the most that fit them at MIN_BALANCE."""
    saturate = math.ceil(HBM_BYTES_PER_S * HBM_LATENCY_S / (units * kv_bytes_in_flight))
    choices = {1, min(saturate, (num_sms // 2 - 1) // units)}
    for waves in range(1, ctas_per_sm + 1):
        splits = waves * num_sms // units
        if units * splits >= MIN_BALANCE * waves * num_sms:
            choices.add(splits)
    return sorted({min(c, n_blocks) for c in choices if c >= 1})


def _gains(seconds, best, same_head_blocks):
    """Whether a choice beats the best so far: by MIN_GAIN, or at all with as many head blocks."""
    return seconds < best * (1 - MIN_GAIN) or (seconds < best and same_head_blocks)


@functools.lru_cache(maxsize=4096)
def _plan(B, Lq, Hq, Hkv, Hk, Dk, Dv, has_qv, elem_bytes, max_len, num_splits, limits):
    """Block sizes, head blocks, stages, CTAs per SM, registers a thread (maxnreg), split count, MMA kind and shared
    bytes (`smem`) of one call on a GPU of these DeviceLimits: of the head-block and split counts above whose tiles
    fit (_fit_stages), the one modelled fastest (modelled_seconds; among those on the compute floor, the memory
    model's fastest). It sees Lq only as LQ_BLOCK (its power of two: Lq up to MAX_LQ compiles at most 5 variants); a
    decode loop at batch 1 may switch head blocks (one more compile) as its cache grows. Raises ValueError, naming
    the shape and the GPU's shared memory per block, if no tile fits it."""
    G = Hq // Hkv
    BLOCK_DK, BLOCK_DV = _pow2(Dk), _pow2(Dv)
    LQ_BLOCK = triton.next_power_of_2(Lq)
    tokens = max(1, KV_TILE_BYTES // ((BLOCK_DK + BLOCK_DV) * elem_bytes))  # 1: a token wider than a tile
    BLOCK_N = max(MIN_BLOCK, min(MAX_BLOCK_N, 1 << (tokens.bit_length() - 1)))  # its power of two, within bounds
    n_blocks = triton.cdiv(max_len, BLOCK_N)
    flops = call_flops(B, LQ_BLOCK, Hq, Dk, Dv, has_qv, max_len)
    tile_bytes = BLOCK_N * (Dk + Dv) * elem_bytes  # what one stage loads from memory
    # All G x LQ_BLOCK rows of a group in one program, unless they overflow MAX_ACC_ELEMS of their MMA kind:
    # 64 query heads on one 512-wide latent (DeepSeek-V3's 128 heads under TP-2, FlashMLA's case) would take 128 KiB
    # of float32 accumulators, half an SM's registers (FlashMLA's choice: one CTA per SM, two warpgroups); we split
    # them into head blocks.
    # More head blocks than the fewest have fewer rows, whose accumulators fit too (up to 64 x 256 through wgmma, so
    # up to 32 x 256 through mma.sync).
    fewest = next(n for n in range(1, G + 1) if _acc_fits(_rows(G, n, LQ_BLOCK), BLOCK_DV, limits))
    best, n_head_blocks = None, fewest
    least_smem, least_rows = math.inf, None  # the smallest tiles tried, for the error if none fits
    while True:
        heads_per_block = triton.cdiv(G, n_head_blocks)
        n_head_blocks = triton.cdiv(G, heads_per_block)  # as even as possible
        BLOCK_M = _rows(G, n_head_blocks, LQ_BLOCK)
        mma = _mma(BLOCK_M, limits)
        ctas_by_registers = CTAS_PER_SM_SMALL_ACC if BLOCK_M * BLOCK_DV <= SMALL_ACC_ELEMS else CTAS_PER_SM
        fit = _fit_stages(BLOCK_M, BLOCK_N, BLOCK_DK, BLOCK_DV, has_qv, mma, elem_bytes, ctas_by_registers, limits)
        smem = shared_bytes(BLOCK_M, BLOCK_N, BLOCK_DK, BLOCK_DV, has_qv, SAFE_STAGES, mma, elem_bytes)
        if smem < least_smem:
            least_smem, least_rows = smem, BLOCK_M
        if fit is not None:
            num_stages, ctas_per_sm = fit
            # A single-buffered loop (SAFE_STAGES) still has its one tile's loads outstanding while it waits.
            in_flight = max(num_stages - 2, 1) * tile_bytes
            units = B * Hkv * n_head_blocks
            if num_splits is not None:
                split_counts = [num_splits]
            else:
                split_counts = _split_choices(units, n_blocks, ctas_per_sm, limits.num_sms, in_flight)
            for splits in split_counts:
                split_len = triton.cdiv(n_blocks, max(1, min(splits, n_blocks))) * BLOCK_N
                n_splits = triton.cdiv(max_len, split_len)
                nbytes = sum(call_bytes(B, LQ_BLOCK, Hq, Hk, Hkv, Dk, Dv, has_qv, max_len, elem_bytes, n_splits))
                seconds, memory = modelled_seconds(nbytes, flops, mma, units * n_splits, ctas_per_sm, in_flight,
                                                   limits.num_sms)
                # Where several choices sit on the compute floor, the memory model tells them apart.
                if (best is None or _gains(seconds, best["seconds"], False) or (seconds <= best["seconds"] and
                        _gains(memory, best["memory_seconds"], n_head_blocks == best["n_head_blocks"]))):
                    best = dict(LQ_BLOCK=LQ_BLOCK, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_DK=BLOCK_DK,
                                BLOCK_DV=BLOCK_DV, heads_per_block=heads_per_block, n_head_blocks=n_head_blocks,
                                split_len=split_len, n_splits=n_splits, ctas_per_sm=ctas_per_sm,
                                num_warps=NUM_WARPS, num_stages=num_stages, maxnreg=_max_registers(ctas_per_sm),
                                tile_bytes=tile_bytes, mma=mma,
                                smem=shared_bytes(BLOCK_M, BLOCK_N, BLOCK_DK, BLOCK_DV, has_qv, num_stages, mma,
                                                  elem_bytes),
                                seconds=seconds, memory_seconds=memory)
        more = 2 * n_head_blocks
        if more > min(G, max(fewest, MAX_PASSES)) or triton.cdiv(G, more) * LQ_BLOCK < MIN_BLOCK:
            break
        n_head_blocks = more
    if best is None:
        major, minor = limits.capability
        raise ValueError(
            f"decode_attention: no launch plan fits this GPU's shared memory: Hq={Hq} query heads in Hkv={Hkv} "
            f"groups, Dk={Dk}, Dv={Dv}{' with qv' if has_qv else ''}, Lq={Lq}, {elem_bytes}-byte elements need at "
            f"least {least_smem / KIB:.1f} KiB a block (q tiles of {least_rows} rows and one K/V tile of {BLOCK_N} "
            f"tokens), and compute capability {major}.{minor} gives a block at most {limits.smem_per_block / KIB:.0f} "
            "KiB; use narrower heads or a GPU with more shared memory per block")
    return best
