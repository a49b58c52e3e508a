"""
GQA, MLA and GLA-g attention side by side, in one GPT.

Three ways to spend a decode step's memory traffic, written so they can be read
next to each other:

- GQA (Ainslie et al. 2023): n_kv_head key/value heads, each shared by a group
  of n_head // n_kv_head query heads. n_kv_head = n_head is MHA, 1 is MQA.
  Cache per token per layer: 2 * n_kv_head * head_dim.
- MLA (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1): keys and values are rebuilt
  per head from ONE compressed latent c (kv_lora_rank) plus ONE roped key shared
  by all heads (qk_rope_head_dim). Cache: kv_lora_rank + qk_rope_head_dim.
- GLA-g (Zadouri, Strauss, Dao 2025, "Hardware-Efficient Attention for Fast
  Decoding", arXiv 2505.21487, Sec. 3.3): the latent is split into g latent
  heads, each serving n_head // g query heads; the roped key stays shared.
  Same cache as MLA, but each head group reads only kv_lora_rank / g latent
  dims, and g devices can each hold one latent head. MLA is GLA-1, and the code
  is the same class.

Training runs the "naive" form (rebuild per-head K and V, then
F.scaled_dot_product_attention). Decoding fills a preallocated cache: a prompt
attends in the training form, each decode step in the "absorbed" form through
kernels.py (see LatentAttention.forward). `python gla.py --bench` times decoding;
`python gla.py --ckpt out/gla2/seed1337/ckpt.pt --prompt ...` samples from a trained run,
and under torchrun with --tp N each process keeps its tensor-parallel shard (shard_for_tp).

Einsum index letters used below:
    b batch, t query position, g KV / latent head (group), k query head within
    its group, d per-head feature, r latent dims of one latent head.
"""

import argparse
import functools
import json
import math
import os
import pathlib
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from kernels import MAX_LQ, decode_attention, decode_attention_ref

ATTN_TYPES = ("gqa", "mla", "gla")
# Model shapes of the presets: (n_layer, n_embd, head_dim, vocab_size, block_size).
# Everything else is derived from these by make_config with the paper's ratios.
PRESETS = {
    "tiny": (2, 256, 32, 256, 128),  # trains on 2 CPU cores in about 2 minutes
    "small": (12, 768, 64, 50304, 1024),  # ~125M parameters, one GPU
    "paper": (24, 3072, 128, 50304, 2048),  # the double-heads ablation of Liu et al. 2026
}


class ConfigError(ValueError):
    """A configuration that cannot be built; the message says what to change."""


@dataclass
class GPTConfig:
    """Everything that defines a model. Saved beside every run and in every checkpoint.

    Fields that a variant does not use keep their defaults (0): GQA ignores the
    *_rank / qk_* / v_head_dim fields, MLA and GLA ignore head_dim / n_kv_head.
    Raises ConfigError for head counts or dims the chosen variant cannot split.
    """

    attn: str = "gqa"  # "gqa", "mla" or "gla"
    vocab_size: int = 256
    block_size: int = 128  # training sequence length; default cache capacity
    n_layer: int = 2
    n_embd: int = 256
    n_head: int = 8
    ffn_hidden: int = 808  # SwiGLU width; make_config derives it with swiglu_width
    # GQA
    head_dim: int = 32
    n_kv_head: int = 2
    # MLA / GLA
    q_lora_rank: int = 0
    kv_lora_rank: int = 0  # all latent heads together
    n_latent_heads: int = 1  # 1 = MLA, 2 = GLA-2
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02

    def __post_init__(self):
        if self.attn not in ATTN_TYPES:
            raise ConfigError(f"unknown attn {self.attn!r}; choose one of {', '.join(ATTN_TYPES)}")
        for name in ("vocab_size", "block_size", "n_layer", "n_embd", "n_head", "ffn_hidden"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}={getattr(self, name)} must be positive")
        if self.attn == "gqa":
            if self.n_kv_head <= 0 or self.n_head % self.n_kv_head:
                raise ConfigError(
                    f"GQA cannot split n_head={self.n_head} query heads into n_kv_head={self.n_kv_head} "
                    "equal groups; choose n_head divisible by n_kv_head"
                )
            if self.head_dim <= 0 or self.head_dim % 2:
                raise ConfigError(f"head_dim={self.head_dim} must be positive and even (RoPE rotates pairs)")
            return
        if self.attn == "mla" and self.n_latent_heads != 1:
            raise ConfigError(f"MLA has one latent head, got n_latent_heads={self.n_latent_heads}; use attn='gla'")
        g = self.n_latent_heads
        if g <= 0 or self.n_head % g or self.kv_lora_rank % g:
            raise ConfigError(
                f"GLA-{g} cannot split n_head={self.n_head} query heads and kv_lora_rank={self.kv_lora_rank} "
                f"into {g} latent heads; choose both divisible by n_latent_heads={g}"
            )
        dims = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        if any(getattr(self, name) <= 0 for name in dims) or self.qk_rope_head_dim % 2:
            raise ConfigError(f"{self.attn} needs positive {', '.join(dims)} and an even qk_rope_head_dim")

    @property
    def rope_dim(self):
        return self.head_dim if self.attn == "gqa" else self.qk_rope_head_dim


def _round8(x):
    return int(math.floor(x / 8 + 0.5)) * 8


def kv_cache_shapes(config):
    """Per-token decode cache of one layer: ((Hk, Dk), (Hkv, Dv)) for k_cache and v_cache.

    GQA caches roped K and V of every KV head. MLA/GLA cache the ONE shared
    roped key as "k" and the normalized, scaled latent as "v": the latent is
    both the value and the non-rope part of the key (the absorbed decode of
    DeepSeek-V2, arXiv 2405.04434, Sec. 2.1; GLA, Zadouri et al. 2025, Sec. 3.3).
    """
    if config.attn == "gqa":
        return (config.n_kv_head, config.head_dim), (config.n_kv_head, config.head_dim)
    g = config.n_latent_heads
    return (1, config.qk_rope_head_dim), (g, config.kv_lora_rank // g)


def kv_cache_elems_per_token_per_layer(config):
    """Cached elements per token per layer (1536 for paper GQA, 576 for paper MLA and GLA-2)."""
    (hk, dk), (hv, dv) = kv_cache_shapes(config)
    return hk * dk + hv * dv


def swiglu_width(config):
    """SwiGLU width that gives attention + MLP the parameters of a reference MHA layer.

    The width rule of Liu et al. 2026 (arXiv 2603.02188, the double-heads ablation;
    its MLRA release sets every width this way, and the rule reproduces all six of its
    paper-scale widths): the reference layer has n_embd // head_dim heads, i.e. 4 n_embd^2 attention
    weights, and a SwiGLU of width 8/3 n_embd (3 matrices: 8 n_embd^2). We count
    every weight of this config's attention (RMSNorm weights included), give the
    rest to the MLP, and round its width to the nearest multiple of 8.
    """
    with torch.device("meta"):
        n_attn = sum(p.numel() for p in ATTENTION[config.attn](config).parameters())
    return _round8((12 * config.n_embd**2 - n_attn) / (3 * config.n_embd))


def make_config(preset="tiny", variant="gqa", double_heads=False, n_head=None, n_kv_head=None, n_layer=None,
                n_embd=None, head_dim=None, **overrides):
    """Build the GPTConfig of a preset and variant from the paper's ratios.

    variant: "gqa", "mla", or "glaG" (e.g. "gla2"). Baseline: n_embd // head_dim
    query heads. Derived as the paper-scale configs of Liu et al. 2026 (the MLRA
    release) are, at any width: GQA groups of 4 (at baseline);
    MLA q_lora_rank = n_embd/2; GLA q_lora_rank = n_embd/3 (rounded to 8);
    kv_lora_rank = 4 head_dim; qk_rope = head_dim/2; qk_nope = v = head_dim.
    double_heads doubles the query heads and nothing about the cache (same
    n_kv_head, same latent and rope dims); the width rule then shrinks the MLP.
    n_head: baseline query heads (default n_embd // head_dim), doubled by
    double_heads; n_kv_head: GQA's KV heads (default baseline n_head // 4).
    n_layer, n_embd, head_dim: replace the preset's shape before anything is
    derived from it (the CPU sweeps of README use them).
    overrides: any other GPTConfig field (block_size, vocab_size, ...); the
    SwiGLU width is re-derived unless ffn_hidden is given.
    Raises ConfigError for an unknown preset or variant or an unsplittable config.
    """
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    m = re.fullmatch(r"(gqa|mla|gla)(\d*)", variant)
    if m is None or (m[1] != "gla" and m[2]):
        raise ConfigError(f"unknown attention variant {variant!r}; choose gqa, mla or gla2")
    shape = PRESETS[preset]
    n_layer, n_embd, head_dim = n_layer or shape[0], n_embd or shape[1], head_dim or shape[2]
    vocab_size, block_size = shape[3:]
    n_head = n_head or n_embd // head_dim
    fields = dict(n_layer=n_layer, n_embd=n_embd, vocab_size=vocab_size, block_size=block_size, attn=m[1])
    if m[1] == "gqa":
        fields.update(head_dim=head_dim, n_kv_head=n_kv_head or max(n_head // 4, 1))
    else:
        fields.update(
            q_lora_rank=n_embd // 2 if m[1] == "mla" else _round8(n_embd / 3),
            kv_lora_rank=4 * head_dim,
            n_latent_heads=int(m[2] or 2) if m[1] == "gla" else 1,
            qk_nope_head_dim=head_dim,
            qk_rope_head_dim=head_dim // 2,
            v_head_dim=head_dim,
        )
    fields["n_head"] = 2 * n_head if double_heads else n_head
    fields.update(overrides)
    if "ffn_hidden" not in fields:  # the width rule counts the attention only
        fields["ffn_hidden"] = swiglu_width(GPTConfig(**fields))
    return GPTConfig(**fields)


# ----------------------------------------------------------------------------
# Shared pieces: RoPE, SwiGLU, the decode cache


def rope_cos_sin(positions, dim, theta):
    """RoPE angles (Su et al. 2021, RoFormer, Sec. 3.4) for integer positions.

    positions: (B or 1, T) int64. Returns cos, sin: (B or 1, T, 1, dim) float32,
    broadcastable over heads; entries i and i + dim/2 hold the angle of pair i.
    Computed per call (cheap next to the model), so decoding has no position table
    to outgrow.
    """
    inv_freq = theta ** (-torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)
    angles = positions.float()[..., None] * inv_freq  # (B, T, dim/2)
    angles = torch.cat((angles, angles), dim=-1)[:, :, None, :]  # (B, T, 1, dim)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate pairs (x_i, x_{i+dim/2}) of x (B, T, H, dim) by the angles; same dtype out.

    Written as x cos + (-x2, x1) sin, Llama-style: fewer tensor ops per call than
    rotating the halves one by one, and the same numbers bit for bit.
    """
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    return (x32 * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


def causal_attention(q, k, v, softmax_scale=None, attn_mask=None):
    """Causal softmax attention through F.scaled_dot_product_attention, in our layout.

    q (B, T, H, Dqk), k (B, S, Hkv, Dqk), v (B, S, Hkv, Dv) with H a multiple of
    Hkv (query head h reads KV head h // (H // Hkv)); returns (B, T, H, Dv).
    softmax_scale defaults to 1 / sqrt(Dqk). attn_mask None: the keys are the
    queries' own tokens (S = T), plain causal; else (B, 1, T, S) bool, True where a
    query may look (a prompt after cached tokens, see CacheSlots.prefill_mask).

    SDPA's fused CPU and GPU kernels need Dv == Dqk; otherwise it falls back to a
    math path that materialises the (T, T) score matrix of every head (MLA: 48-dim
    scores, 32-dim values at the tiny preset; 192 and 128 at paper scale). We pad
    the narrower of the two with zeros instead: zero key columns add nothing to the
    scores, zero value columns produce output columns we slice off, so the result
    and its gradients are unchanged (up to float rounding), and the fused kernel
    runs: 1.3x faster training than the math path at 8 x 512 tokens on a 2-core CPU.
    """
    dqk, dv = q.size(-1), v.size(-1)
    scale = softmax_scale if softmax_scale is not None else dqk**-0.5
    if dv < dqk:
        v = F.pad(v, (0, dqk - dv))
    elif dqk < dv:
        q, k = F.pad(q, (0, dv - dqk)), F.pad(k, (0, dv - dqk))
    y = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask, is_causal=attn_mask is None,
        scale=scale, enable_gqa=k.size(2) != q.size(2),
    )  # (B, H, T, max(Dqk, Dv))
    return y.transpose(1, 2)[..., :dv]  # (B, T, H, Dv)


class SwiGLU(nn.Module):
    """(silu(x W1) * (x W2)) W3 (Shazeer 2020, "GLU Variants Improve Transformer")."""

    def __init__(self, n_embd, hidden):
        super().__init__()
        self.w1 = nn.Linear(n_embd, hidden, bias=False)
        self.w2 = nn.Linear(n_embd, hidden, bias=False)
        self.w3 = nn.Linear(hidden, n_embd, bias=False)

    def forward(self, x):
        return self.w3(F.silu(self.w1(x)) * self.w2(x))


class CacheSlots(NamedTuple):
    """Where one GPT.decode call's Lq new tokens go, the same for every layer's KVCache.

    positions (B, Lq) int64: the new tokens' cache slots, which are also their RoPE positions;
    seqlens (B,) int32: tokens cached once they are written (decode_attention's cache_seqlens);
    max_seqlen: a host-side int bound on seqlens, so slicing the cache never waits for a GPU.
    """

    positions: torch.Tensor
    seqlens: torch.Tensor
    max_seqlen: int

    @property
    def use_decode_attention(self):
        """Whether the new tokens attend through the decode kernel (the absorbed form for
        MLA/GLA): up to kernels.MAX_LQ of them after cached ones. A prompt (nothing cached
        before it: max_seqlen == Lq) or a longer chunk goes through SDPA, the training path."""
        Lq = self.positions.shape[1]
        return Lq <= MAX_LQ and self.max_seqlen > Lq

    def prefill_mask(self):
        """SDPA's mask for the prefill path: None (plain causal) when nothing was cached
        before, else (B, 1, Lq, max_seqlen) bool: new token i of sequence b sees the cache
        up to its own position."""
        Lq = self.positions.shape[1]
        if self.max_seqlen == Lq:
            return None
        return torch.arange(self.max_seqlen, device=self.positions.device) <= self.positions[:, None, :, None]


class KVCache(nn.Module):
    """One layer's decode cache, preallocated at max_seq_len and written in place.

    Buffers k_cache (B, Hk, S, Dk) and v_cache (B, Hkv, S, Dv), head counts and dims from
    kv_cache_shapes, zero-initialised. Head-major as in gpt-fast: each head's cache is one
    contiguous (S, D) matrix, which the CPU path multiplies in place and a GPU reads in
    long coalesced runs; the kernels take (B, S, H, D) views of it (FA3's layout). Static
    shapes (no torch.cat growth): a decode step allocates no cache memory, and
    torch.compile sees the same shapes every step.
    """

    def __init__(self, batch_size, max_seq_len, k_shape, v_shape, device=None, dtype=None):
        super().__init__()
        (hk, dk), (hv, dv) = k_shape, v_shape
        kw = dict(device=device, dtype=dtype)
        self.register_buffer("k_cache", torch.zeros(batch_size, hk, max_seq_len, dk, **kw), persistent=False)
        self.register_buffer("v_cache", torch.zeros(batch_size, hv, max_seq_len, dv, **kw), persistent=False)

    def update(self, k, v, slots):
        """Write the new tokens' k (B, Lq, Hk, Dk) and v (B, Lq, Hkv, Dv) at slots.positions."""
        rows = torch.arange(k.shape[0], device=k.device)[:, None]  # (B, 1) against positions (B, Lq)
        self.k_cache.transpose(1, 2)[rows, slots.positions] = k.to(self.k_cache.dtype)
        self.v_cache.transpose(1, 2)[rows, slots.positions] = v.to(self.v_cache.dtype)

    def prefix(self, slots, dtype):
        """The first slots.max_seqlen cached tokens in `dtype`: k (B, S, Hk, Dk), v (B, S, Hkv, Dv)."""
        S = slots.max_seqlen
        return (self.k_cache[:, :, :S].transpose(1, 2).to(dtype), self.v_cache[:, :, :S].transpose(1, 2).to(dtype))

    def attend(self, q, slots, qv=None, softmax_scale=None):
        """Decode attention of q (B, Lq, Hq, Dk) (and qv) over the cache, the new tokens
        included; returns (B, Lq, Hq, Dv) in q's dtype. CUDA runs the Triton kernel, other
        devices the PyTorch reference, told that our buffers hold only finite numbers."""
        dtype = self.k_cache.dtype  # the kernel takes q in the cache's dtype (autocast may have made q bf16)
        args = (q.to(dtype), self.k_cache.transpose(1, 2), self.v_cache.transpose(1, 2), slots.seqlens)
        kw = dict(qv=None if qv is None else qv.to(dtype), softmax_scale=softmax_scale, max_seqlen=slots.max_seqlen)
        if q.is_cuda:
            out = decode_attention(*args, **kw)
        else:
            out = decode_attention_ref(*args, **kw, finite_cache=True)
        return out.to(q.dtype)


# ----------------------------------------------------------------------------
# The attention variants. Both take x (B, T, n_embd), the RoPE angles, and slots:
# None for training / full forward, else a CacheSlots (GPT.decode): the T new tokens
# are written to self.cache (set up by GPT.setup_cache), then a prompt attends
# through SDPA as in training and a decode step through the decode kernel.


class GroupedQueryAttention(nn.Module):
    """GQA (Ainslie et al. 2023, arXiv 2305.13245, Sec. 2.2); MHA and MQA as n_kv_head = n_head, 1.

    Query head h reads KV head h // (n_head // n_kv_head).
    Parameters: n_embd * head_dim * (2 n_head + 2 n_kv_head).
    Cache per token per layer: 2 * n_kv_head * head_dim (roped K and V).
    """

    def __init__(self, config):
        super().__init__()
        c = config
        self.n_head, self.n_kv_head, self.head_dim = c.n_head, c.n_kv_head, c.head_dim
        self.wq = nn.Linear(c.n_embd, c.n_head * c.head_dim, bias=False)
        self.wk = nn.Linear(c.n_embd, c.n_kv_head * c.head_dim, bias=False)
        self.wv = nn.Linear(c.n_embd, c.n_kv_head * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_head * c.head_dim, c.n_embd, bias=False)
        self.cache = None

    def forward(self, x, cos, sin, slots=None):
        """x (B, T, n_embd) -> (B, T, n_embd); slots as in the section comment above."""
        B, T, _ = x.shape
        q = apply_rope(self.wq(x).view(B, T, self.n_head, self.head_dim), cos, sin)  # (B, T, H, D)
        k = apply_rope(self.wk(x).view(B, T, self.n_kv_head, self.head_dim), cos, sin)  # (B, T, Hkv, D)
        v = self.wv(x).view(B, T, self.n_kv_head, self.head_dim)  # (B, T, Hkv, D)
        mask = None
        if slots is not None:
            self.cache.update(k, v, slots)
            if slots.use_decode_attention:
                return self.wo(self.cache.attend(q, slots).reshape(B, T, -1))
            k, v = self.cache.prefix(slots, q.dtype)  # (B, S, Hkv, D): the cached tokens, the new ones included
            mask = slots.prefill_mask()
        y = causal_attention(q, k, v, attn_mask=mask)  # (B, T, H, D)
        return self.wo(y.reshape(B, T, -1))


class LatentAttention(nn.Module):
    """MLA (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1) and GLA-g (Zadouri et al. 2025, Sec. 3.3).

    With H = n_head query heads, g = n_latent_heads, r = kv_lora_rank // g:
      queries: x -> wq_a (q_lora_rank) -> RMSNorm -> * sqrt(n_embd / q_lora_rank)
               -> wq_b -> per head [q_nope (qk_nope_head_dim) | q_rope (qk_rope_head_dim)]
      keys/values: x -> wkv_a -> [c (g x r) | k_rope (qk_rope_head_dim)];
               each latent head c_j gets its own RMSNorm and * sqrt(n_embd / r);
               k_rope is ONE roped head shared by every query head;
               query head h = (j, k) of group j up-projects c_j with wkv_b[j, k]
               into [k_nope (qk_nope_head_dim) | v (v_head_dim)].
      scores: [q_nope | q_rope] . [k_nope | k_rope] * softmax_scale,
               softmax_scale = 1 / sqrt(qk_nope_head_dim + qk_rope_head_dim).
    Cache per token per layer: kv_lora_rank + qk_rope_head_dim (c and k_rope),
    the same for MLA and GLA-g at equal kv_lora_rank.
    """

    def __init__(self, config):
        super().__init__()
        c = config
        self.n_head, self.g = c.n_head, c.n_latent_heads
        self.r = c.kv_lora_rank // c.n_latent_heads
        self.nope, self.rope, self.v_dim = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        # The latents are scaled by sqrt(n_embd / rank) after their RMSNorm, as Liu et al.'s
        # MLRA release does (DeepSeek-V2 has no such scale): a normalised rank-r vector then
        # has the norm of an n_embd-wide one, so the up-projections see inputs of one size.
        self.q_scale = math.sqrt(c.n_embd / c.q_lora_rank)
        self.kv_scale = math.sqrt(c.n_embd / self.r)
        self.softmax_scale = 1.0 / math.sqrt(self.nope + self.rope)
        self.wq_a = nn.Linear(c.n_embd, c.q_lora_rank, bias=False)
        self.q_norm = nn.RMSNorm(c.q_lora_rank, eps=c.norm_eps)
        self.wq_b = nn.Linear(c.q_lora_rank, c.n_head * (self.nope + self.rope), bias=False)
        self.wkv_a = nn.Linear(c.n_embd, c.kv_lora_rank + self.rope, bias=False)
        self.kv_norm = nn.ModuleList(nn.RMSNorm(self.r, eps=c.norm_eps) for _ in range(self.g))
        # Up-projection of each query head from its group's latent, stored per head
        # as (out, in) like a Linear weight: wkv_b[j, k] = [W_UK ; W_UV] of head (j, k).
        self.wkv_b = nn.Parameter(torch.empty(self.g, c.n_head // self.g, self.nope + self.v_dim, self.r))
        self.wo = nn.Linear(c.n_head * self.v_dim, c.n_embd, bias=False)
        self.cache = None

    def forward(self, x, cos, sin, slots=None):
        """x (B, T, n_embd) -> (B, T, n_embd); slots None trains, else decodes (a prompt in the
        naive form, a decode step in the absorbed form)."""
        B, T, _ = x.shape
        H, g, r = self.n_head, self.g, self.r
        q = self.wq_b(self.q_norm(self.wq_a(x)) * self.q_scale).view(B, T, H, self.nope + self.rope)
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        q_rope = apply_rope(q_rope, cos, sin)  # (B, T, H, rope)
        latent, k_rope = self.wkv_a(x).split([g * r, self.rope], dim=-1)
        latent = latent.view(B, T, g, r)
        latent = torch.stack([norm(latent[:, :, j]) for j, norm in enumerate(self.kv_norm)], dim=2) * self.kv_scale
        k_rope = apply_rope(k_rope.view(B, T, 1, self.rope), cos, sin)  # (B, T, 1, rope), shared by all heads
        w_uk, w_uv = self.wkv_b.split([self.nope, self.v_dim], dim=2)  # (g, H/g, nope, r), (g, H/g, v, r)

        naive = slots is None or not slots.use_decode_attention
        mask = None
        if slots is not None:
            # The cache holds only the latent and the shared roped key, whichever form attends.
            self.cache.update(k_rope, latent, slots)
            if naive:  # a prompt: the naive form over the cached tokens, the new ones included
                k_rope, latent = self.cache.prefix(slots, q.dtype)  # (B, S, 1, rope), (B, S, g, r)
                mask = slots.prefill_mask()
        if naive:
            # Naive form (training): rebuild every head's key and value from its group's latent.
            S = latent.shape[1]  # keys: T in training, the cached tokens in a prompt
            k_nope = torch.einsum("btgr,gkdr->btgkd", latent, w_uk).reshape(B, S, H, self.nope)
            v = torch.einsum("btgr,gkdr->btgkd", latent, w_uv).reshape(B, S, H, self.v_dim)
            q = torch.cat([q_nope, q_rope], dim=-1)
            k = torch.cat([k_nope, k_rope.expand(B, S, H, self.rope)], dim=-1)
            y = causal_attention(q, k, v, self.softmax_scale, attn_mask=mask)  # (B, T, H, v)
        else:
            # Absorbed form (decode). Since k_nope = W_UK c, the score q_nope . k_nope
            # equals (W_UK^T q_nope) . c: we fold W_UK into the query once per step
            # (qv, r dims) instead of rebuilding keys for every cached token. Likewise
            # sum_s p_s (W_UV c_s) = W_UV (sum_s p_s c_s): we attend over the latent
            # itself and up-project the result once. So the cache holds only c and
            # k_rope, and decode is MQA-shaped (MLA) or GQA-shaped with g groups (GLA):
            # the latent is both the value and the non-rope part of the key. W_UK and
            # W_UV are views of wkv_b, so nothing is recomputed per step.
            qv = torch.einsum("btgkd,gkdr->btgkr", q_nope.view(B, T, g, H // g, self.nope), w_uk)
            # o (B, T, H, r): the attention output, still in latent space
            o = self.cache.attend(q_rope, slots, qv=qv.reshape(B, T, H, r), softmax_scale=self.softmax_scale)
            y = torch.einsum("btgkr,gkdr->btgkd", o.view(B, T, g, H // g, r), w_uv)  # (B, T, g, H/g, v)
        return self.wo(y.reshape(B, T, -1))


ATTENTION = {"gqa": GroupedQueryAttention, "mla": LatentAttention, "gla": LatentAttention}


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config):
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.attn = ATTENTION[config.attn](config)
        self.mlp_norm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.mlp = SwiGLU(config.n_embd, config.ffn_hidden)

    def forward(self, x, cos, sin, slots=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, slots)
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """Decoder-only transformer with tied embeddings and no biases, pre-norm RMSNorm,
    SwiGLU MLPs and RoPE, as the models of Liu et al. 2026's ablation (the MLRA release).

    Init: every weight N(0, init_std), the attention and MLP output projections
    zero, RMSNorm weights one.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, mean=0.0, std=config.init_std)
        for block in self.blocks:
            nn.init.zeros_(block.attn.wo.weight)
            nn.init.zeros_(block.mlp.w3.weight)

    def num_params(self):
        """Parameter count, tied embedding counted once."""
        return sum(p.numel() for p in self.parameters())

    def _run(self, idx, positions, slots=None):
        cos, sin = rope_cos_sin(positions, self.config.rope_dim, self.config.rope_theta)
        x = self.tok_emb(idx)
        for block in self.blocks:
            x = block(x, cos, sin, slots)
        return self.lm_head(self.norm(x))

    def forward(self, idx, targets=None):
        """idx (B, T) int64 token ids, T <= block_size; targets (B, T) int64 or None.

        Returns (logits (B, T, vocab_size), loss: mean cross-entropy in nats, or None).
        Raises ValueError if T > block_size.
        """
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size={self.config.block_size}")
        logits = self._run(idx, torch.arange(T, device=idx.device)[None])
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    # ---------------------------------------------------------------- decoding

    def setup_cache(self, batch_size, max_seq_len=None, dtype=None):
        """Allocate every layer's KVCache for batch_size sequences of up to max_seq_len
        tokens (default block_size), in the model's dtype unless given. A cache dtype other
        than the model's stores K/V (or the latent) in it; attention math and outputs stay
        in the model's dtype. Raises ValueError for a dtype that is not floating point."""
        max_seq_len = max_seq_len or self.config.block_size
        p = self.tok_emb.weight
        dtype = dtype or p.dtype
        if not dtype.is_floating_point:
            raise ValueError(f"cache dtype must be floating point (e.g. torch.bfloat16), got {dtype}")
        k_shape, v_shape = kv_cache_shapes(self.config)
        for block in self.blocks:
            block.attn.cache = KVCache(batch_size, max_seq_len, k_shape, v_shape, p.device, dtype)

    @torch.no_grad()
    def decode(self, idx, cache_seqlens, *, max_seqlen=None):
        """Run Lq new tokens per sequence against the cache and append them to it.

        idx (B, Lq) int64: the new tokens (a prompt, 1 per decode step, or up to
        kernels.MAX_LQ speculative drafts to verify); cache_seqlens (B,) int: tokens
        already cached per sequence (may differ across the batch: ragged batches).
        Returns logits (B, Lq, vocab_size); the caller advances cache_seqlens by Lq.
        A prompt (nothing cached before) or a chunk of more than MAX_LQ tokens attends
        through SDPA, the training path; up to MAX_LQ tokens after cached ones go
        through the decode kernel (CacheSlots.use_decode_attention).
        max_seqlen: a host-side int bound, max(cache_seqlens) + Lq <= max_seqlen (a
        decode loop knows it). Given, we trust it and read nothing of cache_seqlens on
        the host: no GPU sync, and a step compiles with torch.compile(fullgraph=True).
        None: we read cache_seqlens to check it (on CUDA one sync) and take its max.
        Raises ValueError without a cache, for mismatched shapes, negative
        cache_seqlens, a max_seqlen < Lq, or when the new tokens would go past the
        cache's capacity.
        """
        cache = self.blocks[0].attn.cache
        if cache is None:
            raise ValueError("no KV cache: call model.setup_cache(batch_size, max_seq_len) before decode")
        B, Lq = idx.shape
        capacity = cache.k_cache.shape[2]
        if cache.k_cache.shape[0] != B or cache_seqlens.shape != (B,):
            raise ValueError(f"cache holds {cache.k_cache.shape[0]} sequences, got idx {tuple(idx.shape)} "
                             f"and cache_seqlens {tuple(cache_seqlens.shape)}")
        if max_seqlen is None:
            lo, hi = (int(x) for x in torch.aminmax(cache_seqlens))  # on CUDA: waits for the GPU
            if lo < 0:
                raise ValueError(f"cache_seqlens must be >= 0, got {cache_seqlens.tolist()}")
            max_seqlen = hi + Lq
        if max_seqlen > capacity:
            raise ValueError(f"decode past the cache capacity: {max_seqlen} tokens > max_seq_len={capacity}; "
                             "call setup_cache with a larger max_seq_len")
        if max_seqlen < Lq:
            raise ValueError(f"max_seqlen={max_seqlen} must count the Lq={Lq} new tokens too")
        positions = cache_seqlens[:, None].long() + torch.arange(Lq, device=idx.device)  # (B, Lq)
        slots = CacheSlots(positions, (cache_seqlens + Lq).to(torch.int32), max_seqlen)
        return self._run(idx, positions, slots)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, compile=False):
        """Sample max_new_tokens after the prompt idx (B, T) with a KV cache.

        One prefill of the prompt (through SDPA, as in training), then one decode step
        per token; temperature and top_k as in `sample`. We check the arguments and
        the cache's capacity once here, so a step never waits for the GPU.
        compile=True runs the steps through torch.compile(fullgraph=True, dynamic=False):
        a compiled step attends over the whole preallocated cache under a mask (static
        shapes, so it compiles once per batch size and length), while an eager step
        reads only the filled length. Returns (B, T + max_new_tokens) int64.
        Raises ValueError for an empty prompt, a negative max_new_tokens, or bad
        temperature / top_k.
        """
        check_sampling(temperature, top_k)
        B, T = idx.shape
        if T == 0 or max_new_tokens < 0:
            raise ValueError(f"need a prompt of >= 1 token and max_new_tokens >= 0; got T={T}, "
                             f"max_new_tokens={max_new_tokens}")
        S = T + max_new_tokens
        self.setup_cache(B, S)
        out = idx.new_empty(B, S)
        out[:, :T] = idx
        cached = torch.zeros(B, dtype=torch.int32, device=idx.device)  # tokens in the cache
        logits = self.decode(idx, cached, max_seqlen=T)[:, -1]  # prefill
        step = torch.compile(self.decode, fullgraph=True, dynamic=False) if compile else self.decode
        for t in range(T, S):
            out[:, t] = sample(logits, temperature, top_k)
            if t + 1 < S:
                cached.fill_(t)
                logits = step(out[:, t:t + 1], cached, max_seqlen=S if compile else t + 1)[:, -1]
        return out


def check_sampling(temperature, top_k):
    """Raise ValueError (one line) unless temperature >= 0 and top_k is None or >= 0."""
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 or None: no filtering), got {top_k}")


def sample(logits, temperature=1.0, top_k=None):
    """Next token ids (B,) int64 from logits (B, vocab_size).

    temperature 0: argmax (greedy). Otherwise a draw from softmax(logits / temperature)
    restricted to the top_k most likely tokens; top_k None or 0 keeps them all, as in
    HF transformers. Arguments as check_sampling allows.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k).values[:, -1:]  # (B, 1): the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)[:, 0]


# Prefixes that wrappers add to parameter names: torch.compile's OptimizedModule and
# DistributedDataParallel / DataParallel. A checkpoint saved through one loads as ours.
WRAPPER_PREFIXES = ("_orig_mod.", "module.")


def load_state(model, state_dict):
    """Load a state dict into model, stripping the prefixes of WRAPPER_PREFIXES.

    Raises ValueError (one line) naming missing, unexpected or misshapen entries,
    instead of load_state_dict's multi-line RuntimeError.
    """
    clean = {}
    for key, value in state_dict.items():
        while key.startswith(WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        clean[key] = value
    own = model.state_dict()
    missing = sorted(own.keys() - clean.keys())
    unexpected = sorted(clean.keys() - own.keys())
    shapes = [f"{k} {tuple(clean[k].shape)} vs {tuple(own[k].shape)}" for k in sorted(own.keys() & clean.keys())
              if tuple(clean[k].shape) != tuple(own[k].shape)]
    problems = [f"{what}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
                for what, keys in (("missing", missing), ("unexpected", unexpected), ("shape differs", shapes)) if keys]
    if problems:
        raise ValueError("the weights do not fit this model (" + "; ".join(problems) + ")")
    model.load_state_dict(clean)


# ----------------------------------------------------------------------------
# Tensor-parallel decode, Megatron-style (Shoeybi et al. 2019, arXiv 1909.08053, Sec. 3):
# each of tp ranks holds a slice of every layer and computes a partial sum of the
# attention output and of the MLP output; one all-reduce after each adds them up, so
# every rank carries the same residual stream. Query heads and MLP columns are split
# (the "column-parallel" wq / wq_b / wkv_b / w1 / w2: each rank computes its own
# heads and hidden units), and the output projections wo and w3 are split by their
# input columns to match ("row-parallel": each rank's share is a partial sum).
# Embeddings, norms, lm_head and MLA/GLA's query down-projection wq_a are replicated:
# every rank computes them, as it does the shared rope key. The KV or latent heads go
# with the query heads that read them, which is GLA's argument (Zadouri et al. 2025,
# Sec. 3.3 and the tensor-parallel discussion): GLA-2 at tp 2 gives each rank one
# latent head, while MLA's single latent must sit on every rank.


def n_groups(config):
    """KV heads (GQA) or latent heads (MLA/GLA): what the query heads are grouped by."""
    return config.n_kv_head if config.attn == "gqa" else config.n_latent_heads


def tp_config(config, tp):
    """The GPTConfig of one rank's shard under tp-way tensor parallelism.

    Each rank gets n_head / tp query heads and ffn_hidden / tp MLP columns. The
    KV or latent heads are split when tp divides them (GQA's 6 KV heads: 3 per
    rank at tp 2; GLA-2: one latent head per rank) and duplicated when tp is a
    multiple of them (MLA's single latent on every rank). Raises ConfigError
    when tp divides neither way or does not divide n_head and ffn_hidden.
    """
    g = n_groups(config)
    if tp < 1 or config.n_head % tp or config.ffn_hidden % tp or (g % tp and tp % g):
        what = "n_kv_head" if config.attn == "gqa" else "n_latent_heads"
        raise ConfigError(f"--tp {tp} must divide n_head={config.n_head} and ffn_hidden={config.ffn_hidden}, and "
                          f"divide {what}={g} or be a multiple of it; pick another --tp")
    local = max(g // tp, 1)  # KV / latent heads per rank
    fields = dict(n_head=config.n_head // tp, ffn_hidden=config.ffn_hidden // tp)
    if config.attn == "gqa":
        fields["n_kv_head"] = local
    else:
        fields.update(n_latent_heads=local, kv_lora_rank=config.kv_lora_rank // g * local)
    return replace(config, **fields)


class TPShare(NamedTuple):
    """What rank `rank` of `tp` holds: its config and its slices of the full model's query
    heads, KV/latent heads (groups) and MLP columns, as ranges of indices."""

    config: GPTConfig
    heads: range
    groups: range
    ffn: range


def tp_share(config, rank, tp):
    """TPShare of rank under tp-way tensor parallelism; ConfigError as tp_config."""
    local = tp_config(config, tp)
    heads = range(rank * local.n_head, (rank + 1) * local.n_head)
    g0 = heads.start // (config.n_head // n_groups(config))  # the group of our first query head
    ffn = range(rank * local.ffn_hidden, (rank + 1) * local.ffn_hidden)
    return TPShare(local, heads, range(g0, g0 + n_groups(local)), ffn)


def _keep(linear, dim, *spans):
    """Keep only the features in spans (ranges) of linear's outputs (dim 0) or inputs (dim 1)."""
    index = torch.cat([torch.arange(s.start, s.stop) for s in spans]).to(linear.weight.device)
    linear.weight = nn.Parameter(linear.weight.detach().index_select(dim, index))
    linear.out_features, linear.in_features = linear.weight.shape


def _rows(span, width):
    """Feature indices of heads (or groups) `span`, each `width` features wide, as a range."""
    return range(span.start * width, span.stop * width)


def _all_reduce_output(module, args, output):
    """Forward hook: the rank's partial output (its slice of wo or w3) summed over ranks."""
    dist.all_reduce(output)
    return output


def shard_for_tp(model, rank, tp):
    """Turn a full GPT (weights loaded) into rank's tp-way shard, in place; returns it.

    Slices every block (see the section comment): GQA keeps its query heads'
    rows of wq, their KV heads' rows of wk and wv; MLA/GLA keep their query heads'
    rows of wq_b and of wkv_b, their latent heads' rows of wkv_a and kv_norm plus
    the shared rope key's rows (every rank computes that key); both keep the
    matching input columns of wo; the MLP keeps its columns of w1, w2 and rows of
    w3. Then sets the per-rank head counts and model.config = tp_config(...), so
    setup_cache allocates only this rank's cache, and hooks an all-reduce onto the
    output of every attention and MLP (torch.distributed must be initialised
    before the first forward). The training code is untouched: a shard runs the
    same forward, decode and generate.
    Raises ConfigError as tp_config.
    """
    full, share = model.config, tp_share(model.config, rank, tp)
    for block in model.blocks:
        attn = block.attn
        if full.attn == "gqa":
            _keep(attn.wq, 0, _rows(share.heads, full.head_dim))
            _keep(attn.wk, 0, _rows(share.groups, full.head_dim))
            _keep(attn.wv, 0, _rows(share.groups, full.head_dim))
            _keep(attn.wo, 1, _rows(share.heads, full.head_dim))
            attn.n_kv_head = share.config.n_kv_head
        else:
            latent_rows = _rows(share.groups, attn.r)
            rope_rows = range(full.kv_lora_rank, full.kv_lora_rank + full.qk_rope_head_dim)
            _keep(attn.wq_b, 0, _rows(share.heads, full.qk_nope_head_dim + full.qk_rope_head_dim))
            _keep(attn.wkv_a, 0, latent_rows, rope_rows)
            attn.kv_norm = attn.kv_norm[share.groups.start:share.groups.stop]
            # wkv_b (g, H/g, nope + v, r): query head h = (j, k) is row j * H/g + k once we flatten
            # (g, H/g), so our heads are one block of rows, inside our latent head(s)
            w = attn.wkv_b.detach().flatten(0, 1)[share.heads.start:share.heads.stop]  # (H_r, nope + v, r)
            attn.wkv_b = nn.Parameter(w.unflatten(0, (len(share.groups), -1)))
            _keep(attn.wo, 1, _rows(share.heads, full.v_head_dim))
            attn.g = share.config.n_latent_heads
        attn.n_head = share.config.n_head
        _keep(block.mlp.w1, 0, share.ffn)
        _keep(block.mlp.w2, 0, share.ffn)
        _keep(block.mlp.w3, 1, share.ffn)
        attn.register_forward_hook(_all_reduce_output)
        block.mlp.register_forward_hook(_all_reduce_output)
    model.config = share.config
    return model


# ----------------------------------------------------------------------------
# Measuring stick for the benchmarks (train.py and gla.py --bench): the HF transformers model
# a user would pick instead, at equal dims. transformers is not a dependency.


def hf_twin(config):
    """The HF transformers model with this config's dims, for side-by-side speed.

    GQA -> LlamaForCausalLM; MLA and GLA-g -> a dense DeepseekV3ForCausalLM (every
    layer dense, MLA with the same q_lora_rank, kv_lora_rank (all latent heads
    together: HF has no GLA), qk_nope / qk_rope / v head dims). Tied embeddings,
    no biases, SDPA attention, float32. Raises ImportError without transformers.
    """
    import transformers

    c = config
    common = dict(vocab_size=c.vocab_size, hidden_size=c.n_embd, intermediate_size=c.ffn_hidden,
                  num_hidden_layers=c.n_layer, num_attention_heads=c.n_head, max_position_embeddings=c.block_size,
                  rms_norm_eps=c.norm_eps, tie_word_embeddings=True, attention_bias=False,
                  rope_parameters=dict(rope_type="default", rope_theta=c.rope_theta))
    if c.attn == "gqa":
        hf = transformers.LlamaConfig(num_key_value_heads=c.n_kv_head, head_dim=c.head_dim, mlp_bias=False, **common)
        cls = transformers.LlamaForCausalLM
    else:
        hf = transformers.DeepseekV3Config(
            num_key_value_heads=c.n_head, q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank,
            qk_nope_head_dim=c.qk_nope_head_dim, qk_rope_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim,
            first_k_dense_replace=c.n_layer, n_routed_experts=1, rope_interleave=False, **common)
        cls = transformers.DeepseekV3ForCausalLM
    hf._attn_implementation = "sdpa"
    return cls(hf)


# ----------------------------------------------------------------------------
# Command line. python gla.py --bench: decode speed on this machine's CPU.

BENCH_CALLS = 10  # calls per timed run of a single decode step or forward (milliseconds each)


def machine(device="cpu"):
    """One line naming the machine for benchmark output: the CPU model (or the GPU of a
    CUDA device), threads, torch version."""
    if torch.device(device).type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:  # Linux names the CPU model here
                name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return f"{name}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def _time_interleaved(contenders, repeats):
    """Seconds per call of each contender (name -> zero-argument function): one warm-up
    call each, then `repeats` rounds that call each once in turn, so a busy machine slows
    all of them alike. Returns name -> list of seconds."""
    for fn in contenders.values():
        fn()
    times = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def bench(args):
    """Greedy generation tokens/s, ours (eager, optionally compiled) against HF transformers
    at equal dims (hf_twin; skipped without transformers), then the cost of the next token
    at context_len tokens: one cached decode step against recomputing the full forward.
    Prints markdown tables; CPU, float32."""
    torch.manual_seed(0)
    P, N = args.prompt_len, args.new_tokens
    print(f"Decode benchmark on {machine()}")
    print(f"preset {args.preset}, float32, greedy, {P}-token prompt + {N} new tokens; tokens/s = "
          f"B x {N} / median seconds of {args.repeats} interleaved runs (prefill included)\n")
    names = ["ours"] + (["ours compiled"] if args.compile else []) + ["HF"]
    print("| variant | B | " + " | ".join(f"{n} tok/s" for n in names) + " | "
          + " | ".join(f"{n} / HF" for n in names[:-1]) + " |")
    print("|---|---|" + "---|" * (2 * len(names) - 1))
    hf_missing = False
    for variant in args.variants:
        config = make_config(args.preset, variant, block_size=P + N)
        model = GPT(config).eval()
        try:
            hf = hf_twin(config).eval()
            hf.generation_config.eos_token_id = None  # always N new tokens, as ours
            hf.generation_config.pad_token_id = 0
        except ImportError:
            hf, hf_missing = None, True
        for B in args.batch_sizes:
            idx = torch.randint(0, config.vocab_size, (B, P))
            contenders = {"ours": lambda: model.generate(idx, N, temperature=0)}
            if args.compile:
                contenders["ours compiled"] = lambda: model.generate(idx, N, temperature=0, compile=True)
            if hf is not None:
                contenders["HF"] = lambda: hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=N,
                                                       do_sample=False)
            with torch.no_grad():
                times = _time_interleaved(contenders, args.repeats)
            rates = [f"{B * N / statistics.median(times[n]):.0f}" if n in times else "-" for n in names]
            ratios = [f"{statistics.median(times['HF']) / statistics.median(times[n]):.2f}" if hf else "-"
                      for n in names[:-1]]
            print(f"| {variant} | {B} | " + " | ".join(rates + ratios) + " |", flush=True)
    if hf_missing:
        print("\n(HF columns empty: transformers is not installed)")

    L = args.context_len
    print(f"\nThe next token at {L} tokens, B=1: one decode step over the {L - 1} cached tokens against "
          f"recomputing the full forward over all {L} (median of {args.repeats} interleaved runs of "
          f"{BENCH_CALLS} calls):\n")
    print("| variant | decode step ms | full forward ms | speedup |\n|---|---|---|---|")
    for variant in args.variants:
        model = GPT(make_config(args.preset, variant, block_size=L)).eval()
        idx = torch.randint(0, model.config.vocab_size, (1, L))
        model.setup_cache(1, L)
        cached = torch.full((1,), L - 1, dtype=torch.int32)
        with torch.no_grad():
            model.decode(idx[:, :-1], torch.zeros_like(cached), max_seqlen=L - 1)  # the first L - 1 tokens
            times = _time_interleaved({  # each call rewrites the same last cache slot: the same work every time
                "cached": lambda: [model.decode(idx[:, -1:], cached, max_seqlen=L) for _ in range(BENCH_CALLS)],
                "recompute": lambda: [model(idx) for _ in range(BENCH_CALLS)]}, args.repeats)
        step, full = (statistics.median(times[n]) / BENCH_CALLS for n in ("cached", "recompute"))
        print(f"| {variant} | {step * 1e3:.2f} | {full * 1e3:.2f} | {full / step:.1f} |", flush=True)


# ----------------------------------------------------------------------------
# python gla.py --ckpt out/gla2/seed1337/ckpt.pt --prompt "...": text from a trained run, through
# the KV cache and the decode path of GPT.generate, on one process or (torchrun) tp of them.


class Codec(NamedTuple):
    """How a run's prompt becomes token ids (encode: str -> list of int) and ids become text."""

    name: str
    encode: Callable[[str], list]
    decode: Callable[[list], str]


def _bytes_to_text(ids):
    # Invalid UTF-8 (a half-learned character) shows as \xNN escapes, so nothing drawn is
    # hidden; ids past 255 (a byte-level run with a padded vocabulary can draw them) as <id>.
    return b"".join(bytes([i]) if i < 256 else f"<{i}>".encode() for i in ids).decode(errors="backslashreplace")


def _parse_ids(prompt):
    try:
        return [int(t) for t in prompt.split()]
    except ValueError:
        raise ValueError("this run reads GPT-2 token ids and tiktoken is not installed: give --prompt as ids, "
                         "e.g. --prompt '464 2068 7586'") from None


def text_codec(config, source=None):
    """The Codec of a run. source: the data source train.py wrote to config.json (None:
    unknown). The default corpus and text files are byte-level (train.py reads bytes);
    token files hold GPT-2 ids, which tiktoken turns into text if it is installed (not a
    dependency), and which are printed as numbers otherwise. Without a source, a
    vocabulary of 256 means bytes."""
    byte_level = config.vocab_size == 256 if source is None else not source.startswith("token files")
    if byte_level:
        return Codec("bytes", lambda s: list(s.encode()), _bytes_to_text)
    try:
        import tiktoken

        enc = tiktoken.get_encoding("gpt2")
        return Codec("GPT-2 BPE (tiktoken)", enc.encode, enc.decode)
    except Exception:  # not installed, or its vocabulary file cannot be fetched (offline)
        return Codec("GPT-2 token ids", _parse_ids, lambda ids: " ".join(map(str, ids)))


def load_run(path):
    """(GPTConfig, state dict, data source or None) of a train.py run, from its ckpt.pt or
    its folder. The checkpoint is memory-mapped: only the weights we load are read. The
    data source comes from config.json beside it. Raises ValueError (one line) for a
    missing or unreadable checkpoint."""
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / "ckpt.pt"
    if not path.is_file():
        raise ValueError(f"no checkpoint at {path}; pass a run's ckpt.pt (train.py writes "
                         "<out_dir>/<run>/seed<seed>/ckpt.pt) or its folder")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        config, state = GPTConfig(**ckpt["config"]["model"]), ckpt["model"]
    except Exception as e:  # truncated, not a checkpoint, or not train.py's
        first_line = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"cannot read {path} as a train.py checkpoint ({type(e).__name__}: {first_line})") from None
    info = path.with_name("config.json")
    source = json.loads(info.read_text()).get("data", {}).get("source") if info.is_file() else None
    return config, state, source


def variant_name(config):
    """gqa, mla or glaG (e.g. gla2), as make_config and train.py name them."""
    return f"gla{config.n_latent_heads}" if config.attn == "gla" else config.attn


def cache_report(model, full_config, rank, tp, length):
    """One line: what rank holds of the full model and its KV cache at `length` tokens
    (elements per token per layer, and bytes of every layer's filled cache)."""
    share = tp_share(full_config, rank, tp)
    kind = "KV" if full_config.attn == "gqa" else "latent"
    caches = [block.attn.cache for block in model.blocks]
    nbytes = sum(c.k_cache[:, :, :length].nbytes + c.v_cache[:, :, :length].nbytes for c in caches)
    return (f"rank {rank}/{tp}: {_span('query head', share.heads)} of {full_config.n_head}, "
            f"{_span(kind + ' head', share.groups)} of {n_groups(full_config)}, {_span('MLP column', share.ffn)} | "
            f"KV cache: {kv_cache_elems_per_token_per_layer(model.config)} elements per token per layer (one "
            f"process: {kv_cache_elems_per_token_per_layer(full_config)}), {nbytes:,} bytes at {length} tokens "
            f"({len(caches)} layers x batch {caches[0].k_cache.shape[0]}, {caches[0].k_cache.dtype})")


def _span(noun, r):
    """'heads 4-7' or 'head 1': a range of indices in words."""
    return f"{noun}s {r.start}-{r.stop - 1}" if len(r) > 1 else f"{noun} {r.start}"


class SampleJob(NamedTuple):
    """One checkpoint to sample from, checked: its model, weights, codec, prompt ids and length."""

    path: str
    config: GPTConfig
    state: dict
    codec: Codec
    prompt: list
    max_new_tokens: int


def prepare_sampling(args):
    """Check everything the sampling command was given before any process group or model
    exists, so that every rank fails alike, with one line. Returns (device, [SampleJob]).
    Raises ValueError (ConfigError for a --tp the model cannot split)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if args.tp != world:
        fix = (f"launch torchrun --standalone --nproc_per_node={args.tp} gla.py ... --tp {args.tp}" if args.tp > 1
               else f"pass --tp {world}")
        raise ValueError(f"--tp {args.tp} needs {args.tp} process(es), found WORLD_SIZE={world}: {fix}")
    check_sampling(args.temperature, args.top_k)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        if world > torch.cuda.device_count():
            raise ValueError(f"--tp {world} on CUDA needs {world} GPUs, found {torch.cuda.device_count()}; "
                             "use --device cpu (gloo) or fewer processes")
        if world > 1:
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    jobs = []
    for path in args.ckpt:
        config, state, source = load_run(path)
        tp_config(config, args.tp)
        codec = text_codec(config, source)
        prompt = codec.encode(args.prompt)
        capacity = config.block_size  # the run's training length: positions past it were never trained
        if not prompt or len(prompt) >= capacity:
            raise ValueError(f"{path}: the prompt is {len(prompt)} tokens ({codec.name}); it needs 1 to "
                             f"{capacity - 1} to fit the cache of block_size={capacity} with a new token")
        if max(prompt) >= config.vocab_size:
            raise ValueError(f"{path}: prompt token id {max(prompt)} >= vocab_size={config.vocab_size}")
        n_new = capacity - len(prompt) if args.max_new_tokens is None else args.max_new_tokens
        if len(prompt) + n_new > capacity:
            raise ValueError(f"{path}: a {len(prompt)}-token prompt + --max_new_tokens {n_new} exceed the cache "
                             f"of block_size={capacity} tokens; lower --max_new_tokens or shorten the prompt")
        jobs.append(SampleJob(str(path), config, state, codec, prompt, n_new))
    return device, jobs


def run_sampling(args, device, jobs):
    """Sample from each job's model on this rank and print, on rank 0, the text, tokens/s
    and what every rank holds. Under torchrun (args.tp > 1), each rank builds the full
    model (for a moment it holds all the weights: simple, not frugal), keeps its shard
    (shard_for_tp), and runs the same generate: the all-reduces give every rank the
    same logits, so the same seed draws the same tokens everywhere (checked at the end
    of each job)."""
    rank, tp = int(os.environ.get("RANK", 0)), args.tp
    if tp > 1:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        for job in jobs:
            model = GPT(job.config)
            load_state(model, job.state)
            model.to(device).eval()
            if tp > 1:
                shard_for_tp(model, rank, tp)
            idx = torch.tensor([job.prompt], device=device)
            generate = functools.partial(model.generate, idx, job.max_new_tokens, args.temperature, args.top_k,
                                         compile=args.compile)
            if args.compile:
                generate()  # compiles the step (once per length); the timed run below reuses it
            torch.manual_seed(args.seed)
            t0 = time.perf_counter()
            out = generate()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - t0
            mine = (cache_report(model, job.config, rank, tp, out.shape[1]), out[0].tolist())
            ranks = [mine]
            if tp > 1:
                ranks = [None] * tp
                dist.all_gather_object(ranks, mine)
            if any(tokens != mine[1] for _, tokens in ranks):
                raise RuntimeError("the ranks drew different tokens: their logits differ; a sharding bug")
            if rank == 0:
                how = "greedy" if args.temperature == 0 else f"temperature {args.temperature}, top_k {args.top_k}"
                print(f"== {job.path}: {variant_name(job.config)}, {job.codec.name}, tp {tp}, {device.type}, "
                      f"{model.tok_emb.weight.dtype}, {how}, seed {args.seed}")
                print(job.codec.decode(mine[1]))
                print(f"-- {job.max_new_tokens} new tokens in {seconds:.3f} s: {job.max_new_tokens / seconds:.1f} "
                      f"tokens/s (batch 1, prompt of {len(job.prompt)} tokens, prefill included)")
                print("\n".join(report for report, _ in ranks), flush=True)
    finally:
        if tp > 1:
            dist.destroy_process_group()


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block; under torchrun from rank 0 only
        if os.environ.get("RANK", "0") == "0":
            self._print_message(f"{self.prog}: error: {message}\n", sys.stderr)
        self.exit(2)


def main(argv=None):
    parser = _Parser(description="GQA, MLA and GLA-g in one GPT. --ckpt: sample text from a trained run "
                     "(under torchrun with --tp N: tensor-parallel); --bench: decode speed on this CPU.")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--compile", action="store_true", help="decode steps through torch.compile "
                        "(sampling: after one untimed run that compiles; --bench: also time them)")
    g = parser.add_argument_group("sampling: python gla.py --ckpt out/gla2/seed1337/ckpt.pt --prompt TEXT")
    g.add_argument("--ckpt", nargs="+", help="train.py checkpoints (ckpt.pt or its run folder), sampled in turn")
    g.add_argument("--prompt", default="\n", help="text (byte-level runs, or GPT-2 runs with tiktoken), "
                   "else GPT-2 token ids separated by spaces (default: a newline)")
    g.add_argument("--max_new_tokens", type=int, default=None, help="default: fill the run's block_size")
    g.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    g.add_argument("--top_k", type=int, default=200, help="sample among the k likeliest tokens (0: all)")
    g.add_argument("--seed", type=int, default=1337)
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel processes; > 1 under torchrun "
                   "--nproc_per_node=TP (gloo on CPU, nccl on GPUs)")
    g.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    b = parser.add_argument_group("benchmark: python gla.py --bench")
    b.add_argument("--bench", action="store_true", help="time greedy generation: ours vs HF, cache vs none")
    b.add_argument("--preset", default="tiny", choices=list(PRESETS), help="model shape (default tiny)")
    b.add_argument("--variants", nargs="+", default=["gqa", "mla", "gla2"], help="e.g. gqa mla gla2")
    b.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 8])
    b.add_argument("--prompt_len", type=int, default=32)
    b.add_argument("--new_tokens", type=int, default=256)
    b.add_argument("--context_len", type=int, default=512, help="tokens in the cached step vs full forward")
    b.add_argument("--repeats", type=int, default=5, help="interleaved timed runs per contender")
    args = parser.parse_args(argv)
    for name, least in (("prompt_len", 1), ("new_tokens", 1), ("context_len", 2), ("repeats", 1), ("threads", 1),
                        ("max_new_tokens", 0), ("tp", 1)):
        value = getattr(args, name)
        if value is not None and value < least:
            parser.error(f"--{name} must be >= {least}, got {value}")
    if min(args.batch_sizes) < 1:
        parser.error(f"--batch_sizes must be >= 1, got {args.batch_sizes}")
    for variant in args.variants:
        try:
            make_config(args.preset, variant)
        except ConfigError as e:
            parser.error(str(e))
    if args.bench and args.ckpt:
        parser.error("--bench and --ckpt are two commands; give one")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.bench:
        bench(args)
    elif args.ckpt:
        try:
            device, jobs = prepare_sampling(args)
        except ValueError as e:
            parser.error(str(e))
        run_sampling(args, device, jobs)
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
