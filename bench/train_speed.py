"""Training speed: tokens/s of our six models of the ablation against HF transformers' models at equal dims.

Forward, backward and a plain AdamW step for both (so that the ratio compares the models, not the optimizers), at
two batch shapes; the two take turns step by step in one process, so both see the same machine load, and we report
the median of the timed steps after warm-up ones. HF's model (bench/common.hf_twin: Llama for GQA, a dense
DeepSeek-V3 for MLA and GLA-2) is timed only if transformers is installed.

On a CPU it first times the main job's steps (train.py's tiny preset and batch, its optimizer step) on one thread
and prints their FLOP rate (bench/common.training_flops_per_token) as a fraction of one
core's float32 matmul GFLOP/s (bench/common.matmul_gflops).

    python bench/train_speed.py [--preset tiny] [--device cpu] [--compile]
"""
import argparse
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import torch  # noqa: E402

import gla  # noqa: E402
import train  # noqa: E402
from bench.common import (InputError, hf_twin, import_transformers, machine, matmul_gflops,  # noqa: E402
                          time_interleaved, time_models, train_call, training_flops_per_token)

SHAPES = ((16, 128), (8, 512))  # (sequences, tokens each) per training step
STEPS, WARMUP = 6, 2
MAIN_JOB_STEPS = 5  # timed steps per model of the main job, after 2 warm-up ones


def main_job_fraction():
    """Print the main job's training FLOP rate per model (float32, one thread on the CPU) as a fraction of one core's
    matmul GFLOP/s."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gflops = matmul_gflops()
        args = train.get_args(["--attn", "all"])
        print(f"the main job (train.py --attn all: tiny preset, {args.batch_size} x {args.max_iters} steps per run), "
              f"one thread; one core's float32 matmul (1024^3 torch.mm): {gflops:.1f} GFLOP/s")
        print(f"{'model':<20}{'tokens/s':>9}{'MFLOP/token':>12}{'GFLOP/s':>9}{'of matmul':>11}")
        for name, (config, step_s) in time_models(args, train.setup("cpu"), MAIN_JOB_STEPS).items():
            tokens_per_s = args.batch_size * config.block_size / step_s
            flops_per_token = training_flops_per_token(config)
            rate = tokens_per_s * flops_per_token / 1e9
            print(f"{name:<20}{tokens_per_s:>9,.0f}{flops_per_token / 1e6:>12.2f}{rate:>9.1f}"
                  f"{100 * rate / gflops:>10.0f}%", flush=True)
    finally:
        torch.set_num_threads(threads)
    print()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny", choices=list(gla.PRESETS))
    for flag in ("n_layer", "n_embd", "head_dim", "n_head", "n_kv_head", "vocab_size"):
        p.add_argument(f"--{flag}", type=int, help="as train.py's (default: the preset's)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="autocast dtype (default: bfloat16 on cuda)")
    p.add_argument("--compile", action="store_true", help="torch.compile our models")
    args = p.parse_args(argv)
    try:
        ctx = train_call(train.setup, args.device, args.dtype)  # train.py's device and dtype, checked the same way
    except InputError as e:
        p.error(str(e))
    device = ctx.device
    try:
        import_transformers()
        contenders = ("ours", "hf")
    except ModuleNotFoundError:  # not installed; any other error is a failure to see
        contenders = ("ours",)
    if device.type == "cpu":
        main_job_fraction()
    print(f"training throughput on {machine(device)}, {ctx.dtype}"
          + ("" if "hf" in contenders else "; pip install transformers to compare with HF"))
    print(f"{'model':<20}{'batch':>9}{'ours tok/s':>12}"
          + (f"{'HF tok/s':>10}{'ours / HF':>11}" * ("hf" in contenders)))
    shape = {k: getattr(args, k) for k in ("n_layer", "n_embd", "head_dim", "n_head", "n_kv_head", "vocab_size")
             if getattr(args, k)}
    for variant in gla.VARIANTS:
        for double_heads in (False, True):
            for batch, T in SHAPES:
                try:
                    config = gla.make_config(args.preset, variant, double_heads, block_size=T, **shape)
                except AssertionError as e:  # what gla cannot build, one line
                    p.error(str(e))
                x = torch.randint(config.vocab_size, (batch, T), device=device)
                steps = {}
                for who in contenders:
                    torch.manual_seed(0)
                    model = (gla.GPT(config) if who == "ours" else hf_twin(config)).to(device)
                    run = torch.compile(model) if args.compile and who == "ours" else model
                    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

                    def step(run=run, optimizer=optimizer, who=who):
                        with ctx.autocast():
                            loss = run(x, x)[1] if who == "ours" else run(input_ids=x, labels=x).loss
                        loss.backward()
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                        if device.type == "cuda":
                            torch.cuda.synchronize()
                    steps[who] = step
                times = time_interleaved(steps, STEPS, warmup=WARMUP)
                rate = {who: batch * T / statistics.median(t) for who, t in times.items()}
                line = f"{train.run_name(variant, double_heads):<20}{f'{batch}x{T}':>9}{rate['ours']:>12.0f}"
                if "hf" in rate:
                    line += f"{rate['hf']:>10.0f}{rate['ours'] / rate['hf']:>10.2f}x"
                print(line, flush=True)


if __name__ == "__main__":
    main()
