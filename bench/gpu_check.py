"""The whole GPU path in one command: the suite's CUDA tests, the bf16 kernel against its reference up to 128K cached
tokens, a short training run (one process, then one under torchrun), sampling from it through the Triton kernel,
compiled decoding against eager, and the kernel's time against the copy-bandwidth floor; then one table, a row per
check. Exits 1 if any check failed, 0 otherwise, 2 without a CUDA GPU (unless --device cpu).

    python bench/gpu_check.py                 # one H100 or H200: about 9 minutes (an estimate: see below)
    python bench/gpu_check.py --device cpu    # a dry run of every check's plumbing on a CPU: under a minute

Each check runs in a process of its own (a crash, a hung kernel or a CUDA error in one cannot hide the others), its
output echoed as it comes; the table at the end gives each check's result, seconds, and a figure or, for a failure,
the first line of its reason (the full output is above the table). The checks and what each proves:

  cuda_tests  `pytest -k cuda test_gla.py bench/test_bench.py` passes: the compiled kernel in each dtype, the model's
              decode path into it, compiled decoding, the GPU build figures against this GPU's own builds.
  kernel      decode_attention (bf16) equals decode_attention_ref within CHECK_TOL in every launch of
              check_configs(): each design of BENCH_SHAPES at batch 1 and 32, 8K / 32K / 128K cached tokens (where
              the GPU's memory holds the reference), Lq 1, 2 and MAX_LQ, ragged lengths with NaN past them (never
              read), with the default splits, with max_seqlen and with 3 splits.
  train       train.py trains GLA-2 for 20 steps on the GPU (bf16 autocast, its default there) to a finite val_loss.
  torchrun    the same under a one-process torchrun (the NCCL process group; gloo on a CPU).
  sample      train.py --sample decodes 32 tokens from that run on the GPU (bf16, its default there), through the
              Triton kernel, and prints its text and time.
  compile     greedy decoding with the decode step under torch.compile (bench.common.compiled_greedy, the Triton
              kernel inside it) gives GPT.generate's greedy tokens, for GQA, MLA and GLA-2 (tiny models, perturbed
              weights, float32).
  speed       the median time of a decode_attention call (bf16, Lq 1, 32K cached tokens, batch 1 and 32, each
              design) against its floor: the bytes it must read (bench.roofline.call_bytes) at the GPU's measured
              device-to-device copy bandwidth. It reports the percent of the floor reached; it fails on errors only.

The time on one H100 is an estimate, not a measurement (nothing here has run on a GPU yet): the CUDA tests 2-3 min
(the GPU builds of the widest tiles are compiled twice, ahead of time and by the runtime), the kernel check 2-4 min
(90 launches, 88 on an H100, whose memory cannot hold the two largest references, 71 GB each; about 15 tile shapes
for the autotuner to compile in 5 configs each), training and torchrun about a minute together, sampling 15 s,
compiling 3 models 1-2 min, the speed check 30 s: 7-11 minutes. Each check has a time limit (LIMITS_S) past which it
is killed and fails, and the kernel check starts no launch after KERNEL_BUDGET_S (those left are counted in its row).

--device cpu runs what a CPU can: the kernel check in Triton's interpreter (TRITON_INTERPRET=1, set here before
Triton is imported) in float32 on dry_shapes() (the designs with a quarter of their heads and widths, a 40-token
cache), training and torchrun (gloo) at a tiny size on a small text file, sampling (through the PyTorch reference,
as the model decodes on a CPU), and compiled decoding for GLA-2 (torch.compile's CPU backend, where a C++ compiler is
found); the CUDA tests and the speed check are skipped.
"""
import argparse
import importlib.util
import json
import math
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the repository's modules

import torch  # noqa: E402

# kernels, gla and bench.common (which imports them) are imported where they are used: under --device cpu,
# TRITON_INTERPRET must be set before Triton is.

# The table's rows, in order.
CHECKS = ("cuda_tests", "kernel", "train", "torchrun", "sample", "compile", "speed")
# Wall seconds a check may take before it is killed and fails.
LIMITS_S = {"cuda_tests": 420, "kernel": 480, "train": 240, "torchrun": 240, "sample": 180, "compile": 420,
            "speed": 240}
KERNEL_BUDGET_S = 360  # the kernel check starts no launch after this; those left count in its figure
MEMORY_MARGIN = 0.8  # a launch may take at most this fraction of the GPU's free memory
RESULT = "gpu_check result: "  # the line a check's child process ends with, then its result as JSON
# Per sequence, max |kernel - reference| / max |reference| in bf16. Emulating the kernel's roundings (bf16
# probabilities into P.V, bf16 partials with float32 log-sum-exps, bf16 output) on the bench shapes at 4096 tokens
# gave 0.24-0.42%; dropping one 16-token tile of a 4096-token sequence gave 3.2-8.7%. CHECK_TOL sits between.
CHECK_TOL = 1.5e-2
CHECK_BATCHES = (1, 32)
CHECK_SEQLENS = (8192, 32768, 131072)
SPEED_SEQLEN = 32768
SPEED_BATCHES = (1, 32)
COPY_BYTES = 1 << 30
DRY_SEQLEN = 40  # the dry run's cache: two 16-token tiles and a partial one


class CheckFailed(Exception):
    """A check's failure: its message is the table's reason."""


class Skip(Exception):
    """A check that cannot run here: its message is the table's reason."""


def check_configs():
    """(design, B, Lq, S) of the kernel check on a GPU, every design at the shortest cache first: a time budget that
    runs out leaves the longest caches unchecked, not a design."""
    import kernels
    from bench.common import BENCH_SHAPES
    return [(name, B, Lq, S) for S in CHECK_SEQLENS for name in BENCH_SHAPES for B in CHECK_BATCHES
            for Lq in (1, 2, kernels.MAX_LQ)]


def dry_shapes():
    """The designs of BENCH_SHAPES with a quarter of their query heads and feature widths (at least 16): the same
    groups, qv and shared rope key, small enough for Triton's interpreter."""
    from bench.common import BENCH_SHAPES
    return {name: (max(Hq // 4, Hkv), Hkv, Hk, max(Dk // 4, 16), max(Dv // 4, 16), qv)
            for name, (Hq, Hkv, Hk, Dk, Dv, qv) in BENCH_SHAPES.items()}


def dry_configs():
    """(design, B, Lq, S) of the kernel check under --device cpu: each design at Lq 1 and 2, and GQA's at MAX_LQ
    (a MAX_LQ launch of a latent design takes the interpreter a minute)."""
    import kernels
    from bench.common import BENCH_SHAPES
    first = next(iter(BENCH_SHAPES))
    return ([(name, 2, Lq, DRY_SEQLEN) for name in BENCH_SHAPES for Lq in (1, 2)]
            + [(first, 2, kernels.MAX_LQ, DRY_SEQLEN)])


def check_one(name, B, Lq, S, dtype=torch.bfloat16, device="cuda", shapes=None):
    """The kernel against the reference in one launch of design `name` of shapes (None: BENCH_SHAPES): ragged lengths
    up to S (the first S, the second a few tokens, in which one wrong token shows), NaN past them. Returns its failure
    lines (none if it passes) and the largest relative error of its three calls (defaults, max_seqlen, 3 splits)."""
    import kernels
    from bench.common import BENCH_SHAPES, bench_inputs
    q, k_cache, v_cache, seqlens, qv = bench_inputs(name, B, S, Lq, dtype, device, shapes or BENCH_SHAPES)
    seqlens = torch.randint(Lq, S + 1, (B,), dtype=torch.int32, device=device)
    seqlens[0] = S
    seqlens[1:2] = min(S, Lq + 16)
    stale = torch.arange(S, device=device)[None, :] >= seqlens[:, None]
    k_cache[stale] = float("nan")  # positions past cache_seqlens must never be read
    v_cache[stale] = float("nan")
    # The reference needs finite stale slots: it reads the NaN as 0.
    ref = kernels.decode_attention_ref(q, k_cache.nan_to_num(), v_cache.nan_to_num(), seqlens, qv).float()
    scale = ref.flatten(1).abs().amax(1)  # per sequence
    failures, worst = [], 0.0
    for how in (dict(), dict(max_seqlen=S), dict(num_splits=3)):
        out = kernels.decode_attention(q, k_cache, v_cache, seqlens, qv, **how).float()
        err = ((out - ref).flatten(1).abs().amax(1) / scale).nan_to_num(float("inf")).max().item()
        worst = max(worst, err)
        if not err <= CHECK_TOL:
            failures.append(f"MISMATCH {name} B={B} Lq={Lq} S={S} {how or 'defaults'}: relative error {err:.3g} "
                            f"> {CHECK_TOL} (NaN counts as inf)")
    return failures, worst


def reference_bytes(name, B, Lq, S, elem_bytes, shapes):
    """About the most GPU memory check_one holds at once: the cache, its NaN-free copy and the reference's float32
    K and V (4 caches' worth in bf16), and ~3 float32 score tensors (the mask, SDPA's scores and probabilities)."""
    Hq, Hkv, Hk, Dk, Dv, _ = shapes[name]
    return 4 * B * S * (Hk * Dk + Hkv * Dv) * elem_bytes + 3 * 4 * B * Hq * Lq * S


def kernel_check(device):
    """Every launch of check_configs (GPU, bf16) or dry_configs (CPU, float32 in the interpreter) through check_one;
    one that raises is a failure too. Figure: launches checked, the worst relative error, what was left out."""
    from bench.common import BENCH_SHAPES
    cuda = device == "cuda"
    configs, shapes = (check_configs(), BENCH_SHAPES) if cuda else (dry_configs(), dry_shapes())
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    start, failures, worst, checked, lost = time.time(), [], 0.0, 0, False
    no_memory, no_time, no_context = [], [], []
    for name, B, Lq, S in configs:
        launch = f"{name} B={B} Lq={Lq} S={S}"
        if time.time() > start + KERNEL_BUDGET_S:
            no_time.append(launch)
            continue
        if lost:
            no_context.append(launch)
            continue
        if cuda and reference_bytes(name, B, Lq, S, 2, shapes) > MEMORY_MARGIN * torch.cuda.mem_get_info()[0]:
            no_memory.append(launch)
            continue
        t, before = time.time(), len(failures)
        try:
            lines, err = check_one(name, B, Lq, S, dtype, device, shapes)
            failures += lines
            worst = max(worst, err)
        except Exception as e:  # report every launch, then fail
            failures.append(f"ERROR {launch}: {type(e).__name__}: {first_line(e)}")
            lost = cuda and not cuda_works()  # an illegal address: every later launch would fail the same way
        checked += 1
        print(f"{launch}: {'FAIL' if len(failures) > before else 'ok'} ({time.time() - t:.1f} s)", flush=True)
        if cuda:
            torch.cuda.empty_cache()
    for what, left in [("too large for the GPU's memory", no_memory), (f"past the {KERNEL_BUDGET_S} s budget", no_time),
                       ("the CUDA context was lost at the last ERROR", no_context)]:
        if left:
            print(f"not checked ({what}): {'; '.join(left)}")
    if failures:
        print("\n".join(failures))
        raise CheckFailed(f"{len(failures)} failure(s) in {checked} launches; the first: {failures[0]}")
    figure = f"{checked} launches ({str(dtype).removeprefix('torch.')}), worst relative error {worst:.2g}"
    if not cuda:
        figure += ", interpreter, dry shapes"
    if no_memory or no_time:
        figure += f"; {len(no_memory) + len(no_time)} not checked (memory: {len(no_memory)}, time: {len(no_time)})"
    return figure


def cuda_works():
    """Whether the CUDA context still runs work (an illegal memory access, say, leaves it broken for good)."""
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").item() == 1
    except Exception:
        return False


def compile_check(device):
    """Greedy tokens of bench.common.compiled_greedy (the decode step compiled) equal GPT.generate's for each design
    (GPU: GQA, MLA, GLA-2 at the tiny preset; CPU: GLA-2 at one narrow layer), float32, weights perturbed so that
    attention shapes the logits. Figure: designs and tokens compared."""
    import gla
    from bench import common
    cuda = device == "cuda"
    variants = gla.VARIANTS if cuda else ("gla2",)
    size = {} if cuda else dict(n_layer=1, n_embd=64, head_dim=16, block_size=32)
    new_tokens = 24 if cuda else 8
    wrong = []
    for variant in variants:
        torch.manual_seed(0)
        model = gla.GPT(gla.make_config("tiny", variant, **size))
        with torch.no_grad():  # the output projections start at zero: every block would be the identity
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        model.to(device).eval()
        prompt = torch.randint(0, model.config.vocab_size, (2, 8), device=device)
        try:
            eager = model.generate(prompt, new_tokens, temperature=0)
            same = (common.compiled_greedy(model, prompt, new_tokens) == eager).all(0)
        except Exception as e:  # each design reports, then the check fails
            traceback.print_exc()
            wrong.append(f"{variant}: {type(e).__name__}: {first_line(e)}")
            continue
        print(f"{variant}: {'equal' if same.all() else 'DIFFERENT'}", flush=True)
        if not same.all():
            wrong.append(f"{variant} differs from eager from new token {int((~same).nonzero()[0]) - prompt.shape[1]}")
    if wrong:
        raise CheckFailed("; ".join(wrong))
    return f"{', '.join(variants)}: 2 x {new_tokens} greedy tokens equal (float32)"


def median_seconds(fn):
    """The median time of fn in seconds, by triton.testing.do_bench (warm-up, an L2 flush before each run)."""
    from triton.testing import do_bench
    return do_bench(fn, return_mode="median") * 1e-3


def copy_bandwidth(device):
    """Bytes per second of a COPY_BYTES device-to-device copy, its reads and writes counted, as bench/kernel_speed.py
    measures the floor's bandwidth."""
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * COPY_BYTES / median_seconds(lambda: dst.copy_(src))


def call_seconds(name, B, device):
    """The median time of one decode_attention call of bench shape `name`: bf16, Lq 1, B sequences of SPEED_SEQLEN
    cached tokens."""
    import kernels
    from bench.common import bench_inputs
    q, k, v, seqlens, qv = bench_inputs(name, B, SPEED_SEQLEN, 1, torch.bfloat16, device)
    return median_seconds(lambda: kernels.decode_attention(q, k, v, seqlens, qv, max_seqlen=SPEED_SEQLEN))


def speed_check(device):
    """The time of decode_attention (call_seconds) per design and batch against its floor: the bytes it must read
    (call_bytes) at the measured copy bandwidth. Figure: the worst and the best percent of the floor reached."""
    from bench.common import BENCH_SHAPES, machine
    from bench.roofline import call_bytes
    copy_bw = copy_bandwidth(device)
    print(f"{machine(device)}: device-to-device copy bandwidth {copy_bw / 1e9:.0f} GB/s")
    print("design  B  time_us  MB_read  GB_s  floor_us  pct_of_floor")
    rows = []
    for name, (Hq, Hkv, Hk, Dk, Dv, use_qv) in BENCH_SHAPES.items():
        for B in SPEED_BATCHES:
            t = call_seconds(name, B, device)
            nbytes = call_bytes(B, 1, Hq, Hk, Hkv, Dk, Dv, use_qv, SPEED_SEQLEN, 2)
            pct = 100 * nbytes / copy_bw / t
            rows.append((pct, f"{name} B={B}"))
            print(f"{name}  {B}  {t * 1e6:.1f}  {nbytes / 1e6:.1f}  {nbytes / t / 1e9:.0f}  "
                  f"{nbytes / copy_bw * 1e6:.2f}  {pct:.0f}%", flush=True)
    (low, low_at), (high, high_at) = min(rows), max(rows)
    return (f"{low:.0f}% ({low_at}) to {high:.0f}% ({high_at}) of the copy floor, {copy_bw / 1e9:.0f} GB/s, "
            f"{SPEED_SEQLEN:,} tokens")


IN_CHILD = {"kernel": kernel_check, "compile": compile_check, "speed": speed_check}


def skip_reason(name, device):
    """Why check `name` cannot run on device (None: it can). Without a GPU: the CUDA tests and the speed check
    cannot, nor the kernel check without Triton, nor compiled decoding without a C++ compiler."""
    if device == "cuda":
        return None
    if name == "cuda_tests":
        return "needs a CUDA GPU"
    if name == "speed":
        return "needs a GPU: it times the kernel and the device's copy bandwidth"
    if name == "kernel" and importlib.util.find_spec("triton") is None:
        return "needs Triton (Linux)"
    if name == "compile" and shutil.which(os.environ.get("CXX") or "g++") is None:
        return "torch.compile's CPU backend needs a C++ compiler (g++ or $CXX)"
    return None


def first_line(error):
    """The first non-empty line of an exception's message (or of a text), at most 200 characters."""
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]


def run_command(command, limit_s, env):
    """Run command from the repository root, its output (stdout and stderr) echoed as it comes. Returns (exit status,
    or None where it ran past limit_s and was killed with its process group; its output lines)."""
    print("$ " + shlex.join(command), flush=True)
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    lines = []

    def echo():
        for line in proc.stdout:
            if not line.startswith(RESULT):
                sys.stdout.write(line)
                sys.stdout.flush()
            lines.append(line.rstrip("\n"))

    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    try:
        status = proc.wait(limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and what it started (torchrun's workers)
        proc.wait()
        status = None
    reader.join(10)
    return status, lines


def command_failure(status, lines, limit_s):
    """Why a command failed, in a line: the time limit, or its last line of output and its exit status."""
    if status is None:
        return f"ran past its {limit_s} s limit (killed)"
    last = next((line.strip() for line in reversed(lines) if line.strip()), "no output")
    how = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
    return f"{how}: {last[:200]}"


class Session:
    """What the checks share: the device, a scratch folder, the children's environment, and the training run that
    sampling reads."""

    def __init__(self, device, tmp, only=None):
        self.device = device
        self.only = only  # the checks to run (None: all)
        self.tmp = pathlib.Path(tmp)
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        if device == "cuda":
            self.env.pop("TRITON_INTERPRET", None)
        self.run = None  # the training run's folder, once it passed
        self.cpu_data = None

    def train_flags(self, out_dir):
        """train.py's flags of the short run: 20 steps of GLA-2 on the GPU (the tiny preset, the stdlib corpus); on a
        CPU a few steps of a narrow one-layer model on a small text file."""
        flags = ["train.py", "--attn", "gla2", "--device", self.device, "--seeds", "1", "--out_dir", str(out_dir)]
        if self.device == "cuda":
            return flags + ["--max_iters", "20", "--eval_interval", "10"]
        if self.cpu_data is None:
            self.cpu_data = self.tmp / "text.txt"
            self.cpu_data.write_bytes((REPO / "README.md").read_bytes() * 2)
        return flags + ["--max_iters", "4", "--eval_interval", "2", "--eval_iters", "2", "--batch_size", "4",
                        "--n_layer", "1", "--n_embd", "64", "--head_dim", "16", "--block_size", "64",
                        "--data", str(self.cpu_data)]

    def training(self, name, launcher):
        """A short training run of train.py under launcher: pass when it exits 0 with a finite last val_loss. Returns
        the run's folder and the figure: that val_loss, and the autocast dtype its config.json records."""
        out_dir = self.tmp / name
        status, lines = run_command([*launcher, *self.train_flags(out_dir)], LIMITS_S[name], self.env)
        if status != 0:
            raise CheckFailed(command_failure(status, lines, LIMITS_S[name]))
        runs = sorted(out_dir.glob("*/seed*/metrics.jsonl"))
        if not runs:
            raise CheckFailed(f"no metrics.jsonl under {out_dir}")
        rows = [json.loads(line) for line in runs[0].read_text().splitlines()]
        if not rows or not math.isfinite(rows[-1]["val_loss"]):
            raise CheckFailed(f"{runs[0]}: the last val_loss is {rows[-1]['val_loss'] if rows else 'missing'}")
        dtype = json.loads((runs[0].parent / "config.json").read_text())["train"]["dtype"]
        return runs[0].parent, f"val_loss {rows[-1]['val_loss']:.3f} at step {rows[-1]['iter']}, {dtype}"

    def check_cuda_tests(self):
        """The suite's CUDA tests pass. Figure: pytest's counts."""
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "cuda", "test_gla.py",
                   "bench/test_bench.py"]
        status, lines = run_command(command, LIMITS_S["cuda_tests"], self.env)
        summary = next((line.strip("= ") for line in reversed(lines) if re.search(r"\d+ (passed|failed|error)", line)),
                       None)
        if status != 0:
            raise CheckFailed(summary or command_failure(status, lines, LIMITS_S["cuda_tests"]))
        return re.sub(r" in [\d.]+s.*", "", summary or "passed")

    def check_train(self):
        """train.py trains to a finite val_loss (on a GPU in bf16 autocast, its default there)."""
        self.run, figure = self.training("train", [sys.executable])
        return figure

    def check_torchrun(self):
        """The same run under a one-process torchrun: the process group (NCCL on a GPU, gloo on a CPU) set up and
        left."""
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
        return self.training("torchrun", launcher)[1] + f" ({'NCCL' if self.device == 'cuda' else 'gloo'})"

    def check_sample(self):
        """train.py --sample of the training run exits 0 and prints its header and its time line."""
        if self.run is None:
            raise Skip("no training run to sample (the train check did not pass)")
        command = [sys.executable, "train.py", "--sample", str(self.run), "--prompt", "The return value",
                   "--max_new_tokens", "32", "--device", self.device]
        status, lines = run_command(command, LIMITS_S["sample"], self.env)
        if status != 0:
            raise CheckFailed(command_failure(status, lines, LIMITS_S["sample"]))
        timed = [line for line in lines if re.fullmatch(r"-- 32 new tokens in [\d.]+ s", line)]
        if not any(line.startswith("== ") for line in lines) or not timed:
            raise CheckFailed("exit 0, but no '== <run>: ...' header or '-- 32 new tokens in N s' line")
        dtype = "bfloat16, train.py's default" if self.device == "cuda" else "float32"
        return f"{timed[0].removeprefix('-- ')} ({dtype})"

    def in_child(self, name):
        """Run IN_CHILD[name] in a child process (this script with --child): its result line, or why it has none."""
        command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--device", self.device, "--child", name]
        status, lines = run_command(command, LIMITS_S[name], self.env)
        results = [line for line in lines if line.startswith(RESULT)]
        if not results:
            raise CheckFailed(command_failure(status, lines, LIMITS_S[name]))
        result = json.loads(results[-1].removeprefix(RESULT))
        if result["status"] == "skip":
            raise Skip(result["figure"])
        if result["status"] != "pass":
            raise CheckFailed(result["figure"])
        return result["figure"]

    def check(self, name):
        """(status, seconds, figure or reason) of check `name`: "pass", "FAIL" or "skip"."""
        print(f"\n===== {name} =====", flush=True)
        started = time.time()
        method = getattr(self, "check_" + name, None)
        try:
            if self.only and name not in self.only:
                raise Skip("not asked (--only)")
            if skip_reason(name, self.device):
                raise Skip(skip_reason(name, self.device))
            status, figure = "pass", method() if method else self.in_child(name)
        except Skip as e:
            status, figure = "skip", first_line(e)
        except CheckFailed as e:
            status, figure = "FAIL", first_line(e)
        except Exception as e:  # a failure of this script itself: the table says it too
            traceback.print_exc()
            status, figure = "FAIL", f"{type(e).__name__}: {first_line(e)}"
        seconds = time.time() - started
        print(f"----- {name}: {status} ({seconds:.1f} s): {figure}", flush=True)
        return status, seconds, figure


def print_table(results):
    """One table, a row per check: its name, result, seconds, and a figure or the first line of its reason."""
    rows = [("check", "result", "seconds", "figure or reason")]
    rows += [(name, status, f"{seconds:.1f}", first_line(figure))
             for name, (status, seconds, figure) in results.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    print()
    for row in rows:
        print(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}")


def run_child(name, device):
    """The --child side: run IN_CHILD[name] here and end with its RESULT line."""
    try:
        status, figure = "pass", IN_CHILD[name](device)
    except Skip as e:
        status, figure = "skip", first_line(e)
    except CheckFailed as e:
        status, figure = "FAIL", first_line(e)
    except Exception as e:
        traceback.print_exc()
        status, figure = "FAIL", f"{type(e).__name__}: {first_line(e)}"
    sys.stdout.flush()
    print(RESULT + json.dumps(dict(status=status, figure=figure)), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda (default): the GPU path; cpu: a dry run of the checks' plumbing")
    parser.add_argument("--only", nargs="+", choices=CHECKS, metavar="CHECK",
                        help=f"run these checks only, of {', '.join(CHECKS)} (sample needs train)")
    parser.add_argument("--child", choices=sorted(IN_CHILD), help=argparse.SUPPRESS)  # one check, in this process
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported (through kernels), here and in the children
    else:
        import kernels
        if kernels.triton is None or not torch.cuda.is_available() or kernels.INTERPRET:
            print("bench/gpu_check.py needs a CUDA GPU, Triton, and TRITON_INTERPRET unset (--device cpu: a dry run)",
                  file=sys.stderr)
            sys.exit(2)
    if args.child:
        return run_child(args.child, args.device)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        session = Session(args.device, tmp, args.only)
        results = {name: session.check(name) for name in CHECKS}
    print_table(results)
    sys.exit(1 if any(status == "FAIL" for status, _, _ in results.values()) else 0)


if __name__ == "__main__":
    main()
