"""train.py --sample: text from trained runs through GPT.generate (the KV cache and the decode path), on one process
or tensor-parallel under torchrun, with what each rank holds.

    python train.py --sample out/gla2/seed1337 --prompt "The return value"
    torchrun --standalone --nproc_per_node=2 train.py --sample out/gla2/seed1337 --tp 2

Each rank builds the full model, keeps its shard (gla.shard_for_tp) and generates; the all-reduces give every rank
the same logits, hence the same tokens, which we check. Bad input: one UsageError line, on every rank alike.
"""
import functools
import json
import math
import os
import pathlib
import time
import unicodedata

import torch
import torch.distributed as dist

import gla
from harness.checkpoints import load_state
from harness.context import device_type, leave_process_group, setup_context
from harness.stops import ArgumentParser, UsageError

NEWLINE_GPT2_ID = 198  # GPT-2's token for "\n": the default prompt of a run on token files without tiktoken


def get_args(argv):
    """The sampling flags (training's are refused here, as sampling's are by train.py's parser)."""
    p = ArgumentParser(prog="train.py --sample", description="Sample text from trained runs.")
    p.add_argument("--sample", nargs="+", metavar="RUN", required=True,
                   help="runs to sample from: a ckpt.pt or its folder, <out_dir>/<run>/seed<seed>")
    p.add_argument("--prompt", help="text, or GPT-2 token ids without tiktoken (default: a newline)")
    p.add_argument("--max_new_tokens", type=int, help="default: fill the run's block_size")
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top_k", type=int, default=200, help="sample among the k likeliest tokens (0: all)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel processes (gloo on CPU, nccl on GPUs)")
    p.add_argument("--seed", type=int, default=1337, help="torch seed of the draws")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step")
    args = p.parse_args(argv)
    if args.tp < 1:
        raise UsageError(f"--tp must be 1 or more (processes), got {args.tp}")
    if args.max_new_tokens is not None and args.max_new_tokens < 0:
        raise UsageError(f"--max_new_tokens must be >= 0, got {args.max_new_tokens}")
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise UsageError(f"--temperature must be >= 0 and finite (0: greedy), got {args.temperature}")
    if args.top_k < 0:
        raise UsageError(f"--top_k must be >= 0 (0: every token), got {args.top_k}")
    return args


def printable(text):
    """text with control characters (a carriage return, ESC) shown as \\xNN: a sample cannot redraw the terminal.
    Newlines and tabs stay."""
    shown = []
    for ch in text:
        if ch not in "\n\t" and unicodedata.category(ch) == "Cc":
            shown.append(f"\\x{ord(ch):02x}")
        else:
            shown.append(ch)
    return "".join(shown)


class ByteCodec:
    """Bytes are tokens (the stdlib corpus, text files). Nothing drawn is hidden: invalid UTF-8 (a half-learned
    character) shows as \\xNN, ids past 255 as <id>."""
    name = "bytes"
    default_prompt = "\n"

    def encode(self, text):
        # surrogateescape: bytes in argv that are not UTF-8 reach us as surrogates; they go back to those bytes.
        return list(text.encode("utf-8", errors="surrogateescape"))

    def decode(self, ids):
        raw = b"".join(bytes([i]) if i < 256 else f"<{i}>".encode() for i in ids)
        return printable(raw.decode("utf-8", errors="backslashreplace"))


class TiktokenCodec:
    """GPT-2's BPE through tiktoken."""
    name = "GPT-2 BPE (tiktoken)"
    default_prompt = "\n"

    def __init__(self, encoding):
        self.encoding = encoding

    def encode(self, text):
        try:
            return self.encoding.encode(text)
        except UnicodeEncodeError:
            raise UsageError("--prompt is not valid UTF-8 text") from None

    def decode(self, ids):
        return printable(self.encoding.decode(ids))


class TokenIdCodec:
    """GPT-2 token ids as numbers, where tiktoken is missing: the prompt is ids, the sample is ids."""
    name = "GPT-2 token ids"
    default_prompt = str(NEWLINE_GPT2_ID)

    def encode(self, text):
        try:
            return [int(t) for t in text.split()]
        except ValueError:
            raise UsageError("this run reads GPT-2 token ids and tiktoken is not installed: give --prompt as ids, "
                             "e.g. --prompt '464 2068 7586'") from None

    def decode(self, ids):
        return " ".join(map(str, ids))


def text_codec(config, source=None):
    """The codec of a run from its data source (config.json's data.source; None: 256 tokens mean bytes): bytes for
    the stdlib corpus and text files; GPT-2 tokens for token files, as text through tiktoken if it is installed."""
    if source is None:
        reads_bytes = config.vocab_size == 256
    else:
        reads_bytes = not source.startswith("token files")
    if reads_bytes:
        return ByteCodec()
    try:
        import tiktoken
        return TiktokenCodec(tiktoken.get_encoding("gpt2"))
    except Exception:  # not installed, or its vocabulary file cannot be fetched (offline)
        return TokenIdCodec()


def load_run(path):
    """(gla.GPTConfig, state dict, codec) of a run, from its ckpt.pt or its folder; memory-mapped, so only the weights
    we load are read. Raises UsageError (one line) for a missing or unreadable checkpoint or config.json."""
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / "ckpt.pt"
    if not path.is_file():
        top = path.parent
        while not top.is_dir():  # the nearest folder that exists, e.g. the out_dir the reader meant
            top = top.parent
        found = sorted(top.glob("*/seed*/ckpt.pt")) + sorted(top.glob("*/*/seed*/ckpt.pt"))
        names = ", ".join(str(run.parent) for run in found[:6])
        have = f"; runs with a checkpoint under {top}: {names}" if found else ""
        raise UsageError(f"no checkpoint at {path}; pass a run's ckpt.pt or its folder (<out_dir>/<run>/seed<seed>)"
                         f"{have}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        config = gla.GPTConfig(**ckpt["config"]["model"])
        state = ckpt["model"]
    except Exception as e:  # truncated, not a checkpoint, or not train.py's
        first_line = (str(e).strip().splitlines() or [""])[0]
        raise UsageError(f"cannot read {path} as a train.py checkpoint ({type(e).__name__}: {first_line})") from None
    info = path.with_name("config.json")
    source = None
    if info.exists():
        try:
            source = json.loads(info.read_text())["data"]["source"]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
            raise UsageError(f"cannot read the data source from {info} ({type(e).__name__}); restore it, or move it "
                             "away to sample as bytes (vocab_size 256) or GPT-2 token ids") from None
    return config, state, text_codec(config, source)


def span(noun, heads):
    """'query heads 0-3' or 'latent head 1'."""
    if len(heads) > 1:
        return f"{noun}s {heads.start}-{heads.stop - 1}"
    return f"{noun} {heads.start}"


def cache_report(model, full, rank, tp, length):
    """One line: what rank of tp holds of the full model (config `full`) and its KV cache at `length` tokens."""
    share = gla.tp_share(full, rank, tp)
    caches = [block.attn.cache for block in model.blocks]
    nbytes = sum(c.k_cache[:, :, :length].nbytes + c.v_cache[:, :, :length].nbytes for c in caches)
    group = "KV head" if full.attn == "gqa" else "latent head"
    return (f"rank {rank}/{tp}: {span('query head', share.heads)} of {full.n_head}, {span(group, share.groups)} of "
            f"{full.n_groups}, {span('MLP column', share.ffn)} | KV cache: "
            f"{model.config.kv_cache_elems_per_token_per_layer} elements per token per layer (one process: "
            f"{full.kv_cache_elems_per_token_per_layer}), {nbytes:,} bytes at {length} tokens ({len(caches)} layers x "
            f"batch {caches[0].k_cache.shape[0]}, {caches[0].k_cache.dtype})")


def plan_sample(path, args):
    """What to sample from one run: (path, config, state, codec, prompt ids, new tokens), checked. UsageError."""
    config, state, codec = load_run(path)
    try:
        gla.tp_share(config, 0, args.tp)
    except gla.ConfigError as e:
        raise UsageError(str(e)) from None
    capacity = config.block_size  # positions past it were never trained
    if capacity < 2:
        raise UsageError(f"{path}: block_size={capacity} leaves no room for a prompt and a new token")
    text = codec.default_prompt if args.prompt is None else args.prompt
    prompt = codec.encode(text)
    new = capacity - len(prompt) if args.max_new_tokens is None else args.max_new_tokens
    if not prompt or len(prompt) >= capacity:
        raise UsageError(f"{path}: the prompt is {len(prompt)} tokens ({codec.name}); it needs 1 to "
                         f"{capacity - 1} to fit the cache of block_size={capacity} with a new token")
    if not 0 <= min(prompt) <= max(prompt) < config.vocab_size:
        raise UsageError(f"{path}: prompt token ids must lie in [0, vocab_size={config.vocab_size}), got "
                         f"{min(prompt)} to {max(prompt)}")
    if len(prompt) + new > capacity:
        raise UsageError(f"{path}: a {len(prompt)}-token prompt + --max_new_tokens {new} exceed the cache of "
                         f"block_size={capacity} tokens; lower --max_new_tokens or shorten the prompt")
    return path, config, state, codec, prompt, new


def main(argv):
    """--sample: print each run's text, its tokens/s and what the cache holds; returns 0. Raises UsageError."""
    args = get_args(argv)
    world = int(os.environ.get("WORLD_SIZE", 1))
    if args.tp != world:
        if args.tp > 1:
            fix = f"launch torchrun --standalone --nproc_per_node={args.tp} train.py --sample ... --tp {args.tp}"
        else:
            fix = f"pass --tp {world}"
        raise UsageError(f"--tp {args.tp} needs {args.tp} process(es), found WORLD_SIZE={world}: {fix}")
    if device_type(args.device) == "cuda" and world > torch.cuda.device_count():
        raise UsageError(f"--tp {world} on CUDA needs {world} GPUs, found {torch.cuda.device_count()}; "
                         "use --device cpu (gloo) or fewer processes")
    samples = [plan_sample(path, args) for path in args.sample]
    ctx = setup_context(args.device)
    finished = False
    try:
        for path, config, state, codec, prompt, new in samples:
            sample_one(path, config, state, codec, prompt, new, args, ctx, world)
        finished = True
    finally:
        leave_process_group(finished)
    return 0


def sample_one(path, config, state, codec, prompt, new, args, ctx, world):
    """Generate from one run and print its text, speed and, per rank, what the cache holds."""
    model = gla.GPT(config)
    load_state(model, state, path)
    model.to(ctx.device).eval()
    if world > 1:
        gla.shard_for_tp(model, ctx.rank, world)
    idx = torch.tensor([prompt], device=ctx.device)
    generate = functools.partial(model.generate, idx, new, args.temperature, args.top_k, compile=args.compile)
    if args.compile:
        generate()  # compiles the step (once per length); the timed run below reuses it
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    tokens = generate()[0].tolist()  # .tolist() waits for the GPU
    seconds = time.perf_counter() - t0
    ranks = [(cache_report(model, config, ctx.rank, world, len(tokens)), tokens)] * world
    if world > 1:
        dist.all_gather_object(ranks, ranks[0])  # replaces every entry with that rank's
    if any(other != tokens for _, other in ranks):
        raise RuntimeError("the ranks drew different tokens: their logits differ; a sharding bug")
    if not ctx.master:
        return
    if args.temperature == 0:
        how = "greedy"
    else:
        how = f"temperature {args.temperature}, top_k {args.top_k}"
    variant = f"gla{config.n_latent_heads}" if config.attn == "gla" else config.attn
    folder = pathlib.Path(path) if pathlib.Path(path).is_dir() else pathlib.Path(path).parent  # <out_dir>/<run>/seed<S>
    if folder.parent.name.endswith("_double_heads"):  # train.py's run_name
        variant += f" double heads ({config.n_head} query heads)"
    rate = new / seconds if seconds > 0 else math.inf
    print(f"== {path}: {variant}, {codec.name}, tp {world}, {ctx.device.type}, {model.tok_emb.weight.dtype}, {how}, "
          f"seed {args.seed}", codec.decode(tokens),
          f"-- {new} new tokens in {seconds:.3f} s: {rate:.1f} tokens/s (batch 1, prompt of {len(prompt)} tokens, "
          "prefill included)", *(report for report, _ in ranks), sep="\n", flush=True)
