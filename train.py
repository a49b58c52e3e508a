"""
Train the double-heads ablation: one of its models, or all six.

    python train.py --attn gla2 --double_heads        # one model (two seeds on the tiny preset), CPU ok
    python train.py --attn all                        # the six models of the ablation
    torchrun --standalone --nproc_per_node=8 train.py --attn all --preset paper \\
        --data edu_fineweb100B/ --grad_accum 60 --compile
    python train.py --sample out/gla2/seed1337 --prompt "The return value"    # text from a trained run

The ablation (Liu et al., "Multi-Head Low-Rank Attention", ICLR 2026, arXiv 2603.02188) trains GQA, MLA and GLA-2
twice each: as they are (the baseline) and with their query heads doubled at equal parameters and KV cache
(gla.make_config). Each model trains for seeds --seed, --seed + 1, ...; a seed's runs see the same batches and
validation batches, so plot.py's seed-by-seed difference cancels the data's noise.

Read top to bottom: the flags, the runs, the batch, the schedule and the optimizer, one step, evaluation, the loop
with its checkpoints, and main. What keeps long runs safe and lets them fit (signals, the run lock, disk and memory
checks, atomic writes, big-corpus formats, sampling) lives in harness/, which a first reader may skip. Each run
writes <out_dir>/<run>/seed<seed>/: config.json, metrics.jsonl (one evaluation a line), ckpt.pt.
"""

import argparse
import functools
import math
import os
import pathlib
import sys
import time
from contextlib import ExitStack

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

import gla
from harness import checkpoints, memory, preflight, progress, sampling
from harness.context import leave_process_group, setup_context
from harness.files import check_out_dir
from harness.stops import ArgumentParser, Interrupted, RunError, StopFlag, UsageError, run_command, stop_on_signals

# ----------------------------------------------------------------------------
# The flags

# Training defaults per preset. paper: the ablation as Liu et al.'s MLRA release trains it, ~98B tokens on 8 GPUs.
TRAIN_DEFAULTS = {
    "tiny": dict(max_iters=400, batch_size=16, learning_rate=2e-3, warmup_iters=200,
                 eval_interval=25, eval_iters=8, ckpt_interval=100, seeds=2),
    "small": dict(max_iters=10000, batch_size=64, learning_rate=6e-4, warmup_iters=500,
                  eval_interval=250, eval_iters=20, ckpt_interval=1000, seeds=1),
    "paper": dict(max_iters=100000, batch_size=480, learning_rate=1.6e-4, warmup_iters=2000,
                  eval_interval=1000, eval_iters=20, ckpt_interval=1000, seeds=1),
}
# Flags that override the preset's model; gla.make_config derives everything else from them.
MODEL_FLAGS = {
    "n_layer": "layers",
    "n_embd": "model width",
    "head_dim": "head dim; MLA/GLA derive theirs from it",
    "block_size": "sequence length",
    "vocab_size": "vocabulary size (bytes need 256)",
    "n_head": "baseline query heads (default: n_embd / head_dim)",
    "n_kv_head": "GQA KV heads (default: baseline n_head / 4)",
    "kv_lora_rank": "MLA/GLA latent, all latent heads together (default: 4 head_dim)",
}


def get_args(argv=None):
    """Parse the flags and fill in the preset's defaults. Raises UsageError for a flag out of its range."""
    p = ArgumentParser(prog="train.py", description=__doc__.split("\n\n")[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="Sampling has flags of its own: python train.py --sample RUN --help")
    p.add_argument("--attn", default="gqa", choices=[*gla.VARIANTS, "all"], help="variant, or all six models")
    p.add_argument("--double_heads", action="store_true", help="double the query heads (same KV cache)")
    p.add_argument("--preset", default="tiny", choices=list(gla.PRESETS))
    p.add_argument("--max_iters", type=int, help="optimizer steps (default: per preset)")
    p.add_argument("--batch_size", type=int, help="sequences per step, all processes together")
    p.add_argument("--grad_accum", type=int, default=1, help="micro-batches per process per step")
    for flag, text in MODEL_FLAGS.items():
        p.add_argument(f"--{flag}", type=int, help=text if "default" in text else text + " (default: per preset)")
    p.add_argument("--learning_rate", type=float, help="peak learning rate")
    p.add_argument("--warmup_iters", type=int, help="linear warmup steps")
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--init", default="coupled", choices=["coupled", "independent"],
                   help="coupled: a seed's two arms share the draws of what they have in common (gla.GPT.couple_init)")
    p.add_argument("--grad_clip", type=float, default=1.0)
    p.add_argument("--eval_interval", type=int, help="steps between validation evaluations")
    p.add_argument("--eval_iters", type=int, help="validation batches per evaluation")
    p.add_argument("--ckpt_interval", type=int, help="steps between checkpoints (and one at the end)")
    p.add_argument("--out_dir", default="out")
    p.add_argument("--data", help="text file (bytes), folder with train.bin/val.bin, or llm.c shards")
    p.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], help="autocast dtype (default: bfloat16 on cuda)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--seed", type=int, default=1337, help="first seed")
    p.add_argument("--seeds", type=int, help="seeds per model: --seed, --seed + 1, ... (default: per preset)")
    p.add_argument("--allow_repeats", action="store_true", help="--preset paper: allow reading the data again")
    once = p.add_mutually_exclusive_group()  # --resume and --overwrite contradict each other
    once.add_argument("--resume", action="store_true", help="continue each run from its checkpoint")
    once.add_argument("--overwrite", action="store_true", help="start runs over even if they have a checkpoint")
    args = p.parse_args(argv)
    for key, value in TRAIN_DEFAULTS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    preflight.check_args(args, tuple(MODEL_FLAGS))
    return args


# ----------------------------------------------------------------------------
# The runs of the ablation: a model (variant, double heads or not) and a seed


def models_of(args):
    """(variant, double_heads) of each model to train."""
    if args.attn == "all":
        return [(variant, double_heads) for variant in gla.VARIANTS for double_heads in (False, True)]
    return [(args.attn, args.double_heads)]


def runs_of(args):
    """(variant, double_heads, seed) of each run, seed by seed: an interrupted ablation has whole seeds to plot."""
    return [(v, d, seed) for seed in range(args.seed, args.seed + args.seeds) for v, d in models_of(args)]


def run_name(variant, double_heads):
    """Folder name of a model under --out_dir: gqa, gqa_double_heads, mla, ..."""
    return variant + ("_double_heads" if double_heads else "")


def run_dir(out_dir, variant, double_heads, seed):
    """Folder of one run: <out_dir>/<run name>/seed<seed>."""
    return pathlib.Path(out_dir, run_name(variant, double_heads), f"seed{seed}")


def model_config(args, variant, double_heads):
    """The GPTConfig of a model: the preset, the variant, and the model flags. Raises UsageError naming the model."""
    overrides = {flag: getattr(args, flag) for flag in MODEL_FLAGS if getattr(args, flag) is not None}
    try:
        return gla.make_config(args.preset, variant, double_heads, **overrides)
    except gla.ConfigError as e:
        raise UsageError(f"{run_name(variant, double_heads)}: {e}") from None


# ----------------------------------------------------------------------------
# The batch: batch `step` is a pure function of (seed, step)


def get_batch(data, split, step, batch_size, block_size, seed, rank=0, world_size=1):
    """Inputs and next-token targets of one step, (batch_size // world_size, block_size) int64 each, on the CPU: this
    process's rows [rank B/W, (rank + 1) B/W) of the step's B = batch_size rows.

    Row j = step * batch_size + row of the whole run reads window j mod N of pass j // N over the split's N windows
    of block_size + 1 tokens, each pass in an order drawn for (seed, split, pass) (harness/data.py): every pass reads
    every window once, as the paper reads each token once. So every run of a seed sees the same batches, the ranks
    of torchrun read disjoint rows, and resuming at step s needs no state of the data: batch s is what it was."""
    per_process = batch_size // world_size
    rows = step * batch_size + np.arange(rank * per_process, (rank + 1) * per_process)
    windows = torch.from_numpy(data.read_rows(split, rows, block_size, seed))  # (per_process, block_size + 1)
    return windows[:, :-1], windows[:, 1:]


# ----------------------------------------------------------------------------
# The schedule and the optimizer, as the MLRA release trains (Liu et al. 2026)


def lr_at(step, args):
    """Linear warmup to the peak, then cosine decay to 0.1 x the peak at max_iters."""
    peak = args.learning_rate
    if step < args.warmup_iters:
        return peak * (step + 1) / args.warmup_iters
    progress_ = min(1.0, (step - args.warmup_iters) / max(1, args.max_iters - args.warmup_iters))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress_)))


def make_optimizer(model, args):
    """AdamW, betas (0.9, 0.95), eps 1e-8, weight decay on every parameter (the RMSNorm gains too, where nanoGPT
    decays matrices only), fused (one kernel for all parameters)."""
    return torch.optim.AdamW(model.parameters(), lr=args.learning_rate, betas=(0.9, 0.95),
                             weight_decay=args.weight_decay, fused=True)


# ----------------------------------------------------------------------------
# One step, and evaluation


def micro_batches(x, y, n, device):
    """The n equal micro-batches of (x, y), this process's share of a batch, on `device`: no forward sees more."""
    micro = x.size(0) // n
    return [(x[m * micro:(m + 1) * micro].to(device), y[m * micro:(m + 1) * micro].to(device)) for m in range(n)]


def train_step(model, x, y, args, ctx):
    """Forward and backward of this process's share (x, y) of a step's batch, in grad_accum micro-batches whose
    gradients add up (DDP averages them over the processes on the last one); this process's mean loss of the step,
    a float64 tensor on the device, read by the caller (no wait for the device here). The optimizer step is the
    caller's."""
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for m, (xb, yb) in enumerate(micro_batches(x, y, args.grad_accum, ctx.device)):
        last = m == args.grad_accum - 1
        # Under DDP, only the last micro-batch's backward all-reduces the gradients.
        sync = ExitStack() if last or ctx.world_size == 1 else model.no_sync()
        with ctx.autocast(), sync:
            _, loss = model(xb, yb)
            (loss / args.grad_accum).backward()
        total += loss.detach().double() / args.grad_accum  # float64: no float32 rounding in the step's sum
    return total


@torch.no_grad()
def evaluate(model, data, args, ctx, block_size):
    """Mean loss on the validation batches 0 .. eval_iters - 1 (every run of the seed evaluates on the same ones), in
    the training step's micro-batches, summed on the device: one wait for it, at the end."""
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for k in range(args.eval_iters):
        x, y = get_batch(data, "val", k, args.batch_size, block_size, args.seed, ctx.rank, ctx.world_size)
        for xb, yb in micro_batches(x, y, args.grad_accum, ctx.device):
            with ctx.autocast():
                _, loss = model(xb, yb)
            total += loss.double()
    model.train()
    return ctx.all_sum(total / (args.eval_iters * args.grad_accum)).item() / ctx.world_size


# ----------------------------------------------------------------------------
# The loop, with its checkpoints and an exact resume


def train_run(args, variant, double_heads, data, ctx, stop, job, log):
    """Train the run of seed args.seed (or resume it, or skip it if finished); returns its last evaluation.
    job: this process's progress (harness/progress.py). Raises RunError (a NaN loss, a failed write),
    Interrupted (a signal: after a checkpoint), UsageError (a checkpoint that does not match)."""
    name = f"{run_name(variant, double_heads)} seed {args.seed}"
    config = model_config(args, variant, double_heads)
    spec = checkpoints.run_spec(args, config, data.fingerprint, ctx.dtype)
    run = checkpoints.RunFiles(run_dir(args.out_dir, variant, double_heads, args.seed), spec, ctx.master)
    job.begin_run()

    # The model: the same init in every process and at every resume, from the seed alone.
    torch.manual_seed(args.seed)
    model = gla.GPT(config)
    if args.init == "coupled":  # common random numbers with the other arm of the pair
        model.couple_init(args.seed, model_config(args, variant, not double_heads))
    model.to(ctx.device)
    optimizer = make_optimizer(model, args)

    # Resume: weights, AdamW's state, the step and the running train loss. The data needs nothing: batch s is a
    # function of (seed, s).
    step = 0
    elapsed = 0.0  # seconds trained before this process
    loss_sum = 0.0  # the train losses since the last evaluation, which reports their mean
    loss_count = 0
    rows = []  # the evaluations so far, metrics.jsonl's rows
    if args.resume and run.ckpt_path.exists():
        ckpt = checkpoints.load_checkpoint(run.ckpt_path, spec)
        checkpoints.load_state(model, ckpt["model"], f"cannot resume {run.ckpt_path}")
        try:
            optimizer.load_state_dict(ckpt["optimizer"])  # the saved state, its `fused` flag included
        except (ValueError, KeyError, TypeError) as e:
            raise UsageError(f"cannot resume {run.ckpt_path}: its optimizer state does not fit ({e}); use "
                             "--overwrite to start over") from None
        step = ckpt["iter"]
        elapsed = ckpt["elapsed_s"]
        loss_sum = ckpt["train_loss_sum"]
        loss_count = ckpt["train_loss_count"]
        del ckpt  # the model and the optimizer hold copies now: no second set of weights for the whole run
        rows = checkpoints.read_metrics(run.metrics_path, step)
        run.saved = step
        if step >= args.max_iters:
            log(f"{name}: finished at iteration {step}, skipped")
            return rows[-1] if rows else None
        log(f"{name}: resuming at iteration {step}")
    run.start(rows, data.source)
    if ctx.master:
        log(f"{name}: {model.num_params():,} parameters, n_head {config.n_head}, ffn_hidden {config.ffn_hidden}, "
            f"KV cache {config.kv_cache_elems_per_token_per_layer} elements/token/layer")

    train_model = torch.compile(model) if args.compile else model
    if ctx.world_size > 1:  # gradient_as_bucket_view: no second copy of the gradients (harness/memory.py)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        train_model = DDP(train_model, device_ids=device_ids, gradient_as_bucket_view=True)
    tokens_per_step = args.batch_size * config.block_size
    # tqdm bars on a terminal only (disable=None), so that logs in files stay readable.
    bar = tqdm(total=args.max_iters, initial=step, desc=name, disable=None if ctx.master else True,
               leave=False, dynamic_ncols=True)
    started = time.time() - elapsed
    try:
        while step < args.max_iters:
            # One optimizer step.
            lr = lr_at(step, args)
            for group in optimizer.param_groups:
                group["lr"] = lr
            x, y = get_batch(data, "train", step, args.batch_size, config.block_size, args.seed, ctx.rank,
                             ctx.world_size)
            loss = train_step(train_model, x, y, args, ctx)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
            # The step's one wait for the device: its loss, its gradient norm and whether a signal asks us to stop
            # (Ctrl-C, SIGTERM: harness/stops.py), in one tensor summed over the processes, so that all agree.
            stopping = torch.full((), float(stop.signum != 0), dtype=torch.float64, device=ctx.device)
            loss, grad_norm, stopping = ctx.all_sum(torch.stack([loss, grad_norm.double(), stopping])).tolist()
            step_loss = loss / ctx.world_size
            grad_norm /= ctx.world_size
            if not math.isfinite(step_loss) or not math.isfinite(grad_norm):
                raise RunError(f"{name}: loss {step_loss}, gradient norm {grad_norm} at iteration {step}; stopped, "
                               f"{run.kept()}")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            loss_sum += step_loss
            loss_count += 1

            # Progress: this run's bar, and the whole job's estimate.
            job.stepped()
            job.tick(log)
            tokens_per_s = step * tokens_per_step / (time.time() - started)
            bar.update(1)
            bar.set_postfix(loss=f"{step_loss:.3f}", tok_s=f"{tokens_per_s:.0f}")

            if step % args.eval_interval == 0 or step == args.max_iters:
                val_loss = evaluate(model, data, args, ctx, config.block_size)
                job.evaluated()
                elapsed = time.time() - started
                row = dict(iter=step, tokens=step * tokens_per_step, train_loss=loss_sum / loss_count,
                           val_loss=val_loss, lr=lr, elapsed_s=round(elapsed, 3),
                           tokens_per_s=round(step * tokens_per_step / elapsed, 1))
                loss_sum = 0.0
                loss_count = 0
                rows.append(row)
                run.append_metrics(row)
                if ctx.master:
                    bar.write(f"{name} iter {step}: train {row['train_loss']:.4f} val {val_loss:.4f}")
            if step % args.ckpt_interval == 0 or step == args.max_iters:
                save_checkpoint(run, name, model, optimizer, step, started, loss_sum, loss_count, tokens_per_step)

            # A signal stops us between two steps, with a whole state to save.
            if stopping:
                if step != run.saved:
                    save_checkpoint(run, name, model, optimizer, step, started, loss_sum, loss_count,
                                    tokens_per_step)
                raise Interrupted(f"{name}: interrupted at iteration {step}", stop.signum)
    finally:
        bar.close()  # an error message then starts on a clean line
    return rows[-1] if rows else None


def save_checkpoint(run, name, model, optimizer, step, started, loss_sum, loss_count, tokens_per_step):
    """Save what an exact resume needs: the weights, AdamW's state, the step, the time and the running train loss.
    Weights that went non-finite (a finite loss, then an overflowing update) are never saved: RunError."""
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        raise RunError(f"{name}: non-finite weights at iteration {step}; stopped, {run.kept()}")
    run.save(dict(model=model.state_dict(), optimizer=optimizer.state_dict(), iter=step,
                  tokens=step * tokens_per_step, elapsed_s=time.time() - started, train_loss_sum=loss_sum,
                  train_loss_count=loss_count, config=run.spec))


# ----------------------------------------------------------------------------
# main: check everything, then train the runs seed by seed


def check_runs(args):
    """The GPTConfig of each model to train, once everything that needs neither a device nor data is checked: every
    model builds (and its twin, which --init coupled draws against), the batch splits, and no run folder holds what
    this command would erase (harness/checkpoints.py). Raises UsageError."""
    configs = [model_config(args, v, d) for v, d in models_of(args)]
    if args.init == "coupled":
        for variant, double_heads in models_of(args):
            model_config(args, variant, not double_heads)
    preflight.check_batch(args, int(os.environ.get("WORLD_SIZE", 1)))
    first_checkpoint = min(args.ckpt_interval, args.max_iters)
    for run in runs_of(args):
        checkpoints.check_existing_run(run_dir(args.out_dir, *run), args.resume, args.overwrite, first_checkpoint)
    return configs


def check_memory(args, configs, ctx):
    """Refuse a job whose step would not fit in memory (harness/memory.py), where memory can run out: on a GPU, or a
    preset past tiny. (On a CPU, torchrun's processes on this host share its memory.)"""
    if ctx.device.type == "cpu" and args.preset == "tiny":
        return
    per_process = args.batch_size // ctx.world_size
    sharing = 1
    if ctx.device.type == "cpu":
        sharing = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    memory.check_memory(configs, per_process, per_process // args.grad_accum, ctx.dtype, ctx.device,
                        ctx.world_size > 1, sharing)


def plan_run(args, variant, double_heads, seed):
    """The run's PlannedRun (harness/progress.py): the steps it has left (a --resume starts from its checkpoint)."""
    done = 0
    if args.resume:
        done = checkpoints.saved_iter(run_dir(args.out_dir, variant, double_heads, seed) / "ckpt.pt")
    name = f"{run_name(variant, double_heads)} seed {seed}"
    return progress.plan_run(name, model_config(args, variant, double_heads), max(0, args.max_iters - done),
                             args.batch_size, args.eval_interval, args.eval_iters, args.max_iters)


def train_runs(args, block_size, data, ctx, stop, log):
    """Train every run, seed by seed, in this process, reporting the job's progress."""
    runs = runs_of(args)
    tokens_per_step = args.batch_size * block_size
    job = progress.JobProgress([plan_run(args, *run) for run in runs], tokens_per_step, report=ctx.master)
    try:
        for variant, double_heads, seed in runs:
            run_args = argparse.Namespace(**{**vars(args), "seed": seed})  # the run's own seed, the rest shared
            train_run(run_args, variant, double_heads, data, ctx, stop, job, log)
    finally:
        job.close()


def main(argv=None, stop=None):
    """Check the input, then train the requested runs; returns the exit status (0: all trained). Raises UsageError
    for bad input, RunError for a run that cannot go on, Interrupted after a signal (every run checkpointed first)."""
    args = get_args(argv)
    stop = stop or StopFlag()

    # Pre-flight: everything we can check before we write anything (harness/preflight.py).
    configs = check_runs(args)
    ctx = setup_context(args.device, args.dtype)
    check_memory(args, configs, ctx)
    block_size = configs[0].block_size  # one for every run: the preset's or --block_size
    data, passes = preflight.load_data(args, ctx, block_size, min(c.vocab_size for c in configs))
    check_out_dir(args.out_dir)
    log = tqdm.write if ctx.master else print_nothing

    with ExitStack() as locks, stop_on_signals(stop):
        # The run folders: ours alone from now on (rank 0 holds them for torchrun's ranks), if the disk has room.
        eval_points = args.max_iters // args.eval_interval + 1
        runs = [(run_dir(args.out_dir, v, d, s), model_config(args, v, d)) for v, d, s in runs_of(args)]
        preflight.on_master(ctx, functools.partial(preflight.claim_folders, locks, args.out_dir, runs, eval_points))
        log(f"data: {data.source}, {data.n_tokens['train']:,} train / {data.n_tokens['val']:,} val tokens, "
            f"sha256 {data.fingerprint}; {ctx.world_size} process(es) on {ctx.device}, {args.dtype or ctx.dtype}")
        log(f"training: {passes}, windows of {block_size} tokens drawn without replacement")
        train_runs(args, block_size, data, ctx, stop, log)

    if ctx.master:
        for folder, _ in runs:
            rows = checkpoints.read_metrics(folder / "metrics.jsonl")
            if rows:
                log(f"{folder}: final val loss {rows[-1]['val_loss']:.4f} after {rows[-1]['tokens']:,} tokens")
    leave_process_group(finished=True)
    return 0


def print_nothing(message):
    """The log of torchrun's ranks other than 0: rank 0 speaks for all."""


def cli(argv=None):
    """The command line: `train.py --sample ...` samples (harness/sampling.py); anything else trains (main). Errors
    print as one line; returns the exit status (harness/stops.py)."""
    argv = sys.argv[1:] if argv is None else argv
    if "--sample" in argv:
        return run_command(sampling.main, argv, "train.py", StopFlag())
    stop = StopFlag()
    return run_command(functools.partial(main, stop=stop), argv, "train.py", stop)


if __name__ == "__main__":
    sys.exit(cli())
