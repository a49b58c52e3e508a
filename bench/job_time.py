"""How long a train.py job takes on this CPU, predicted in about ten seconds: this core's one-thread float32 matmul
GFLOP/s, then a few timed training steps of each of the job's models on all the threads torch has, as train.py trains
them, summed over the job's plan.

Without flags it predicts the main job, `python train.py --attn all`; any train.py flag changes the job (e.g.
--seeds 4). The job's plan is train.py's: its defaults per preset, its runs trained in turn, seed by seed, in one
process. A run's time is its steps and its evaluations (a forward of eval_iters batches each, a third of a step a
batch) at its model's timed seconds a step. Process start, data loading and checkpoints are left out (a few
seconds a run).

    python bench/job_time.py [--steps 3] [train.py flags]
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import torch  # noqa: E402

import train  # noqa: E402
from bench.common import (InputError, machine, matmul_gflops, time_models, train_call,  # noqa: E402
                          training_flops_per_token)


def minutes(seconds):
    """'45 s', '3.5 min' or '1 h 20 min'."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min" if seconds < 600 else f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {seconds % 3600 / 60:.0f} min"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Any other flag is train.py's (python train.py --help); default: --attn all")
    p.add_argument("--steps", type=int, default=3, help="timed training steps per model, after 2 warm-up ones")
    ours, train_flags = p.parse_known_args(argv)
    if ours.steps < 1:
        p.error(f"--steps must be >= 1, got {ours.steps}")
    try:
        args = train_call(train.get_args, ["--attn", "all", *train_flags])  # a later --attn wins
        ctx = train_call(train.setup, args.device or "cpu", args.dtype)
        if ctx.device.type != "cpu":
            raise InputError("bench/job_time.py predicts a CPU job; drop --device")
    except InputError as e:
        p.error(str(e))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gflops = matmul_gflops()
    finally:
        torch.set_num_threads(threads)
    print(f"{machine()}\none core's float32 matmul (1024^3 torch.mm, one thread): {gflops:.1f} GFLOP/s")
    print(f"one process trains on {threads} thread(s); {args.batch_size} x {args.max_iters} steps per run; timed: "
          f"{ours.steps} steps per model\n")
    print(f"{'model':<20}{'GFLOP/step':>11}{'s/step':>8}{'tokens/s':>10}{'GFLOP/s':>9}{'of matmul':>11}{'run min':>9}")
    run_seconds = {}
    evaluations = len([s for s in range(1, args.max_iters + 1) if s % args.eval_interval == 0 or s == args.max_iters])
    for name, (config, step_s) in time_models(args, ctx, ours.steps).items():
        tokens_per_step = args.batch_size * config.block_size
        step_flops = training_flops_per_token(config) * tokens_per_step
        rate = step_flops / step_s  # FLOP/s
        run_seconds[name] = step_s * (args.max_iters + evaluations * args.eval_iters / 3)
        tokens_per_s = tokens_per_step / step_s
        print(f"{name:<20}{step_flops / 1e9:>11.2f}{step_s:>8.3f}{tokens_per_s:>10,.0f}{rate / 1e9:>9.1f}"
              f"{100 * rate / 1e9 / gflops:>10.0f}%{run_seconds[name] / 60:>9.1f}")
    runs = args.seeds * len(run_seconds)
    print(f"\nestimate: {runs} runs ({len(run_seconds)} model(s) x {args.seeds} seed(s)) of {args.max_iters} steps, "
          f"one process: about {minutes(args.seeds * sum(run_seconds.values()))} in all "
          f"(one core's matmul: {gflops:.0f} GFLOP/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
