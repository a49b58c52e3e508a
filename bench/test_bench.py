"""Tests for the bench/ scripts: the measuring sticks' arithmetic, tables, figures and command lines.

python -m pytest -q    # from the repository root: this file and test_gla.py

The product's modules (gla, kernels, plot, train) are imported from the repository root, which pytest puts on
sys.path (bench/ is a package). Some helpers come from test_gla.py (its seeding fixture, small models, token files);
test_gla.py imports nothing from here.
"""

import os

import torch
import torch.nn.functional as F

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede importing triton (through kernels)

import dataclasses
import json
import pathlib
import re
import subprocess
import sys
import time
import types

import numpy as np
import pytest

import gla
import kernels
import plot
import train
from bench import common, decode_cpu, gpu_build, gpu_check, job_time, release, replot, roofline, train_speed
from bench import memory as memory_bench

# torch.compile's CPU backend imports torch.utils.mkldnn, which still uses the
# deprecated torch.jit.script_method: torch's warning, not ours to act on.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method`:DeprecationWarning")

REPO = pathlib.Path(__file__).resolve().parents[1]
HERE = str(REPO)
VARIANTS = list(gla.VARIANTS)
interpreter_only = pytest.mark.skipif(HAS_CUDA, reason="CPU tensors need the interpreter; CUDA: test_kernel_on_cuda")
from test_gla import seeded  # noqa: E402, F401 (the autouse fixture that seeds torch before each test)
from test_gla import GPT2Stand_in, small_model, write_tokens  # noqa: E402


# ----------------------------------------------------------------------------
# Runs as train.py writes them, and plot.py's figure of them (for bench/replot.py)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LABELS = [plot.STYLE[v][0] for v in plot.VARIANTS]


def _run_config(run, seed, **changes):
    """config.json as train.py writes it for `run` (e.g. "mla_double_heads") at the tiny preset and `seed`, on bytes;
    changes: {"part.key": value} set on top (e.g. {"train.learning_rate": 9e-3})."""
    variant = run.removesuffix(plot.DOUBLE_SUFFIX)
    model = dataclasses.asdict(gla.make_config("tiny", variant, double_heads=run.endswith(plot.DOUBLE_SUFFIX)))
    train_spec = {"preset": "tiny", "max_iters": 400, "batch_size": 16, "grad_accum": 1, "learning_rate": 2e-3,
                  "warmup_iters": 200, "weight_decay": 0.1, "grad_clip": 1.0, "eval_interval": 25,
                  "eval_iters": 8, "seed": seed, "init": "coupled", "dtype": "float32"}
    data = {"source": f"stdlib corpus (/somewhere/{run}/corpus.txt)", "tokenizer": "bytes",
            "train_tokens": 1_871_702, "val_tokens": 207_967}
    config = {"model": model, "train": train_spec, "data": data}
    for key, value in changes.items():
        part, name = key.split(".")
        config[part][name] = value
    return config


def _write_seeds(out, seeds=(1337,), shifts=None, config=None):
    """metrics.jsonl and config.json of both runs of each variant for each seed, as train.py writes them: a token
    grid and losses whose dL differ (the last variant's has one dL < 0 and one dL == 0); the double-heads losses of
    seed k lowered by shifts[k] (dL raised by it)."""
    n = 9
    tokens = np.arange(n) * 500_000
    for k, seed in enumerate(seeds):
        for i, v in enumerate(plot.VARIANTS):
            delta = np.linspace(0.004 + 0.003 * i, 0.002 + 0.001 * i, n)
            if v == plot.VARIANTS[-1]:
                delta[3], delta[5] = -0.0015, 0.0
            delta += shifts[k] if shifts else 0.0
            base = 4.0 - 0.1 * np.arange(n) + 0.01 * i
            for run, losses in ((v, base), (v + plot.DOUBLE_SUFFIX, base - delta)):
                d = out / run / f"seed{seed}"
                d.mkdir(parents=True, exist_ok=True)
                rows = [{"iter": j, "tokens": int(t), "train_loss": float(x) + 0.1, "val_loss": float(x), "lr": 1e-4,
                         "elapsed_s": float(j)} for j, (t, x) in enumerate(zip(tokens, losses))]
                (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
                (d / "config.json").write_text(json.dumps(_run_config(run, seed, **(config or {}))))


def _run_main(tmp_path, out):
    """plot.py's command line on the runs in out: (its exit status, the PNG, the CSV beside it)."""
    png = tmp_path / "fig" / "ablation.png"
    rc = 0
    try:
        plot.main(["--out_dir", str(out), "--output", str(png)])
    except SystemExit as e:
        if isinstance(e.code, str):  # as Python does at the command line: the message on stderr, exit status 1
            print(e.code, file=sys.stderr)
            rc = 1
        else:
            rc = e.code or 0
    return rc, png, png.with_suffix(".csv")


def csv_rows(path):
    import csv

    with open(path) as f:
        yield from csv.DictReader(f)


# ----------------------------------------------------------------------------
# bench/common.py: HF transformers imported beside our kernels.py


def test_import_transformers_loads_hf_kernels_beside_ours(tmp_path):
    """transformers >= 5 runs `from kernels import CUDAProperties`; with our kernels.py first on sys.path that raised.
    In a fresh process, stand-ins for transformers and Hugging Face's `kernels` sit right after the repository's
    folder on sys.path, ahead of any installed transformers: import_transformers loads them beside ours."""
    site = tmp_path / "site-packages"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("CUDAProperties = 'hf'\n")
    (site / "transformers" / "integrations").mkdir(parents=True)
    (site / "transformers" / "__init__.py").write_text("")
    (site / "transformers" / "integrations" / "__init__.py").write_text("")
    (site / "transformers" / "integrations" / "hub_kernels.py").write_text("from kernels import CUDAProperties\n")
    script = f"""
import sys
sys.path[:0] = [{str(REPO)!r}, {str(site)!r}]
import gla, kernels
from bench.common import import_transformers
transformers = import_transformers()
assert transformers.__file__ == {str(site / "transformers" / "__init__.py")!r}, transformers.__file__
assert transformers.integrations.hub_kernels.CUDAProperties == "hf"
assert sys.modules["kernels"] is kernels and kernels.decode_attention is gla.decode_attention  # ours again
assert kernels.__file__ == {str(REPO / "kernels.py")!r}, kernels.__file__
assert sys.path[:2] == [{str(REPO)!r}, {str(site)!r}], sys.path[:2]
"""
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


# ----------------------------------------------------------------------------
# bench/decode_cpu.py, job_time.py, train_speed.py, memory.py: the CPU measurements; every script's --help


def test_decode_bench_prints_machine_and_tables_without_transformers(monkeypatch, capsys):
    heads = []

    def no_transformers(config):
        heads.append(config.n_head)
        raise ModuleNotFoundError("No module named 'transformers'", name="transformers")

    monkeypatch.setattr(decode_cpu, "hf_twin", no_transformers)
    monkeypatch.setattr(decode_cpu, "CALLS", 1)
    decode_cpu.main(["--variants", "gla2", "--double_heads", "--batch_sizes", "2", "--prompt_len", "3",
                     "--new_tokens", "2", "--context_len", "6", "--repeats", "1"])
    out = capsys.readouterr().out
    assert f"torch {torch.__version__}" in out and f"{torch.get_num_threads()} thread" in out
    assert "tiny, double heads," in out and heads == [2 * gla.make_config("tiny", "gla2").n_head]
    assert re.search(r"^\| gla2 \| 2 \| \d+ \| - \| - \|$", out, re.M)  # ours only: no HF columns
    assert re.search(r"^\| gla2 \| \d+\.\d\d \| \d+\.\d\d \| \d+\.\d \|$", out, re.M)  # step vs full forward
    for bad, match in [(["--context_len", "1"], "--context_len must be >= 2"), (["--variants", "gla0"], "0 groups"),
                       (["--long_tokens", "0"], "--long_tokens must be >= 1")]:
        with pytest.raises(SystemExit):
            decode_cpu.main(bad)
        assert match in capsys.readouterr().err


class FixedStepTimes:
    """A stand-in for bench.common.time_models: every model of the job takes `seconds` a step."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __call__(self, args, ctx, steps):
        return {train.run_name(v, d): (train.model_config(args, v, d), self.seconds) for v, d in train.models_of(args)}


def test_job_time_predicts_the_main_job_from_timed_steps_and_its_plan(monkeypatch, capsys):
    """Issue 52: one command that prints this core's matmul GFLOP/s and the main job's time. With every step 0.5 s,
    a run of the main job is 400 steps + 16 evaluations of 8 forwards (a third of a step each): 221.3 s; one process
    trains the six models of each of its 2 seeds in turn, so the job takes 12 x 221.3 s = 44 min."""
    monkeypatch.setattr(job_time, "time_models", FixedStepTimes(0.5))
    monkeypatch.setattr(job_time, "matmul_gflops", lambda: 85.0)
    threads = torch.get_num_threads()
    job_time.main([])
    out = capsys.readouterr().out
    assert "one core's float32 matmul (1024^3 torch.mm, one thread): 85.0 GFLOP/s" in out
    assert f"one process trains on {threads} thread(s)" in out
    assert "estimate: 12 runs (6 model(s) x 2 seed(s)) of 400 steps, one process: about 44 min in all" in out
    job_time.main(["--attn", "mla", "--seeds", "4", "--max_iters", "10", "--eval_interval", "5"])
    run = 0.5 * (10 + 2 * 8 / 3)  # seconds: 10 steps, 2 evaluations of 8 forwards
    assert f"4 runs (1 model(s) x 4 seed(s)) of 10 steps, one process: about {4 * run:.0f} s" in capsys.readouterr().out
    assert torch.get_num_threads() == threads  # the matmul's one thread given back
    with pytest.raises(SystemExit):
        job_time.main(["--steps", "0"])
    assert "--steps must be >= 1" in capsys.readouterr().err
    args = train.get_args(["--n_layer", "1", "--n_embd", "32", "--head_dim", "8", "--block_size", "8",
                           "--batch_size", "2"])
    assert common.train_step_seconds(train.model_config(args, "gla2", True), args, train.setup("cpu"), 1) > 0


def test_train_speed_prints_the_main_jobs_fraction_of_the_matmul_peak(monkeypatch, capsys):
    """Issue 52: tokens/s x training FLOPs per token (the model's own count) over one core's matmul GFLOP/s."""
    monkeypatch.setattr(train_speed, "time_models", FixedStepTimes(0.5))
    monkeypatch.setattr(train_speed, "matmul_gflops", lambda: 100.0)
    threads = torch.get_num_threads()
    train_speed.main_job_fraction()
    assert torch.get_num_threads() == threads
    out = capsys.readouterr().out
    config = gla.make_config("tiny", "gla2", True)
    flops = common.training_flops_per_token(config)
    rate = 16 * 128 / 0.5 * flops / 1e9  # GFLOP/s
    assert re.search(rf"^gla2_double_heads +4,096 +{flops / 1e6:.2f} +{rate:.1f} "
                     rf"+{rate:.0f}%$", out, re.M), out


def test_training_flops_per_token_counts_parameters_and_attention():
    config = gla.make_config("tiny", "gqa")
    n_params = gla.GPT(config).num_params()
    attention = 6 * config.n_layer * config.n_head * config.block_size * 2 * config.head_dim
    assert common.training_flops_per_token(config) == 6 * n_params + attention
    mla = gla.make_config("tiny", "mla")
    d_qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    attention = 6 * mla.n_layer * mla.n_head * mla.block_size * (d_qk + mla.v_head_dim)
    assert common.training_flops_per_token(mla) == 6 * gla.GPT(mla).num_params() + attention


def test_measured_peak_memory_counts_what_a_step_holds():
    config = gla.make_config("tiny", "mla", double_heads=True, n_layer=4, block_size=64)
    f32, n = torch.float32, gla.GPT(config).num_params()
    # Extrapolated from 1 and 2 layers, as a deep model is measured, equals measuring all 4 layers.
    full = memory_bench._tracked_peak(tuple(dataclasses.asdict(config).items()), 4, f32, True, False)
    assert abs(memory_bench.peak_bytes(config, 4, f32) - full) <= 0.01 * full
    step, ev = memory_bench.peak_bytes(config, 4, f32), memory_bench.peak_bytes(config, 4, f32, train=False)
    # float32 weights and AdamW's two moments, plus the logits (4 x 64 x 256 float32) that the loss needs
    assert step > 12 * n + 4 * 64 * 256 * 4
    assert 4 * n + 4 * 64 * 256 * 4 < ev < step
    assert memory_bench.peak_bytes(config, 8, f32) > step  # activations grow with the micro-batch
    assert memory_bench.peak_bytes(config, 4, torch.bfloat16) < step  # bf16 activations
    # A later micro-batch of --grad_accum starts with the step's float32 gradients held: it peaks about 4n higher
    # (under the peak of one whose gradients build up as its activations are freed, a little less than 4n).
    held = memory_bench.peak_bytes(config, 4, f32, grads_held=True)
    assert step + 3.5 * n < held <= step + 4 * n
    assert memory_bench.train_peak(config, 4, 4, f32, False) == step  # one micro-batch per step
    assert memory_bench.train_peak(config, 4, 8, f32, False) == held  # --grad_accum 2: the second micro-batch
    assert memory_bench.train_peak(config, 4, 4, f32, True) == held  # DDP: gradients live in its buckets (views)


def test_memory_plan_gives_peaks_and_the_largest_micro_batch(capsys, monkeypatch):
    argv = ["--attn", "gla2", "--double_heads", "--block_size", "64", "--batch_size", "48", "--grad_accum", "3"]
    monkeypatch.setenv("WORLD_SIZE", "4")  # the default of --world_size
    assert memory_bench.main(argv) == 0
    monkeypatch.delenv("WORLD_SIZE")
    argv += ["--world_size", "4"]
    assert memory_bench.main(argv) == 0
    line, again = map(json.loads, capsys.readouterr().out.splitlines())
    assert line == again
    config = gla.make_config("tiny", "gla2", double_heads=True, block_size=64)
    bf16 = torch.bfloat16  # planned for GPUs unless --device cpu
    assert line["run"] == "gla2_double_heads" and line["world_size"] == 4 and line["micro_batch"] == 4
    assert line["peak_train_bytes"] == memory_bench.train_peak(config, 4, 12, bf16, True)
    assert line["peak_eval_bytes"] == memory_bench.peak_bytes(config, 4, bf16, train=False)
    # A device with room for 5 sequences per micro-batch: 12 per process -> the largest divisor that fits is 4.
    five, six = (memory_bench.train_peak(config, m, 12, bf16, True) for m in (5, 6))
    gib = (five + six) / 2 / (1 - memory_bench.MEMORY_MARGIN) / 2**30
    assert memory_bench.main([*argv, "--device_memory", str(gib)]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["max_micro_batch"] == 4 and line["grad_accum"] == 3
    assert memory_bench.main([*argv, "--device_memory", "1e-6"]) == 0
    assert json.loads(capsys.readouterr().out)["max_micro_batch"] == 0
    assert memory_bench.main([*argv, "--device", "cpu"]) == 0  # train.py's --device, not --device_memory
    assert json.loads(capsys.readouterr().out)["dtype"] == "float32"
    for bad, match in [(["--world_size", "5"], "--batch_size 48 does not split into 5 process(es)"),
                       (["--world_size", "x"], "invalid int value"), (["--device_memory", "0"], "must be positive"),
                       (["--attn", "gla0"], "invalid choice")]:
        assert memory_bench.main([*argv, *bad]) == 2
        err = capsys.readouterr().err
        assert match in err and err.count("\n") == 1 and err.startswith("bench/memory.py: error:"), err


HELP_SCRIPTS = ["decode_cpu.py", "gpu_build.py", "gpu_check.py", "job_time.py", "kernel_speed.py", "memory.py",
                "release.py", "roofline.py", "train_cost.py", "train_speed.py"]
# Each script run by its path with --help, from another folder, in turn in one process (one start of torch, not
# ten): before each, sys.path and the repository's modules as a fresh process has them, so each script must put the
# repository on sys.path itself.
HELP_CHILD = """
import runpy, sys
base = list(sys.path)
for script in sys.argv[1:]:
    sys.path[:] = base
    for name in [m for m in sys.modules if m.split(".")[0] in ("gla", "kernels", "train", "plot", "bench")]:
        del sys.modules[name]
    sys.argv = [script, "--help"]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        assert e.code in (0, None), (script, e.code)
    else:
        raise AssertionError(script + " --help did not exit")
    print("answered", script)
"""


def test_bench_scripts_answer_help_from_anywhere():
    paths = [str(REPO / "bench" / script) for script in HELP_SCRIPTS]
    r = subprocess.run([sys.executable, "-c", HELP_CHILD, *paths], cwd="/", capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("usage:") == len(paths) and all(f"answered {p}" in r.stdout for p in paths), r.stdout


# ----------------------------------------------------------------------------
# bench/gpu_build.py, gpu_check.py, kernel_speed.py: the kernel's launches and GPU builds, its check on a GPU


@pytest.mark.parametrize("name", list(common.BENCH_SHAPES))
def test_lq_compiles_once_per_power_of_two(name):
    # Lq itself is a runtime argument; only its power of two reaches the constexprs:
    # Lq 1, 2, 3-4, 5-8, 9-16 compile one variant each.
    by_lq = {Lq: tuple(sorted(gpu_build.launch(name, 2, Lq, 4096)[2].items())) for Lq in range(1, kernels.MAX_LQ + 1)}
    groups = {}
    for Lq, constexprs in by_lq.items():
        groups.setdefault(constexprs, []).append(Lq)
    assert sorted(groups.values()) == [[1], [2], [3, 4], [5, 6, 7, 8], list(range(9, 17))]


def test_split_count_fills_the_sms_once():
    """Flash-Decoding's heuristic: a launch of fewer programs (batch x KV heads x head blocks) than SMs splits each
    sequence until they fill more than half of the SMs and at most all of them; a launch that fills them already
    does not split. Head blocks keep a tile's accumulator within kernels.ACC_ELEMS (rows of 16 at the least)."""
    for arch, target in gpu_build.TARGETS.items():
        for name, B, Lq, S, *_ in gpu_build.ROWS + [(name, 2, kernels.MAX_LQ, 4096) for name in common.BENCH_SHAPES]:
            (head_blocks, splits, units), _, meta = gpu_build.launch(name, B, Lq, S, arch)
            Hq, Hkv = gpu_build.SHAPES[name][:2]
            assert units == B * Hkv and head_blocks * meta["BLOCK_M"] >= Hq // Hkv * Lq, (name, B, Lq)
            assert meta["BLOCK_M"] == 16 or meta["BLOCK_M"] * meta["BLOCK_DV"] <= kernels.ACC_ELEMS, (name, B, Lq)
            programs = head_blocks * splits * units
            if head_blocks * units >= target.num_sms:
                assert splits == 1, (arch, name, B, Lq)
            elif S >= 16 * target.num_sms:  # long enough to split that far
                assert target.num_sms / 2 < programs <= target.num_sms, (arch, name, B, Lq, S, programs)
    # 64 heads on one 512-wide latent: 4 head blocks of 16 heads at Lq 1, 8 of 8 at Lq 2; batch 1 then splits
    # 132 // 4 = 33 and 132 // 8 = 16 ways on an H100.
    assert gpu_build.launch("MLA 1 GPU", 1, 1, 32768)[0] == (4, 33, 1)
    assert gpu_build.launch("MLA 1 GPU", 1, 2, 32768)[0] == (8, 16, 1)


# The split kernel's autotune configs compiled for Ampere, Ada and Hopper (sm_80, sm_86, sm_89, sm_90) ahead of time
# on the CPU and read with the cuobjdump and nvdisasm in Triton's wheel (bench/gpu_build.py). It follows Triton 3.9's
# internals: another version skips, saying so.
needs_sass_tools = pytest.mark.skipif(gpu_build.unsupported() is not None, reason=str(gpu_build.unsupported()))


class GpuBuildSkips:
    """A pytest plugin: the run's summary ends with one line, how many GPU build checks were skipped and why (a
    silent skip would hide that another Triton turned the build analysis off)."""

    def pytest_terminal_summary(self, terminalreporter):
        reasons = {}
        for report in terminalreporter.stats.get("skipped", []):
            if "::test_gpu_build" in report.nodeid:
                reason = report.longrepr[2].removeprefix("Skipped: ")
                reasons[reason] = reasons.get(reason, 0) + 1
        if reasons:
            terminalreporter.write_line(f"GPU build checks skipped: {sum(reasons.values())} ("
                                        + "; ".join(f"{n}: {reason}" for reason, n in reasons.items()) + ")")


@pytest.fixture(scope="session", autouse=True)
def report_gpu_build_skips(request):
    """Registers GpuBuildSkips for this run: a test module cannot define pytest's hooks itself."""
    if not request.config.pluginmanager.has_plugin("gpu_build_skips"):
        request.config.pluginmanager.register(GpuBuildSkips(), "gpu_build_skips")


# Per target, the rows with the widest tiles: the bench's MLA on one device (a 512-wide latent, 8 heads x 2 tokens a
# tile) and GLA-2 on one device (two 256-wide latents, 32 rows), at B 32, Lq 2 and 128K cached tokens, in bf16; and
# MLA's in float32 for sm_90 (its builds compile slowly: one target only).
WIDEST = [("MLA 1 GPU", 32, 2, 131072, "bfloat16"), ("GLA-2 1 GPU", 32, 2, 131072, "bfloat16")]
WIDEST_FLOAT32 = [("MLA 1 GPU", 32, 2, 131072, "float32")]


@pytest.fixture(scope="module")
def gpu_tables():
    """{arch: bench/gpu_build.py's table of the WIDEST rows, "float32": sm_90's of WIDEST_FLOAT32}, every config
    compiled at once (one child process under the interpreter; Triton caches the builds on disk too)."""
    configs = range(len(kernels.CONFIGS))
    builds = [(arch, *row, c) for arch in gpu_build.TARGETS for row in WIDEST for c in configs]
    gpu_build.figures_many(builds + [(90, *row, c) for row in WIDEST_FLOAT32 for c in configs])
    return {**{arch: gpu_build.rows_of(arch, WIDEST) for arch in gpu_build.TARGETS},
            "float32": gpu_build.rows_of(90, WIDEST_FLOAT32)}


@needs_sass_tools
@pytest.mark.parametrize("arch", sorted(gpu_build.TARGETS))
def test_gpu_build_widest_tiles_have_configs_that_fit_every_target(arch, gpu_tables):
    """For each target, the widest tiles compile in every config, with tensor-core MMAs; a config fits where its
    shared memory is within the target's per block and it does not spill; at least one fits, so the autotuner on
    such a GPU has a config that runs without spills (bench/gpu_build.py checks every row so)."""
    limit = gpu_build.TARGETS[arch].smem_per_block
    for row in gpu_tables[arch]:
        for c, f in enumerate(row["configs"]):
            assert f["mma"] > 0 and f["mma_kind"] in ("HMMA", "HGMMA"), (row["shape"], c, f)
            assert f["fits"] == (f["smem"] <= limit and f["stack"] == 0 and f["spills"] == 0), (row["shape"], c, f)
            assert (c in row["fit"]) == f["fits"]
        assert row["fit"], (row["shape"], row["configs"])
    # MLA's 576-wide tokens: 4 stages of 32 tokens (three tiles buffered) need more than sm_86's and sm_89's 99 KiB.
    mla = gpu_tables[arch][0]["configs"]
    assert (mla[2]["smem"] > 99 * 1024) and (mla[2]["fits"] == (arch in (80, 90))), mla[2]


@needs_sass_tools
def test_gpu_build_float32_tiles_take_the_cuda_cores(gpu_tables):
    """A float32 build (kernels.py asks tl.dot for IEEE float32) issues FFMA and no tensor-core MMA: its row's compute
    floor is the target's FFMA peak, its bytes 4 an element; a row that no config fits is named as a bf16 row is."""
    (row,) = gpu_tables["float32"]
    assert all(f["mma"] == 0 and f["mma_kind"] == "none" and f["ffma"] > 0 for f in row["configs"]), row["configs"]
    Hq, Hkv, Hk, Dk, Dv, qv = common.BENCH_SHAPES["MLA 1 GPU"]
    flops = roofline.call_flops(32, 2, Hq, Dk, Dv, qv, 131072)
    nbytes = roofline.call_bytes(32, 2, Hq, Hk, Hkv, Dk, Dv, qv, 131072, 4)
    target = gpu_build.TARGETS[90]
    assert row["mma_kind"] == "FFMA" and row["compute_floor_s"] == flops / target.fp32_flops_per_s
    assert row["mem_floor_s"] == nbytes / target.hbm_bytes_per_s and row["flop_per_byte"] == flops / nbytes
    bf16 = gpu_tables[90][0]
    assert [f["smem"] > g["smem"] for f, g in zip(row["configs"], bf16["configs"])] == [True] * len(kernels.CONFIGS)
    # Only the 16-token tile (kernels.CONFIGS' last) fits MLA's 512-wide latent in float32 without spilling.
    assert row["fit"] == [len(kernels.CONFIGS) - 1] and gpu_build.failures(90, [row]) == []


@needs_sass_tools
def test_gpu_build_table_from_the_command_line(tmp_path, capsys, monkeypatch, gpu_tables):
    """`bench/gpu_build.py`: its rows are the bench shapes, then the presets' decode shapes (each variant, baseline
    and double heads, B 1 and 32, Lq 1 and 2), in bf16, then the bench shapes in float32; it prints the target's
    limits, then a table whose every row (and its CSV) holds the figures of each config's build; a row that no config
    fits makes it exit 1, naming the row."""
    n_bench = len(common.BENCH_SHAPES) * len(common.BENCH_BATCHES) * len(common.BENCH_LQ) * len(common.BENCH_SEQLENS)
    bench_rows = [(name, B, Lq, S) for name in common.BENCH_SHAPES for B in common.BENCH_BATCHES
                  for Lq in common.BENCH_LQ for S in common.BENCH_SEQLENS]
    assert gpu_build.ROWS[:n_bench] == [(*row, "bfloat16") for row in bench_rows]
    assert gpu_build.ROWS[-n_bench:] == [(*row, "float32") for row in bench_rows]
    assert len(gpu_build.ROWS) == 2 * n_bench + 3 * len(gla.VARIANTS) * 2 * 2 * 2
    paper = gla.make_config("paper", "mla", True)
    assert gpu_build.SHAPES["paper MLA double heads"] == (48, 1, 1, 64, 512, True) and paper.n_head == 48
    assert ("paper MLA double heads", 32, 2, paper.block_size, "bfloat16") in gpu_build.ROWS
    monkeypatch.setattr(gpu_build, "ROWS", WIDEST)  # the fixture's builds: nothing to compile
    csv_path = tmp_path / "builds.csv"
    gpu_build.main(["--arch", "86", "--output", str(csv_path)])  # in process: reuses the builds of the fixture
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == gpu_build.describe(86) and "99 KiB of shared memory per block" in lines[0]
    assert re.split(r"\s{2,}", lines[1].strip()) == gpu_build.COLUMNS
    rows = list(csv_rows(csv_path))
    assert len(rows) == len(lines) - 3 == len(WIDEST)  # limits, header, rows, "wrote ..."
    for row, shape, want in zip(rows, WIDEST, gpu_tables[86]):
        assert (row["shape"], int(row["B"]), int(row["Lq"]), int(row["S"]), row["dtype"]) == shape
        for column in ("head_blocks", "splits", "programs"):
            assert int(row[column]) == want[column], column
        for name, f in zip(gpu_build.CONFIG_NAMES, want["configs"]):
            assert row[name] == (f"spills {f['stack']} B" if f["stack"] or f["spills"] else
                                 f"{f['regs']} regs, {f['smem'] / 1024:.1f} KiB" + ("" if f["fits"] else " (over)"))
        assert row["fit"] == f"{len(want['fit'])}/{len(kernels.CONFIGS)}"
        assert row["flop_per_byte"] == f"{want['flop_per_byte']:.1f}" and row["bound"] == want["bound"]
    over = [dict(f, smem=228 * 1024, fits=False) for f in gpu_tables[90][0]["configs"]]
    monkeypatch.setattr(gpu_build, "figures_many", lambda builds: over)
    monkeypatch.setattr(gpu_build, "ROWS", WIDEST[:1])
    with pytest.raises(SystemExit) as exit_:
        gpu_build.main([])
    err = capsys.readouterr().err
    assert exit_.value.code == 1, err
    assert "sm_90 MLA 1 GPU bfloat16 B=32 Lq=2 S=131072: no config fits 227 KiB of shared memory per block" in err


def test_requirements_ask_for_the_triton_the_gpu_build_analysis_follows():
    from packaging.requirements import Requirement  # pytest's own dependency

    line = next(x for x in (REPO / "requirements.txt").read_text().splitlines() if x.startswith("triton"))
    spec = Requirement(line).specifier
    major, minor = map(int, gpu_build.TRITON_VERSION.split("."))
    assert spec.contains(f"{major}.{minor}.0") and spec.contains(f"{major}.{minor}.9"), line
    assert not any(spec.contains(v) for v in (f"{major}.{minor - 1}.0", f"{major}.{minor + 1}.0", f"{major + 1}.0.0"))


def test_run_ends_saying_how_many_gpu_build_checks_skipped_and_why(monkeypatch):
    # Another Triton, as a fresh install could resolve one: the run's last lines say so.
    # (The test that passes is one of this file's: their autouse fixture registers GpuBuildSkips.)
    code = ("import sys, pytest\nfrom bench import gpu_build\ngpu_build.TRITON_VERSION = '0.0'\n"
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'bench/test_bench.py', '-k', "
            "'fit_every_target and 90 or test_decode_speed_floor_is_the_higher_roof']))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    monkeypatch.setattr(gpu_build, "TRITON_VERSION", "0.0")
    tail = r.stdout.strip().splitlines()[-2:]
    assert r.returncode == 0 and re.fullmatch(r"1 passed, 1 skipped, \d+ deselected.*", tail[1]), r.stdout
    assert tail[0] == f"GPU build checks skipped: 1 (1: {gpu_build.unsupported()})", r.stdout


@interpreter_only
def test_gpu_check_passes_the_kernel_and_fails_a_wrong_one(monkeypatch):
    # `bench/gpu_check.py` compares in bf16 on the GPU; here its comparison runs in float16
    # through the interpreter, on a short cache.
    failures, worst = gpu_check.check_one("GQA-8 TP-8", 2, 2, S=40, dtype=torch.float16, device="cpu")
    assert failures == [] and 0 < worst < gpu_check.CHECK_TOL
    right = kernels.decode_attention

    def one_tile_short(q, k_cache, v_cache, cache_seqlens, qv=None, **kw):  # drops the first 16 tokens
        return right(q, k_cache[:, 16:], v_cache[:, 16:], cache_seqlens - 16, qv)
    monkeypatch.setattr(kernels, "decode_attention", one_tile_short)
    failures, worst = gpu_check.check_one("GQA-8 TP-8", 2, 2, S=40, dtype=torch.float16, device="cpu")
    assert len(failures) == 3 and all(f.startswith("MISMATCH GQA-8 TP-8 B=2 Lq=2 S=40") for f in failures)
    assert worst > gpu_check.CHECK_TOL


def test_gpu_check_sizes_its_kernel_check_to_128k_and_the_gpus_memory():
    """On a GPU the kernel check takes every design at batch 1 and 32, Lq 1, 2 and MAX_LQ, up to 128K cached tokens,
    the shortest caches first; a launch whose reference would not fit 80% of an H100's 80 GB is left out (MLA and
    GLA-2 on one device at batch 32, MAX_LQ and 128K: their float32 scores alone are 3 x 17 GB)."""
    configs = gpu_check.check_configs()
    assert len(configs) == len(common.BENCH_SHAPES) * 2 * 3 * 3 and configs[0][3] == 8192
    assert [S for *_, S in configs] == sorted(S for *_, S in configs) and configs[-1][3] == 131072
    assert {(B, Lq) for _, B, Lq, _ in configs} == {(B, Lq) for B in (1, 32) for Lq in (1, 2, kernels.MAX_LQ)}
    too_big = [c for c in configs if gpu_check.reference_bytes(*c, 2, common.BENCH_SHAPES) > 0.8 * 80e9]
    assert too_big == [("MLA 1 GPU", 32, kernels.MAX_LQ, 131072), ("GLA-2 1 GPU", 32, kernels.MAX_LQ, 131072)]


def test_gpu_check_gives_a_crash_a_hang_and_an_error_their_rows(tmp_path, monkeypatch, capsys):
    """Each check runs apart: a child that dies or hangs past its limit, or a check that raises, fails its own row
    with the first line of its reason; a check that needs an earlier one's output skips; any failure exits 1."""
    env = dict(os.environ)
    status, lines = gpu_check.run_command([sys.executable, "-c", "print('before', flush=True); import os; os.abort()"],
                                          60, env)
    assert status < 0 and gpu_check.command_failure(status, lines, 60) == f"killed by signal {-status}: before"
    status, lines = gpu_check.run_command([sys.executable, "-c", "import time; time.sleep(60)"], 1, env)
    assert status is None and gpu_check.command_failure(status, lines, 1) == "ran past its 1 s limit (killed)"
    session = gpu_check.Session("cpu", tmp_path)
    monkeypatch.setattr(gpu_check.Session, "check_train", lambda self: 1 / 0)
    assert session.check("train")[::2] == ("FAIL", "ZeroDivisionError: division by zero")
    assert session.check("sample")[::2] == ("skip", "no training run to sample (the train check did not pass)")
    results = {name: ("pass", 1.0, "fine") for name in gpu_check.CHECKS}
    results["kernel"] = ("FAIL", 2.5, "MISMATCH here\nand more")
    monkeypatch.setattr(gpu_check.Session, "check", lambda self, name: results[name])
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # main sets it for --device cpu: given back after the test
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(["--device", "cpu"])
    assert exit_.value.code == 1
    table = capsys.readouterr().out.strip().splitlines()
    assert table[0].split() == ["check", "result", "seconds", "figure", "or", "reason"] and len(table) == 8
    assert re.fullmatch(r"kernel +FAIL +2\.5 +MISMATCH here", table[2]), table


def test_gpu_check_speed_figures_from_its_timings(monkeypatch, capsys):
    """The speed check's arithmetic, its timer and kernel stood in for: a call that takes 10 us against the bytes it
    must read at the copy bandwidth (a 1 KiB copy in 1 ns: 2 bytes moved each, 2.048 TB/s)."""
    testing = pytest.importorskip("triton.testing")
    monkeypatch.setattr(gpu_check, "COPY_BYTES", 1024)
    monkeypatch.setattr(gpu_check, "SPEED_SEQLEN", 32)
    monkeypatch.setattr(kernels, "decode_attention", lambda *args, **kw: None)

    def do_bench(fn, return_mode):  # milliseconds: 1 ns for the copy, 10 us for a call
        fn()
        return 1e-6 if "copy_" in fn.__code__.co_names else 1e-2
    monkeypatch.setattr(testing, "do_bench", do_bench)
    figure = gpu_check.speed_check("cpu")
    bw = 2 * 1024 / 1e-9
    pct = {(name, B): 100 * roofline.call_bytes(B, 1, Hq, Hk, Hkv, Dk, Dv, qv, 32, 2) / bw / 1e-5
           for name, (Hq, Hkv, Hk, Dk, Dv, qv) in common.BENCH_SHAPES.items() for B in gpu_check.SPEED_BATCHES}
    (low, low_at), (high, high_at) = min((v, k) for k, v in pct.items()), max((v, k) for k, v in pct.items())
    assert figure == (f"{low:.0f}% ({low_at[0]} B={low_at[1]}) to {high:.0f}% ({high_at[0]} B={high_at[1]}) of the "
                      "copy floor, 2048 GB/s, 32 tokens")
    assert "device-to-device copy bandwidth 2048 GB/s" in capsys.readouterr().out


def test_gpu_check_dry_run_on_a_cpu_prints_a_row_per_check():
    """`bench/gpu_check.py --device cpu` runs the plumbing of the checks a CPU can (here the kernel check in the
    interpreter, training and sampling; --only leaves out torchrun and compiled decoding, which test_gla.py's torchrun
    and compile tests cover), skips the CUDA tests and the speed check, ends with one table, a row per check, and exits
    0."""
    r = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--device", "cpu", "--only", "kernel",
                        "train", "sample"], cwd="/", capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    table = r.stdout.strip().splitlines()[-len(gpu_check.CHECKS) - 1:]
    assert re.split(r"\s{2,}", table[0]) == ["check", "result", "seconds", "figure or reason"], table
    rows = {name: re.split(r"\s{2,}", line, maxsplit=3)[1:] for name, line in zip(gpu_check.CHECKS, table[1:])}
    assert all(line.startswith(name + " ") for name, line in zip(gpu_check.CHECKS, table[1:])), table
    for name in ("cuda_tests", "torchrun", "compile", "speed"):
        assert rows[name][0] == "skip" and rows[name][2] == "not asked (--only)", table
    for name in ("kernel", "train", "sample"):
        assert rows[name][0] == "pass", table
    assert re.fullmatch(r"11 launches \(float32\), worst relative error [\d.e-]+, interpreter, dry shapes",
                        rows["kernel"][2])
    assert re.fullmatch(r"val_loss \d+\.\d+ at step 4, float32", rows["train"][2])
    assert rows["sample"][2].startswith("32 new tokens in ")
    assert all(float(seconds) >= 0 for _, seconds, _ in rows.values())
    assert gpu_check.skip_reason("speed", "cpu").startswith("needs a GPU")
    assert gpu_check.skip_reason("cuda_tests", "cpu") == "needs a CUDA GPU"


@pytest.mark.skipif(HAS_CUDA, reason="checks the behaviour without a GPU")
@pytest.mark.parametrize("command", [["bench/gpu_check.py"], ["bench/kernel_speed.py"]])
def test_gpu_commands_without_cuda_exit_2(command):
    r = subprocess.run([sys.executable, os.path.join(HERE, *command[0].split("/")), *command[1:]],
                       capture_output=True, text=True, cwd=HERE, timeout=120)
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "CUDA" in lines[0], lines


@pytest.mark.skipif(not HAS_CUDA or gpu_build.unsupported() is not None,
                    reason="needs a CUDA GPU and the GPU build tools")
def test_gpu_build_figures_match_this_cuda_gpus_own_build():
    """The premise of the CPU build tests: on a GPU of a target's compute capability, the runtime's build has the
    registers, spills and shared memory of the ahead-of-time one, for the widest rows in every config that fits
    (run by bench/gpu_check.py); and MLA's float32 row, in every config within the shared memory, has the registers
    and shared memory of the ahead-of-time build, spilling where it spills (the driver counts spills in its own
    unit)."""
    major, minor = torch.cuda.get_device_capability()
    arch = 10 * major + minor
    if arch not in gpu_build.TARGETS:
        pytest.skip(f"sm_{arch} is not one of bench/gpu_build.py's targets {sorted(gpu_build.TARGETS)}")
    for row in gpu_build.rows_of(arch, WIDEST):
        for c in row["fit"]:
            f = row["configs"][c]
            want = dict(regs=f["regs"], spills=0, dynamic_smem=f["dynamic_smem"])
            build = gpu_build.runtime_build(row["shape"], row["B"], row["Lq"], row["S"], row["dtype"], arch, c)
            assert build == want, (row, c)
    for row in gpu_build.rows_of(arch, WIDEST_FLOAT32):
        for c, f in enumerate(row["configs"]):
            if f["smem"] <= f["smem_limit"]:
                build = gpu_build.runtime_build(row["shape"], row["B"], row["Lq"], row["S"], row["dtype"], arch, c)
                got = (build["regs"], build["dynamic_smem"], build["spills"] > 0)
                assert got == (f["regs"], f["dynamic_smem"], f["stack"] > 0), (row["shape"], c, build, f)


# ----------------------------------------------------------------------------
# bench/decode_speed.py: the arithmetic of a decode step against the cache shapes and hand counts
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("double_heads", [False, True])
@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_speed_counts_the_bytes_and_flops_of_a_step(variant, double_heads, tp):
    from bench import decode_speed
    config = decode_speed.layer_config(variant, double_heads, tp)
    # Elements cached per token: GQA 6 KV heads of K and V, 128 each; MLA the latent 512 and the rope key 64, whole on
    # each rank; GLA-2 two latent heads of 256 and the rope key, one latent head a rank under TP-2 (Zadouri et al.).
    elems = {1: {"gqa": 1536, "mla": 576, "gla2": 576}, 2: {"gqa": 768, "mla": 576, "gla2": 320}}[tp][variant]
    assert elems == sum(heads * dim for heads, dim in config.kv_cache_shapes)
    Hq = 24 * (2 if double_heads else 1) // tp
    dims = {"gqa": 128 + 128, "mla": 64 + 512 + 512, "gla2": 64 + 256 + 256}[variant]  # scores' Dk (+ Dv), P.V's Dv
    B, Lq, S = 3, 2, 1000
    assert decode_speed.cache_cost(config, B, Lq, S, 4) == (B * S * elems * 4, 2 * B * Lq * Hq * S * dims)
    # Weights: attention, MLP (3 matrices), the 256-token head (tied: the embedding once); RMSNorm gains 3 x 3072 (the
    # block's two and the final one) plus the latent designs' q and kv norms.
    n, f = 3072, config.ffn_hidden
    if variant == "gqa":
        attention = n * 128 * Hq * 2 + n * 128 * (6 // tp) * 2  # wq, wo; wk, wv
    else:
        r, g = config.kv_lora_rank // config.n_latent_heads, config.n_latent_heads
        attention = (n * config.q_lora_rank + config.q_lora_rank * Hq * (128 + 64)  # wq_a, wq_b
                     + n * (g * r + 64) + Hq * (128 + 128) * r + Hq * 128 * n)  # wkv_a, wkv_b, wo
    matrices = attention + 3 * n * f + 256 * n
    gains = 3 * n + (0 if variant == "gqa" else config.q_lora_rank + config.kv_lora_rank)
    assert decode_speed.weights_cost(config, B, Lq, 4) == (4 * (matrices + gains), 2 * B * Lq * matrices)
    step, base = decode_speed.step_cost(config, B, Lq, S, 4), decode_speed.step_cost(config, B, Lq, 1, 4)
    assert step[0] - base[0] == B * (S - 1) * elems * 4  # the cache's part: S - 1 more tokens read
    assert step[1] - base[1] == 2 * B * Lq * Hq * (S - 1) * dims


@pytest.mark.parametrize("variant", gla.VARIANTS)
def test_decode_speed_times_the_products_of_every_design(variant):
    """products_seconds builds each design's score and P @ V products from its cache shapes: a shape that does not
    multiply fails here."""
    from bench import decode_speed
    config = decode_speed.layer_config(variant, True, 2)
    assert decode_speed.products_seconds(config, 2, 16, 1, torch.float32, time.perf_counter) > 0


def test_decode_speed_floor_is_the_higher_roof():
    from bench import decode_speed
    assert decode_speed.floor_seconds(300, 100, bandwidth=10, peak=50) == (30, "memory")
    assert decode_speed.floor_seconds(300, 2000, bandwidth=10, peak=50) == (40, "compute")


def test_decode_speed_command_prints_rows_and_draws(tmp_path, capsys):
    from bench import decode_speed
    png, threads = tmp_path / "speed.png", torch.get_num_threads()
    try:
        decode_speed.main(["--variants", "gla2", "--heads", "double", "--batch", "2", "--lq", "1", "2", "--min_tokens",
                           "8", "--max_tokens", "16", "--repeats", "1", "--threads", "1", "--tp", "2", "--clock", "cpu",
                           "--device", "cpu", "--output", str(png)])
    finally:
        torch.set_num_threads(threads)  # --threads 1 set this process's: later tests see torch's own
    out = capsys.readouterr().out
    assert "TP-2: rank 0's shard" in out and f"torch {torch.__version__}" in out and "CPU time" in out
    number = r"-?\d+\.\d"
    for S in (8, 16):  # GLA-2 double heads under TP-2: 24 heads and 320 cached elements a rank; Lq 2 new tokens
        mb = 2 * (S + 2) * 320 * 4 / 1e6
        assert re.search(rf"^\| GLA-2 x2 heads \| 24 \| 2 \| 2 \| {S} \| {number} \| {number} (memory|compute) \| "
                         rf"-?\d+% \| {number} \| {mb:.0f} \| ", out, re.M), out
    for S in (8, 16):  # the products alone, at Lq 1 only
        assert re.search(rf"^\| GLA-2 x2 heads \| 2 \| {S} \| {number} \| {number} \| {number} \| \d+% \|$", out, re.M)
    assert png.read_bytes()[:8] == PNG_MAGIC
    rows, title = decode_speed.read_rows(png.with_suffix(".csv"))  # what --from_csv redraws from
    assert [(r["S"], r["Lq"], r["double_heads"]) for r in rows] == [(8, 1, True), (16, 1, True), (8, 2, True),
                                                                    (16, 2, True)]
    assert all(r["cache_bytes"] == 2 * (r["S"] + r["Lq"]) * 320 * 4 for r in rows) and "TP-2" in title
    redrawn = tmp_path / "again.png"
    assert decode_speed.main(["--from_csv", str(png.with_suffix(".csv")), "--output", str(redrawn)]) == 0
    assert redrawn.read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(SystemExit):
        decode_speed.main(["--min_tokens", "64", "--max_tokens", "32"])
    assert "--max_tokens 32 must be >= --min_tokens 64" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        decode_speed.main(["--clock", "cpu", "--threads", "2"])
    assert "--clock cpu times one thread" in capsys.readouterr().err


# ----------------------------------------------------------------------------
# bench/replot.py, dl_vs_lr.py, roofline.py: the figures drawn from CSVs and from the model's arithmetic


def test_replot_redraws_a_figure_from_its_own_csv(tmp_path, capsys):
    """bench/replot.py rebuilds the curves from each seed's dL in a CSV that plot.py wrote (written again, they are
    the same CSV) and draws the figure from them."""
    out = tmp_path / "out"
    _write_seeds(out, seeds=(1, 2, 3), shifts=(0.0, 0.003, -0.001))
    rc, png, csv = _run_main(tmp_path, out)
    assert rc == 0
    assert plot.csv_text(*replot.read_csv_curves(csv)).encode() == csv.read_bytes()
    again = tmp_path / "again.png"
    assert replot.main([str(csv), "--output", str(again)]) == 0
    assert again.read_bytes()[:8] == PNG_MAGIC and not again.with_suffix(".csv").exists()
    assert f"{LABELS[0]:<6} 3 seed(s)" in capsys.readouterr().out
    (tmp_path / "bad.csv").write_text("variant,tokens\nGQA,1\n")
    assert replot.main([str(tmp_path / "bad.csv"), "--output", str(again)]) == 2
    assert "not a CSV as plot.py writes it" in capsys.readouterr().err
    assert replot.main([str(csv), "--out_dir", str(out), "--output", str(again)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("replot.py: error: unrecognized arguments: --out_dir")


def test_replot_writes_the_png_beside_its_csv_and_leaves_the_csv_as_it_was(tmp_path, capsys):
    """X.csv redrawn (--output defaults to X.png) leaves X.csv byte for byte, even where plot.py would write it
    otherwise (here with CRLF line ends): the CSV is the one copy of every seed's dL."""
    out = tmp_path / "out"
    _write_seeds(out)
    rc, png, csv = _run_main(tmp_path, out)
    assert rc == 0
    png.unlink()
    csv.write_bytes(csv.read_bytes().replace(b"\n", b"\r\n"))
    before = csv.read_bytes()
    capsys.readouterr()
    assert replot.main([str(csv)]) == 0
    assert csv.read_bytes() == before and png.read_bytes()[:8] == PNG_MAGIC
    assert sorted(p.name for p in png.parent.iterdir()) == ["ablation.csv", "ablation.png"]
    assert capsys.readouterr().out.startswith(f"wrote {png}\n")


def test_the_title_names_the_setting_from_the_runs_and_from_the_csv(tmp_path, monkeypatch):
    """The figure's title names preset, width, heads, steps, learning rate, warm-up, init and seeds, read from the
    runs' config.json; the CSV carries the setting, so a redrawn figure has the same title."""
    import matplotlib.figure

    titles = []
    suptitle = matplotlib.figure.Figure.suptitle

    def recorded(fig, text, **kw):
        titles.append(text)
        return suptitle(fig, text, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "suptitle", recorded)
    out = tmp_path / "out"
    changes = {"train.max_iters": 3000, "train.learning_rate": 8e-3, "train.warmup_iters": 800,
               "train.init": "independent", "model.n_embd": 128}
    _write_seeds(out, seeds=(1340, 1341, 1342), shifts=(0.0, 0.001, 0.002), config=changes)
    rc, png, csv = _run_main(tmp_path, out)
    assert rc == 0
    assert titles[0].splitlines()[1] == ("preset tiny, width 128, 8 and 16 query heads, 3,000 steps, lr 0.008 "
                                         "(warm-up 800), independent init; seeds 1340, 1341, 1342")
    assert replot.main([str(csv), "--output", str(tmp_path / "again.png")]) == 0
    assert titles[1] == titles[0]
    assert {r["setting"] for r in csv_rows(csv)} == {titles[0].splitlines()[1].split(";")[0]}


def test_replot_of_edited_values_is_one_line(tmp_path, capsys):
    """A CSV edited by hand (an unknown variant, nan / inf / 1e308, n_seeds not a number, tokens too large or not
    increasing, a made-up unit, two settings) is one line and exit 2, and nothing is written."""
    import csv

    out = tmp_path / "out"
    _write_seeds(out, seeds=(1, 2), shifts=(0.0, 0.003))
    rc, _, csv_path = _run_main(tmp_path, out)
    assert rc == 0
    rows = list(csv_rows(csv_path))
    cases = [("variant", "FOO", "unknown variant 'FOO'"), ("dL_seed1", "nan", "not a finite number"),
             ("dL_seed2", "1e308", "not a finite number"), ("n_seeds", "x", "invalid literal"),
             ("tokens", "99999999999999999999999", "tokens"), ("tokens", "2000000", "tokens do not increase"),
             ("unit", "furlongs", "its unit must be"), ("setting", "another", "one setting")]
    for column, value, words in cases:
        edited = [dict(r) for r in rows]
        edited[0][column] = value
        bad = tmp_path / "bad.csv"
        with open(bad, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(edited)
        assert replot.main([str(bad), "--output", str(tmp_path / "x.png")]) == 2, words
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1 and err.startswith("replot.py: error:"), (words, err)
    assert not (tmp_path / "x.png").exists()


def test_dl_vs_lr_reads_the_notebooks_tables_and_agrees_with_the_p1_figure(tmp_path, capsys):
    """bench/dl_vs_lr.py: four seeds at each rate, seed 1337 at lr 8e-3 from the Xeon (the machine of the other
    three), whose final dL per seed are those of the Xeon's P1 figure (assets/double_heads_P1_xeon.csv) to the 4
    digits the notebook prints; and dL falls from lr 2e-3 to 8e-3 in all 12 seed x variant pairs."""
    from bench import dl_vs_lr

    rows = dl_vs_lr.read_sweeps()
    points = {rate: dl_vs_lr.p1_seeds_at(rows, rate) for rate in dl_vs_lr.RATES}
    assert all([r["seeds"] for r in seeds] == ["1337", "1338", "1339", "1340"] for seeds in points.values())
    assert {r["machine"] for r in points[8e-3]} == {"Xeon"}
    final = {}
    for r in csv_rows(pathlib.Path(plot.__file__).parent / "assets" / "double_heads_P1_xeon.csv"):
        final[r["variant"]] = r  # the last row of each variant: its final evaluation
    for label, column in dl_vs_lr.VARIANT_COLUMNS.items():
        for r in points[8e-3]:
            assert r[column] == pytest.approx(float(final[label][f"dL_seed{r['seeds']}"]), abs=5e-5)
    png = tmp_path / "dl_vs_lr.png"
    assert dl_vs_lr.main(["--output", str(png)]) == 0 and png.read_bytes()[:8] == PNG_MAGIC
    assert "dL falls from lr 2e-3 to 8e-3 in 12 of 12 seed x variant pairs" in capsys.readouterr().out
    # Each rate names its seeds' machines (a line joins two rates only where they are one machine), and the one
    # outlier seed does not set the y range, which holds every mean and every other seed.
    assert [dl_vs_lr.machines(points[rate]) for rate in dl_vs_lr.RATES] == ["EPYC", "1 EPYC + 3 Xeon", "Xeon", "Xeon"]
    lo, hi = dl_vs_lr.y_range(points, plot.paper_range("nats/byte")[0])
    values = sorted(r[c] for seeds in points.values() for r in seeds for c in dl_vs_lr.VARIANT_COLUMNS.values())
    assert values[0] == -0.0564 and values[1] > lo > values[0] and lo < -0.0257 and hi > values[-1]


def test_roofline_figure(tmp_path, capsys):
    """`bench/roofline.py`: FLOP per byte of a decode step at paper scale (24 query heads, 32K cached tokens) from
    its call_flops and call_bytes. Per cached bf16 token a group's R rows (heads x new tokens) do 2 R (Dk + 2 Dv) FLOP
    with qv, 4 R Dk without, against 2 (Hk Dk + Dv) bytes per group read; q, qv and the output add up to 2.2% (MLA at
    Lq 16). So GQA (groups of 4) stays under every ridge at any Lq, and MLA on one device crosses the H200's wgmma
    ridge between Lq 4 and 8."""
    png = tmp_path / "figs" / "roofline.png"
    assert roofline.main(["--output", str(png)]) == 0 and png.read_bytes()[:8] == PNG_MAGIC
    out = capsys.readouterr().out
    rows = {(r["variant"], r["tp"], r["Lq"]): r["flop_per_byte"] for r in roofline.roofline_rows()}
    per_lq = {("gqa", 1): 4, ("gqa", 2): 4, ("mla", 1): 24 * (64 + 1024) / 576, ("mla", 2): 12 * (64 + 1024) / 576,
              ("gla2", 1): 24 * (64 + 512) / 576, ("gla2", 2): 12 * (64 + 512) / 320}
    assert len(rows) == len(per_lq) * len(roofline.ROOFLINE_LQ)
    for (variant, tp, Lq), value in rows.items():
        assert value == pytest.approx(per_lq[variant, tp] * Lq, rel=2.5e-2), (variant, tp, Lq)
    ridges = roofline.ridges()
    assert max(rows[v, tp, 16] for v, tp in [("gqa", 1), ("gqa", 2)]) < min(ridges.values())
    h200 = ridges["H200 ridge, HGMMA (wgmma) peak"]
    assert rows["mla", 1, 4] < h200 < rows["mla", 1, 8]
    assert f"GQA    tp 1 (24 heads): {rows['gqa', 1, 1]:6.1f}" in out and f"{h200:.0f}" in out
    with pytest.raises(SystemExit, match="must end in .png"):
        roofline.main(["--output", str(tmp_path / "r.svg")])
    assert not (tmp_path / "r.svg").exists()


# ----------------------------------------------------------------------------
# bench/pretrained.py: a checkpoint in the release's layout, written, loaded and timed


def test_pretrained_bench_writes_loads_and_tabulates_a_tiny_checkpoint(tmp_path, capsys):
    """bench/pretrained.py at a tiny size: a sharded checkpoint in the release's layout is written, loaded in a fresh
    process per dtype, and tabulated; the temporary folder is gone afterwards."""
    from bench import pretrained
    assert pretrained.main(["--preset", "tiny", "--variant", "mla", "--n_layer", "1", "--new_tokens", "2",
                            "--prompt_len", "3", "--bandwidth_gb", "0.001", "--shard_gb", "0.001",
                            "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"threads, torch {torch.__version__}" in out
    assert re.search(r"wrote \S+ GB of float32 in \d+ s: \d+ file\(s\), pytorch_model-00001-of-000\d\d\.bin", out)
    for dtype in "float32", "bfloat16":
        assert re.search(rf"^\| {dtype} \| [\d.e-]+ \| [\d.]+ \| [\d.]+ \([\d.]+x\) \|", out, re.M), out
    assert re.search(r"load average before: [\d.]+ ", out) and not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------
# bench/release.py: checkpoints in the layout of Liu et al. 2026's MLRA release (github.com/SongtaoLiu0823/MLRA),
# written here from its name tables inverted; neither the release's code nor the network is needed.

# Layer 0's attention weights as the release's save_pretrained names them (read off its model/gqa.py, mla.py, gla_2.py
# saved at tiny sizes): written out here, not derived from release.py's tables, so a renamed entry there fails.
RELEASE_ATTENTION_NAMES = {
    "gqa": ["c_q", "c_k", "c_v", "c_proj"],
    "mla": ["q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "c_proj"],
    "gla": ["q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm_1", "kv_a_layernorm_2",
            "kv_b_proj_1", "kv_b_proj_2", "c_proj"],
}


def release_checkpoint(model):
    """(state dict, config.json fields) that the release's save_pretrained writes for a model of this GPT's weights:
    the release's names (release.py's tables inverted; wkv_b[j] flattened to the (H/g * (nope + v), r) weight of
    kv_b_proj[_j]), the tied matrix one tensor under both names, and the fields its train_*.py pass."""
    c = model.config
    ours_to_release = {ours: theirs for theirs, ours in release.RELEASE_MODEL.items() if theirs != "lm_head"}
    for theirs, ours in {**release.RELEASE_BLOCK, **release.RELEASE_ATTENTION[c.attn]}.items():
        ours_to_release[ours] = theirs
    sd = {}
    for name, p in model.state_dict().items():
        if name == "lm_head.weight":
            continue  # the tie: tok_emb's, below
        layer = re.match(r"blocks\.(\d+)\.(.+)", name)
        if layer is None:
            sd[ours_to_release[name.removesuffix(".weight")] + ".weight"] = p.detach()
        elif name.endswith("wkv_b"):
            for j, head in enumerate(p.detach()):
                sd[f"transformer.h.{layer[1]}.{ours_to_release[f'attn.wkv_b.{j}']}.weight"] = head.flatten(0, 1)
        else:
            sd[f"transformer.h.{layer[1]}.{ours_to_release[layer[2].removesuffix('.weight')]}.weight"] = p.detach()
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    fields = dict(architectures=["GPT"], model_type="gpt2", vocab_size=c.vocab_size, n_layer=c.n_layer,
                  n_head=c.n_head, n_embd=c.n_embd, intermediate_size=c.ffn_hidden, block_size=c.block_size,
                  bias=False, dropout=0.0, torch_dtype="float32", transformers_version="4.51.3")
    if c.attn == "gqa":
        fields.update(head_dim=c.head_dim, group_size=c.n_head // c.n_kv_head)
    else:
        fields.update(q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank, qk_nope_head_dim=c.qk_nope_head_dim,
                      qk_rope_head_dim=c.qk_rope_head_dim)
    return sd, fields


def write_release(folder, sd, fields, layout="bin"):
    """Write sd and fields into folder as the release would: "bin" (one pytorch_model.bin), "sharded" (two
    pytorch_model-0000k-of-00002.bin and their index; the tied names fall in different shards), "lm_head" or "wte"
    (one .bin holding only that tied name)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields, indent=2, sort_keys=True))
    if layout == "sharded":
        names = list(sd)
        shards = {f"pytorch_model-0000{k + 1}-of-00002.bin": names[k * len(names) // 2:(k + 1) * len(names) // 2]
                  for k in range(2)}
        for file, keys in shards.items():
            torch.save({key: sd[key] for key in keys}, folder / file)
        weight_map = {key: file for file, keys in shards.items() for key in keys}
        (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    else:
        drop = {"lm_head": "transformer.wte.weight", "wte": "lm_head.weight"}.get(layout)
        torch.save({k: t for k, t in sd.items() if k != drop}, folder / "pytorch_model.bin")


def release_logits(sd, fields, idx):
    """The release's forward (its model/*.py GPT with output_all_seq=True) written again from its names, in float64,
    independent of gla.py: pre-norm RMSNorm (eps 1e-6) blocks; GQA (c_q, c_k, c_v; query head h reads KV head
    h // group_size) or MLA / GLA-g (latent query q_a_proj -> q_a_layernorm * sqrt(n_embd / q_lora_rank) -> q_b_proj,
    per head [nope | rope]; kv_a_proj_with_mqa -> g latents and one shared rope key; latent j normed, * sqrt(n_embd /
    r), kv_b_proj[_j] -> its H/g heads' [k_nope | v]); RoPE pairing (i, i + d/2); softmax scale 1 / sqrt(q's width);
    SwiGLU silu(c_fc1) * c_fc2 -> c_proj; the tied lm_head. idx (B, T) -> logits (B, T, vocab) float64."""
    w = {k: t.double() for k, t in sd.items()}
    B, T = idx.shape
    H, D = fields["n_head"], fields["n_embd"]

    def norm(x, name):
        return w[name + ".weight"] * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def rope(x):  # (B, T, heads, d)
        d = x.shape[-1]
        angle = torch.arange(T, dtype=torch.float64)[:, None, None] * 10000.0 ** (-torch.arange(0, d, 2) / d)
        a, b = x[..., :d // 2], x[..., d // 2:]
        return torch.cat([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()], -1)

    x = w["transformer.wte.weight"][idx]
    for i in range(fields["n_layer"]):
        def lin(module, inp):
            return inp @ w[f"transformer.h.{i}.{module}.weight"].T
        h = norm(x, f"transformer.h.{i}.input_layernorm")
        if "head_dim" in fields:
            hd, groups = fields["head_dim"], fields["group_size"]
            q = rope(lin("attn.c_q", h).view(B, T, H, hd))
            k = rope(lin("attn.c_k", h).view(B, T, H // groups, hd)).repeat_interleave(groups, dim=2)
            v = lin("attn.c_v", h).view(B, T, H // groups, hd).repeat_interleave(groups, dim=2)
        else:
            nope, rope_dim, rank = fields["qk_nope_head_dim"], fields["qk_rope_head_dim"], fields["kv_lora_rank"]
            cq = norm(lin("attn.q_a_proj", h), f"transformer.h.{i}.attn.q_a_layernorm")
            q = lin("attn.q_b_proj", cq * (D / fields["q_lora_rank"]) ** 0.5).view(B, T, H, nope + rope_dim)
            q = torch.cat([q[..., :nope], rope(q[..., nope:])], -1)
            kv = lin("attn.kv_a_proj_with_mqa", h)
            suffixes = ["_1", "_2"] if f"transformer.h.{i}.attn.kv_b_proj_1.weight" in w else [""]
            r = rank // len(suffixes)
            k_nope, v = [], []
            for j, s in enumerate(suffixes):
                c = norm(kv[..., j * r:(j + 1) * r], f"transformer.h.{i}.attn.kv_a_layernorm{s}") * (D / r) ** 0.5
                heads = lin(f"attn.kv_b_proj{s}", c).view(B, T, H // len(suffixes), 2 * nope)
                k_nope.append(heads[..., :nope])
                v.append(heads[..., nope:])
            k_rope = rope(kv[..., rank:].view(B, T, 1, rope_dim)).expand(B, T, H, rope_dim)
            k, v = torch.cat([torch.cat(k_nope, 2), k_rope], -1), torch.cat(v, 2)
        scores = torch.einsum("bthd,bshd->bhts", q, k) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v).reshape(B, T, -1)
        x = x + lin("attn.c_proj", y)
        h = norm(x, f"transformer.h.{i}.post_attention_layernorm")
        x = x + lin("mlp.c_proj", F.silu(lin("mlp.c_fc1", h)) * lin("mlp.c_fc2", h))
    return norm(x, "layernorm") @ w["lm_head.weight"].T


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("double_heads", [False, True])
def test_release_checkpoint_names_and_math_are_the_releases(variant, double_heads):
    """release.py's tables, inverted, write the release's names; and the release's math (written again above, in
    float64) on those weights gives our logits: a swapped pair in the tables (c_fc1 / c_fc2, kv_b_proj_1 / _2) fails
    here."""
    model = small_model(variant, double_heads)
    sd, fields = release_checkpoint(model)
    design = model.config.attn
    layer0 = [k.removeprefix("transformer.h.0.attn.").removesuffix(".weight") for k in sd if ".h.0.attn." in k]
    assert sorted(layer0) == sorted(RELEASE_ATTENTION_NAMES[design])
    idx = torch.randint(0, model.config.vocab_size, (1, 16))
    with torch.no_grad():
        ours, _ = model(idx)
    torch.testing.assert_close(release_logits(sd, fields, idx), ours.double(), rtol=0, atol=2e-4)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("double_heads", [False, True])
def test_from_pretrained_gives_bit_identical_logits(tmp_path, variant, double_heads):
    model = small_model(variant, double_heads)
    idx = torch.randint(0, model.config.vocab_size, (1, 16))
    with torch.no_grad():
        want, _ = model(idx)
    sd, fields = release_checkpoint(model)
    for layout in ["bin", "sharded", "lm_head", "wte"]:
        write_release(tmp_path / layout, sd, fields, layout)
        loaded = release.from_pretrained(tmp_path / layout)
        assert loaded.config == model.config, layout  # intermediate_size as saved, not re-derived
        assert loaded.lm_head.weight is loaded.tok_emb.weight and loaded.num_params() == model.num_params(), layout
        with torch.no_grad():
            assert torch.equal(loaded(idx)[0], want), layout


def test_from_pretrained_maps_the_weights_and_converts_each_once(tmp_path):
    """float32: the parameters are the checkpoint file's pages (memory-mapped, no copy; wkv_b alone is restacked);
    bfloat16: every parameter is the original's cast, the tie kept."""
    model = small_model("gla2", True)
    write_release(tmp_path, *release_checkpoint(model))
    loaded = release.from_pretrained(tmp_path)
    mapped = []
    with open("/proc/self/maps") as f:  # Linux: "start-end perms offset dev inode path" per mapping
        for line in f:
            if line.rstrip().endswith(str(tmp_path / "pytorch_model.bin")):
                start, end = (int(a, 16) for a in line.split()[0].split("-"))
                mapped.append((start, end))
    for name, p in loaded.named_parameters():
        in_file = any(start <= p.data_ptr() < end for start, end in mapped)
        assert in_file == (not name.endswith("wkv_b")), name
    half = release.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert half.lm_head.weight is half.tok_emb.weight
    for (name, p), q in zip(half.named_parameters(), model.parameters()):
        assert p.dtype == torch.bfloat16 and torch.equal(p, q.detach().to(torch.bfloat16)), name


def test_from_pretrained_converts_the_tied_matrix_once_wherever_its_names_fall(tmp_path, monkeypatch):
    """The tied embedding saved under both names, lm_head's in the first shard and wte's in the second: a bfloat16
    load converts it once (one copy of the largest matrix, not two)."""
    model = small_model("gqa", vocab_size=320)  # the one matrix of its shape
    sd, fields = release_checkpoint(model)
    write_release(tmp_path, {}, fields)
    first = {"lm_head.weight": sd["lm_head.weight"]}
    torch.save(first, tmp_path / "pytorch_model-00001-of-00002.bin")
    torch.save({k: t for k, t in sd.items() if k not in first}, tmp_path / "pytorch_model-00002-of-00002.bin")
    (tmp_path / "pytorch_model.bin").unlink()
    converted, real = [], torch.Tensor.to

    def to(self, *args, **kwargs):
        if self.shape == model.tok_emb.weight.shape:
            converted.append(self.shape)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to)
    loaded = release.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert len(converted) == 1 and loaded.lm_head.weight is loaded.tok_emb.weight


def _gated(sd):
    sd["transformer.h.0.attn.gated_proj.weight"] = torch.zeros(4, 4)


def _mlra(sd):  # MLRA / GLA-4: four latent norms, one (4, r, ...) kv_b_proj parameter
    for j in range(4):
        sd[f"transformer.h.0.attn.kv_a_layernorms.{j}.weight"] = torch.ones(4)
    sd["transformer.h.0.attn.kv_b_proj"] = sd.pop("transformer.h.0.attn.kv_b_proj_1.weight")


def _bias(sd):
    sd["transformer.h.1.mlp.c_fc1.bias"] = torch.zeros(4)


def _missing(sd):
    del sd["transformer.h.1.mlp.c_fc2.weight"]


def _misshaped(sd):
    sd["transformer.h.0.attn.kv_b_proj_2.weight"] = sd["transformer.h.0.attn.kv_b_proj_2.weight"][:, :-1]


@pytest.mark.parametrize("edit, says", [
    (_gated, "attn.gated_proj"), (_mlra, "attn.kv_a_layernorms.0"), (_bias, "transformer.h.1.mlp.c_fc1.bias"),
    (_missing, 'Missing key(s) in state_dict: "blocks.1.mlp.w2.weight"'),
    (_misshaped, "stack expects each tensor to be equal size"), (None, "holds no pytorch_model"),
])
def test_from_pretrained_refuses_in_one_line(tmp_path, edit, says, monkeypatch, capsys):
    """What is not a release checkpoint of a design we have fails in from_pretrained (an assert, or torch's own
    check of the names and shapes), and bench/release.py says it in one line."""
    sd, fields = release_checkpoint(small_model("gla2"))
    if edit is None:
        (tmp_path / "config.json").write_text(json.dumps(fields))
    else:
        edit(sd)
        write_release(tmp_path, sd, fields)
    with pytest.raises((AssertionError, RuntimeError)):
        release.from_pretrained(tmp_path)
    monkeypatch.setitem(sys.modules, "tiktoken", types.SimpleNamespace(get_encoding=lambda name: GPT2Stand_in()))
    with pytest.raises(SystemExit) as caught:
        release.main([str(tmp_path)])
    assert caught.value.code.startswith(f"release.py: cannot load {tmp_path} (")
    assert says in caught.value.code and "\n" not in caught.value.code


def test_release_samples_a_release_folder_and_measures_its_validation_loss(tmp_path, capsys, monkeypatch):
    """bench/release.py samples a release folder (greedy: generate's tokens), decoded by tiktoken's GPT-2 encoding,
    and --data adds the model's mean loss on the first --eval_iters validation windows of that data, as training reads
    them (batch s = f(seed, s)); without tiktoken, one line."""
    model = small_model("gla2", double_heads=True, n_layer=1, vocab_size=50304)  # the release's vocabulary
    folder = tmp_path / "main" / "gla_2"
    write_release(folder, *release_checkpoint(model))
    shards = tmp_path / "edu_fineweb10B"
    shards.mkdir()
    rng = np.random.default_rng(0)
    for name in ("edu_fineweb_train_000001.bin", "edu_fineweb_val_000000.bin"):
        write_tokens(shards / name, rng.integers(0, 50257, 1000), [20240520, 1, 1000])
    argv = [str(folder), "--prompt", "hi", "--max_new_tokens", "3", "--temperature", "0", "--data", str(shards),
            "--eval_iters", "2"]
    monkeypatch.setitem(sys.modules, "tiktoken", None)  # not installed
    with pytest.raises(SystemExit, match="^release.py: the release's GPT-2 tokens need tiktoken: pip install"):
        release.main(argv)
    monkeypatch.setitem(sys.modules, "tiktoken", types.SimpleNamespace(get_encoding=lambda name: GPT2Stand_in()))
    release.main(argv)
    out = capsys.readouterr().out
    greedy = model.generate(torch.tensor([list(b"hi")]), 3, temperature=0)[0].tolist()
    assert out.startswith(" ".join(map(str, greedy)) + "\n-- 3 new tokens in ")
    data = train.load_data(str(shards), model.config.block_size, model.config.vocab_size)
    losses = [model(*train.get_batch(data, "val", k, 1, model.config.block_size, 1337))[1].item() for k in range(2)]
    loss = float(re.search(r"^-- validation loss (\d+\.\d+) nats a token over 2 windows$", out, re.M)[1])
    assert loss == pytest.approx(sum(losses) / 2, abs=1e-4)


def test_readmes_release_commands_take_the_flags_they_give(monkeypatch):
    """README's bench/release.py commands parse: each reaches the loader with the folder it names."""
    import shlex
    readme = (REPO / "README.md").read_text()
    commands = [shlex.split(line, comments=True)[2:] for line in readme.splitlines()
                if line.startswith("python bench/release.py ")]
    assert len(commands) == 2, commands
    monkeypatch.setitem(sys.modules, "tiktoken", types.SimpleNamespace(get_encoding=lambda name: GPT2Stand_in()))
    loaded = []

    def from_pretrained(path, dtype):
        loaded.append(path)
        raise SystemExit("stop")

    monkeypatch.setattr(release, "from_pretrained", from_pretrained)
    for argv in commands:
        with pytest.raises(SystemExit, match="^stop$"):
            release.main(argv)
    assert loaded == ["mlra/main/gla_2"] * 2


def test_release_bad_input_is_one_line(tmp_path, monkeypatch, capsys):
    """bench/release.py's bad input, past the loader, ends in one line: an empty prompt, a prompt and new tokens past
    block_size, a negative temperature, --data that is missing or not GPT-2 tokens."""
    model = small_model("gla2", n_layer=1, vocab_size=50304, block_size=32)
    folder = tmp_path / "gla_2"
    write_release(folder, *release_checkpoint(model))
    (tmp_path / "text.txt").write_text("bytes, not GPT-2 tokens " * 20)
    monkeypatch.setitem(sys.modules, "tiktoken", types.SimpleNamespace(get_encoding=lambda name: GPT2Stand_in()))
    cases = [
        (["--prompt", ""], "^release.py: an empty prompt$"),
        (["--max_new_tokens", "40"], "^release.py: a prompt of 1 tokens and 40 new ones exceed block_size, 32$"),
        (["--data", str(tmp_path / "none")], "^release.py: --data: .* neither a text file nor a folder"),
        (["--data", str(tmp_path / "text.txt")], "^release.py: --data .*text.txt: the release reads GPT-2 tokens"),
    ]
    for argv, match in cases:
        with pytest.raises(SystemExit, match=match):
            release.main([str(folder), "--max_new_tokens", "4", *argv])
    with pytest.raises(SystemExit) as caught:  # argparse's own line, status 2
        release.main([str(folder), "--temperature", "-1"])
    assert caught.value.code == 2 and "--temperature and --top_k must be 0 or more" in capsys.readouterr().err
