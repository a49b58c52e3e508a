"""What the main job costs on a CPU core: FLOPs per training step of each of the six tiny runs, their tokens/s on one
thread, and the share of the core's float32 peak that reaches.

FLOPs are counted by torch.utils.flop_counter.FlopCounterMode on one forward and backward of the real model at the
main job's batch, with SDPA on its math backend (the CPU flash kernel that training runs has no FLOP formula); the
count is the full T x T attention, of which a causal kernel skips about half. Step times are process CPU time, so a
busy machine inflates them less than wall time; the peak is the best single-thread torch.mm rate at 256^3 (bench/
fma_peak.c measures the FMA units themselves). The evaluation's share follows from the FLOPs: eval_iters forwards
every eval_interval steps, a forward being a third of a step.

    python bench/train_cost.py [--steps 20]
"""
import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import gla  # noqa: E402
import train  # noqa: E402
from bench.common import machine, matmul_gflops  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="timed training steps per run, after 3 warm-up ones")
    steps = p.parse_args(argv).steps
    torch.set_num_threads(1)
    peak = matmul_gflops(256, reps=200) * 1e9  # the best case of a small product
    print(f"{machine()}; torch.mm 256^3 peak {peak / 1e9:.1f} GFLOP/s")
    print(f"{'run':<18} {'GFLOP/step':>10} {'tokens/s':>9} {'GFLOP/s':>8} {'% of mm peak':>12} {'eval share':>10}")
    for variant, double_heads in [(v, d) for v in gla.VARIANTS for d in (False, True)]:
        args = train.get_args(["--attn", variant] + ["--double_heads"] * double_heads)
        config = train.model_config(args, variant, double_heads)
        data = train.load_data(None, config.block_size, config.vocab_size)
        torch.manual_seed(args.seed)
        model = gla.GPT(config)
        optimizer = train.make_optimizer(model, args)
        x, y = train.get_batch(data, "train", 0, args.batch_size, config.block_size, args.seed)
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            model(x, y)[1].backward()
        flops = counter.get_total_flops()
        optimizer.zero_grad(set_to_none=True)
        seconds = []
        for step in range(3 + steps):
            x, y = train.get_batch(data, "train", step, args.batch_size, config.block_size, args.seed)
            t = time.process_time()
            model(x, y)[1].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            seconds.append(time.process_time() - t)
        median = sorted(seconds[3:])[steps // 2]
        forwards = args.max_iters // args.eval_interval * args.eval_iters
        eval_share = forwards / (3 * args.max_iters + forwards)
        print(f"{train.run_name(variant, double_heads):<18} {flops / 1e9:>10.2f} "
              f"{args.batch_size * config.block_size / median:>9.0f} {flops / median / 1e9:>8.1f} "
              f"{100 * flops / median / peak:>11.0f}% {100 * eval_share:>9.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
