"""What the benchmarks share: the HF transformers model a user would pick instead, the machine's name,
interleaved timing, and the GLA paper's per-device decode shapes (BENCH_SHAPES) with their inputs. transformers
is a measuring stick here, not a dependency of the project."""
import contextlib
import importlib
import importlib.util
import io
import pathlib
import platform
import statistics
import sys
import time

import torch

import gla
import train

OUR_KERNELS = pathlib.Path(__file__).resolve().parents[1] / "kernels.py"


class InputError(Exception):
    """Bad input to a bench script, in its own flags or in train.py's that it passes on: one line to print."""


def train_call(fn, *args):
    """fn(*args), one of train.py's functions that end bad input in SystemExit (get_args, setup, model_config), that
    input raised as InputError: its one line without the "train.py: " prefix, or argparse's without its usage block."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return fn(*args)
    except SystemExit as e:
        if isinstance(e.code, str):
            raise InputError(e.code.removeprefix("train.py: ")) from None
        last = err.getvalue().strip().rpartition("\n")[2]
        if e.code != 2 or not last.startswith("train.py: error: "):
            raise
        err = io.StringIO()  # argparse's usage block and its line: the InputError says it
        raise InputError(last.removeprefix("train.py: error: ")) from None
    finally:
        sys.stderr.write(err.getvalue())  # anything else it printed


def import_transformers():
    """HF transformers, imported beside our kernels.py; raises ModuleNotFoundError without it.

    transformers >= 5 imports Hugging Face's `kernels` package, whose name our kernels.py (the design card's file
    name) shares, and a process has one module of a name: whichever Python finds first. So we import transformers
    with ours set aside (out of sys.modules, its folder off sys.path): HF's package loads, and transformers keeps the
    names it took from it. Then we put ours back, so gla, the tests and bench/ go on with ours. transformers imports
    from `kernels` again only to use Hub kernels (use_kernels=True), which our comparisons never ask for."""
    if sys.modules.get("transformers") is not None:
        return sys.modules["transformers"]
    ours = sys.modules.pop("kernels", None)
    path = sys.path[:]
    sys.path[:] = [entry for entry in path if (pathlib.Path(entry or ".") / "kernels.py").resolve() != OUR_KERNELS]
    try:
        transformers = importlib.import_module("transformers")
        # transformers loads its modules on first use: the one that imports HF's `kernels` must load now.
        if importlib.util.find_spec("transformers.integrations.hub_kernels") is not None:
            importlib.import_module("transformers.integrations.hub_kernels")
    finally:
        sys.path[:] = path
        if ours is None:
            sys.modules.pop("kernels", None)  # a later `import kernels` finds ours on sys.path
        else:
            sys.modules["kernels"] = ours
    return transformers


def hf_twin(config):
    """The HF transformers model with this GPTConfig's dims: GQA -> LlamaForCausalLM; MLA and GLA-g -> a dense
    DeepseekV3ForCausalLM (every layer dense; MLA with the same q_lora_rank, kv_lora_rank of all latent heads
    together, as HF has no GLA, and qk_nope / qk_rope / v head dims). Tied embeddings, no biases, SDPA attention.
    Raises ModuleNotFoundError without transformers."""
    transformers = import_transformers()
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
    threads = torch.get_num_threads()
    return f"{name}, {threads} thread{'s' if threads > 1 else ''}, torch {torch.__version__}"


def matmul_gflops(n=1024, reps=10):
    """This process's float32 matrix-product speed in GFLOP/s, on the threads torch has now (set one for a core's
    figure): 2 n^3 FLOPs of an n x n x n torch.mm over the fastest of `reps` calls, after a warm-up call. The issue
    that asked for it (52) measured 1024^3 on one thread: 34 GFLOP/s on an AVX2 EPYC, about 85 on README's cores."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def train_step_seconds(config, args, ctx, steps, warmup=2):
    """Median wall seconds of one of train.py's optimizer steps of a GPT of `config`, at args.batch_size sequences in
    args.grad_accum micro-batches, on the threads torch has now: train.train_step (forward and backward), the gradient
    clip and the fused AdamW step, as train.py's loop runs them, on random tokens (the speed does not depend on them),
    after `warmup` steps. args: train.get_args's; ctx: a train.Context."""
    torch.manual_seed(0)
    model = gla.GPT(config).to(ctx.device)
    optimizer = train.make_optimizer(model, args)
    tokens = torch.randint(config.vocab_size, (args.batch_size, config.block_size + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    seconds = []
    for _ in range(warmup + steps):
        t = time.perf_counter()
        train.train_step(model, x, y, args, ctx)
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip).item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t)
    return statistics.median(seconds[warmup:])


def training_flops_per_token(config):
    """FLOPs of one token of a training step, forward and backward (2 per multiply-add): 6 per parameter (Kaplan et
    al. 2020, "Scaling Laws for Neural Language Models", Sec. 2.1; the tied embedding counts once, as the output
    projection) plus the attention's scores and weighted sums, 6 n_layer n_head block_size (d_qk + d_v) over the full
    T x T as nanoGPT's MFU counts it (a causal kernel skips about half). MLA / GLA in the naive form training runs:
    d_qk = qk_nope + qk_rope, d_v = v_head_dim."""
    with torch.device("meta"):
        n_params = gla.GPT(config).num_params()
    if config.attn == "gqa":
        d_qk = config.head_dim
        d_v = config.head_dim
    else:
        d_qk = config.qk_nope_head_dim + config.qk_rope_head_dim
        d_v = config.v_head_dim
    return 6 * n_params + 6 * config.n_layer * config.n_head * config.block_size * (d_qk + d_v)


def time_models(args, ctx, steps):
    """{run name: (GPTConfig, median seconds of a step)} of each model that train.py trains with args
    (train.models_of), timed by train_step_seconds one after the other."""
    timed = {}
    for variant, double_heads in train.models_of(args):
        config = train.model_config(args, variant, double_heads)
        timed[train.run_name(variant, double_heads)] = (config, train_step_seconds(config, args, ctx, steps))
    return timed


def compiled_greedy(model, idx, max_new_tokens):
    """GPT.generate at temperature 0 with its decode step under torch.compile, as gpt-fast decodes: idx (B, T) int64 ->
    (B, T + max_new_tokens) int64. Static shapes (fullgraph, every step reads the cache to its full length, masked by
    cache_seqlens): one compile. no_grad, not inference mode: torch.compile cannot yet trace the cache's in-place
    writes there (torch 2.13)."""
    B, T = idx.shape
    S = T + max_new_tokens
    model.setup_cache(B, S)
    step = torch.compile(model.decode, fullgraph=True, dynamic=False)
    out = torch.cat([idx, idx.new_empty(B, max_new_tokens)], dim=1)
    cached = torch.zeros(B, dtype=torch.int32, device=idx.device)
    with torch.no_grad():
        logits = model.decode(idx, cached, max_seqlen=T)[:, -1]  # the prompt, eager
        for t in range(T, S):
            out[:, t] = logits.argmax(-1)
            if t + 1 < S:
                cached.fill_(t)
                logits = step(out[:, t:t + 1], cached, max_seqlen=S)[:, -1]
    return out


def time_interleaved(contenders, repeats, warmup=1, clock=time.perf_counter):
    """Seconds per call of each contender (name -> zero-argument function): warmup calls each, then `repeats`
    rounds that call each once in turn, so that a busy machine slows all of them alike. name -> list of seconds.
    clock: wall time, or time.process_time (this process's CPU seconds: on a loaded machine, one thread)."""
    for _ in range(warmup):
        for fn in contenders.values():
            fn()
    times = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            t0 = clock()
            fn()
            times[name].append(clock() - t0)
    return times


# name: (Hq, Hkv, Hk, Dk, Dv, uses qv): per-device shapes of the GLA paper's decode benchmark (not our presets), 64
# query heads in all. GQA-8: 8 KV heads of 128 (Llama-3-70B's attention), one per device under TP-8; under TP-2 MLA
# keeps the whole latent on each device, GLA-2 one latent head.
BENCH_SHAPES = {
    "GQA-8 TP-8": (8, 1, 1, 128, 128, False),
    "MLA 1 GPU": (64, 1, 1, 64, 512, True),
    "GLA-2 1 GPU": (64, 2, 1, 64, 256, True),
    "MLA TP-2": (32, 1, 1, 64, 512, True),
    "GLA-2 TP-2": (32, 1, 1, 64, 256, True),
}
BENCH_BATCHES = (1, 32)
BENCH_SEQLENS = (8192, 32768, 131072)
BENCH_LQ = (1, 2)


def bench_inputs(name, B, S, Lq, dtype, device, shapes=BENCH_SHAPES):
    """q, k_cache, v_cache, cache_seqlens (all S), qv (or None) of shape `name` of shapes (by default a bench shape,
    (Hq, Hkv, Hk, Dk, Dv, uses qv)); on the "meta" device, shapes without memory."""
    Hq, Hkv, Hk, Dk, Dv, use_qv = shapes[name]
    q = torch.randn(B, Lq, Hq, Dk, dtype=dtype, device=device)
    k_cache = torch.randn(B, S, Hk, Dk, dtype=dtype, device=device)
    v_cache = torch.randn(B, S, Hkv, Dv, dtype=dtype, device=device)
    qv = torch.randn(B, Lq, Hq, Dv, dtype=dtype, device=device) if use_qv else None
    return q, k_cache, v_cache, torch.full((B,), S, dtype=torch.int32, device=device), qv
