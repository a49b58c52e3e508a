"""Decoding speed on this CPU: our GPT.generate against HF transformers' generate at equal dims, and one cached
decode step against recomputing the full forward.

Greedy generation tokens/s (B x new tokens / median seconds of interleaved runs, prefill included) of ours
(eager, and compiled with --compile) and of HF's model at equal dims (bench/common.hf_twin: Llama for GQA, a dense
DeepSeek-V3 for MLA and GLA-2; skipped without transformers); then, at --context_len tokens, the cost of the next
token through the cache against a full forward. float32.

    python bench/decode_cpu.py [--variants gqa mla gla2] [--double_heads] [--batch_sizes 1 8] [--compile] [--threads 1]
"""
import argparse
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import torch  # noqa: E402

import gla  # noqa: E402
from bench.common import hf_twin, machine, time_interleaved  # noqa: E402

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
    args = p.parse_args(argv)
    for name, least in (("prompt_len", 1), ("new_tokens", 1), ("context_len", 2), ("repeats", 1)):
        if getattr(args, name) < least:
            p.error(f"--{name} must be >= {least}, got {getattr(args, name)}")
    if min(args.batch_sizes) < 1 or (args.threads is not None and args.threads < 1):
        p.error("--batch_sizes and --threads must be >= 1")
    try:
        configs = {v: gla.make_config(args.preset, v, args.double_heads, block_size=args.prompt_len + args.new_tokens)
                   for v in args.variants}
    except gla.ConfigError as e:
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
                contenders["ours compiled"] = lambda: model.generate(idx, N, temperature=0, compile=True)
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


if __name__ == "__main__":
    main()
