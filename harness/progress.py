"""The whole job's plan, its time estimate, and what is left of it.

A job is runs (a model and a seed), trained in order by one process, or shared by --jobs processes side by side
(slots). Each run's cost is its FLOPs (training_flops_per_token: the model's own count) for the steps it has left,
its evaluations included. Each slot measures how many FLOPs a second it does once it has trained a few seconds; the
job's time left is the longest of the slots' (work left / that rate). So the estimate counts the runs that go side
by side, and every run's own size, from the first measured steps on; it sharpens as the job goes.

The numbers live in one flat list of floats per job, FIELDS a slot: a --jobs worker writes its slot into a shared
array that its parent reads, prints and draws.
"""
import dataclasses
import time

import torch
from tqdm import tqdm

import gla

# Per slot: the run being trained (its index in the slot's plan), FLOPs done, steps done, and when the slot's first
# step ended with the FLOPs and steps done then (the rate is measured from there: the first step compiles and warms).
RUN, COST, STEPS, FIRST_TIME, FIRST_COST, FIRST_STEPS = range(6)
FIELDS = 6
ESTIMATE_AFTER_S = 5.0  # a slot's rate is trusted after this many seconds of steps ...
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
    """The job's plan, one list of PlannedRuns per slot (process) in the order it trains them, and the numbers each
    slot reports (`state`: a list, or a shared array in --jobs, FIELDS floats a slot). report=True: this process
    prints the estimate line and the minute lines (or draws the overall bar on a terminal)."""

    def __init__(self, slots, tokens_per_step, state=None, report=True, bars=True):
        self.slots = slots
        self.tokens_per_step = tokens_per_step
        if state is None:  # a new job; a --jobs worker gets the state its parent made
            state = [0.0] * (FIELDS * len(slots))
            for slot in range(len(slots)):
                state[FIELDS * slot + RUN] = -1
        self.state = state
        self.report = report
        self.bars = bars
        self.started = time.time()
        self.estimated = False
        self.last_log = time.time()
        self.bar = None

    def total_flops(self, slot):
        return sum(run.flops for run in self.slots[slot])

    def current_run(self, slot):
        """The PlannedRun the slot trains now (None before its first)."""
        index = int(self.state[FIELDS * slot + RUN])
        return self.slots[slot][index] if index >= 0 else None

    def begin_run(self, slot):
        """The slot moves on to the next run of its plan."""
        self.state[FIELDS * slot + RUN] += 1

    def stepped(self, slot):
        """The slot's current run finished a training step."""
        base = FIELDS * slot
        self.state[base + COST] += self.current_run(slot).step_flops
        self.state[base + STEPS] += 1
        if not self.state[base + FIRST_TIME]:
            self.state[base + FIRST_TIME] = time.time()
            self.state[base + FIRST_COST] = self.state[base + COST]
            self.state[base + FIRST_STEPS] = self.state[base + STEPS]

    def evaluated(self, slot):
        """The slot's current run finished an evaluation."""
        self.state[FIELDS * slot + COST] += self.current_run(slot).eval_flops

    def seconds_left(self):
        """(seconds left, FLOPs per second of each slot), or None while a slot with work has not measured its rate."""
        now = time.time()
        left = 0.0
        rates = []
        for slot in range(len(self.slots)):
            base = FIELDS * slot
            todo = self.total_flops(slot) - self.state[base + COST]
            if todo <= 0:
                continue
            seconds = now - self.state[base + FIRST_TIME]
            steps = self.state[base + STEPS] - self.state[base + FIRST_STEPS]
            if not self.state[base + FIRST_TIME] or seconds < ESTIMATE_AFTER_S or steps < ESTIMATE_AFTER_STEPS:
                return None
            rate = (self.state[base + COST] - self.state[base + FIRST_COST]) / seconds
            rates.append((rate, steps / seconds))
            left = max(left, todo / rate)
        if not rates:  # the job is done
            return None
        return left, rates

    def fraction_done(self):
        done = sum(self.state[FIELDS * slot + COST] for slot in range(len(self.slots)))
        total = sum(self.total_flops(slot) for slot in range(len(self.slots)))
        return done / total if total else 1.0

    def plan_line(self, left, rates):
        """The estimate line: runs x seeds x steps, tokens, this machine's measured tokens/s, the time in all."""
        runs = [run for slot in self.slots for run in slot]
        steps = sorted({run.steps for run in runs})
        tokens = sum(run.steps for run in runs) * self.tokens_per_step
        per_process = sum(steps_per_s for _, steps_per_s in rates) / len(rates) * self.tokens_per_step
        side_by_side = f"{len(self.slots)} processes side by side" if len(self.slots) > 1 else "one process"
        elapsed = time.time() - self.started
        return (f"estimate: {len(runs)} run(s) of {'/'.join(map(str, steps))} steps, {tokens:,} tokens; "
                f"{side_by_side} at {per_process:,.0f} tokens/s each on this machine: about "
                f"{minutes(elapsed + left)} in all, {minutes(left)} left")

    def tick(self, log):
        """Report if it is time: the estimate line once the rates are measured, then the time left every minute (no
        terminal) or in the overall bar (a terminal). Cheap: train.py calls it after every step."""
        if not self.report:
            return
        estimate = self.seconds_left()
        if estimate is None:
            return
        left, rates = estimate
        if not self.estimated:
            self.estimated = True
            log(self.plan_line(left, rates))
            if self.bars:
                self.bar = tqdm(total=100, desc="the whole job", disable=None, leave=False, dynamic_ncols=True,
                                bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix}")
        if self.bar is not None and not self.bar.disable:
            self.bar.n = round(100 * self.fraction_done(), 1)
            self.bar.set_postfix_str(f"about {minutes(left)} left")
        elif time.time() - self.last_log >= LOG_EVERY_S:
            self.last_log = time.time()
            log(f"progress: {100 * self.fraction_done():.0f}% of the job after {minutes(time.time() - self.started)}, "
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
