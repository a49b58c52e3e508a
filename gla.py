"""GQA, MLA and GLA-g attention side by side, in one GPT.

- GQA (Ainslie et al. 2023, arXiv 2305.13245): n_kv_head key/value heads, each shared by n_head // n_kv_head query
  heads. Cache per token per layer: 2 * n_kv_head * head_dim.
- MLA (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1): keys and values rebuilt per head from ONE latent (kv_lora_rank),
  plus ONE roped key shared by all heads. Cache: kv_lora_rank + qk_rope_head_dim.
- GLA-g (Zadouri, Strauss, Dao 2025, arXiv 2505.21487, Sec. 3.3): the latent split into g latent heads, each serving
  n_head // g query heads: MLA's cache, but g devices can each hold one latent head. MLA is GLA-1: one class.

Einsum letters: b batch, t position, g KV / latent head (group), h query head within its group, d per-head feature,
r latent dims of one latent head."""

import hashlib
import math
import re
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from kernels import MAX_LQ, decode_attention, decode_attention_ref, decode_mask

# ---- The config: presets, the paper's ratios, the MLP width rule
VARIANTS = ("gqa", "mla", "gla2")  # the double-heads ablation's three designs
PRESETS = {  # model shapes: (n_layer, n_embd, head_dim, vocab_size, block_size)
    "tiny": (2, 256, 32, 256, 128),  # trains on 2 CPU cores in minutes
    "small": (12, 768, 64, 50304, 1024),  # ~124M parameters, one GPU
    "paper": (24, 3072, 128, 50304, 2048),  # the double-heads ablation of Liu et al. 2026
}


@dataclass
class GPTConfig:
    """Everything that defines a model; saved with every run. A variant ignores the others' fields."""
    attn: str = "gqa"  # "gqa", "mla" or "gla"
    vocab_size: int = 256
    block_size: int = 128  # training sequence length; default cache capacity
    n_layer: int = 2
    n_embd: int = 256
    n_head: int = 8
    ffn_hidden: int = 811  # SwiGLU width; make_config derives it with swiglu_width
    head_dim: int | None = 32  # GQA (None for MLA / GLA)
    n_kv_head: int | None = 2  # GQA
    q_lora_rank: int | None = None  # MLA / GLA from here on (None for GQA)
    kv_lora_rank: int | None = None  # all latent heads together
    n_latent_heads: int | None = None  # g: 1 = MLA, 2 = GLA-2
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02

    def __post_init__(self):
        if self.attn == "gqa":
            own = (self.head_dim, self.n_kv_head)
        else:
            own = (self.q_lora_rank, self.kv_lora_rank, self.n_latent_heads, self.qk_nope_head_dim,
                   self.qk_rope_head_dim, self.v_head_dim)
        assert None not in own, f"{self.attn}'s own fields are unset: make_config sets them"
        assert self.n_head >= 1, "no query head: head_dim is wider than n_embd"
        assert self.ffn_hidden >= 1, f"{self.n_head} query heads leave the MLP no width: fewer heads or a wider n_embd"
        assert self.rope_dim % 2 == 0, \
            f"RoPE rotates pairs, but the roped dims are {self.rope_dim}: an even head_dim (MLA / GLA: a multiple of 4)"
        assert self.n_groups >= 1 and self.n_head % self.n_groups == 0, \
            f"{self.n_head} query heads do not split into {self.n_groups} groups"
        if self.attn != "gqa":
            assert self.q_lora_rank >= 1, "no query latent: n_embd is too narrow"
            assert self.kv_lora_rank % self.n_latent_heads == 0, \
                f"a latent of {self.kv_lora_rank} does not split into {self.n_latent_heads} latent heads"

    @property
    def rope_dim(self):
        return self.head_dim if self.attn == "gqa" else self.qk_rope_head_dim

    @property
    def n_groups(self):
        """What the query heads are grouped by: KV heads (GQA) or latent heads (MLA / GLA)."""
        return self.n_kv_head if self.attn == "gqa" else self.n_latent_heads

    @property
    def kv_cache_shapes(self):
        """((Hk, Dk), (Hkv, Dv)) per token of a layer's k_cache, v_cache: GQA's roped K and V; MLA / GLA's one roped
        key and the latent heads."""
        if self.attn == "gqa":
            return (self.n_kv_head, self.head_dim), (self.n_kv_head, self.head_dim)
        return (1, self.qk_rope_head_dim), (self.n_latent_heads, self.kv_lora_rank // self.n_latent_heads)

    @property
    def kv_cache_elems_per_token_per_layer(self):
        """Cached elements per token per layer (1536 for paper GQA, 576 for paper MLA and GLA-2)."""
        return sum(heads * dim for heads, dim in self.kv_cache_shapes)


def swiglu_width(config):
    """Liu et al. 2026's rule: the SwiGLU width giving attention + MLP the parameters of a reference MHA layer
    (4 n_embd^2 attention weights, SwiGLU width 8/3 n_embd). Rounded to a multiple of 8 (the paper's widths) from
    n_embd 1024 on, below to 1."""
    with torch.device("meta"):  # counted without memory, RMSNorm gains included
        attention = sum(p.numel() for p in ATTENTION[config.attn](config).parameters())
    width = (12 * config.n_embd**2 - attention) / (3 * config.n_embd)
    multiple = 8 if config.n_embd >= 1024 else 1
    return multiple * int(math.floor(width / multiple + 0.5))


def make_config(preset="tiny", variant="gqa", double_heads=False, n_head=None, n_embd=None, head_dim=None,
                n_kv_head=None, kv_lora_rank=None, **overrides):
    """The GPTConfig of a preset and variant ("gqa", "mla" or "glaG", e.g. "gla2") with the ratios of Liu et al.
    2026's paper-scale configs at any width: n_embd // head_dim query heads, GQA groups of 4, q_lora_rank n_embd / 2
    (MLA) or n_embd / 3 (GLA), kv_lora_rank 4 head_dim, qk_rope head_dim / 2, qk_nope = v = head_dim. double_heads
    doubles the query heads and nothing of the cache. Keywords replace the preset's values."""
    m = re.fullmatch(r"(gqa|mla|gla)(\d*)", variant)
    assert m and (m[1] == "gla" or not m[2]), f"unknown attention variant {variant!r}: gqa, mla or glaG (e.g. gla2)"
    n_layer, preset_embd, preset_head_dim, vocab_size, block_size = PRESETS[preset]
    n_embd = n_embd or preset_embd
    head_dim = head_dim or preset_head_dim
    n_head = n_head or n_embd // head_dim
    fields = dict(n_layer=n_layer, n_embd=n_embd, vocab_size=vocab_size, block_size=block_size, attn=m[1],
                  n_head=2 * n_head if double_heads else n_head)
    if m[1] == "gqa":
        fields.update(head_dim=head_dim, n_kv_head=n_kv_head or max(n_head // 4, 1))
    else:
        fields.update(head_dim=None, n_kv_head=None,
                      q_lora_rank=n_embd // 2 if m[1] == "mla" else 8 * int(math.floor(n_embd / 24 + 0.5)),
                      kv_lora_rank=kv_lora_rank or 4 * head_dim, qk_nope_head_dim=head_dim,
                      qk_rope_head_dim=head_dim // 2, v_head_dim=head_dim,
                      n_latent_heads=int(m[2] or 2) if m[1] == "gla" else 1)
    fields.update(overrides)
    if "ffn_hidden" not in fields:  # the width rule counts the attention only
        fields["ffn_hidden"] = swiglu_width(GPTConfig(**fields))
    return GPTConfig(**fields)


# ---- Shared pieces: RoPE, causal attention, SwiGLU
def rope_cos_sin(positions, dim, theta):
    """RoPE angles (Su et al. 2021, RoFormer, Sec. 3.4) of positions (B or 1, T) int64: cos and the signed sin,
    (B or 1, T, 1, dim) float32, pair i being (i, i + dim/2), the GPT-NeoX / Llama layout."""
    inv_freq = torch.pow(theta, -torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim)
    angles = positions.float()[..., None] * inv_freq  # (B, T, dim/2)
    cos, sin = angles.cos(), angles.sin()
    return torch.cat((cos, cos), dim=-1)[:, :, None, :], torch.cat((-sin, sin), dim=-1)[:, :, None, :]


def apply_rope(x, cos, sin):
    """Rotate the pairs (x_i, x_{i+dim/2}) of x (B, T, H, dim) by rope_cos_sin's angles; x's dtype out. The pair
    (x_i cos - x_{i+dim/2} sin, x_{i+dim/2} cos + x_i sin) is x * cos + (x rolled by dim/2) * the signed sin."""
    x32 = x.float()
    return (x32 * cos + x32.roll(x.shape[-1] // 2, dims=-1) * sin).to(x.dtype)


def causal_attention(q, k, v, softmax_scale=None, attn_mask=None):
    """Causal softmax attention through SDPA: q (B, T, H, Dqk), k (B, S, Hkv, Dqk), v (B, S, Hkv, Dv) -> (B, T, H, Dv);
    attn_mask: None (causal) or additive (B, 1, T, S). SDPA's fused kernels need Dv == Dqk (MLA: 192-dim keys,
    128-dim values): we zero-pad the narrower side."""
    dqk, dv = q.size(-1), v.size(-1)
    scale = softmax_scale if softmax_scale is not None else dqk**-0.5
    if dv < dqk:
        v = F.pad(v, (0, dqk - dv))
    elif dqk < dv:
        q, k = F.pad(q, (0, dv - dqk)), F.pad(k, (0, dv - dqk))
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask,
                                       is_causal=attn_mask is None, scale=scale, enable_gqa=k.size(2) != q.size(2))
    return y.transpose(1, 2)[..., :dv]  # y (B, H, T, max(Dqk, Dv)) -> (B, T, H, Dv)


class SwiGLU(nn.Module):
    """(silu(x W1) * (x W2)) W3 (Shazeer 2020, "GLU Variants Improve Transformer")."""
    def __init__(self, n_embd, hidden):
        super().__init__()
        self.w1 = nn.Linear(n_embd, hidden, bias=False)
        self.w2 = nn.Linear(n_embd, hidden, bias=False)
        self.w3 = nn.Linear(hidden, n_embd, bias=False)

    def forward(self, x):
        return self.w3(F.silu(self.w1(x)) * self.w2(x))


# ---- The attention designs take x (B, T, n_embd) and the RoPE angles; to decode, also the new tokens' positions
# (B, T) and max_seqlen, a host-side bound on the cache's length with them (None: training, no cache).
def uses_decode_kernel(positions, max_seqlen):
    """Up to MAX_LQ new tokens after cached ones go through the decode kernel; a prompt or a longer chunk, SDPA."""
    return positions.shape[1] <= MAX_LQ and max_seqlen > positions.shape[1]


class GroupedQueryAttention(nn.Module):
    """GQA (Ainslie et al. 2023, Sec. 2.2): query head h reads KV head h // (n_head / n_kv_head). Cache: roped K, V."""
    def __init__(self, config):
        super().__init__()
        c = config
        self.n_head = c.n_head
        self.n_kv_head = c.n_kv_head
        self.head_dim = c.head_dim
        self.wq = nn.Linear(c.n_embd, c.n_head * c.head_dim, bias=False)
        self.wk = nn.Linear(c.n_embd, c.n_kv_head * c.head_dim, bias=False)
        self.wv = nn.Linear(c.n_embd, c.n_kv_head * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_head * c.head_dim, c.n_embd, bias=False)
        self.cache = None

    def forward(self, x, cos, sin, positions=None, max_seqlen=None):
        B, T, _ = x.shape
        q = apply_rope(self.wq(x).view(B, T, self.n_head, self.head_dim), cos, sin)  # (B, T, H, D)
        k = apply_rope(self.wk(x).view(B, T, self.n_kv_head, self.head_dim), cos, sin)  # (B, T, Hkv, D)
        v = self.wv(x).view(B, T, self.n_kv_head, self.head_dim)  # (B, T, Hkv, D)
        if max_seqlen is None:  # training
            y = causal_attention(q, k, v)
        else:
            self.cache.update(k, v, positions)
            if uses_decode_kernel(positions, max_seqlen):
                y = self.cache.attend(q, positions, max_seqlen)
            else:
                k, v, mask = self.cache.prefix(positions, max_seqlen, q.dtype)  # (B, S, Hkv, D): all cached tokens
                y = causal_attention(q, k, v, attn_mask=mask)
        return self.wo(y.reshape(B, T, -1))


class LatentAttention(nn.Module):
    """MLA (DeepSeek-V2, Sec. 2.1) and GLA-g (Zadouri et al. 2025, Sec. 3.3).

    With H = n_head query heads, g = n_latent_heads, r = kv_lora_rank // g:
      queries: x -> wq_a (q_lora_rank) -> RMSNorm -> * sqrt(n_embd / q_lora_rank)
               -> wq_b -> per head [q_nope (qk_nope_head_dim) | q_rope (qk_rope_head_dim)]
      keys/values: x -> wkv_a -> [c (g x r) | k_rope (qk_rope_head_dim)]; each latent head c_j has its own
               RMSNorm and * sqrt(n_embd / r); k_rope is ONE roped head for all; query head h = (j, k)
               up-projects c_j with wkv_b[j, k] into [k_nope (qk_nope_head_dim) | v (v_head_dim)].
      scores: [q_nope | q_rope] . [k_nope | k_rope] / sqrt(qk_nope_head_dim + qk_rope_head_dim)."""
    def __init__(self, config):
        super().__init__()
        c = config
        self.n_head = c.n_head
        self.g = c.n_latent_heads
        self.r = c.kv_lora_rank // c.n_latent_heads  # one latent head's dims
        self.nope_dim = c.qk_nope_head_dim
        self.rope_dim = c.qk_rope_head_dim
        self.v_dim = c.v_head_dim
        # Latents scaled by sqrt(n_embd / rank) after their RMSNorm, as the MLRA release (not DeepSeek-V2) does.
        self.q_scale = math.sqrt(c.n_embd / c.q_lora_rank)
        self.kv_scale = math.sqrt(c.n_embd / self.r)
        self.softmax_scale = 1.0 / math.sqrt(self.nope_dim + self.rope_dim)
        self.wq_a = nn.Linear(c.n_embd, c.q_lora_rank, bias=False)
        self.q_norm = nn.RMSNorm(c.q_lora_rank, eps=c.norm_eps)
        self.wq_b = nn.Linear(c.q_lora_rank, c.n_head * (self.nope_dim + self.rope_dim), bias=False)
        self.wkv_a = nn.Linear(c.n_embd, c.kv_lora_rank + self.rope_dim, bias=False)
        self.kv_norm = nn.ModuleList(nn.RMSNorm(self.r, eps=c.norm_eps) for _ in range(self.g))
        # wkv_b[j, k] = [W_UK ; W_UV] of query head (j, k), DeepSeek-V2's up-projections of the latent to the key's
        # non-rope part and to the value, stored (out, in) like a Linear weight.
        self.wkv_b = nn.Parameter(torch.empty(self.g, c.n_head // self.g, self.nope_dim + self.v_dim, self.r))
        self.wo = nn.Linear(c.n_head * self.v_dim, c.n_embd, bias=False)
        self.cache = None

    def forward(self, x, cos, sin, positions=None, max_seqlen=None):
        B, T, _ = x.shape
        H, g, r = self.n_head, self.g, self.r
        q = self.wq_b(self.q_norm(self.wq_a(x)) * self.q_scale).view(B, T, H, self.nope_dim + self.rope_dim)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        q_rope = apply_rope(q_rope, cos, sin)  # (B, T, H, rope)
        latent, k_rope = self.wkv_a(x).split([g * r, self.rope_dim], dim=-1)
        latent = latent.view(B, T, g, r)
        latent = torch.stack([norm(latent[:, :, j]) for j, norm in enumerate(self.kv_norm)], dim=2) * self.kv_scale
        k_rope = apply_rope(k_rope.view(B, T, 1, self.rope_dim), cos, sin)  # (B, T, 1, rope), shared by all heads
        w_uk, w_uv = self.wkv_b.split([self.nope_dim, self.v_dim], dim=2)  # (g, H/g, nope, r), (g, H/g, v, r)
        if max_seqlen is None or not uses_decode_kernel(positions, max_seqlen):
            # Naive form (training, and a prompt): rebuild every head's key and value from its group's latent.
            mask = None
            if max_seqlen is not None:  # a prompt attends over every cached token, the new ones too
                self.cache.update(k_rope, latent, positions)
                k_rope, latent, mask = self.cache.prefix(positions, max_seqlen, q.dtype)  # (B, S, 1 or g, .)
            S = latent.shape[1]
            k_nope = torch.einsum("btgr,ghdr->btghd", latent, w_uk).reshape(B, S, H, self.nope_dim)
            v = torch.einsum("btgr,ghdr->btghd", latent, w_uv).reshape(B, S, H, self.v_dim)
            q = torch.cat([q_nope, q_rope], dim=-1)
            k = torch.cat([k_nope, k_rope.expand(B, S, H, self.rope_dim)], dim=-1)
            y = causal_attention(q, k, v, self.softmax_scale, attn_mask=mask)  # (B, T, H, v)
        else:
            # Absorbed form (decode). Since k_nope = W_UK c, the score q_nope . k_nope equals (W_UK^T q_nope) . c:
            # we fold W_UK into the query once per step (qv, r dims) instead of rebuilding keys for every cached
            # token. Likewise sum_s p_s (W_UV c_s) = W_UV (sum_s p_s c_s): we attend over the latent itself and
            # up-project the result once. So the cache holds only c and k_rope, and decode is MQA-shaped (MLA) or
            # GQA-shaped with g groups (GLA): the latent is both the value and the non-rope part of the key.
            self.cache.update(k_rope, latent, positions)
            qv = torch.einsum("btghd,ghdr->btghr", q_nope.view(B, T, g, H // g, self.nope_dim), w_uk)
            # The naive form's scale, 1/sqrt(nope + rope): not the kernel's default, 1/sqrt(rope + r).
            o = self.cache.attend(q_rope, positions, max_seqlen, qv.reshape(B, T, H, r), self.softmax_scale)
            y = torch.einsum("btghr,ghdr->btghd", o.view(B, T, g, H // g, r), w_uv)  # o: in latent space
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

    def forward(self, x, cos, sin, positions=None, max_seqlen=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, positions, max_seqlen)
        return x + self.mlp(self.mlp_norm(x))


# ---- The decode cache
class KVCache(nn.Module):
    """One layer's decode cache, preallocated and written in place as in gpt-fast: the same shapes every step.
    k_cache (B, Hk, S, Dk) and v_cache (B, Hkv, S, Dv) (GPTConfig.kv_cache_shapes), head-major: each head's cache is
    read in one run; the kernels take (B, S, H, D) views."""
    def __init__(self, batch_size, max_seq_len, k_shape, v_shape, device=None, dtype=None):
        super().__init__()
        for name, (heads, dim) in ("k_cache", k_shape), ("v_cache", v_shape):
            self.register_buffer(name, torch.zeros(batch_size, heads, max_seq_len, dim, device=device, dtype=dtype),
                                 persistent=False)

    def update(self, k, v, positions):
        """Write the new tokens' k (B, Lq, Hk, Dk) and v (B, Lq, Hkv, Dv) at positions (B, Lq) int64."""
        at = (torch.arange(k.shape[0], device=k.device)[:, None], positions)  # rows (B, 1), positions (B, Lq)
        self.k_cache.transpose(1, 2).index_put_(at, k.to(self.k_cache.dtype))
        self.v_cache.transpose(1, 2).index_put_(at, v.to(self.v_cache.dtype))

    def prefix(self, positions, max_seqlen, dtype):
        """The first max_seqlen cached tokens, k (B, S, Hk, Dk) and v (B, S, Hkv, Dv) in dtype, and the mask
        (B, 1, Lq, S) of new tokens at positions (B, Lq) (None: causal)."""
        k, v = (c[:, :, :max_seqlen].transpose(1, 2).to(dtype) for c in (self.k_cache, self.v_cache))
        mask = None if max_seqlen == positions.shape[1] else decode_mask(positions, max_seqlen).to(dtype)
        return k, v, mask

    def attend(self, q, positions, max_seqlen, qv=None, softmax_scale=None):
        """Decode attention of new tokens at positions (B, Lq): q (B, Lq, Hq, Dk) (and qv) over the cache, the new
        ones included -> (B, Lq, Hq, Dv)."""
        dtype = self.k_cache.dtype  # in the cache's dtype (autocast may have made q bf16)
        seqlens = (positions[:, -1] + 1).to(torch.int32)  # cached tokens, the new ones written: cache_seqlens
        args = (q.to(dtype), self.k_cache.transpose(1, 2), self.v_cache.transpose(1, 2), seqlens,
                None if qv is None else qv.to(dtype), softmax_scale)
        kernel = decode_attention if q.is_cuda else decode_attention_ref
        return kernel(*args, max_seqlen=max_seqlen).to(q.dtype)


# ---- The model: training forward, decode, generate
ZERO_INIT = ("attn.wo.weight", "mlp.w3.weight")  # output projections start at zero: each block is the identity


class GPT(nn.Module):
    """Decoder-only transformer as in Liu et al. 2026's ablation: tied embeddings, no biases, pre-norm RMSNorm, SwiGLU,
    RoPE."""
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, mean=0.0, std=config.init_std)
            if name.endswith(ZERO_INIT):
                nn.init.zeros_(p)

    def couple_init(self, seed, twin):
        """Redraw every N(0, init_std) weight for common random numbers with the model of GPTConfig `twin` (the other
        arm of a double-heads pair): weight `name` is drawn at the larger of its two shapes from a stream keyed by
        (seed, name) and keeps the leading slice, so what the arms share (the embedding, the KV or latent
        projections, the leading rows of the others) starts equal."""
        with torch.device("meta"):
            other = dict(GPT(twin).named_parameters())
        for name, p in self.named_parameters():
            if p.dim() < 2 or name.endswith(ZERO_INIT):
                continue
            digest = hashlib.blake2b(repr((seed, name)).encode(), digest_size=8).digest()
            key = int.from_bytes(digest, "little")
            shape = [max(a, b) for a, b in zip(p.shape, other[name].shape)]
            w = torch.randn(shape, generator=torch.Generator().manual_seed(key)) * self.config.init_std
            with torch.no_grad():
                p.copy_(w[tuple(slice(n) for n in p.shape)])

    def num_params(self):
        """Parameter count, the tied embedding once."""
        return sum(p.numel() for p in self.parameters())

    def _run(self, idx, positions, max_seqlen=None):
        cos, sin = rope_cos_sin(positions, self.config.rope_dim, self.config.rope_theta)
        x = self.tok_emb(idx)
        for block in self.blocks:
            x = block(x, cos, sin, positions, max_seqlen)
        return self.lm_head(self.norm(x))

    def forward(self, idx, targets=None):
        """idx, targets (B, T) int64, T <= block_size -> (logits (B, T, vocab_size), mean cross-entropy in nats or
        None)."""
        T = idx.shape[1]
        assert T <= self.config.block_size, f"{T} tokens, but block_size is {self.config.block_size}"
        logits = self._run(idx, torch.arange(T, device=idx.device)[None])
        loss = None if targets is None else F.cross_entropy(logits.float().flatten(0, 1), targets.reshape(-1))
        return logits, loss

    def setup_cache(self, batch_size, max_seq_len=None, dtype=None):
        """Allocate every layer's KVCache: batch_size sequences of up to max_seq_len tokens (default block_size)."""
        p = self.tok_emb.weight
        if dtype is None:
            dtype = p.dtype
        if max_seq_len is None:
            max_seq_len = self.config.block_size
        for block in self.blocks:
            block.attn.cache = KVCache(batch_size, max_seq_len, *self.config.kv_cache_shapes, p.device, dtype)

    @torch.no_grad()
    def decode(self, idx, cache_seqlens, *, max_seqlen=None):
        """Run Lq new tokens idx (B, Lq) int64 after cache_seqlens (B,) int32 cached tokens each (ragged batches
        welcome), write them into the cache and return their logits (B, Lq, vocab_size). max_seqlen: a host-side
        bound on max(cache_seqlens) + Lq (given, nothing waits for the GPU)."""
        cache = self.blocks[0].attn.cache
        assert cache is not None, "call setup_cache first"
        Lq = idx.shape[1]
        if max_seqlen is None:
            max_seqlen = int(cache_seqlens.max()) + Lq  # the cache is sliced to a host-side length: a GPU sync
        assert max_seqlen <= cache.k_cache.shape[2], "past the cache's max_seq_len"
        positions = cache_seqlens[:, None].long() + torch.arange(Lq, device=idx.device)  # (B, Lq)
        return self._run(idx, positions, max_seqlen)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Sample max_new_tokens after the prompts idx (B, T) int64 -> (B, T + max_new_tokens) int64: a prefill, then a
        cached decode step per token (temperature, top_k as in `sample`). As forward, at most block_size tokens."""
        B, T = idx.shape
        S = T + max_new_tokens
        assert T >= 1, "an empty prompt"
        assert S <= self.config.block_size, \
            f"a prompt of {T} tokens and {max_new_tokens} new ones exceed block_size, {self.config.block_size}"
        self.setup_cache(B, S)
        out = torch.cat([idx, idx.new_empty(B, max_new_tokens)], dim=1)  # (B, S): the prompt, then the samples
        cached = torch.zeros(B, dtype=torch.int32, device=idx.device)  # tokens in the cache
        with torch.inference_mode():  # no autograd bookkeeping on every op; the cache stays a normal tensor
            logits = self.decode(idx, cached, max_seqlen=T)[:, -1]  # prefill
            for t in range(T, S):
                out[:, t] = sample(logits, temperature, top_k)
                if t + 1 < S:
                    cached.fill_(t)
                    logits = self.decode(out[:, t:t + 1], cached, max_seqlen=t + 1)[:, -1]
        return out


def sample(logits, temperature=1.0, top_k=None):
    """Next token ids (B,) int64 from logits (B, vocab_size): argmax at temperature 0, else a draw from
    softmax(logits / temperature) over the top_k likeliest (None or 0: all).

    logits - max is divided in float64: the likeliest stays at 0, and a tiny temperature (1e-40) sends the rest to
    -inf, never softmax to NaN.
    The draw is gpt-fast's: argmax_i p_i / E_i with E_i ~ Exponential(1). E_i / p_i is an exponential wait of rate
    p_i, and the shortest of such waits is token i's with probability p_i: torch.multinomial's draw, without waiting
    for the GPU."""
    assert temperature >= 0 and (top_k or 0) >= 0, f"temperature {temperature} and top_k {top_k}: 0 or more"
    if temperature == 0:
        return logits.argmax(dim=-1)
    shifted = logits.double() - logits.double().amax(dim=-1, keepdim=True)  # (B, vocab): <= 0, the likeliest 0
    logits = (shifted / temperature).float()  # -inf where a tiny temperature leaves nothing
    if top_k and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k).values[:, -1:]  # (B, 1): the k-th largest logit
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = F.softmax(logits, dim=-1)
    return (probs / torch.empty_like(probs).exponential_(1)).argmax(dim=-1)


# ---- Tensor-parallel decode, Megatron-style (Shoeybi et al. 2019, arXiv 1909.08053, Sec. 3)
# Query heads and MLP columns are split across ranks, the KV or latent heads go with the query heads that read them,
# the rest is replicated. That is GLA's argument (Zadouri et al. 2025, Sec. 3.3): at tp 2 each rank of GLA-2 caches
# one latent head and the rope key, 320 of the 576 elements per token and layer; MLA's one latent sits whole on both.
class TPShare(NamedTuple):
    """What a rank holds: its config, and its ranges of the full model's query heads, groups and MLP columns."""
    config: GPTConfig
    heads: range
    groups: range
    ffn: range


def tp_share(config, rank, tp):
    """The TPShare of rank of tp: n_head / tp query heads, about ffn_hidden / tp MLP columns; the KV / latent heads
    split when tp divides them, shared when tp is a multiple."""
    g = config.n_groups
    assert config.n_head % tp == 0 and (g % tp == 0 or tp % g == 0), \
        f"{tp} processes must divide the {config.n_head} query heads, and divide the {g} groups or be a multiple"
    H = config.n_head // tp  # query heads per rank
    local = max(g // tp, 1)  # KV / latent heads per rank
    if config.attn == "gqa":
        fields = dict(n_kv_head=local)
    else:
        fields = dict(n_latent_heads=local, kv_lora_rank=config.kv_lora_rank // g * local)
    first_group = rank * H // (config.n_head // g)  # the group of our first query head
    ffn = range(rank * config.ffn_hidden // tp, (rank + 1) * config.ffn_hidden // tp)
    return TPShare(replace(config, n_head=H, ffn_hidden=len(ffn), **fields),
                   range(rank * H, (rank + 1) * H), range(first_group, first_group + local), ffn)


def _keep(linear, dim, *spans, width=1):
    """Keep the features of spans (ranges of heads `width` wide) of linear's outputs (dim 0) or inputs (dim 1)."""
    index = torch.cat([torch.arange(s.start * width, s.stop * width) for s in spans]).to(linear.weight.device)
    linear.weight = nn.Parameter(linear.weight.detach().index_select(dim, index))
    linear.out_features, linear.in_features = linear.weight.shape


def _all_reduce_output(module, args, output):
    dist.all_reduce(output)


def shard_for_tp(model, rank, tp):
    """Turn a full GPT (weights loaded) into rank's tp-way shard, in place: model.config becomes the shard's, and an
    all-reduce sums the partial attention and MLP outputs of the ranks (initialise torch.distributed first)."""
    full = model.config
    share = tp_share(full, rank, tp)
    for block in model.blocks:
        attn = block.attn
        if full.attn == "gqa":
            for linear, span in (attn.wq, share.heads), (attn.wk, share.groups), (attn.wv, share.groups):
                _keep(linear, 0, span, width=full.head_dim)
            _keep(attn.wo, 1, share.heads, width=full.head_dim)
            attn.n_kv_head = share.config.n_kv_head
        else:
            rope = range(full.kv_lora_rank, full.kv_lora_rank + full.qk_rope_head_dim)
            _keep(attn.wq_b, 0, share.heads, width=full.qk_nope_head_dim + full.qk_rope_head_dim)
            _keep(attn.wkv_a, 0, range(share.groups.start * attn.r, share.groups.stop * attn.r), rope)
            attn.kv_norm = attn.kv_norm[share.groups.start:share.groups.stop]
            # wkv_b (g, H/g, nope + v, r): query head h = (j, k) is row j * H/g + k of its first two dims flattened,
            # so our heads are one block of rows, inside our latent head(s).
            w = attn.wkv_b.detach().flatten(0, 1)[share.heads.start:share.heads.stop]
            attn.wkv_b = nn.Parameter(w.unflatten(0, (len(share.groups), -1)))
            _keep(attn.wo, 1, share.heads, width=full.v_head_dim)
            attn.g = share.config.n_latent_heads
        attn.n_head = share.config.n_head
        for linear, dim in (block.mlp.w1, 0), (block.mlp.w2, 0), (block.mlp.w3, 1):
            _keep(linear, dim, share.ffn)
        for module in attn, block.mlp:  # a rank's output is a partial sum (its slice of wo or w3): sum in place
            module.register_forward_hook(_all_reduce_output)
    model.config = share.config
    return model
