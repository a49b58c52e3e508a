"""The decode kernel's launch configs compiled for Ampere, Ada and Hopper GPUs (sm_80, sm_86, sm_89, sm_90), without
a GPU.

Triton compiles ahead of time for these targets on a CPU, and its wheel ships cuobjdump (registers, spill stack) and
nvdisasm (SASS) to read the result. For every row, each of kernels.CONFIGS (the autotuner's tile length, stages and
warps) is compiled with the specialisation the runtime would give the row's launch (meta tensors, the row's dtype,
the head blocks and splits kernels.py chooses for the target's SM count). The rows: every bench shape (the GLA paper's
per-device decode shapes) at B 1 and 32, Lq 1 and 2, 8K / 32K / 128K cached tokens, then the decode shapes of the
tiny, small and paper presets (each variant, baseline and double heads, B 1 and 32, Lq 1 and 2, the preset's
block_size cached tokens), in bf16; then the bench shapes again in float32 (IEEE: FFMA on the CUDA cores, not
tensor cores, and twice the shared memory a tile). A config fits a target when its shared memory is within the
target's per block and it does not spill; the autotuner on such a GPU skips the others. Each row also gives the
roofline floor of the target's reference GPU: FLOP per byte, the memory floor (bytes / HBM bandwidth), the compute
floor (FLOPs at the peak of the MMA instructions in the SASS: HGMMA, Hopper's wgmma, or mma.sync, HMMA; float32 at
the FFMA peak) and which one binds.

    python bench/gpu_build.py [--arch {80,86,89,90}] [--dtype {bfloat16,float32}] [--output builds.csv]

It exits 1 naming every row of the --dtype asked for that no config fits. In float32, as compiled here with Triton
3.9, that is 6 (sm_80) to 24 (sm_90) of the 60 rows a target, all GLA-2's: the 32- and 64-token tiles over a latent
spill on every target, and MLA's fits through the 16-token tile alone (its 32-token tile, 110 KiB, is over sm_86's and
sm_89's shared memory). The analysis follows the internals of Triton 3.9 (the runtime's specialisation); with another
version it refuses (exit 2, and the tests skip) instead of printing wrong figures.
"""
import argparse
import concurrent.futures
import csv
import functools
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
from typing import NamedTuple

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said out loud (it warns otherwise)

import torch  # noqa: E402

import gla  # noqa: E402
import kernels  # noqa: E402
from bench.common import BENCH_BATCHES, BENCH_LQ, BENCH_SEQLENS, BENCH_SHAPES, bench_inputs  # noqa: E402
from bench.roofline import H200_HBM_BYTES_PER_S, H200_TENSOR_FLOPS_PER_S, call_bytes, call_flops  # noqa: E402
from kernels import triton  # noqa: E402

KIB = 1024


class BuildTarget(NamedTuple):
    """A GPU to compile for: the most shared memory (bytes) a block may take (with the opt-in), its SMs (they set
    the split count), the GPU whose SM count and floor we take (gpu), its HBM bandwidth (bytes/s), its dense 16-bit
    tensor-core peak with float32 accumulation per MMA kind (FLOP/s), and its float32 peak on the CUDA cores (FFMA,
    FLOP/s), which float32 tiles take: kernels.py asks tl.dot for IEEE float32, not TF32's tensor cores."""
    smem_per_block: int
    num_sms: int
    gpu: str
    hbm_bytes_per_s: float
    tensor_flops_per_s: dict
    fp32_flops_per_s: float


# Shared memory per block: the CUDA C++ Programming Guide, "Technical Specifications per Compute Capability". The
# reference GPUs' SMs, bandwidth and peaks:
# sm_80: NVIDIA's A100 datasheet (80 GB SXM: 2,039 GB/s; BFLOAT16 Tensor Core 312 TFLOPS dense, 624 with sparsity;
#        FP32 19.5 TFLOPS) and the NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs);
# sm_86: NVIDIA's RTX A6000 datasheet (768 GB/s, 10,752 CUDA cores: 84 SMs of 128; single-precision 38.7 TFLOPS) and
#        the NVIDIA Ampere GA102 GPU Architecture whitepaper (v2, RTX A6000: Peak BF16 Tensor TFLOPS with FP32
#        Accumulate 154.8 / 309.6);
# sm_89: the NVIDIA Ada GPU Architecture whitepaper, appendix A, GeForce RTX 4090 (128 SMs, 1,008 GB/s, Peak FP32
#        TFLOPS (non-Tensor) 82.6, Peak BF16 Tensor TFLOPS with FP32 Accumulate 165.2 / 330.4);
# sm_90: bench/roofline.py's H200 figures (4.8 TB/s; 989 TFLOP/s through wgmma, 2/3 of it through mma.sync), NVIDIA's
#        H200 datasheet (SXM: FP32 67 TFLOPS) and the 132 SMs of an H100 or H200 SXM.
TARGETS = {
    80: BuildTarget(163 * KIB, 108, "A100 SXM", 2.039e12, {"HMMA": 312e12}, 19.5e12),
    86: BuildTarget(99 * KIB, 84, "RTX A6000", 768e9, {"HMMA": 154.8e12}, 38.7e12),
    89: BuildTarget(99 * KIB, 128, "RTX 4090", 1008e9, {"HMMA": 165.2e12}, 82.6e12),
    90: BuildTarget(227 * KIB, 132, "H200 SXM", H200_HBM_BYTES_PER_S, H200_TENSOR_FLOPS_PER_S, 67e12),
}
DEFAULT_ARCH = 90
SASS_TOOLS = ("ptxas", "cuobjdump", "nvdisasm")
TRITON_VERSION = "3.9"  # the internals _runtime_specialization mirrors
_MMA = re.compile(r"\b(HGMMA|HMMA)\b")
CONFIG_NAMES = [f"N{c.kwargs['BLOCK_N']} s{c.num_stages} w{c.num_warps}" for c in kernels.CONFIGS]
COLUMNS = (["shape", "dtype", "B", "Lq", "S", "rows", "head_blocks", "splits", "programs"] + CONFIG_NAMES
           + ["fit", "MMA", "flop_per_byte", "mem_floor_us", "compute_floor_us", "bound"])


def variant_name(variant):
    """The name a table gives a variant: "gqa" -> GQA, "mla" -> MLA, "gla2" -> GLA-2 (any glaG: GLA-G)."""
    if variant.startswith("gla"):
        return "GLA-" + variant[3:]
    return variant.upper()


def _preset_shapes():
    """{name: (Hq, Hkv, Hk, Dk, Dv, uses qv)} and {name: block_size} of the decode calls of the tiny, small and paper
    presets' models (gla.make_config; the caches' shapes from GPTConfig.kv_cache_shapes), e.g. "small MLA",
    "paper GLA-2 double heads"."""
    shapes, seqlens = {}, {}
    for preset in ("tiny", "small", "paper"):
        for variant in gla.VARIANTS:
            for double_heads in (False, True):
                c = gla.make_config(preset, variant, double_heads)
                (Hk, Dk), (Hkv, Dv) = c.kv_cache_shapes
                name = f"{preset} {variant_name(variant)}" + (" double heads" if double_heads else "")
                shapes[name] = (c.n_head, Hkv, Hk, Dk, Dv, c.attn != "gqa")
                seqlens[name] = c.block_size
    return shapes, seqlens


PRESET_SHAPES, PRESET_SEQLENS = _preset_shapes()
SHAPES = {**BENCH_SHAPES, **PRESET_SHAPES}
PRESET_BATCHES = (1, 32)
PRESET_LQ = (1, 2)
# The table's rows, (shape, B, Lq, S, dtype): the bench shapes and the presets' in bf16, then the bench shapes in
# float32, the kernel's other dtype (twice the bytes of a tile, and the CUDA cores' FFMA instead of tensor cores).
ROWS = ([(name, B, Lq, S, "bfloat16") for name in BENCH_SHAPES for B in BENCH_BATCHES for Lq in BENCH_LQ
         for S in BENCH_SEQLENS]
        + [(name, B, Lq, PRESET_SEQLENS[name], "bfloat16") for name in PRESET_SHAPES for B in PRESET_BATCHES
           for Lq in PRESET_LQ]
        + [(name, B, Lq, S, "float32") for name in BENCH_SHAPES for B in BENCH_BATCHES for Lq in BENCH_LQ
           for S in BENCH_SEQLENS])


def unsupported():
    """None if this machine can build and read the GPU builds, else the one-line reason it cannot."""
    if triton is None:
        return "the GPU builds need Triton"
    if not triton.__version__.startswith(TRITON_VERSION + "."):
        return (f"the GPU build analysis follows Triton {TRITON_VERSION}'s internals (the runtime's "
                f"specialisation); this is Triton {triton.__version__}")
    path = tools_dir()
    if not all(os.access(os.path.join(path, t), os.X_OK) for t in SASS_TOOLS):
        return f"Triton's bundled CUDA tools ({', '.join(SASS_TOOLS)}) are missing from {path}"
    return None


def tools_dir():
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def launch(name, B, Lq, S, arch=DEFAULT_ARCH, device="meta", dtype="bfloat16"):
    """decode_attention's launch of a table shape in dtype (a torch dtype's name) for sm_<arch>'s SM count, (grid,
    args, meta), on meta tensors by default; the autotuner's config is not in meta. kernels.py takes the SM count of
    the GPU it launches on: we apply its split rule to the target's, num_sms // (B x Hkv x head blocks), and pass the
    splits."""
    q, k_cache, v_cache, seqlens, qv = bench_inputs(name, B, S, Lq, getattr(torch, dtype), device, SHAPES)
    scale = kernels._default_scale(q.shape[3], v_cache.shape[3], qv)
    (head_blocks, _, units), *_ = kernels._split_launch(q, k_cache, v_cache, seqlens, qv, scale, S, num_splits=1)
    num_splits = max(1, TARGETS[arch].num_sms // (units * head_blocks))  # units: B x Hkv
    grid, args, meta, _, _ = kernels._split_launch(q, k_cache, v_cache, seqlens, qv, scale, S, num_splits)
    return grid, args, meta


def _runtime_specialization(fn, args, kwargs, backend):
    """(signature, constexprs, attrs) as Triton's runtime derives them from launch arguments.

    Mirrors triton/runtime/jit.py (3.9): create_function_from_signature feeds every
    non-constexpr argument to native_specialize_impl(backend, arg, is_const, specialize,
    align), and JITFunction._pack_args makes its answers the compile's signature
    (types; "constexpr" for ints equal to 1), constexprs (those 1s and the declared
    constexprs) and attrs (backend.parse_attr: tt.divisibility=16 for 16-divisible ints
    and 16-byte-aligned pointers).
    """
    from triton._C.libtriton import native_specialize_impl
    bound = inspect.signature(fn.fn).bind(*args, **kwargs).arguments
    spec = [("constexpr", bound[kp.name]) if kp.is_constexpr else
            native_specialize_impl(backend, bound[kp.name], kp.is_const, not kp.do_not_specialize,
                                   not kp.do_not_specialize_on_alignment)
            for kp in fn.params]
    signature = {kp.name: s[0] for kp, s in zip(fn.params, spec)}
    constexprs = {(i,): bound[kp.name] for i, (kp, s) in enumerate(zip(fn.params, spec)) if s[0] == "constexpr"}
    attrs = {(i,): backend.parse_attr("" if s[0] == "constexpr" else s[1])
             for i, s in enumerate(spec) if s[0] == "constexpr" or isinstance(s[1], str)}
    return signature, constexprs, attrs


@functools.cache
def _split_kernel_jit():
    """The split kernel under the autotuner as a compilable JITFunction, also under TRITON_INTERPRET=1 (where the
    decorator made an interpreter of it)."""
    from triton.runtime.jit import JITFunction
    fn = kernels._decode_split_kernel.fn
    return fn if isinstance(fn, JITFunction) else JITFunction(fn.fn)


def _build_key(arch, name, B, Lq, S, dtype, config):
    """The _compile key of a table row's launch for sm_<arch> with kernels.CONFIGS[config]: builds that specialise
    alike share one key."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    c = kernels.CONFIGS[config]
    _, args, meta = launch(name, B, Lq, S, arch, dtype=dtype)
    signature, constexprs, attrs = _runtime_specialization(_split_kernel_jit(), args, {**meta, **c.kwargs},
                                                           make_backend(GPUTarget("cuda", arch, 32)))
    attrs = tuple((k, tuple(map(tuple, v))) for k, v in attrs.items())
    return (tuple(signature.items()), tuple(constexprs.items()), attrs,
            (("num_warps", c.num_warps), ("num_stages", c.num_stages)))


@functools.cache
def _compile(arch, key):
    """Compile the split kernel for sm_<arch> from a _build_key; return the cubin and the dynamic shared bytes.
    Triton's compiler is not thread-safe: call this from one thread."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    signature, constexprs, attrs, options = (dict(x) for x in key)
    src = ASTSource(_split_kernel_jit(), signature, constexprs, {k: list(map(list, v)) for k, v in attrs.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    return kernel.asm["cubin"], kernel.metadata.shared


def _read_cubin(cubin):
    """cuobjdump's resource usage and nvdisasm's SASS of a cubin (bytes). Subprocesses only: safe to call from
    several threads at once."""
    tools = tools_dir()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        runs = [subprocess.run([os.path.join(tools, tool), flag, path], capture_output=True, text=True)
                for tool, flag in (("cuobjdump", "--dump-resource-usage"), ("nvdisasm", "-c"))]
    if any(run.returncode for run in runs):
        raise RuntimeError(f"cuobjdump or nvdisasm failed on a GPU build (exit {[r.returncode for r in runs]})")
    return runs[0].stdout, runs[1].stdout


_FIGURES = {}  # (arch, shape, B, Lq, S, dtype, config) -> figures


def figures_many(builds):
    """What the split kernel compiles to for each (arch, shape, B, Lq, S, dtype, config) of builds (sm_<arch>, all B
    sequences at S cached tokens, dtype a torch dtype's name, config an index into kernels.CONFIGS), each computed
    once, as dicts: regs, stack (spill bytes), spills (STL/LDL instructions), smem (bytes per CTA), smem_limit (the
    target's per block), mma (HGMMA/HMMA instructions), mma_kind ("HGMMA", "HMMA" or "none"), ffma (FFMA
    instructions) and fits (within smem_limit, no spills).

    Under TRITON_INTERPRET=1 (the CPU tests) Triton's compiler cannot run in this process (its code generator would
    call the interpreter's tl.max, tl.sum and co.), so we compute them in one child process without that variable."""
    builds = [tuple(b) for b in builds]
    missing = [b for b in dict.fromkeys(builds) if b not in _FIGURES]
    if missing and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        code = ("import json, sys; from bench import gpu_build; "
                "print(json.dumps(gpu_build.figures_many(json.loads(sys.argv[1]))))")
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        child = subprocess.run([sys.executable, "-c", code, json.dumps(missing)], capture_output=True, text=True,
                               env=env, cwd=pathlib.Path(__file__).resolve().parents[1])
        if child.returncode:
            raise RuntimeError(f"the GPU builds failed in a child process:\n{child.stderr[-3000:]}")
        _FIGURES.update(zip(missing, json.loads(child.stdout.splitlines()[-1])))
    missing = [b for b in missing if b not in _FIGURES]
    keys = {b: _build_key(*b) for b in missing}
    # Compiles run here, one after another, while the cubins already built are read by the tools side by side
    # (threads that wait on subprocesses).
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        reads = {}
        for b, key in keys.items():
            if (b[0], key) not in reads:
                cubin, dynamic_smem = _compile(b[0], key)
                reads[b[0], key] = (pool.submit(_read_cubin, cubin), dynamic_smem)
        for b, key in keys.items():
            read, dynamic_smem = reads[b[0], key]
            usage, sass = read.result()
            regs, stack, static_smem = (int(re.search(k + r":(\d+)", usage).group(1))
                                        for k in ("REG", "STACK", "SHARED"))
            spills = len(re.findall(r"\b(STL|LDL)\b", sass))
            smem, limit = static_smem + dynamic_smem, TARGETS[b[0]].smem_per_block
            mma = _MMA.findall(sass)
            _FIGURES[b] = dict(regs=regs, stack=stack, spills=spills, smem=smem, dynamic_smem=dynamic_smem,
                               smem_limit=limit, mma=len(mma), mma_kind=mma[0] if mma else "none",
                               ffma=len(re.findall(r"\bFFMA\b", sass)),
                               fits=smem <= limit and stack == 0 and spills == 0)
    return [_FIGURES[b] for b in builds]


def rows_of(arch, rows=None):
    """The table of sm_<arch>, one dict per row of rows (None: ROWS): shape, dtype, B, Lq, S, BLOCK_M (rows of a
    tile), head_blocks, splits, programs, configs (figures_many's dict of each of kernels.CONFIGS), fit (the indices
    of the configs that fit), and the floor of the target's reference GPU: flop_per_byte, mem_floor_s,
    compute_floor_s (bf16: at the peak of the MMA kind the configs that fit issue; float32: the CUDA cores' FFMA
    peak), bound ("memory" or "compute")."""
    rows = ROWS if rows is None else rows
    n = len(kernels.CONFIGS)
    figures = figures_many([(arch, *row, c) for row in rows for c in range(n)])
    target, table = TARGETS[arch], []
    for i, (name, B, Lq, S, dtype) in enumerate(rows):
        grid, _, meta = launch(name, B, Lq, S, arch, dtype=dtype)
        configs = figures[i * n:(i + 1) * n]
        fit = [c for c in range(n) if configs[c]["fits"]]
        Hq, Hkv, Hk, Dk, Dv, use_qv = SHAPES[name]
        nbytes = call_bytes(B, Lq, Hq, Hk, Hkv, Dk, Dv, use_qv, S, getattr(torch, dtype).itemsize)
        flops = call_flops(B, Lq, Hq, Dk, Dv, use_qv, S)
        mma_kind = configs[fit[0] if fit else 0]["mma_kind"]
        if dtype == "float32" and mma_kind == "none":  # IEEE float32: the CUDA cores
            mma_kind, peak = "FFMA", target.fp32_flops_per_s
        elif mma_kind == "none":
            raise RuntimeError(f"the sm_{arch} build of {name} {dtype} B={B} Lq={Lq} S={S} has no tensor-core MMA")
        else:
            peak = target.tensor_flops_per_s[mma_kind]
        mem_floor_s, compute_floor_s = nbytes / target.hbm_bytes_per_s, flops / peak
        table.append(dict(shape=name, dtype=dtype, B=B, Lq=Lq, S=S, BLOCK_M=meta["BLOCK_M"], head_blocks=grid[0],
                          splits=grid[1], programs=grid[0] * grid[1] * grid[2], configs=configs, fit=fit,
                          mma_kind=mma_kind,
                          flop_per_byte=flops / nbytes, mem_floor_s=mem_floor_s, compute_floor_s=compute_floor_s,
                          bound="compute" if compute_floor_s > mem_floor_s else "memory"))
    return table


def _cell(f):
    """A config's cell: its registers and shared KiB, or why it does not fit."""
    if f["stack"] or f["spills"]:
        return f"spills {f['stack']} B"
    return f"{f['regs']} regs, {f['smem'] / KIB:.1f} KiB" + ("" if f["fits"] else " (over)")


def table_rows(table):
    """rows_of's dicts as rows under COLUMNS."""
    return [[r["shape"], r["dtype"], r["B"], r["Lq"], r["S"], r["BLOCK_M"], r["head_blocks"], r["splits"],
             r["programs"], *map(_cell, r["configs"]), f"{len(r['fit'])}/{len(r['configs'])}", r["mma_kind"],
             f"{r['flop_per_byte']:.1f}", f"{r['mem_floor_s'] * 1e6:.2f}", f"{r['compute_floor_s'] * 1e6:.2f}",
             r["bound"]] for r in table]


def failures(arch, table):
    """One line per row of sm_<arch>'s table that no config fits."""
    return [f"sm_{arch} {r['shape']} {r['dtype']} B={r['B']} Lq={r['Lq']} S={r['S']}: no config fits "
            f"{TARGETS[arch].smem_per_block // KIB} KiB of shared memory per block without spills"
            for r in table if not r["fit"]]


def describe(arch):
    """One line naming sm_<arch>'s shared memory per block, its SMs and its reference GPU's floor."""
    t = TARGETS[arch]
    peaks = ", ".join(f"{flops / 1e12:.1f} TFLOP/s {mma}" for mma, flops in t.tensor_flops_per_s.items())
    return (f"sm_{arch}: {t.smem_per_block // KIB} KiB of shared memory per block; {t.num_sms} SMs and the floor of "
            f"an {t.gpu}: {t.hbm_bytes_per_s / 1e9:,.0f} GB/s, {peaks} (bf16, float32 accumulation, dense), "
            f"{t.fp32_flops_per_s / 1e12:.1f} TFLOP/s FFMA (float32)")


def runtime_build(name, B, Lq, S, dtype, arch, config):
    """On a GPU of compute capability sm_<arch>: the runtime's own build of a table row with kernels.CONFIGS[config],
    loaded, as {regs, spills, dynamic_smem}, to compare with figures_many's (the premise of the CPU tests)."""
    grid, args, meta = launch(name, B, Lq, S, arch, device="cuda", dtype=dtype)
    kernel = kernels._decode_split_kernel.fn.warmup(*args, grid=grid, **meta, **kernels.CONFIGS[config].all_kwargs())
    kernel._init_handles()  # loads it: the driver's registers and spills
    return dict(regs=kernel.n_regs, spills=kernel.n_spills, dynamic_smem=kernel.metadata.shared)


def write_table(path, columns, rows):
    """rows under columns, as CSV."""
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([columns] + rows)
    print(f"wrote {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, choices=sorted(TARGETS), default=DEFAULT_ARCH,
                        help=f"compute capability to build for (default {DEFAULT_ARCH})")
    parser.add_argument("--output", help="also write the table to PATH as CSV")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                        help="the rows' dtype: bfloat16 (the default on CUDA) or float32 (on request; GLA-2's rows "
                             "spill)")
    args = parser.parse_args(argv)
    reason = unsupported()
    if reason:
        print(f"bench/gpu_build.py: {reason}", file=sys.stderr)
        sys.exit(2)
    table = rows_of(args.arch, [row for row in ROWS if row[-1] == args.dtype])
    rows = table_rows(table)
    print(describe(args.arch))
    widths = [max(len(str(x)) for x in col) for col in zip(COLUMNS, *rows)]
    for r in [COLUMNS] + rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip())
    if args.output:
        write_table(args.output, COLUMNS, rows)
    bad = failures(args.arch, table)
    if bad:
        print(f"bench/gpu_build.py: {len(bad)} row(s) with no config that fits sm_{args.arch}:\n" + "\n".join(bad),
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
