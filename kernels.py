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
latent head.

    python kernels.py --sass    # what the compiler makes of the kernel for an H100/H200 (no GPU needed)
    python kernels.py --check   # on a GPU: bf16 results against the reference, then --bench
    python kernels.py --bench   # on a GPU: time against the floor
"""
import argparse
import functools
import inspect
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext

import torch

try:  # Triton is Linux-only in requirements; the reference path must import without it.
    import triton
    import triton.language as tl
    import triton.testing
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:
    triton = None

# Speculative decoding verifies a few drafted tokens at once; a prompt (prefill) is
# attention of another shape, which the model runs through F.scaled_dot_product_attention.
# Lq is a runtime argument: Lq up to MAX_LQ compiles once per power-of-two row tile.
MAX_LQ = 16
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


def _heads_as_rows(x, groups):
    """(B, Lq, H, D) -> (B * groups, H // groups * Lq, D) float32: the queries of each KV
    head group as the rows of one matrix, row = head_in_group * Lq + token."""
    B, Lq, H, D = x.shape
    return x.float().transpose(1, 2).reshape(B * groups, H // groups * Lq, D)


def decode_attention_ref(q, k_cache, v_cache, cache_seqlens, qv=None, softmax_scale=None, *, max_seqlen=None,
                         finite_cache=False):
    """Decode attention in plain PyTorch (float32 math): the tests' oracle and the model's CPU path.

    Args and result as `decode_attention`: q (B, Lq, Hq, Dk), k_cache (B, S, Hk, Dk),
    v_cache (B, S, Hkv, Dv), cache_seqlens (B,) int32, qv (B, Lq, Hq, Dv) or None,
    max_seqlen (int or None); returns (B, Lq, Hq, Dv) in q's dtype. Reads only the first
    max(cache_seqlens) (or max_seqlen) cache positions. Positions past a sequence's
    cache_seqlens may hold garbage (NaN in torch.empty buffers) and never reach the
    output. finite_cache=True promises that they hold finite numbers (the model's KVCache
    does: zero-initialised, written only with finite values), which lets us skip
    zeroing V there: a full copy of V, about as slow on CPU as the attention itself.
    Raises ValueError on inconsistent inputs.
    Fast on CPU for head-major caches ((B, S, H, D) views of (B, H, S, D) buffers, as the
    model's KVCache): the matrix products below then read each head's cache in place.
    Source: MLA absorbed decode, DeepSeek-V2 (arXiv 2405.04434) Sec. 2.1; GLA, arXiv 2505.21487.
    """
    S = _check_inputs(q, k_cache, v_cache, cache_seqlens, qv, max_seqlen)
    B, Lq, Hq, Dk = q.shape
    Hk, Hkv, Dv = k_cache.shape[2], v_cache.shape[2], v_cache.shape[3]
    scale = _default_scale(Dk, Dv, qv) if softmax_scale is None else softmax_scale
    # Positions past every sequence's length are never seen: we slice them off.
    k = k_cache[:, :S].transpose(1, 2).float()  # (B, Hk, S, Dk)
    v = v_cache[:, :S].transpose(1, 2).float()  # (B, Hkv, S, Dv)
    pos = torch.arange(S, device=q.device)
    if not finite_cache:
        # Masking the scores alone would let garbage through: NaN + -inf = NaN, 0 * NaN = NaN.
        valid = (pos < cache_seqlens[:, None])[:, None, :, None]  # (B, 1, S, 1)
        k, v = torch.where(valid, k, 0.0), torch.where(valid, v, 0.0)
    k, v = k.reshape(B * Hk, S, Dk), v.reshape(B * Hkv, S, Dv)
    # Query head h = g * G + n uses value head g (and key head g, or the one shared key
    # head when Hk = 1). We stack each group's queries as the rows of one matrix rather
    # than copying K and V G times (that copy would not fit at 128K tokens). With Hk = 1
    # all Hq heads form one group for q . k; its rows are the Hkv groups' rows in order.
    scores = torch.bmm(_heads_as_rows(q, Hk), k.transpose(1, 2)).view(B * Hkv, -1, S)  # (B Hkv, G Lq, S)
    if qv is not None:  # MLA / GLA: the latent is also the non-rope key
        scores = torch.baddbmm(scores, _heads_as_rows(qv, Hkv), v.transpose(1, 2))
    # New token i sits at position cache_seqlens - Lq + i and sees every position up to
    # it. We add -inf to the rest: on CPU, adding a small float bias costs a fraction of
    # a boolean masked_fill over all the scores.
    first_unseen = cache_seqlens[:, None] + torch.arange(1 - Lq, 1, device=q.device)  # (B, Lq)
    bias = torch.where(pos >= first_unseen[:, None, :, None], float("-inf"), 0.0)  # (B, 1, Lq, S)
    scores = torch.add(bias, scores.view(B, Hq, Lq, S), alpha=scale)  # scale * scores + bias
    out = torch.bmm(scores.softmax(dim=-1).view(B * Hkv, -1, S), v)  # (B Hkv, G Lq, Dv)
    return out.view(B, Hq, Lq, Dv).transpose(1, 2).to(q.dtype)


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
        # Lq, group and heads_per_block are runtime values (Triton still makes a 1 a constant);
        # each head takes LQ_BLOCK = Lq rounded up to a power of two rows, so Lq up to
        # MAX_LQ compiles at most 5 variants, and r // LQ_BLOCK is a shift. (With Lq itself
        # at run time, r // Lq and r % Lq cost MLA and GLA-2 at Lq 2 the last few registers:
        # 255 and up to 128 bytes of spills.)
        hb = tl.program_id(0)
        split = tl.program_id(1)
        bg = tl.program_id(2).to(tl.int64)  # int64: b * stride_kb overflows int32 at 128K x B 32
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
        # One program: one (b, new token, head) row, BLOCK_D features at a time.
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
# The launch plan, for an H100/H200 (sm_90). `python kernels.py --sass` compiles the
# kernel for every bench shape ahead of time and prints what the compiler made of each
# plan, with the memory model below fed by that build.

NUM_WARPS = 4  # one warpgroup: the unit of a Hopper wgmma
MIN_BLOCK = 16  # tl.dot needs every dimension >= 16
MAX_BLOCK_N = 128
# A program keeps its fp32 accumulator (BLOCK_M rows x Dv) in registers: 16K elements are
# 128 registers a thread (of 255), so two CTAs of 4 warps still fit an SM's 64K registers.
# Up to 4K elements (32 registers a thread) we count on 3 CTAs per SM, else on 2.
MAX_ACC_ELEMS = 16384
SMALL_ACC_ELEMS = 4096
CTAS_PER_SM_SMALL_ACC, CTAS_PER_SM = 3, 2
# One pipeline stage loads about 16 KiB of keys and values: GQA 32 tokens x (128 + 128)
# dims in bf16, MLA 16 x (64 + 512), GLA-2 16 x (64 + 256) (16 tokens: tl.dot's floor).
KV_TILE_BYTES = 16 * 1024
# Triton's num_stages = s keeps s - 2 tiles arriving by cp.async while the loop computes
# on another (the sm_90 builds wait with `DEPBAR.LE SB0, 2 (s - 2)`). We take as many
# stages as shared memory allows at the planned CTAs per SM, up to MAX_STAGES: 4 tiles,
# 40 KiB (GLA-2) to 72 KiB (MLA) in flight per program.
MAX_STAGES = 6
SM90_SMEM_PER_SM = 228 * 1024  # CUDA C++ Programming Guide, compute capability 9.0
SM90_SMEM_RESERVED_PER_CTA = 1024  # cudaDevAttrReservedSharedMemoryPerBlock
SMEM_SCRATCH = 2048  # the compiler's own buffers (layout conversions): 1-2 KiB in every sm_90 build
# Head blocks. When a group's heads x Lq rows overflow MAX_ACC_ELEMS, they split into head
# blocks, each of which reads the group's cache again (passes; the repeats are meant to
# hit the 50 MB L2, as the head blocks of a tile start together). At batch 1, a few head
# blocks more than the registers need give more programs per split, so fewer splits, so
# fewer partial outputs to write and combine: up to MAX_PASSES passes, and only when the
# model gains more than MIN_GAIN (it counts the repeats as free, a GPU does not).
MAX_PASSES = 4
MIN_GAIN = 0.01
# The memory model. A decode call moves its bytes (the cache of the valid tokens once,
# q, qv and the output, and the partial outputs written and read back by the combine) at
# min(HBM bandwidth, bytes in flight / HBM latency) (Little's law): to stream at 4.8 TB/s
# with 0.8 us latency the programs must keep 3.8 MB of K/V loads in flight. These are an
# H200's figures (4.8 TB/s is its specification; the latency an assumed round trip); the
# model is a proxy that a GPU run of `--bench` checks.
HBM_BYTES_PER_S = 4.8e12
HBM_LATENCY_S = 0.8e-6
DEFAULT_NUM_SMS = 132
# Split counts keep the launch balanced where it fills at least half the SMs: the mean
# over the max programs per SM stays >= MIN_BALANCE (no wave of a few stragglers).
MIN_BALANCE = 0.9


def _pow2(n):
    return max(MIN_BLOCK, triton.next_power_of_2(n))


def decode_bytes(B, Lq, Hq, Hk, Hkv, Dk, Dv, has_qv, seqlen, elem_bytes):
    """(cache, io) bytes of one decode call: the cached K and V of B sequences of seqlen
    tokens, each read once, and q, qv and the output."""
    cache = B * seqlen * (Hk * Dk + Hkv * Dv) * elem_bytes
    io = B * Lq * Hq * (Dk + (Dv if has_qv else 0) + Dv) * elem_bytes
    return cache, io


def partial_bytes(B, Lq, Hq, Dv, n_splits, elem_bytes):
    """Bytes of the partial outputs (in the inputs' dtype, float32 for float32 inputs) and
    their float32 log-sum-exps, written by the split kernel and read by the combine."""
    return 2 * B * Lq * Hq * n_splits * (Dv * elem_bytes + 4)


def modelled_seconds(nbytes, programs, ctas_per_sm, kv_bytes_in_flight, num_sms=DEFAULT_NUM_SMS):
    """The memory model: nbytes at min(HBM_BYTES_PER_S, bytes in flight / HBM_LATENCY_S),
    where min(programs, num_sms x ctas_per_sm) programs run at once, each with
    kv_bytes_in_flight bytes of K/V loads outstanding."""
    in_flight = min(programs, num_sms * ctas_per_sm) * kv_bytes_in_flight
    return nbytes / min(HBM_BYTES_PER_S, in_flight / HBM_LATENCY_S) if in_flight else math.inf


def _num_stages(BLOCK_M, BLOCK_DK, BLOCK_DV, has_qv, tile_smem, ctas_per_sm, elem_bytes):
    """The most pipeline stages (<= MAX_STAGES) whose shared memory fits ctas_per_sm CTAs
    on an SM: the q (and qv) tiles, num_stages - 1 K/V buffers (num_stages where Hopper's
    wgmma, used from 64 rows, may still read the last one) and SMEM_SCRATCH."""
    fixed = BLOCK_M * (BLOCK_DK + (BLOCK_DV if has_qv else 0)) * elem_bytes + SMEM_SCRATCH
    budget = SM90_SMEM_PER_SM // ctas_per_sm - SM90_SMEM_RESERVED_PER_CTA
    extra = 1 if BLOCK_M >= 64 else 0
    stages = 3
    while stages < MAX_STAGES and fixed + (stages + extra) * tile_smem <= budget:
        stages += 1
    return stages


def _split_choices(units, n_blocks, ctas_per_sm, num_sms, kv_bytes_in_flight):
    """Split counts worth modelling for `units` (batch x KV head x head block) programs per
    split: none; the most that stay under half the SMs, but no more than fill HBM's bytes
    in flight (more only add partials); and, for 1 to ctas_per_sm waves, the most that
    fit whole waves of num_sms programs, if they fill MIN_BALANCE of them."""
    saturate = math.ceil(HBM_BYTES_PER_S * HBM_LATENCY_S / (units * kv_bytes_in_flight))
    choices = {1, min(saturate, (num_sms // 2 - 1) // units)}
    for waves in range(1, ctas_per_sm + 1):
        splits = waves * num_sms // units
        if units * splits >= MIN_BALANCE * waves * num_sms:
            choices.add(splits)
    return sorted({min(c, n_blocks) for c in choices if c >= 1})


@functools.lru_cache(maxsize=4096)
def _plan(B, Lq, Hq, Hkv, Hk, Dk, Dv, has_qv, elem_bytes, max_len, num_splits, num_sms):
    """Block sizes, head blocks, stages and split count for one call: of the head-block
    counts and split counts above, the one the memory model finds fastest.

    The choice sees Lq only as LQ_BLOCK, its power of two, so that Lq up to MAX_LQ
    compiles at most 5 variants. It does depend on B and max_len: a decode loop at batch
    1 may switch head blocks (one more compile) as its cache grows.
    """
    G = Hq // Hkv
    BLOCK_DK, BLOCK_DV = _pow2(Dk), _pow2(Dv)
    LQ_BLOCK = triton.next_power_of_2(Lq)
    BLOCK_N = KV_TILE_BYTES // ((BLOCK_DK + BLOCK_DV) * elem_bytes)
    BLOCK_N = max(MIN_BLOCK, min(MAX_BLOCK_N, 1 << (BLOCK_N.bit_length() - 1)))
    n_blocks = triton.cdiv(max_len, BLOCK_N)
    tile_bytes = BLOCK_N * (Dk + Dv) * elem_bytes  # what one stage loads from memory
    cache, io = decode_bytes(B, LQ_BLOCK, Hq, Hk, Hkv, Dk, Dv, has_qv, max_len, elem_bytes)
    # All G x LQ_BLOCK rows of a group in one program, unless they overflow MAX_ACC_ELEMS:
    # MLA's 64 heads x 512 would take 128 KiB of accumulators, half an SM's registers
    # (FlashMLA's choice: one CTA per SM, two warpgroups); we split them into head blocks.
    fewest = triton.cdiv(G, max(1, MAX_ACC_ELEMS // BLOCK_DV // LQ_BLOCK))
    best, n_head_blocks = None, fewest
    while True:
        heads_per_block = triton.cdiv(G, n_head_blocks)
        n_head_blocks = triton.cdiv(G, heads_per_block)  # as even as possible
        BLOCK_M = _pow2(heads_per_block * LQ_BLOCK)
        ctas_per_sm = CTAS_PER_SM_SMALL_ACC if BLOCK_M * BLOCK_DV <= SMALL_ACC_ELEMS else CTAS_PER_SM
        num_stages = _num_stages(BLOCK_M, BLOCK_DK, BLOCK_DV, has_qv, BLOCK_N * (BLOCK_DK + BLOCK_DV) * elem_bytes,
                                 ctas_per_sm, elem_bytes)
        in_flight = (num_stages - 2) * tile_bytes
        units = B * Hkv * n_head_blocks
        for splits in [num_splits] if num_splits else _split_choices(units, n_blocks, ctas_per_sm, num_sms,
                                                                     in_flight):
            split_len = triton.cdiv(n_blocks, max(1, min(splits, n_blocks))) * BLOCK_N
            n_splits = triton.cdiv(max_len, split_len)
            seconds = modelled_seconds(cache + io + partial_bytes(B, LQ_BLOCK, Hq, Dv, n_splits, elem_bytes),
                                       units * n_splits, ctas_per_sm, in_flight, num_sms)
            if (best is None or seconds < best["seconds"] * (1 - MIN_GAIN)
                    or (seconds < best["seconds"] and n_head_blocks == best["n_head_blocks"])):
                best = dict(LQ_BLOCK=LQ_BLOCK, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_DK=BLOCK_DK,
                            BLOCK_DV=BLOCK_DV, heads_per_block=heads_per_block, n_head_blocks=n_head_blocks,
                            split_len=split_len, n_splits=n_splits, ctas_per_sm=ctas_per_sm,
                            num_warps=NUM_WARPS, num_stages=num_stages, tile_bytes=tile_bytes, seconds=seconds)
        more = 2 * n_head_blocks
        if more > min(G, max(fewest, MAX_PASSES)) or triton.cdiv(G, more) * LQ_BLOCK < MIN_BLOCK:
            return best
        n_head_blocks = more


def _split_launch(q, k_cache, v_cache, cache_seqlens, qv, scale, max_len, num_splits, num_sms):
    """The split kernel's launch for one call: (plan, grid, args, kwargs, o_part, lse_part).

    decode_attention launches exactly this; sm90_figures compiles it from meta tensors.
    """
    B, Lq, Hq, Dk = q.shape
    Hk, Hkv, Dv = k_cache.shape[2], v_cache.shape[2], v_cache.shape[3]
    p = _plan(B, Lq, Hq, Hkv, Hk, Dk, Dv, qv is not None, q.element_size(), max_len, num_splits, num_sms)
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
                  num_warps=p["num_warps"], num_stages=p["num_stages"])
    return p, (p["n_head_blocks"], n_splits, B * Hkv), args, kwargs, o_part, lse_part


def decode_attention(q, k_cache, v_cache, cache_seqlens, qv=None, softmax_scale=None, *,
                     max_seqlen=None, num_splits=None, out=None):
    """Decode attention over a KV cache with a Triton split-KV (flash-decoding) kernel.

    Semantics of FA3's `flash_attn_with_kvcache`, as the GLA paper (arXiv 2505.21487)
    uses it for GQA, MLA and GLA decode (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1):
    q (B, Lq, Hq, Dk): rope query (GQA: the whole query), Lq <= MAX_LQ (16) new tokens
    per sequence (one, or a speculative draft); k_cache (B, S, Hk, Dk) with
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

    Raises ValueError on inconsistent inputs, Lq > MAX_LQ (a prompt: use
    F.scaled_dot_product_attention) or CPU tensors without TRITON_INTERPRET=1,
    RuntimeError if Triton is not installed.
    """
    if triton is None:
        raise RuntimeError("decode_attention needs Triton (Linux); use decode_attention_ref instead")
    max_len = _check_inputs(q, k_cache, v_cache, cache_seqlens, qv, max_seqlen)
    B, Lq, Hq, Dk = q.shape
    Dv = v_cache.shape[3]
    if Lq > MAX_LQ:
        raise ValueError(f"decode_attention takes at most MAX_LQ={MAX_LQ} new tokens per sequence (decode, "
                         f"speculative drafts); got Lq={Lq}: run a prompt (prefill) through "
                         "F.scaled_dot_product_attention instead")
    cache_seqlens = cache_seqlens.contiguous()  # the kernel reads it with unit stride
    if q.device.type != "cuda" and not isinstance(_decode_split_kernel, InterpretedFunction):
        raise ValueError("decode_attention needs CUDA tensors; on CPU use decode_attention_ref, "
                         "or set TRITON_INTERPRET=1 before importing triton")
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
    _, grid, args, kwargs, o_part, lse_part = _split_launch(q, k_cache, v_cache, cache_seqlens, qv, scale,
                                                            max_len, num_splits, num_sms)
    n_splits = o_part.shape[3]
    with torch.cuda.device(q.device) if q.is_cuda else nullcontext():  # launch on q's GPU, not the current one
        _decode_split_kernel[grid](*args, **kwargs)
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


def _bench_inputs(name, B, S, Lq, dtype, device):
    """q, k_cache, v_cache, cache_seqlens (all S), qv (or None) of a bench shape; on the
    "meta" device they are shapes without memory."""
    Hq, Hkv, Hk, Dk, Dv, use_qv = BENCH_SHAPES[name]
    q = torch.randn(B, Lq, Hq, Dk, dtype=dtype, device=device)
    k_cache = torch.randn(B, S, Hk, Dk, dtype=dtype, device=device)
    v_cache = torch.randn(B, S, Hkv, Dv, dtype=dtype, device=device)
    qv = torch.randn(B, Lq, Hq, Dv, dtype=dtype, device=device) if use_qv else None
    return q, k_cache, v_cache, torch.full((B,), S, dtype=torch.int32, device=device), qv


# ----------------------------------------------------------------------------
# The Hopper build without a GPU. Triton compiles ahead of time for sm_90, and its
# wheel ships cuobjdump (registers, spill stack) and nvdisasm (SASS) to read the
# result. Compiled with the specialisation the runtime would pick for the bench shapes'
# launch arguments, the SASS is what an H100/H200 would run.

# sm_90 limits: CUDA C++ Programming Guide, "Technical Specifications per Compute
# Capability" (9.0): 64K 32-bit registers, 2048 threads, 32 CTAs and 228 KiB of shared
# memory per SM, 227 KiB per CTA; each CTA also takes the driver's reserved 1 KiB
# (cudaDevAttrReservedSharedMemoryPerBlock). A warp's registers come in units of 256
# (the CUDA Occupancy Calculator's "register allocation unit size").
SM90_REGS_PER_SM = 65536
SM90_REG_ALLOC_UNIT = 256
SM90_MAX_THREADS_PER_SM = 2048
SM90_MAX_CTAS_PER_SM = 32
SM90_SMEM_PER_CTA = 227 * 1024
SASS_TOOLS = ("ptxas", "cuobjdump", "nvdisasm")
SASS_SEQLEN = 32768  # cached tokens of the figures
_MMA = re.compile(r"\b(HGMMA|HMMA)\b")


def sass_tools_dir():
    """Triton's bundled CUDA tools (triton/backends/nvidia/bin), or None where missing."""
    if triton is None:
        return None
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    return path if all(os.access(os.path.join(path, t), os.X_OK) for t in SASS_TOOLS) else None


def _runtime_specialization(fn, args, kwargs, backend):
    """(signature, constexprs, attrs) as Triton's runtime derives them from launch arguments.

    Mirrors triton/runtime/jit.py (3.9): create_function_from_signature feeds every
    non-constexpr argument to native_specialize_impl(backend, arg, is_const, specialize,
    align), and JITFunction._pack_args makes its answers the compile's signature
    (types; "constexpr" for ints equal to 1), constexprs (those 1s and the declared
    constexprs) and attrs (backend.parse_attr: tt.divisibility=16 for 16-divisible ints
    and 16-byte-aligned pointers).
    """
    from triton._C.libtriton import native_specialize_impl
    bound = inspect.signature(fn.fn).bind(*args, **kwargs).arguments
    spec = [("constexpr", bound[kp.name]) if kp.is_constexpr else
            native_specialize_impl(backend, bound[kp.name], kp.is_const, not kp.do_not_specialize,
                                   not kp.do_not_specialize_on_alignment)
            for kp in fn.params]
    signature = {kp.name: s[0] for kp, s in zip(fn.params, spec)}
    constexprs = {(i,): bound[kp.name] for i, (kp, s) in enumerate(zip(fn.params, spec)) if s[0] == "constexpr"}
    attrs = {(i,): backend.parse_attr("" if s[0] == "constexpr" else s[1])
             for i, s in enumerate(spec) if s[0] == "constexpr" or isinstance(s[1], str)}
    return signature, constexprs, attrs


@functools.cache
def _split_kernel_jit():
    """The split kernel as a compilable JITFunction, also under TRITON_INTERPRET=1 (where
    the decorator made an interpreter of it)."""
    from triton.runtime.jit import JITFunction
    fn = _decode_split_kernel
    return fn if isinstance(fn, JITFunction) else JITFunction(fn.fn)


@functools.cache
def _sm90_compile(key):
    """Compile the split kernel for sm_90 from a (signature, constexprs, attrs, options)
    key of item tuples; return cuobjdump's resource usage, the SASS and the dynamic shared bytes."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    signature, constexprs, attrs, options = (dict(x) for x in key)
    src = ASTSource(_split_kernel_jit(), signature, constexprs, {k: list(map(list, v)) for k, v in attrs.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    tools = sass_tools_dir()
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "kernel.cubin")
        with open(cubin, "wb") as f:
            f.write(kernel.asm["cubin"])
        runs = [subprocess.Popen([os.path.join(tools, tool), flag, cubin], stdout=subprocess.PIPE, text=True)
                for tool, flag in (("cuobjdump", "--dump-resource-usage"), ("nvdisasm", "-c"))]
        usage, sass = (run.communicate()[0] for run in runs)
        if any(run.returncode for run in runs):
            raise RuntimeError(f"cuobjdump or nvdisasm failed on the sm_90 build (exit {[r.returncode for r in runs]})")
    return usage, sass, kernel.metadata.shared


def _sass_main_loop(sass):
    """Instructions of the innermost loop that issues the MMAs (a backward branch's body)."""
    instrs, labels = [], {}
    for line in sass.splitlines():
        if m := re.match(r"\s*(\.L_x_\d+):", line):
            labels[m.group(1)] = len(instrs)
        elif m := re.search(r"/\*[0-9a-f]+\*/\s+(.*?)\s*;", line):
            instrs.append(m.group(1))
    loops = []
    for i, ins in enumerate(instrs):
        m = re.search(r"\bBRA\b.*\((\.L_x_\d+)\)", ins)
        if m and labels.get(m.group(1), i + 1) <= i:
            loops.append(instrs[labels[m.group(1)]:i + 1])
    with_mma = [loop for loop in loops if any(_MMA.search(ins) for ins in loop)]
    return min(with_mma, key=len) if with_mma else []


def sm90_figures(name, B, Lq, S=SASS_SEQLEN, num_stages=None):
    """What the split kernel compiles to on an H100/H200 for one bench shape (bf16, all
    B sequences at S cached tokens): a dict of the figures behind `--sass` and the sm_90
    test. Needs Triton's bundled CUDA tools (sass_tools_dir); no GPU.

    regs, stack (spill bytes), spills (STL/LDL instructions), smem (bytes per CTA,
    static + dynamic), mma (HGMMA/HMMA instructions), loop_cp_async / loop_ldg (K/V
    loads in the main loop by cp.async / by plain loads), narrow_loads (global loads
    under 32 bits), in_flight (K/V tiles still arriving while the loop computes:
    the smallest `DEPBAR.LE SB0, N` in the loop over the cp.async groups it commits
    per iteration), stages (tiles in shared memory at that point: 1 + in_flight),
    ctas_per_sm (from registers, shared memory and threads) and its limit, programs,
    balance (mean over max programs per SM, DEFAULT_NUM_SMS SMs), passes (head blocks:
    reads of each cached token), the plan's block sizes, stages and ctas_per_sm; and the
    memory model fed by this build: in_flight_B (K/V bytes in flight per program: tiles
    in flight x tile bytes), cache_B, io_B, partial_B (bytes of the call), model_s and
    floor_s (seconds), model_pct (floor over model). num_stages None: the plan's.
    """
    return sm90_figures_many([(name, B, Lq, S, num_stages)])[0]


_SM90_FIGURES = {}  # (name, B, Lq, S, num_stages) -> figures, filled by sm90_figures_many


def sm90_figures_many(configs):
    """sm90_figures of each (name, B, Lq, S, num_stages) in configs, each computed once.

    Under TRITON_INTERPRET=1 (the CPU tests) Triton's compiler cannot run in this process:
    its code generator would call the interpreter's versions of tl.max, tl.sum and co.
    We then compute them in one child process without that variable.
    """
    configs = [tuple(c) for c in configs]
    missing = [c for c in dict.fromkeys(configs) if c not in _SM90_FIGURES]
    if missing and isinstance(_decode_split_kernel, InterpretedFunction):
        code = "import json, sys, kernels; print(json.dumps(kernels.sm90_figures_many(json.loads(sys.argv[1]))))"
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        child = subprocess.run([sys.executable, "-c", code, json.dumps(missing)], capture_output=True, text=True,
                               env=env, cwd=os.path.dirname(os.path.abspath(__file__)))
        if child.returncode:
            raise RuntimeError(f"the sm_90 build failed in a child process:\n{child.stderr[-3000:]}")
        _SM90_FIGURES.update(zip(missing, json.loads(child.stdout.splitlines()[-1])))
    for c in missing:
        if c not in _SM90_FIGURES:
            _SM90_FIGURES[c] = _sm90_figures(*c)
    return [_SM90_FIGURES[c] for c in configs]


def _sm90_figures(name, B, Lq, S, num_stages):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    # The launch decode_attention would make on this bench shape, from meta tensors.
    q, k_cache, v_cache, seqlens, qv = _bench_inputs(name, B, S, Lq, torch.bfloat16, "meta")
    scale = _default_scale(q.shape[3], v_cache.shape[3], qv)
    p, grid, args, kwargs, o_part, _ = _split_launch(q, k_cache, v_cache, seqlens, qv, scale, S, None,
                                                     DEFAULT_NUM_SMS)
    options = (("num_warps", kwargs.pop("num_warps")), ("num_stages", num_stages or kwargs.pop("num_stages")))
    kwargs.pop("num_stages", None)
    signature, constexprs, attrs = _runtime_specialization(_split_kernel_jit(), args, kwargs,
                                                           make_backend(GPUTarget("cuda", 90, 32)))
    # Bench shapes that specialise alike (B 1 and 32, mostly) share one compile.
    usage, sass, dynamic_smem = _sm90_compile((tuple(signature.items()), tuple(constexprs.items()),
                                               tuple((k, tuple(map(tuple, v))) for k, v in attrs.items()), options))
    regs, stack, static_smem = (int(re.search(key + r":(\d+)", usage).group(1)) for key in ("REG", "STACK", "SHARED"))
    smem = static_smem + dynamic_smem
    warps = p["num_warps"]
    warp_regs = -(-regs * 32 // SM90_REG_ALLOC_UNIT) * SM90_REG_ALLOC_UNIT
    limits = {"regs": SM90_REGS_PER_SM // (warps * warp_regs),
              "smem": SM90_SMEM_PER_SM // (smem + SM90_SMEM_RESERVED_PER_CTA),
              "threads": SM90_MAX_THREADS_PER_SM // (warps * 32), "CTAs": SM90_MAX_CTAS_PER_SM}
    limit = min(limits, key=limits.get)
    loop = _sass_main_loop(sass)
    waits = [int(n, 16) for ins in loop for n in re.findall(r"\bDEPBAR\.LE SB0, (0x[0-9a-f]+)", ins)]
    groups = sum("LDGDEPBAR" in ins for ins in loop)
    in_flight = min(waits) // groups if waits and groups else 0
    programs = math.prod(grid)
    Hq, Hkv, Hk, Dk, Dv, use_qv = BENCH_SHAPES[name]
    cache, io = decode_bytes(B, Lq, Hq, Hk, Hkv, Dk, Dv, use_qv, S, 2)
    partial = partial_bytes(B, Lq, Hq, Dv, p["n_splits"], o_part.element_size())
    model_s = modelled_seconds(cache + io + partial, programs, limits[limit], in_flight * p["tile_bytes"])
    floor_s = (cache + io) / HBM_BYTES_PER_S
    return dict(
        shape=name, B=B, Lq=Lq, S=S, BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"], warps=warps, regs=regs,
        stack=stack, spills=len(re.findall(r"\b(STL|LDL)\b", sass)), smem=smem, dynamic_smem=dynamic_smem,
        mma=len(_MMA.findall(sass)), mma_kind="HGMMA" if "HGMMA" in sass else "HMMA" if "HMMA" in sass else "none",
        loop_cp_async=sum("LDGSTS" in ins for ins in loop),
        loop_cp_async_128=sum("LDGSTS" in ins and ".128" in ins for ins in loop),
        loop_ldg=sum(bool(re.search(r"\bLDG\b", ins)) for ins in loop),
        narrow_loads=len(re.findall(r"\bLDG\b[\w.]*\.[US](8|16)\b", sass)),
        in_flight=in_flight, stages=1 + in_flight, ctas_per_sm=limits[limit], ctas_limit=limit,
        planned_ctas_per_sm=p["ctas_per_sm"], planned_in_flight=p["num_stages"] - 2, programs=programs,
        balance=programs / DEFAULT_NUM_SMS / -(-programs // DEFAULT_NUM_SMS), passes=p["n_head_blocks"],
        in_flight_B=in_flight * p["tile_bytes"], cache_B=cache, io_B=io, partial_B=partial, model_s=model_s,
        floor_s=floor_s, model_pct=100 * floor_s / model_s)


SASS_COLUMNS = ["shape", "B", "Lq", "S", "tile", "regs", "spills", "smem_KiB", "MMA", "K/V in loop", "stages",
                "CTAs/SM", "programs", "balance", "passes", "in_flight_B", "cache_B", "partial_B", "model_us",
                "model_pct"]


SASS_CONFIGS = [(name, B, Lq, S, None) for name in BENCH_SHAPES for B in BENCH_BATCHES for Lq in BENCH_LQ
                for S in BENCH_SEQLENS]


def sass_table():
    """The figures of sm90_figures for every bench shape x B x Lq x S, as rows under SASS_COLUMNS."""
    rows = []
    for f in sm90_figures_many(SASS_CONFIGS):
        rows.append([f["shape"], f["B"], f["Lq"], f["S"], f"{f['BLOCK_M']}x{f['BLOCK_N']}, {f['warps']} warps",
                     f["regs"], f"{f['stack']} B, {f['spills']} STL/LDL", f"{f['smem'] / 1024:.1f}",
                     f"{f['mma']} {f['mma_kind']}",
                     f"{f['loop_cp_async']} cp.async ({f['loop_cp_async_128']} x 128-bit), {f['loop_ldg']} LDG",
                     f"{f['stages']} ({f['in_flight']} in flight)", f"{f['ctas_per_sm']} ({f['ctas_limit']})",
                     f["programs"], f"{f['balance']:.2f}", f["passes"], f["in_flight_B"], f["cache_B"],
                     f["partial_B"], f"{f['model_s'] * 1e6:.2f}", f"{f['model_pct']:.1f}"])
    return rows


# ----------------------------------------------------------------------------
# On a GPU: the bf16 check and the benchmark.

# The GPU check runs every plan the bench runs (each bench shape, B, S and Lq), and Lq =
# MAX_LQ at 4096 tokens.
CHECK_CONFIGS = ([(name, B, Lq, S) for name in BENCH_SHAPES for B in BENCH_BATCHES for S in BENCH_SEQLENS
                  for Lq in BENCH_LQ] + [(name, B, MAX_LQ, 4096) for name in BENCH_SHAPES for B in BENCH_BATCHES])
# bf16 check: per sequence, max |kernel - reference| / max |reference|. Emulating the
# kernel's roundings (bf16 probabilities into the P.V product, bf16 partial outputs with
# float32 log-sum-exps, bf16 output) on the bench shapes at 4096 tokens, 8 and 64 splits,
# gave 0.24-0.42% (0.23-0.35% with float32 partials); dropping one 16-token tile of a
# 4096-token sequence gave 3.2-8.7%. CHECK_TOL sits between.
CHECK_TOL = 1.5e-2
CHECK_TIME_BUDGET_S = 270  # --check stops benchmarking here to stay under 5 minutes


def _write_table(path, cols, rows, notes=()):
    """Write rows under cols to path: markdown for *.md, else CSV (notes only in markdown)."""
    with open(path, "w") as f:
        if path.endswith(".md"):
            f.write("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
            f.writelines("| " + " | ".join(map(str, r)) + " |\n" for r in rows)
            f.writelines(f"\n{note}\n" for note in notes)
        else:
            f.writelines(",".join(f'"{x}"' if "," in str(x) else str(x) for x in r) + "\n" for r in [cols] + rows)
    print(f"wrote {path}")


def bench(output=None, deadline=None):
    """Time decode_attention against the floor and the reference on CUDA (bf16); print a
    table and, if `output` is given, write it there (markdown for *.md, else CSV). Stops
    starting new shapes after `deadline` (time.time() seconds) if given."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    src = torch.empty(BENCH_COPY_BYTES, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    # A device-to-device copy reads and writes every byte: the achievable HBM bandwidth.
    copy_bw = 2 * BENCH_COPY_BYTES / (triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median") * 1e-3)
    del src, dst
    print(f"{torch.cuda.get_device_name(dev)}: device-to-device copy bandwidth (our floor): {copy_bw / 1e9:.0f} GB/s")
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
                    if deadline is not None and time.time() > deadline:
                        skipped.append(f"{name} B={B} S={S} Lq={Lq} (out of time)")
                        continue
                    if need > BENCH_MEMORY_MARGIN * torch.cuda.mem_get_info(dev)[0]:
                        skipped.append(f"{name} B={B} S={S} Lq={Lq} (would not fit in GPU memory)")
                        continue
                    q, k, v, seqlens, qv = _bench_inputs(name, B, S, Lq, dt, dev)
                    out = decode_attention(q, k, v, seqlens, qv, max_seqlen=S)
                    ref = decode_attention_ref(q, k, v, seqlens, qv)
                    err = (out.float() - ref.float()).abs().max().item()
                    t = triton.testing.do_bench(lambda: decode_attention(q, k, v, seqlens, qv, max_seqlen=S, out=out),
                                                return_mode="median") * 1e-3
                    t_ref = triton.testing.do_bench(lambda: decode_attention_ref(q, k, v, seqlens, qv),
                                                    return_mode="median") * 1e-3
                    nbytes = cache_bytes + (q.numel() + out.numel() + (qv.numel() if use_qv else 0)) * dt.itemsize
                    passes = _plan(B, Lq, Hq, Hkv, Hk, Dk, Dv, use_qv, dt.itemsize, S, None, num_sms)["n_head_blocks"]
                    rows.append([name, B, S, Lq, passes, f"{t * 1e6:.1f}", f"{nbytes / 1e6:.1f}", f"{nbytes / t / 1e9:.0f}",
                                 f"{100 * nbytes / copy_bw / t:.0f}", f"{t_ref / t:.1f}", f"{err:.2e}"])
                    print("  ".join(str(x) for x in rows[-1]), flush=True)
                    del q, k, v, seqlens, qv, out, ref
    if skipped:
        print("skipped: " + "; ".join(skipped))
    if output:
        _write_table(output, cols, rows, [f"Device: {torch.cuda.get_device_name(dev)}, copy bandwidth "
                                          f"{copy_bw / 1e9:.0f} GB/s."] + (["Skipped: " + "; ".join(skipped)]
                                                                           if skipped else []))


def _check_one(name, B, Lq, S, dtype=torch.bfloat16, device="cuda"):
    """Kernel against reference on one bench shape: ragged lengths up to S (the first S,
    the second short, so that every token weighs), NaN past them, three launch paths.
    Returns a list of failure lines."""
    q, k_cache, v_cache, seqlens, qv = _bench_inputs(name, B, S, Lq, dtype, device)
    seqlens = torch.randint(Lq, S + 1, (B,), dtype=torch.int32, device=device)
    seqlens[0] = S
    seqlens[1:2] = min(S, Lq + 16)
    stale = torch.arange(S, device=device)[None, :] >= seqlens[:, None]
    k_cache[stale] = float("nan")  # positions past cache_seqlens must never be read
    v_cache[stale] = float("nan")
    ref = decode_attention_ref(q, k_cache, v_cache, seqlens, qv).float()
    scale = ref.flatten(1).abs().amax(1)  # per sequence
    failures = []
    for how in (dict(), dict(max_seqlen=S), dict(num_splits=3)):
        out = decode_attention(q, k_cache, v_cache, seqlens, qv, **how).float()
        err = ((out - ref).flatten(1).abs().amax(1) / scale).nan_to_num(float("inf")).max().item()
        if not err <= CHECK_TOL:
            failures.append(f"MISMATCH {name} B={B} Lq={Lq} S={S} {how or 'defaults'}: relative error {err:.3g} "
                            f"> {CHECK_TOL} (NaN counts as inf)")
    return failures


def _check_aot_matches_runtime(name, B, Lq, S):
    """The runtime's own build of a bench shape, loaded on this GPU, against the figures
    of sm90_figures' ahead-of-time build: the premise of the CPU test. Returns failure lines."""
    import ctypes
    q, k_cache, v_cache, seqlens, qv = _bench_inputs(name, B, S, Lq, torch.bfloat16, "cuda")
    scale = _default_scale(q.shape[3], v_cache.shape[3], qv)
    _, grid, args, kwargs, _, _ = _split_launch(q, k_cache, v_cache, seqlens, qv, scale, S, None, DEFAULT_NUM_SMS)
    kernel = _decode_split_kernel.warmup(*args, grid=grid, **kwargs)
    kernel._init_handles()  # loads it: the driver's registers and spills
    ctas = ctypes.c_int()
    ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(ctas), ctypes.c_void_p(kernel.function), kernel.metadata.num_warps * 32,
        ctypes.c_size_t(kernel.metadata.shared))
    f = sm90_figures(name, B, Lq, S)
    got = dict(regs=kernel.n_regs, spills=kernel.n_spills, dynamic_smem=kernel.metadata.shared,
               ctas_per_sm=ctas.value)
    want = dict(regs=f["regs"], spills=0, dynamic_smem=f["dynamic_smem"], ctas_per_sm=f["ctas_per_sm"])
    print(f"  {name} B={B} Lq={Lq} S={S}: runtime build on this GPU {got}", flush=True)
    return [] if got == want else [f"AOT sm_90 figures differ from this GPU's runtime build for {name} B={B} "
                                   f"Lq={Lq} S={S}: expected {want}, got {got}"]


def check(output):
    """The one GPU check (a few minutes on an H200): bf16 kernel against the reference in
    every CHECK_CONFIGS plan, then the suite's CUDA tests; if either fails, print every
    failure and exit 1. Then this GPU's runtime build of every sm_90 table row against
    the ahead-of-time figures, bench(output), and exit 1 if the builds differed."""
    start = time.time()
    failures = []
    for name, B, Lq, S in CHECK_CONFIGS:
        try:
            failures += _check_one(name, B, Lq, S)
        except Exception as e:  # report every shape, then fail
            failures.append(f"ERROR {name} B={B} Lq={Lq} S={S}: {type(e).__name__}: {e}")
        torch.cuda.empty_cache()
    if failures:
        print(f"\nKERNEL CHECK FAILED ({len(failures)}):\n" + "\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print(f"kernel check passed: {len(CHECK_CONFIGS)} configurations within {CHECK_TOL} of the reference "
          f"({time.time() - start:.0f} s)", flush=True)
    # The suite's CUDA tests: the compiled kernel in fp32/fp16/bf16, and the model's decode
    # path (KVCache.attend into this kernel) against its forward.
    tests = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_gla.py")
    if subprocess.run([sys.executable, "-m", "pytest", "-q", "-k", "cuda", tests]).returncode:
        print("\nCUDA TESTS FAILED (see above)", file=sys.stderr)
        sys.exit(1)
    differences = []
    if sass_tools_dir() is None:
        print("AOT vs runtime build: skipped (Triton's bundled CUDA tools are missing)")
    else:
        for name, B, Lq, S, _ in SASS_CONFIGS:
            try:
                differences += _check_aot_matches_runtime(name, B, Lq, S)
            except Exception as e:
                differences.append(f"ERROR comparing the builds of {name} B={B} Lq={Lq} S={S}: "
                                   f"{type(e).__name__}: {e}")
            torch.cuda.empty_cache()
    print("\n".join(differences) or "AOT sm_90 figures = this GPU's runtime build", flush=True)
    bench(output, deadline=start + CHECK_TIME_BUDGET_S)
    if differences:
        print(f"\nBUILD CHECK FAILED ({len(differences)}):\n" + "\n".join(differences), file=sys.stderr)
        sys.exit(1)


def main():
    parser = argparse.ArgumentParser(description="Decode attention kernels (GQA / MLA / GLA).")
    parser.add_argument("--bench", action="store_true", help="benchmark on CUDA against the memory-bound floor")
    parser.add_argument("--check", action="store_true",
                        help="on CUDA: bf16 results against the reference, then the benchmark (fails loudly)")
    parser.add_argument("--sass", action="store_true",
                        help="compile for sm_90 (no GPU needed) and print registers, shared memory, pipeline, "
                             "occupancy and balance per bench shape")
    parser.add_argument("--output", default=None, help="also write the table to PATH (.md: markdown, else CSV)")
    args = parser.parse_args()
    if args.sass:
        if sass_tools_dir() is None:
            print("kernels.py --sass needs Triton with its bundled CUDA tools (triton/backends/nvidia/bin)",
                  file=sys.stderr)
            sys.exit(2)
        rows = sass_table()
        widths = [max(len(str(x)) for x in col) for col in zip(SASS_COLUMNS, *rows)]
        for r in [SASS_COLUMNS] + rows:
            print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)))
        if args.output:
            _write_table(args.output, SASS_COLUMNS, rows)
        return
    if not (args.bench or args.check):
        parser.print_help()
        return
    if triton is None or not torch.cuda.is_available() or isinstance(_decode_split_kernel, InterpretedFunction):
        print(f"kernels.py --{'check' if args.check else 'bench'} needs a CUDA GPU, Triton, and TRITON_INTERPRET "
              "unset", file=sys.stderr)
        sys.exit(2)
    if args.check:
        check(args.output or "kernel_check.md")
    else:
        bench(args.output)


if __name__ == "__main__":
    main()
