"""The job's plan, its time estimate, and what is left of it.

A process trains its runs (a model and a seed) in order. Each run's cost is its FLOPs (training_flops_per_token: the
model's own count) for the steps it has left, its evaluations included. Once the process has trained a few seconds
it knows how many FLOPs a second it does, and so its time left: the estimate counts every run's own size from the
first measured steps on, and sharpens as the job goes.
"""
import dataclasses
import time

import torch
from tqdm import tqdm

import gla

ESTIMATE_AFTER_S = 5.0  # the rate is trusted after this many seconds of steps ...
ESTIMATE_AFTER_STEPS = 3  # ... and this many steps
LOG_EVERY_S = 60.0  # without a terminal, one progress line a minute


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


@dataclasses.dataclass
class PlannedRun:
    """A run of the job: its name ("gqa_double_heads seed 1337"), the steps it has left, the FLOPs of one training
    step and of one evaluation (a forward is a third of a step), and its evaluations left."""
    name: str
    steps: int
    step_flops: float
    eval_flops: float
    evals: int

    @property
    def flops(self):
        return self.steps * self.step_flops + self.evals * self.eval_flops


def plan_run(name, config, steps_left, batch_size, eval_interval, eval_iters, max_iters):
    """The PlannedRun of a run of `config` with steps_left of its max_iters steps to train."""
    per_token = training_flops_per_token(config)
    step_flops = per_token * batch_size * config.block_size
    eval_flops = per_token / 3 * eval_iters * batch_size * config.block_size
    first = max_iters - steps_left
    evals = sum(1 for step in range(first + 1, max_iters + 1) if step % eval_interval == 0 or step == max_iters)
    return PlannedRun(name, steps_left, step_flops, eval_flops, evals)


class JobProgress:
    """This process's plan, its runs (PlannedRuns) in the order it trains them, and what it has done of it.

    report: whether this process reports the job's progress (under torchrun, rank 0 does for all): the estimate
    line, then the whole job's bar on a terminal, else a line a minute."""

    def __init__(self, runs, tokens_per_step, report=True):
        self.runs = runs
        self.tokens_per_step = tokens_per_step
        self.report = report
        self.run = -1  # the index of the run being trained
        self.flops = 0.0  # FLOPs done
        self.steps = 0
        self.first = None  # (time, FLOPs done, steps) at the end of the first step: it compiles and warms up
        self.started = time.time()
        self.estimated = False
        self.last_log = time.time()
        self.bar = None

    def total_flops(self):
        return sum(run.flops for run in self.runs)

    def begin_run(self):
        """We move on to the next run of the plan."""
        self.run += 1

    def stepped(self):
        """The current run finished a training step."""
        self.flops += self.runs[self.run].step_flops
        self.steps += 1
        if self.first is None:
            self.first = (time.time(), self.flops, self.steps)

    def evaluated(self):
        """The current run finished an evaluation."""
        self.flops += self.runs[self.run].eval_flops

    def rates(self):
        """(FLOPs per second, steps per second) since the first step, or None before the rate can be trusted."""
        if self.first is None:
            return None
        seconds = time.time() - self.first[0]
        steps = self.steps - self.first[2]
        if seconds < ESTIMATE_AFTER_S or steps < ESTIMATE_AFTER_STEPS:
            return None
        return (self.flops - self.first[1]) / seconds, steps / seconds

    def seconds_left(self, flops_per_s):
        """What the job has left."""
        return (self.total_flops() - self.flops) / flops_per_s

    def plan_line(self, flops_per_s, steps_per_s):
        """The estimate line: runs x steps, tokens, this machine's measured tokens/s, the time in all."""
        steps = sorted({run.steps for run in self.runs})
        tokens = sum(run.steps for run in self.runs) * self.tokens_per_step
        left = self.seconds_left(flops_per_s)
        return (f"estimate: {len(self.runs)} run(s) of {'/'.join(map(str, steps))} steps, {tokens:,} tokens at "
                f"{steps_per_s * self.tokens_per_step:,.0f} tokens/s on this machine: about "
                f"{minutes(time.time() - self.started + left)} in all, {minutes(left)} left")

    def tick(self, log):
        """Report if it is time: the estimate line once the rate is measured, then the time left every minute (no
        terminal) or in the overall bar (a terminal). Cheap: train.py calls it after every step."""
        rates = self.rates()
        if not self.report or rates is None or self.flops >= self.total_flops():
            return
        if not self.estimated:
            self.estimated = True
            log(self.plan_line(*rates))
            self.bar = tqdm(total=100, desc="the whole job", disable=None, leave=False, dynamic_ncols=True,
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix}")
        left = self.seconds_left(rates[0])
        done = self.flops / self.total_flops()
        if self.bar is not None and not self.bar.disable:
            self.bar.n = round(100 * done, 1)
            self.bar.set_postfix_str(f"about {minutes(left)} left")
        elif time.time() - self.last_log >= LOG_EVERY_S:
            self.last_log = time.time()
            log(f"progress: {100 * done:.0f}% of the job after {minutes(time.time() - self.started)}, "
                f"about {minutes(left)} left")

    def close(self):
        if self.bar is not None:
            self.bar.close()


def minutes(seconds):
    """'45 s', '3.5 min' or '1 h 20 min'."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min" if seconds < 600 else f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {seconds % 3600 / 60:.0f} min"
