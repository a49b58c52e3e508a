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
F.scaled_dot_product_attention). Decoding runs the "absorbed" form over a
preallocated cache (see LatentAttention.forward), through kernels.py.

Einsum index letters used below:
    b batch, t query position, g KV / latent head (group), k query head within
    its group, d per-head feature, r latent dims of one latent head.
"""

import math
import re
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from kernels import decode_attention, decode_attention_ref

ATTN_TYPES = ("gqa", "mla", "gla")
# Model shapes of the presets: (n_layer, n_embd, head_dim, vocab_size, block_size).
# Everything else is derived from these by make_config with the paper's ratios.
PRESETS = {
    "tiny": (2, 256, 32, 256, 128),  # trains on 2 CPU cores in about 2 minutes
    "small": (12, 768, 64, 50304, 1024),  # ~125M parameters, one GPU
    "paper": (24, 3072, 128, 50304, 2048),  # SPEC.md, Liu et al. 2026 ablation
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
    both the value and the non-rope part of the key (SPEC.md, Decoding).
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

    Width rule of SPEC.md (Liu et al. 2026, the double-heads ablation): the
    reference layer has n_embd // head_dim heads, i.e. 4 n_embd^2 attention
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
    query heads. Derived as in SPEC.md: GQA groups of 4 (at baseline);
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

    positions: (B or 1, T) int64. Returns cos, sin: (B or 1, T, 1, dim // 2)
    float32, broadcastable over heads. Computed per call (cheap next to the
    model), so decoding has no position table to outgrow.
    """
    inv_freq = theta ** (-torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)
    angles = positions.float()[..., None] * inv_freq  # (B, T, dim/2)
    return angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]


def apply_rope(x, cos, sin):
    """Rotate pairs (x_i, x_{i+dim/2}) of x (B, T, H, dim) by the angles; same dtype out."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def causal_attention(q, k, v, softmax_scale=None):
    """Causal softmax attention through F.scaled_dot_product_attention, in our layout.

    q (B, T, H, Dqk), k (B, T, Hkv, Dqk), v (B, T, Hkv, Dv) with H a multiple of
    Hkv (query head h reads KV head h // (H // Hkv)); returns (B, T, H, Dv).
    softmax_scale defaults to 1 / sqrt(Dqk).

    SDPA's fused CPU and GPU kernels need Dv == Dqk; otherwise it falls back to a
    math path that materialises the (T, T) score matrix of every head (MLA: 48-dim
    scores, 32-dim values at the tiny preset; 192 and 128 at paper scale). We pad
    the narrower of the two with zeros instead: zero key columns add nothing to the
    scores, zero value columns produce output columns we slice off, so the result
    and its gradients are unchanged, and the fused kernel runs (1.3x faster
    training at 8 x 512 tokens on a 2-core CPU, see README).
    """
    dqk, dv = q.size(-1), v.size(-1)
    scale = softmax_scale if softmax_scale is not None else dqk**-0.5
    if dv < dqk:
        v = F.pad(v, (0, dqk - dv))
    elif dqk < dv:
        q, k = F.pad(q, (0, dv - dqk)), F.pad(k, (0, dv - dqk))
    y = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=scale,
        enable_gqa=k.size(2) != q.size(2),
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


class KVCache(nn.Module):
    """One layer's decode cache, preallocated at max_seq_len and written in place.

    k_cache (B, S, Hk, Dk), v_cache (B, S, Hkv, Dv), shapes from kv_cache_shapes.
    Static shapes (no torch.cat growth): decode allocates nothing per step. (The
    capacity and cache_seqlens range checks still sync with the host once a step.)
    """

    def __init__(self, batch_size, max_seq_len, k_shape, v_shape, device=None, dtype=None):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.register_buffer("k_cache", torch.zeros(batch_size, max_seq_len, *k_shape, **kw), persistent=False)
        self.register_buffer("v_cache", torch.zeros(batch_size, max_seq_len, *v_shape, **kw), persistent=False)

    def attend(self, q, k, v, cache_seqlens, qv=None, softmax_scale=None):
        """Write the new tokens' k (B, Lq, Hk, Dk), v (B, Lq, Hkv, Dv) at positions
        cache_seqlens + [0, Lq), then attend over the cache; returns (B, Lq, Hq, Dv)."""
        B, Lq = k.shape[:2]
        pos = cache_seqlens[:, None].long() + torch.arange(Lq, device=k.device)  # (B, Lq)
        rows = torch.arange(B, device=k.device)[:, None]
        self.k_cache[rows, pos] = k.to(self.k_cache.dtype)
        self.v_cache[rows, pos] = v.to(self.v_cache.dtype)
        attention = decode_attention if q.is_cuda else decode_attention_ref
        seqlens = (cache_seqlens + Lq).to(torch.int32)  # the new tokens count as cached
        dtype = self.k_cache.dtype  # queries in the cache's dtype (autocast may have made them bf16)
        qv = None if qv is None else qv.to(dtype)
        return attention(q.to(dtype), self.k_cache, self.v_cache, seqlens, qv=qv, softmax_scale=softmax_scale)


# ----------------------------------------------------------------------------
# The attention variants. Both take x (B, T, n_embd), the RoPE angles, and
# cache_seqlens: None for training / full forward, else (B,) int32 tokens already
# in self.cache (decode; set up by GPT.setup_cache).


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

    def forward(self, x, cos, sin, cache_seqlens=None):
        """x (B, T, n_embd) -> (B, T, n_embd); cache_seqlens as in the section comment above."""
        B, T, _ = x.shape
        q = apply_rope(self.wq(x).view(B, T, self.n_head, self.head_dim), cos, sin)  # (B, T, H, D)
        k = apply_rope(self.wk(x).view(B, T, self.n_kv_head, self.head_dim), cos, sin)  # (B, T, Hkv, D)
        v = self.wv(x).view(B, T, self.n_kv_head, self.head_dim)  # (B, T, Hkv, D)
        if cache_seqlens is None:
            y = causal_attention(q, k, v)  # (B, T, H, D)
        else:
            y = self.cache.attend(q, k, v, cache_seqlens)  # (B, T, H, D)
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

    def forward(self, x, cos, sin, cache_seqlens=None):
        """x (B, T, n_embd) -> (B, T, n_embd); cache_seqlens None trains, else decodes (absorbed)."""
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

        if cache_seqlens is None:
            # Naive form (training): rebuild every head's key and value from its group's latent.
            k_nope = torch.einsum("btgr,gkdr->btgkd", latent, w_uk).reshape(B, T, H, self.nope)
            v = torch.einsum("btgr,gkdr->btgkd", latent, w_uv).reshape(B, T, H, self.v_dim)
            q = torch.cat([q_nope, q_rope], dim=-1)
            k = torch.cat([k_nope, k_rope.expand(B, T, H, self.rope)], dim=-1)
            y = causal_attention(q, k, v, self.softmax_scale)  # (B, T, H, v)
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
            o = self.cache.attend(
                q_rope, k_rope, latent, cache_seqlens, qv=qv.reshape(B, T, H, r), softmax_scale=self.softmax_scale
            )  # (B, T, H, r): still in latent space
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

    def forward(self, x, cos, sin, cache_seqlens=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, cache_seqlens)
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """Decoder-only transformer with tied embeddings and no biases (SPEC.md, paper preset).

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

    def _run(self, idx, positions, cache_seqlens=None):
        cos, sin = rope_cos_sin(positions, self.config.rope_dim, self.config.rope_theta)
        x = self.tok_emb(idx)
        for block in self.blocks:
            x = block(x, cos, sin, cache_seqlens)
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
        """Allocate every layer's KVCache for batch_size sequences of up to
        max_seq_len tokens (default block_size), in the model's dtype unless given."""
        max_seq_len = max_seq_len or self.config.block_size
        p = self.tok_emb.weight
        k_shape, v_shape = kv_cache_shapes(self.config)
        for block in self.blocks:
            block.attn.cache = KVCache(batch_size, max_seq_len, k_shape, v_shape, p.device, dtype or p.dtype)

    @torch.no_grad()
    def decode(self, idx, cache_seqlens):
        """Run Lq new tokens per sequence against the cache and append them to it.

        idx (B, Lq) int64: the new tokens (Lq = prompt length for prefill, 1 per
        decode step, > 1 to verify speculative drafts); cache_seqlens (B,) int32:
        tokens already cached per sequence (may differ across the batch: ragged
        batches). Returns logits (B, Lq, vocab_size). The caller advances
        cache_seqlens by Lq. Raises ValueError without a cache, for negative
        cache_seqlens, or when the new tokens would go past its capacity.
        """
        cache = self.blocks[0].attn.cache
        if cache is None:
            raise ValueError("no KV cache: call model.setup_cache(batch_size, max_seq_len) before decode")
        B, Lq = idx.shape
        capacity = cache.k_cache.shape[1]
        if cache.k_cache.shape[0] != B or cache_seqlens.shape != (B,):
            raise ValueError(f"cache holds {cache.k_cache.shape[0]} sequences, got idx {tuple(idx.shape)} "
                             f"and cache_seqlens {tuple(cache_seqlens.shape)}")
        if int(cache_seqlens.min()) < 0:
            raise ValueError(f"cache_seqlens must be >= 0, got {cache_seqlens.tolist()}")
        end = int(cache_seqlens.max()) + Lq
        if end > capacity:
            raise ValueError(f"decode past the cache capacity: {end} tokens > max_seq_len={capacity}; "
                             "call setup_cache with a larger max_seq_len")
        positions = cache_seqlens[:, None].long() + torch.arange(Lq, device=idx.device)  # (B, Lq)
        return self._run(idx, positions, cache_seqlens.to(torch.int32))

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Sample max_new_tokens after the prompt idx (B, T) with a KV cache.

        One prefill of the prompt, then one decode step per token. temperature 0
        means greedy (argmax). Returns (B, T + max_new_tokens) int64.
        """
        B, T = idx.shape
        self.setup_cache(B, T + max_new_tokens)
        seqlens = torch.zeros(B, dtype=torch.int32, device=idx.device)
        logits = self.decode(idx, seqlens)[:, -1]  # prefill
        seqlens += T
        for i in range(max_new_tokens):
            if temperature == 0:
                next_tok = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits.float() / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                next_tok = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat([idx, next_tok], dim=1)
            if i + 1 < max_new_tokens:
                logits = self.decode(next_tok, seqlens)[:, -1]
                seqlens += 1
        return idx


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
# Measuring stick for the benchmarks (train.py --bench): the HF transformers model
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
