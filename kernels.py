"""Decode attention over a KV cache: a Triton split-KV kernel and its PyTorch reference.

One function serves the three cache designs of "Hardware-Efficient Attention for
Fast Decoding" (Zadouri, Strauss, Dao 2025, arXiv 2505.21487, sections on GLA and
on the decode kernel), with the interface of FA3's
`flash_attn_with_kvcache(q, k_cache, v_cache, qv=..., cache_seqlens=...)`:

    GQA   : q . k over Hkv key/value heads, qv = None, Dk = Dv.
    MLA   : absorbed decode (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1): the latent c
            (Dv = 512) is the value AND the non-rope key; scores = qv . c + q . k_rope,
            one "KV head" (Hkv = Hk = 1) shared by every query head.
    GLA-2 : two latent heads of 256 (Hkv = 2), each shared by half of the query heads,
            and one shared rope key (Hk = 1, stored once, not per latent head).

Why decode is memory bound, and the floor we measure against. Each cached element
we load takes part in one or two multiply-adds per row of its head group (heads
per group x Lq new tokens: 8 to 128 rows here), so a step does roughly `rows`
FLOPs per byte read. An H200 needs ~200 FLOP/byte (~990 bf16 TFLOP/s over
~4.8 TB/s) before compute becomes the limit, so the tensor cores mostly wait on
HBM, and the best a kernel can do is to read every byte once:

    floor_seconds = (bytes of cached K and V of the valid tokens, each read once
                     + bytes of q, qv and the output) / HBM bandwidth

GLA-2 halves the bytes per head group compared with MLA (256 + 64 instead of
512 + 64 elements per token), and under TP-2 each device reads only its own
latent head. `python kernels.py --bench` reports the percentage of this floor.
"""
import argparse
import math
import sys
from contextlib import nullcontext

import torch

try:  # Triton is Linux-only in requirements; the reference path must import without it.
    import triton
    import triton.language as tl
    import triton.testing
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:
    triton = None

# Tile sizing. We keep one program's fp32 accumulator (rows x Dv) at or under
# MAX_ACC_ELEMS so it stays in registers, and one stage of the K+V tile at or under
# KV_TILE_BYTES of shared memory (two stages fit an H100/H200's 228 KiB).
MAX_ACC_ELEMS = 16384
KV_TILE_BYTES = 64 * 1024
MIN_BLOCK = 16  # tl.dot needs every dimension >= 16
MAX_BLOCK_N = 128
NUM_STAGES = 2
SMALL_TILE_ELEMS = 4096  # tiles up to this many accumulator elements use 4 warps, larger ones 8
# Split-KV sizing: enough programs to fill the GPU's SMs (H200: 132), but we stop
# splitting once the fp32 partial outputs (written, then read back by the combine
# step) would exceed MAX_PARTIAL_TRAFFIC of the cache bytes the kernel reads.
DEFAULT_NUM_SMS = 132
MAX_PARTIAL_TRAFFIC = 0.125
COMBINE_BLOCK_D = 64
LOG2E = 1.4426950408889634


def _check_inputs(q, k_cache, v_cache, cache_seqlens, qv, max_seqlen=None):
    """Validate the decode inputs; return an upper bound on cache_seqlens (int). Raises ValueError.

    max_seqlen None: we read cache_seqlens to check its range (on CUDA a host sync)
    and return its max. max_seqlen an int: the caller promises cache_seqlens <=
    max_seqlen (a decode loop knows its length on the host); we check only shapes,
    dtypes and devices, so nothing waits for the GPU, and return max_seqlen.
    """
    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError(f"q, k_cache, v_cache must be 4-D (B, L, H, D); got shapes "
                         f"{tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    B, Lq, Hq, Dk = q.shape
    _, S, Hk, _ = k_cache.shape
    _, _, Hkv, Dv = v_cache.shape
    if min(B, Lq, Hq, Dk, S, Hk, Hkv, Dv) < 1:
        raise ValueError(f"empty input: q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, "
                         f"v_cache {tuple(v_cache.shape)}; every dimension must be >= 1")
    if k_cache.shape[0] != B or v_cache.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {B}, k_cache {k_cache.shape[0]}, v_cache {v_cache.shape[0]}")
    if v_cache.shape[1] != S:
        raise ValueError(f"k_cache and v_cache must hold the same length S; got {S} and {v_cache.shape[1]}")
    if k_cache.shape[3] != Dk:
        raise ValueError(f"k_cache head dim {k_cache.shape[3]} != q head dim {Dk}; q is the query of k_cache's width")
    if Hq % Hkv != 0:
        raise ValueError(f"Hq={Hq} query heads must be a multiple of Hkv={Hkv} value heads (one group per value head)")
    if Hk not in (1, Hkv):
        raise ValueError(f"k_cache has Hk={Hk} heads; expected 1 (one key head shared by all groups) or Hkv={Hkv}")
    if qv is not None and tuple(qv.shape) != (B, Lq, Hq, Dv):
        raise ValueError(f"qv must have shape (B, Lq, Hq, Dv) = {(B, Lq, Hq, Dv)}; got {tuple(qv.shape)}")
    named = {"q": q, "k_cache": k_cache, "v_cache": v_cache}
    if qv is not None:
        named["qv"] = qv
    if not q.dtype.is_floating_point or any(t.dtype != q.dtype for t in named.values()):
        raise ValueError("q, k_cache, v_cache, qv must share one floating dtype; got "
                         + ", ".join(f"{n} {t.dtype}" for n, t in named.items()))
    if cache_seqlens.dtype != torch.int32 or tuple(cache_seqlens.shape) != (B,):
        raise ValueError(f"cache_seqlens must be int32 of shape ({B},); got {cache_seqlens.dtype} "
                         f"{tuple(cache_seqlens.shape)} (use .to(torch.int32))")
    named["cache_seqlens"] = cache_seqlens
    if any(t.device != q.device for t in named.values()):
        raise ValueError("all inputs must be on one device; got "
                         + ", ".join(f"{n} {t.device}" for n, t in named.items()))
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


def decode_attention_ref(q, k_cache, v_cache, cache_seqlens, qv=None, softmax_scale=None, *, max_seqlen=None):
    """Decode attention in plain PyTorch (float32 math): the CPU path and the tests' oracle.

    Args and result as `decode_attention`: q (B, Lq, Hq, Dk), k_cache (B, S, Hk, Dk),
    v_cache (B, S, Hkv, Dv), cache_seqlens (B,) int32, qv (B, Lq, Hq, Dv) or None,
    max_seqlen (int or None); returns (B, Lq, Hq, Dv) in q's dtype. Raises ValueError
    on inconsistent inputs. Reads only the first max(cache_seqlens) (or max_seqlen)
    cache positions.
    Source: MLA absorbed decode, DeepSeek-V2 (arXiv 2405.04434) Sec. 2.1; GLA, arXiv 2505.21487.
    """
    S = _check_inputs(q, k_cache, v_cache, cache_seqlens, qv, max_seqlen)
    k_cache, v_cache = k_cache[:, :S], v_cache[:, :S]  # positions past every sequence's length are never seen
    B, Lq, Hq, Dk = q.shape
    Hkv, Dv = v_cache.shape[2], v_cache.shape[3]
    G = Hq // Hkv
    scale = _default_scale(Dk, Dv, qv) if softmax_scale is None else softmax_scale
    # Positions at or past cache_seqlens may hold garbage (torch.empty buffers); we zero
    # them so that 0 * NaN cannot leak into the weighted sum.
    valid = (torch.arange(S, device=q.device) < cache_seqlens[:, None])[:, :, None, None]  # (B, S, 1, 1)
    k = torch.where(valid, k_cache.float(), 0.0).expand(B, S, Hkv, Dk)  # Hk = 1 serves every group
    v = torch.where(valid, v_cache.float(), 0.0)
    # Query head h = g * G + n uses key/value head g. We split the query heads into
    # (Hkv, G) instead of copying K and V G times (that copy would not fit at 128K
    # tokens). Letters: b batch, i new token, g head group, n head in group, s cache
    # position, d feature.
    qg = q.float().view(B, Lq, Hkv, G, Dk)
    scores = torch.einsum("bignd,bsgd->bgnis", qg, k)
    if qv is not None:
        scores = scores + torch.einsum("bignd,bsgd->bgnis", qv.float().view(B, Lq, Hkv, G, Dv), v)
    # New token i sits at position cache_seqlens - Lq + i and sees every position up to it.
    limit = cache_seqlens[:, None] - Lq + torch.arange(Lq, device=q.device) + 1  # (B, Lq)
    seen = torch.arange(S, device=q.device) < limit[:, :, None]  # (B, Lq, S)
    scores = (scores * scale).masked_fill(~seen[:, None, None], float("-inf"))
    out = torch.einsum("bgnis,bsgd->bignd", scores.softmax(dim=-1), v)
    return out.reshape(B, Lq, Hq, Dv).to(q.dtype)


if triton is not None:

    @triton.jit
    def _decode_split_kernel(
        Q, QV, K, V, SEQLENS, O_PART, LSE_PART,
        stride_qb, stride_ql, stride_qh, stride_qvb, stride_qvl, stride_qvh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        scale_log2, split_len, n_splits, Hq, Hkv, Dk, Dv,
        LQ: tl.constexpr, GROUP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_DK: tl.constexpr, BLOCK_DV: tl.constexpr,
        HAS_QV: tl.constexpr, PRECISION: tl.constexpr,
    ):
        # One program: heads [hb * BLOCK_H, (hb + 1) * BLOCK_H) of group g, all LQ new
        # tokens, cache positions [split * split_len, (split + 1) * split_len).
        hb = tl.program_id(0)
        split = tl.program_id(1)
        bg = tl.program_id(2).to(tl.int64)  # int64: b * stride_kb overflows int32 at 128K x B 32
        b = bg // Hkv
        g = bg % Hkv
        seqlen = tl.load(SEQLENS + b)
        # Row r of the tile is (head hb * BLOCK_H + r // LQ of the group, new token r % LQ).
        rows = tl.arange(0, BLOCK_M)
        head_in_group = hb * BLOCK_H + rows // LQ
        tok = rows % LQ
        row_ok = (rows < BLOCK_H * LQ) & (head_in_group < GROUP)
        h = g * GROUP + head_in_group
        dk = tl.arange(0, BLOCK_DK)
        dv = tl.arange(0, BLOCK_DV)
        dk_ok = dk < Dk
        dv_ok = dv < Dv
        q = tl.load(Q + b * stride_qb + tok[:, None] * stride_ql + h[:, None] * stride_qh + dk[None, :],
                    mask=row_ok[:, None] & dk_ok[None, :], other=0.0)
        if HAS_QV:
            qv = tl.load(QV + b * stride_qvb + tok[:, None] * stride_qvl + h[:, None] * stride_qvh + dv[None, :],
                         mask=row_ok[:, None] & dv_ok[None, :], other=0.0)
        limit = seqlen - LQ + tok + 1  # new token i sees positions < limit (causal among the new)
        k_base = K + b * stride_kb + g * stride_kh  # stride_kh is 0 when one key head is shared
        v_base = V + b * stride_vb + g * stride_vh
        start = split * split_len
        end = tl.minimum(start + split_len, seqlen)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max, log2 units
        l_i = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(score - m_i)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            pos = (n0 + tl.arange(0, BLOCK_N)).to(tl.int64)  # pos * stride passes 2^31 at millions of tokens
            # Masking loads past seqlen matters even for V: 0 * NaN garbage would poison acc.
            pos_ok = pos < end
            k = tl.load(k_base + pos[:, None] * stride_ks + dk[None, :],
                        mask=pos_ok[:, None] & dk_ok[None, :], other=0.0)
            v = tl.load(v_base + pos[:, None] * stride_vs + dv[None, :],
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
        part = ((b * LQ + tok) * Hq + h) * n_splits + split  # O_PART is (B, LQ, Hq, n_splits, Dv)
        tl.store(LSE_PART + part, lse, mask=row_ok)
        tl.store(O_PART + part[:, None] * Dv + dv[None, :], out, mask=row_ok[:, None] & dv_ok[None, :])

    @triton.jit
    def _combine_kernel(O_PART, LSE_PART, OUT, stride_ob, stride_ol, stride_oh, Hq, LQ, n_splits, Dv,
                        BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
        # One program: one (b, new token, head) row, BLOCK_D features at a time.
        row = tl.program_id(0).to(tl.int64)
        s = tl.arange(0, BLOCK_S)
        lse = tl.load(LSE_PART + row * n_splits + s, mask=s < n_splits, other=float("-inf"))
        m = tl.max(lse, 0)
        w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # each split's share of the softmax mass
        w = w / tl.sum(w, 0)
        b = row // (Hq * LQ)
        i = (row // Hq) % LQ
        h = row % Hq
        for d0 in range(0, Dv, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            o = tl.load(O_PART + (row * n_splits + s[:, None]) * Dv + d[None, :],
                        mask=(s[:, None] < n_splits) & (d[None, :] < Dv), other=0.0)
            out = tl.sum(w[:, None] * o, 0)
            tl.store(OUT + b * stride_ob + i * stride_ol + h * stride_oh + d,
                     out.to(OUT.dtype.element_ty), mask=d < Dv)


def _pow2(n):
    return max(MIN_BLOCK, triton.next_power_of_2(n))


def _plan(B, Lq, Hq, Hkv, Dk, Dv, elem_bytes, max_len, num_splits, num_sms):
    """Block sizes and split count for one call (see the constants at the top)."""
    G = Hq // Hkv
    BLOCK_DK, BLOCK_DV = _pow2(Dk), _pow2(Dv)
    # If all G * Lq rows do not fit the register budget, we split the group into head
    # blocks. Cost: each head block reads the group's cache again (MLA, Lq 2: 4 times);
    # the head blocks are the fastest grid axis, so they run side by side and the L2
    # serves part of the repeated reads.
    max_rows = max(1, MAX_ACC_ELEMS // BLOCK_DV)
    n_head_blocks = triton.cdiv(G, max(1, max_rows // Lq))
    BLOCK_H = triton.cdiv(G, n_head_blocks)
    BLOCK_M = _pow2(BLOCK_H * Lq)
    BLOCK_N = KV_TILE_BYTES // ((BLOCK_DK + BLOCK_DV) * elem_bytes)
    BLOCK_N = max(MIN_BLOCK, min(MAX_BLOCK_N, 1 << (BLOCK_N.bit_length() - 1)))
    n_blocks = triton.cdiv(max_len, BLOCK_N)
    if num_splits is None:
        num_splits = triton.cdiv(num_sms, B * Hkv * n_head_blocks)
        cache_bytes = B * max_len * Hkv * (Dk + Dv) * elem_bytes  # what the programs load
        partial_bytes = 2 * B * Lq * Hq * Dv * 4  # per split: fp32 written, then read back
        num_splits = min(num_splits, max(1, int(cache_bytes * MAX_PARTIAL_TRAFFIC // partial_bytes)))
    split_len = triton.cdiv(n_blocks, max(1, min(num_splits, n_blocks))) * BLOCK_N
    num_warps = 4 if BLOCK_M * BLOCK_DV <= SMALL_TILE_ELEMS else 8
    return dict(BLOCK_H=BLOCK_H, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_DK=BLOCK_DK, BLOCK_DV=BLOCK_DV,
                n_head_blocks=n_head_blocks, split_len=split_len, n_splits=triton.cdiv(max_len, split_len),
                num_warps=num_warps)


def decode_attention(q, k_cache, v_cache, cache_seqlens, qv=None, softmax_scale=None, *,
                     max_seqlen=None, num_splits=None, out=None):
    """Decode attention over a KV cache with a Triton split-KV (flash-decoding) kernel.

    Semantics of FA3's `flash_attn_with_kvcache`, as the GLA paper (arXiv 2505.21487)
    uses it for GQA, MLA and GLA decode (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1):
    q (B, Lq, Hq, Dk): rope query (GQA: the whole query); k_cache (B, S, Hk, Dk) with
    Hk in {1, Hkv}; v_cache (B, S, Hkv, Dv): values (MLA/GLA: the latent); qv
    (B, Lq, Hq, Dv) or None: absorbed query, adds qv . v to the scores; cache_seqlens
    (B,) int32: valid cached tokens per sequence, the Lq new ones included (they sit at
    cache_seqlens - Lq .. cache_seqlens - 1, causal among themselves). Query head h
    uses value head h // (Hq // Hkv), and that key head too when Hk == Hkv.
    softmax_scale defaults to 1/sqrt(Dk + Dv) with qv, else 1/sqrt(Dk). max_seqlen
    (int): an upper bound on cache_seqlens known on the host; given, the call never
    waits for the GPU (no range check of cache_seqlens' values). num_splits
    overrides the split-KV count (None: fill the GPU); out (B, Lq, Hq, Dv) in q's dtype
    receives the result if given. Returns (B, Lq, Hq, Dv) in q's dtype, accumulated in fp32.

    Raises ValueError on inconsistent inputs or CPU tensors without TRITON_INTERPRET=1,
    RuntimeError if Triton is not installed.
    """
    if triton is None:
        raise RuntimeError("decode_attention needs Triton (Linux); use decode_attention_ref instead")
    max_len = _check_inputs(q, k_cache, v_cache, cache_seqlens, qv, max_seqlen)
    cache_seqlens = cache_seqlens.contiguous()  # the kernel reads it with unit stride
    if q.device.type != "cuda" and not isinstance(_decode_split_kernel, InterpretedFunction):
        raise ValueError("decode_attention needs CUDA tensors; on CPU use decode_attention_ref, "
                         "or set TRITON_INTERPRET=1 before importing triton")
    B, Lq, Hq, Dk = q.shape
    Hk, Hkv, Dv = k_cache.shape[2], v_cache.shape[2], v_cache.shape[3]
    if out is None:
        out = torch.empty(B, Lq, Hq, Dv, dtype=q.dtype, device=q.device)
    elif (tuple(out.shape) != (B, Lq, Hq, Dv) or out.dtype != q.dtype or out.device != q.device
          or out.stride(-1) != 1):
        raise ValueError(f"out must be {q.dtype} of shape {(B, Lq, Hq, Dv)} on {q.device} with unit last stride; "
                         f"got {out.dtype} {tuple(out.shape)} on {out.device}")
    # Our pointer arithmetic assumes unit stride along the feature dimension only.
    q, k_cache, v_cache = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k_cache, v_cache))
    if qv is not None and qv.stride(-1) != 1:
        qv = qv.contiguous()
    scale = _default_scale(Dk, Dv, qv) if softmax_scale is None else softmax_scale
    num_sms = (torch.cuda.get_device_properties(q.device).multi_processor_count
               if q.device.type == "cuda" else DEFAULT_NUM_SMS)
    p = _plan(B, Lq, Hq, Hkv, Dk, Dv, q.element_size(), max_len, num_splits, num_sms)
    n_splits = p["n_splits"]
    o_part = torch.empty(B, Lq, Hq, n_splits, Dv, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(B, Lq, Hq, n_splits, dtype=torch.float32, device=q.device)
    qv_arg = q if qv is None else qv  # any tensor: HAS_QV=False never reads it
    with torch.cuda.device(q.device) if q.is_cuda else nullcontext():  # launch on q's GPU, not the current one
        _decode_split_kernel[(p["n_head_blocks"], n_splits, B * Hkv)](
            q, qv_arg, k_cache, v_cache, cache_seqlens, o_part, lse_part,
            q.stride(0), q.stride(1), q.stride(2), qv_arg.stride(0), qv_arg.stride(1), qv_arg.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2) if Hk == Hkv else 0,
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            scale * LOG2E, p["split_len"], n_splits, Hq, Hkv, Dk, Dv,
            LQ=Lq, GROUP=Hq // Hkv, BLOCK_H=p["BLOCK_H"], BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"],
            BLOCK_DK=p["BLOCK_DK"], BLOCK_DV=p["BLOCK_DV"], HAS_QV=qv is not None,
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # 16-bit inputs ignore it
            num_warps=p["num_warps"], num_stages=NUM_STAGES,
        )
        _combine_kernel[(B * Lq * Hq,)](
            o_part, lse_part, out, out.stride(0), out.stride(1), out.stride(2), Hq, Lq, n_splits, Dv,
            BLOCK_S=triton.next_power_of_2(n_splits), BLOCK_D=COMBINE_BLOCK_D,
        )
    return out


# name: (Hq, Hkv, Hk, Dk, Dv, uses qv), per-device shapes of the GLA paper's decode benchmark.
BENCH_SHAPES = {
    "GQA TP-8": (8, 1, 1, 128, 128, False),
    "MLA": (64, 1, 1, 64, 512, True),
    "GLA-2 TP-2": (32, 1, 1, 64, 256, True),  # each device holds one latent head
    "GLA-2 1 GPU": (64, 2, 1, 64, 256, True),
}
BENCH_BATCHES = (1, 32)
BENCH_SEQLENS = (8192, 32768, 131072)
BENCH_LQ = (1, 2)
BENCH_COPY_BYTES = 1 << 30
BENCH_MEMORY_MARGIN = 0.8  # use at most this fraction of free GPU memory


def bench(output=None):
    """Time decode_attention against the floor and the reference on CUDA (bf16); print a
    table and, if `output` is given, write it there (markdown for *.md, else CSV)."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    src = torch.empty(BENCH_COPY_BYTES, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    # A device-to-device copy reads and writes every byte: the achievable HBM bandwidth.
    copy_bw = 2 * BENCH_COPY_BYTES / (triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median") * 1e-3)
    print(f"device-to-device copy bandwidth (our floor): {copy_bw / 1e9:.0f} GB/s")
    num_sms = torch.cuda.get_device_properties(dev).multi_processor_count
    # passes: how often each head group's cache is read (head blocks, see _plan).
    cols = ["shape", "B", "S", "Lq", "passes", "time_us", "MB_read", "GB_s", "pct_floor", "speedup_vs_ref", "max_abs_err"]
    rows, skipped = [], []
    print("  ".join(cols))
    for name, (Hq, Hkv, Hk, Dk, Dv, use_qv) in BENCH_SHAPES.items():
        for B in BENCH_BATCHES:
            for S in BENCH_SEQLENS:
                for Lq in BENCH_LQ:
                    cache_bytes = B * S * (Hk * Dk + Hkv * Dv) * dt.itemsize
                    # The cache, the reference's two transient fp32 copies of it (2x each), ~3 fp32 score tensors.
                    need = 5 * cache_bytes + 3 * 4 * B * Hq * Lq * S
                    if need > BENCH_MEMORY_MARGIN * torch.cuda.mem_get_info(dev)[0]:
                        skipped.append(f"{name} B={B} S={S} Lq={Lq}")
                        continue
                    q = torch.randn(B, Lq, Hq, Dk, device=dev, dtype=dt)
                    qv = torch.randn(B, Lq, Hq, Dv, device=dev, dtype=dt) if use_qv else None
                    k = torch.randn(B, S, Hk, Dk, device=dev, dtype=dt)
                    v = torch.randn(B, S, Hkv, Dv, device=dev, dtype=dt)
                    seqlens = torch.full((B,), S, dtype=torch.int32, device=dev)
                    out = decode_attention(q, k, v, seqlens, qv)
                    ref = decode_attention_ref(q, k, v, seqlens, qv)
                    err = (out.float() - ref.float()).abs().max().item()
                    t = triton.testing.do_bench(lambda: decode_attention(q, k, v, seqlens, qv, out=out),
                                                return_mode="median") * 1e-3
                    t_ref = triton.testing.do_bench(lambda: decode_attention_ref(q, k, v, seqlens, qv),
                                                    return_mode="median") * 1e-3
                    nbytes = cache_bytes + (q.numel() + out.numel() + (qv.numel() if use_qv else 0)) * dt.itemsize
                    passes = _plan(B, Lq, Hq, Hkv, Dk, Dv, dt.itemsize, S, None, num_sms)["n_head_blocks"]
                    rows.append([name, B, S, Lq, passes, f"{t * 1e6:.1f}", f"{nbytes / 1e6:.1f}", f"{nbytes / t / 1e9:.0f}",
                                 f"{100 * nbytes / copy_bw / t:.0f}", f"{t_ref / t:.1f}", f"{err:.2e}"])
                    print("  ".join(str(x) for x in rows[-1]), flush=True)
    if skipped:
        print("skipped (would not fit in GPU memory): " + "; ".join(skipped))
    if output:
        with open(output, "w") as f:
            if output.endswith(".md"):
                f.write("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
                f.writelines("| " + " | ".join(map(str, r)) + " |\n" for r in rows)
                if skipped:
                    f.write("\nSkipped (would not fit in GPU memory): " + "; ".join(skipped) + "\n")
            else:
                f.writelines(",".join(map(str, r)) + "\n" for r in [cols] + rows)
        print(f"wrote {output}")


def main():
    parser = argparse.ArgumentParser(description="Decode attention kernels (GQA / MLA / GLA).")
    parser.add_argument("--bench", action="store_true", help="benchmark on CUDA against the memory-bound floor")
    parser.add_argument("--output", default=None, help="also write the table to PATH (.md: markdown, else CSV)")
    args = parser.parse_args()
    if not args.bench:
        parser.print_help()
        return
    if triton is None or not torch.cuda.is_available() or isinstance(_decode_split_kernel, InterpretedFunction):
        print("kernels.py --bench needs a CUDA GPU, Triton, and TRITON_INTERPRET unset", file=sys.stderr)
        sys.exit(2)
    bench(args.output)


if __name__ == "__main__":
    main()
