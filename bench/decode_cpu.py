"""Decoding speed on this CPU: our GPT.generate against HF transformers' generate at equal dims, one cached
decode step against recomputing the full forward, and one decode step against HF's at long context.

Greedy generation tokens/s (B x new tokens / median seconds of interleaved runs, prefill included) of ours
(eager, and compiled with --compile) and of HF's model at equal dims (bench/common.hf_twin: Llama for GQA, a dense
DeepSeek-V3 for MLA and GLA-2; skipped without transformers); then, at --context_len tokens, the cost of the next
token through the cache against a full forward. float32.

Then, at --long_tokens cached tokens (8K-32K), one decode step of one layer at the paper preset's dims (as
bench/decode_speed.py cuts it) against the same step of its HF twin, batch 1, both caches filled with random values
of the shapes each keeps (ours: the cache of gla.GPTConfig.kv_cache_shapes; HF: whatever its DynamicCache holds after
a step, read from one). HF's cache grows by torch.cat at each step, as in its generate; it is cut back to S between
calls, so every call does the same work.

    python bench/decode_cpu.py [--variants gqa mla gla2] [--double_heads] [--batch_sizes 1 8] [--compile] [--threads 1]
        [--long_tokens 8192 16384 32768]
"""
import argparse
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import torch  # noqa: E402

import gla  # noqa: E402
from bench.common import compiled_greedy, hf_twin, import_transformers, machine, time_interleaved  # noqa: E402
from bench.decode_speed import layer_config, random_cache  # noqa: E402

CALLS = 10  # calls per timed run of a single decode step or forward (milliseconds each)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny", choices=list(gla.PRESETS))
    p.add_argument("--variants", nargs="+", default=["gqa", "mla", "gla2"], help="e.g. gqa mla gla2")
    p.add_argument("--double_heads", action="store_true", help="the variants with twice the query heads")
    p.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt_len", type=int, default=32)
    p.add_argument("--new_tokens", type=int, default=256)
    p.add_argument("--context_len", type=int, default=512, help="tokens of the cached step against the forward")
    p.add_argument("--repeats", type=int, default=5, help="interleaved timed runs per contender")
    p.add_argument("--compile", action="store_true", help="also time steps through torch.compile")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--long_tokens", type=int, nargs="*", default=[8192, 16384, 32768],
                   help="cached tokens of the paper-dims step against HF's (none: skip it)")
    args = p.parse_args(argv)
    for name, least in (("prompt_len", 1), ("new_tokens", 1), ("context_len", 2), ("repeats", 1)):
        if getattr(args, name) < least:
            p.error(f"--{name} must be >= {least}, got {getattr(args, name)}")
    too_small = min(args.batch_sizes) < 1 or min(args.long_tokens, default=1) < 1
    if too_small or (args.threads is not None and args.threads < 1):
        p.error("--batch_sizes, --threads and --long_tokens must be >= 1")
    try:
        configs = {v: gla.make_config(args.preset, v, args.double_heads, block_size=args.prompt_len + args.new_tokens)
                   for v in args.variants}
    except AssertionError as e:  # what gla cannot build, one line
        p.error(str(e))
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    P, N = args.prompt_len, args.new_tokens
    heads = ", double heads" if args.double_heads else ""
    print(f"Decode benchmark on {machine()}\npreset {args.preset}{heads}, float32, greedy, {P}-token prompt + {N} new "
          f"tokens; tokens/s = B x {N} / median seconds of {args.repeats} interleaved runs (prefill included)\n")
    names = ["ours"] + (["ours compiled"] if args.compile else []) + ["HF"]
    print("| variant | B | " + " | ".join(f"{n} tok/s" for n in names) + " | "
          + " | ".join(f"{n} / HF" for n in names[:-1]) + " |\n|---|---|" + "---|" * (2 * len(names) - 1))
    hf_missing = None
    for variant, config in configs.items():
        model = gla.GPT(config).eval()
        try:
            hf = hf_twin(config).eval()
            hf.generation_config.eos_token_id = None  # always N new tokens, as ours
            hf.generation_config.pad_token_id = 0
        except ModuleNotFoundError as e:  # not installed; any other error is a failure to see
            hf, hf_missing = None, e
        for B in args.batch_sizes:
            idx = torch.randint(0, config.vocab_size, (B, P))
            contenders = {"ours": lambda: model.generate(idx, N, temperature=0)}
            if args.compile:
                contenders["ours compiled"] = lambda: compiled_greedy(model, idx, N)
            if hf is not None:
                contenders["HF"] = lambda: hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=N,
                                                       do_sample=False)
            with torch.no_grad():
                times = time_interleaved(contenders, args.repeats)
            rates = [f"{B * N / statistics.median(times[n]):.0f}" if n in times else "-" for n in names]
            ratios = [f"{statistics.median(times['HF']) / statistics.median(times[n]):.2f}" if hf else "-"
                      for n in names[:-1]]
            print(f"| {variant} | {B} | " + " | ".join(rates + ratios) + " |", flush=True)
    if hf_missing:
        print(f"\n(HF columns empty: {hf_missing}; pip install transformers to compare)")

    L = args.context_len
    print(f"\nThe next token at {L} tokens, B=1: one decode step over the {L - 1} cached tokens against the full "
          f"forward over all {L} (median of {args.repeats} interleaved runs of {CALLS} calls):\n")
    print("| variant | decode step ms | full forward ms | speedup |\n|---|---|---|---|")
    for variant in args.variants:
        model = gla.GPT(gla.make_config(args.preset, variant, args.double_heads, block_size=L)).eval()
        idx = torch.randint(0, model.config.vocab_size, (1, L))
        model.setup_cache(1, L)
        cached = torch.full((1,), L - 1, dtype=torch.int32)
        with torch.no_grad():
            model.decode(idx[:, :-1], torch.zeros_like(cached), max_seqlen=L - 1)  # the first L - 1 tokens
            times = time_interleaved({  # each call rewrites the same last cache slot: the same work every time
                "cached": lambda: [model.decode(idx[:, -1:], cached, max_seqlen=L) for _ in range(CALLS)],
                "recompute": lambda: [model(idx) for _ in range(CALLS)]}, args.repeats)
        step, full = (statistics.median(times[n]) / CALLS for n in ("cached", "recompute"))
        print(f"| {variant} | {step * 1e3:.2f} | {full * 1e3:.2f} | {full / step:.1f} |", flush=True)

    if args.long_tokens and not hf_missing:
        print(f"\nOne decode step of one layer at paper dims{heads}, B=1, S cached tokens: ours against HF's "
              f"(median of {args.repeats} interleaved calls); the MB each cache holds at S:\n")
        print("| variant | heads | S | ours ms | HF ms | HF / ours | ours cache MB | HF cache MB |")
        print("|---" * 8 + "|")
        for variant in args.variants:
            long_context_rows(variant, layer_config(variant, args.double_heads), args.long_tokens, args.repeats)


def long_context_rows(variant, config, seqlens, repeats):
    """Print one table row per S in seqlens: the median seconds of GPT.decode of one token after S cached, and of its
    HF twin's forward of one token after S in its DynamicCache, interleaved, with the bytes of each cache."""
    torch.manual_seed(0)
    model = gla.GPT(config).eval()
    hf = hf_twin(config).eval()
    idx = torch.randint(config.vocab_size, (1, 1))
    DynamicCache = import_transformers().DynamicCache
    probe = DynamicCache()
    with torch.no_grad():  # one step from an empty cache: the tensors HF keeps per layer, and their shapes
        hf(input_ids=idx, cache=probe, use_cache=True)
    held = probe.layers[0]
    for S in seqlens:
        cache = random_cache(model, 1, S + 1)
        lengths = torch.full((1,), S, dtype=torch.int32)
        hf_cache = DynamicCache()
        hf_cache.update(torch.randn(*held.keys.shape[:2], S, held.keys.shape[3]),
                        torch.randn(*held.values.shape[:2], S, held.values.shape[3]), 0)
        position = torch.full((1, 1), S)

        def ours():
            model.decode(idx, lengths, max_seqlen=S + 1)

        def theirs():
            hf(input_ids=idx, cache=hf_cache, position_ids=position, use_cache=True)
            hf_cache.crop(-1)  # back to S cached tokens

        with torch.no_grad():
            times = time_interleaved({"ours": ours, "HF": theirs}, repeats)
        mine, hfs = statistics.median(times["ours"]), statistics.median(times["HF"])
        ours_mb = (cache.k_cache[:, :, :S].nbytes + cache.v_cache[:, :, :S].nbytes) / 1e6
        hf_mb = sum(t.nbytes for t in (hf_cache.layers[0].keys, hf_cache.layers[0].values)) / 1e6
        print(f"| {variant} | {config.n_head} | {S} | {mine * 1e3:.1f} | {hfs * 1e3:.1f} | {hfs / mine:.1f} | "
              f"{ours_mb:.0f} | {hf_mb:.0f} |", flush=True)


if __name__ == "__main__":
    main()
