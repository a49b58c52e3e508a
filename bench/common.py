"""What the CPU benchmarks share: the HF transformers model a user would pick instead, the machine's name, and
interleaved timing. transformers is a measuring stick here, not a dependency of the project."""
import platform
import time

import torch


def hf_twin(config):
    """The HF transformers model with this GPTConfig's dims: GQA -> LlamaForCausalLM; MLA and GLA-g -> a dense
    DeepseekV3ForCausalLM (every layer dense; MLA with the same q_lora_rank, kv_lora_rank of all latent heads
    together, as HF has no GLA, and qk_nope / qk_rope / v head dims). Tied embeddings, no biases, SDPA attention.
    Raises ImportError without transformers."""
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


def machine(device="cpu"):
    """One line naming the machine: the CPU model (or the GPU of a CUDA device), threads, torch version."""
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


def time_interleaved(contenders, repeats, warmup=1):
    """Seconds per call of each contender (name -> zero-argument function): warmup calls each, then `repeats`
    rounds that call each once in turn, so that a busy machine slows all of them alike. name -> list of seconds."""
    for _ in range(warmup):
        for fn in contenders.values():
            fn()
    times = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times
