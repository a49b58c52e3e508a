"""What the decode kernel compiles to on Ampere, Ada and Hopper GPUs (sm_80, sm_86, sm_89, sm_90), without a GPU.

Triton compiles ahead of time for these targets on a CPU, and its wheel ships cuobjdump (registers, spill stack) and
nvdisasm (SASS) to read the result. Each build has the specialisation the runtime would pick for its launch
arguments (meta tensors, bf16) and the launch plan kernels.py makes for the target's limits (TARGETS: compute
capability, SMs, shared memory per block and per SM), so its SASS is what such a GPU would run. The rows: every bench
shape (the GLA paper's per-device decode shapes) at B 1 and 32, Lq 1 and 2, 8K / 32K / 128K cached tokens, then the
decode shapes of the tiny, small and paper presets (GQA, MLA and GLA-2, baseline and double heads, B 1 and 32, Lq 1
and 2, the preset's block_size cached tokens). Each row gives the build (tile, registers, spills, shared memory, MMA
instructions, how K/V reach the main loop, stages, CTAs/SM, programs, balance, passes), its bytes, and the roofline
floor of the target's reference GPU: FLOP per byte read, the memory floor (bytes / HBM bandwidth), the compute floor
(FLOPs at the peak of the MMA instructions in the SASS: HGMMA, Hopper's wgmma, or mma.sync, HMMA) and which one binds.
For sm_90 it adds kernels.py's model fed by the build, the modelled time and the percent of the binding floor it
reaches; the model is made for sm_90, so the other targets get the floor only.

    python bench/gpu_build.py [--arch {80,86,89,90}] [--output builds.csv]

It exits 1 naming every build over its target's shared memory per block or with spills. The analysis follows the
internals of Triton 3.9 (the runtime's specialisation); with another version it refuses (exit 2, and the tests skip)
instead of printing wrong figures.
"""
import argparse
import concurrent.futures
import csv
import functools
import inspect
import json
import math
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
from kernels import KIB, DeviceLimits, triton  # noqa: E402


class BuildTarget(NamedTuple):
    """A GPU to compile for: limits (kernels.DeviceLimits, what the plan fits), the SM's most resident threads and
    blocks (with its 64K registers, in units of 256 a warp, they bound the CTAs per SM), the GPU whose SM count and
    floor we take (gpu), its HBM bandwidth (bytes/s) and dense 16-bit tensor-core peak with float32 accumulation per
    MMA kind (FLOP/s), and whether kernels.py's model, made for sm_90, applies (modelled)."""
    limits: DeviceLimits
    max_threads_per_sm: int
    max_ctas_per_sm: int
    gpu: str
    hbm_bytes_per_s: float
    tensor_flops_per_s: dict
    modelled: bool


# Shared memory, resident threads and blocks per SM: the CUDA C++ Programming Guide, "Technical Specifications per
# Compute Capability" (every target: 64K 32-bit registers per SM, 255 a thread). A warp's registers come in units of
# 256 (the CUDA Occupancy Calculator's "register allocation unit size"). The reference GPUs' SMs, bandwidth and peak:
# sm_80: NVIDIA's A100 datasheet (80 GB SXM: 2,039 GB/s; BFLOAT16 Tensor Core 312 TFLOPS dense, 624 with sparsity)
#        and the NVIDIA A100 Tensor Core GPU Architecture whitepaper (108 SMs);
# sm_86: NVIDIA's RTX A6000 datasheet (768 GB/s, 10,752 CUDA cores: 84 SMs of 128) and the NVIDIA Ampere GA102 GPU
#        Architecture whitepaper (v2, RTX A6000: Peak BF16 Tensor TFLOPS with FP32 Accumulate 154.8 / 309.6);
# sm_89: the NVIDIA Ada GPU Architecture whitepaper, appendix A, GeForce RTX 4090 (128 SMs, 1,008 GB/s, Peak BF16
#        Tensor TFLOPS with FP32 Accumulate 165.2 / 330.4);
# sm_90: kernels.py's H200 figures (4.8 TB/s; 989 TFLOP/s through wgmma, 2/3 of it through mma.sync) and the 132 SMs
#        of an H100 or H200 SXM.
REG_ALLOC_UNIT = 256
REGS_PER_SM = 65536
TARGETS = {
    80: BuildTarget(DeviceLimits(capability=(8, 0), num_sms=108, smem_per_block=163 * KIB, smem_per_sm=164 * KIB),
                    max_threads_per_sm=2048, max_ctas_per_sm=32, gpu="A100 SXM", hbm_bytes_per_s=2.039e12,
                    tensor_flops_per_s={"HMMA": 312e12}, modelled=False),
    86: BuildTarget(DeviceLimits(capability=(8, 6), num_sms=84, smem_per_block=99 * KIB, smem_per_sm=100 * KIB),
                    max_threads_per_sm=1536, max_ctas_per_sm=16, gpu="RTX A6000", hbm_bytes_per_s=768e9,
                    tensor_flops_per_s={"HMMA": 154.8e12}, modelled=False),
    89: BuildTarget(DeviceLimits(capability=(8, 9), num_sms=128, smem_per_block=99 * KIB, smem_per_sm=100 * KIB),
                    max_threads_per_sm=1536, max_ctas_per_sm=24, gpu="RTX 4090", hbm_bytes_per_s=1008e9,
                    tensor_flops_per_s={"HMMA": 165.2e12}, modelled=False),
    90: BuildTarget(kernels.DEFAULT_LIMITS, max_threads_per_sm=2048, max_ctas_per_sm=32, gpu="H200 SXM",
                    hbm_bytes_per_s=kernels.HBM_BYTES_PER_S, tensor_flops_per_s=kernels.TENSOR_FLOPS_PER_S,
                    modelled=True),
}
DEFAULT_ARCH = 90
SASS_TOOLS = ("ptxas", "cuobjdump", "nvdisasm")
TRITON_VERSION = "3.9"  # the internals _runtime_specialization mirrors
_MMA = re.compile(r"\b(HGMMA|HMMA)\b")
COLUMNS = ["shape", "B", "Lq", "S", "tile", "regs", "spills", "smem_KiB", "MMA", "K/V in loop", "stages", "CTAs/SM",
           "programs", "balance", "passes", "in_flight_B", "cache_B", "partial_B", "flop_per_byte", "mem_floor_us",
           "compute_floor_us", "bound", "model_us", "roofline_pct"]


def variant_name(variant):
    """The name a table gives a variant: "gqa" -> GQA, "mla" -> MLA, "gla2" -> GLA-2 (any glaG: GLA-G)."""
    if variant.startswith("gla"):
        return "GLA-" + variant[3:]
    return variant.upper()


def _preset_shapes():
    """{name: (Hq, Hkv, Hk, Dk, Dv, uses qv)} and {name: block_size} of the decode calls of the tiny, small and paper
    presets' six models (gla.make_config; the caches' shapes from GPTConfig.kv_cache_shapes), e.g. "small MLA",
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
# The table's rows, (shape, B, Lq, S): the bench shapes, then the presets'.
ROWS = ([(name, B, Lq, S) for name in BENCH_SHAPES for B in BENCH_BATCHES for Lq in BENCH_LQ for S in BENCH_SEQLENS]
        + [(name, B, Lq, PRESET_SEQLENS[name]) for name in PRESET_SHAPES for B in PRESET_BATCHES for Lq in PRESET_LQ])


def configs(arch):
    """The builds of the table for sm_<arch>: (arch, shape, B, Lq, S, num_stages), num_stages None: the plan's."""
    return [(arch, *row, None) for row in ROWS]


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
    """The split kernel as a compilable JITFunction, also under TRITON_INTERPRET=1 (where
    the decorator made an interpreter of it)."""
    from triton.runtime.jit import JITFunction
    fn = kernels._decode_split_kernel
    return fn if isinstance(fn, JITFunction) else JITFunction(fn.fn)


@functools.cache
def _compile(arch, key):
    """Compile the split kernel for sm_<arch> from a (signature, constexprs, attrs, options) key of item tuples;
    return the cubin and the dynamic shared bytes. Triton's compiler is not thread-safe: call this from one thread."""
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


def _sass_main_loop(sass):
    """Instructions of the innermost loop that issues the MMAs (a backward branch's body)."""
    instrs, labels = [], {}
    for line in sass.splitlines():
        if m := re.match(r"\s*(\.L_x_\d+):", line):
            labels[m.group(1)] = len(instrs)
        elif m := re.search(r"/\*[0-9a-f]+\*/\s+(.*?)\s*;", line):
            instrs.append(m.group(1))
    loops = []
    for i, ins in enumerate(instrs):
        m = re.search(r"\bBRA\b.*\((\.L_x_\d+)\)", ins)
        if m and labels.get(m.group(1), i + 1) <= i:
            loops.append(instrs[labels[m.group(1)]:i + 1])
    with_mma = [loop for loop in loops if any(_MMA.search(ins) for ins in loop)]
    return min(with_mma, key=len) if with_mma else []


_FIGURES = {}  # (arch, shape, B, Lq, S, num_stages) -> figures


def figures_many(configs):
    """What the split kernel compiles to for each (arch, shape, B, Lq, S, num_stages) of configs (sm_<arch>, bf16, all
    B sequences at S cached tokens; num_stages None: the plan's), each computed once, as dicts: regs, stack (spill
    bytes), spills (STL/LDL instructions), smem (bytes per CTA) and smem_limit (the target's per block), mma
    (HGMMA/HMMA instructions), loop_cp_async / loop_ldg (K/V loads in the main loop by cp.async / plain loads),
    narrow_loads (global loads under 32 bits), in_flight (K/V tiles still arriving while the loop computes: the
    smallest `DEPBAR.LE SB0, N` in the loop over the cp.async groups it commits per iteration), stages (1 +
    in_flight), ctas_per_sm (from registers, shared memory, threads and blocks) and its limit, programs, balance (mean
    over max programs per SM), passes (head blocks), the plan's figures (planned_mma: the MMA kind the plan expects;
    planned_smem: the shared bytes it expects); the bytes and FLOPs of the call: in_flight_B (K/V bytes in flight per
    program), cache_B, io_B, partial_B, flops, flop_per_byte (over cache_B + io_B); the floor of the target's
    reference GPU: mem_floor_s, compute_floor_s (at the peak of mma_kind), floor_s (the larger), bound ("memory" or
    "compute"); and for a modelled target (sm_90) the model fed by this build, model_s and roofline_pct (100 floor_s /
    model_s), else None.

    Under TRITON_INTERPRET=1 (the CPU tests) Triton's compiler cannot run in this process (its code generator would
    call the interpreter's tl.max, tl.sum and co.), so we compute them in one child process without that variable."""
    configs = [tuple(c) for c in configs]
    missing = [c for c in dict.fromkeys(configs) if c not in _FIGURES]
    if missing and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        code = ("import json, sys; from bench import gpu_build; "
                "print(json.dumps(gpu_build.figures_many(json.loads(sys.argv[1]))))")
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        child = subprocess.run([sys.executable, "-c", code, json.dumps(missing)], capture_output=True, text=True,
                               env=env, cwd=pathlib.Path(__file__).resolve().parents[1])
        if child.returncode:
            raise RuntimeError(f"the GPU builds failed in a child process:\n{child.stderr[-3000:]}")
        _FIGURES.update(zip(missing, json.loads(child.stdout.splitlines()[-1])))
    missing = [c for c in missing if c not in _FIGURES]
    builds = {c: _build(*c) for c in missing}
    # Shapes that specialise alike share one compile. Compiles run here, one after another, while the cubins already
    # built are read by the tools side by side (threads that wait on subprocesses).
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        reads = {}
        for c, (_, _, key) in builds.items():
            if (c[0], key) not in reads:
                cubin, dynamic_smem = _compile(c[0], key)
                reads[c[0], key] = (pool.submit(_read_cubin, cubin), dynamic_smem)
        for c, (p, grid, key) in builds.items():
            read, dynamic_smem = reads[c[0], key]
            usage, sass = read.result()
            _FIGURES[c] = _figures(*c[:5], p, grid, usage, sass, dynamic_smem)
    return [_FIGURES[c] for c in configs]


def launch(name, B, Lq, S, arch=DEFAULT_ARCH, device="meta"):
    """decode_attention's launch of a table shape (plan, grid, args, kwargs, o_part) with the plan for sm_<arch>'s
    limits, on meta tensors by default."""
    q, k_cache, v_cache, seqlens, qv = bench_inputs(name, B, S, Lq, torch.bfloat16, device, SHAPES)
    scale = kernels._default_scale(q.shape[3], v_cache.shape[3], qv)
    p, grid, args, kwargs, o_part, _ = kernels._split_launch(q, k_cache, v_cache, seqlens, qv, scale, S, None,
                                                             TARGETS[arch].limits)
    return p, grid, args, kwargs, o_part


def widest_configs(arch):
    """The builds of sm_<arch> with the widest tiles, which the suite compiles: the bench's MLA shapes (Dv 512) at B
    32, Lq 2 and 128K cached tokens, and each preset's row whose plan takes the most shared memory (the first of
    equals)."""
    rows = [(name, 32, 2, BENCH_SEQLENS[-1]) for name in BENCH_SHAPES if SHAPES[name][4] == 512]
    for preset in ("tiny", "small", "paper"):
        of_preset = [row for row in ROWS if row[0].startswith(preset + " ")]
        smem = [launch(*row, arch=arch)[0]["smem"] for row in of_preset]
        rows.append(of_preset[smem.index(max(smem))])
    return [(arch, *row, None) for row in rows]


def _build(arch, name, B, Lq, S, num_stages):
    """The plan, grid and _compile key of a table shape's launch for sm_<arch> (num_stages None: the plan's)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    p, grid, args, kwargs, _ = launch(name, B, Lq, S, arch)
    options = (("num_warps", kwargs.pop("num_warps")), ("num_stages", num_stages or kwargs.pop("num_stages")),
               ("maxnreg", kwargs.pop("maxnreg")))
    kwargs.pop("num_stages", None)
    signature, constexprs, attrs = _runtime_specialization(_split_kernel_jit(), args, kwargs,
                                                           make_backend(GPUTarget("cuda", arch, 32)))
    return p, grid, (tuple(signature.items()), tuple(constexprs.items()),
                     tuple((k, tuple(map(tuple, v))) for k, v in attrs.items()), options)


def _figures(arch, name, B, Lq, S, p, grid, usage, sass, dynamic_smem):
    """figures_many's dict of one build for sm_<arch>: its plan and grid, cuobjdump's usage, the SASS, the dynamic
    shared bytes."""
    target = TARGETS[arch]
    regs, stack, static_smem = (int(re.search(key + r":(\d+)", usage).group(1)) for key in ("REG", "STACK", "SHARED"))
    smem = static_smem + dynamic_smem
    warps = p["num_warps"]
    warp_regs = -(-regs * 32 // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    limits = {"regs": REGS_PER_SM // (warps * warp_regs),
              "smem": target.limits.smem_per_sm // (smem + kernels.SMEM_RESERVED_PER_CTA),
              "threads": target.max_threads_per_sm // (warps * 32), "CTAs": target.max_ctas_per_sm}
    limit = min(limits, key=limits.get)
    loop = _sass_main_loop(sass)
    waits = [int(n, 16) for ins in loop for n in re.findall(r"\bDEPBAR\.LE SB0, (0x[0-9a-f]+)", ins)]
    groups = sum("LDGDEPBAR" in ins for ins in loop)
    in_flight = min(waits) // groups if waits and groups else 0
    programs = math.prod(grid)
    num_sms = target.limits.num_sms
    Hq, Hkv, Hk, Dk, Dv, use_qv = SHAPES[name]
    cache, io, partial = kernels.call_bytes(B, Lq, Hq, Hk, Hkv, Dk, Dv, use_qv, S, 2, p["n_splits"])
    flops = kernels.call_flops(B, Lq, Hq, Dk, Dv, use_qv, S)
    mma_kind = "HGMMA" if "HGMMA" in sass else "HMMA" if "HMMA" in sass else "none"
    if mma_kind == "none":
        raise RuntimeError(f"the sm_{arch} build of {name} B={B} Lq={Lq} S={S} has no tensor-core MMA")
    mem_floor_s = (cache + io) / target.hbm_bytes_per_s
    compute_floor_s = flops / target.tensor_flops_per_s[mma_kind]
    floor_s = max(mem_floor_s, compute_floor_s)
    model_s = roofline_pct = None
    if target.modelled:
        model_s, _ = kernels.modelled_seconds(cache + io + partial, flops, mma_kind, programs, limits[limit],
                                              in_flight * p["tile_bytes"], num_sms)
        roofline_pct = 100 * floor_s / model_s
    return dict(
        arch=arch, shape=name, B=B, Lq=Lq, S=S, BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"], warps=warps, regs=regs,
        stack=stack, spills=len(re.findall(r"\b(STL|LDL)\b", sass)), smem=smem, dynamic_smem=dynamic_smem,
        smem_limit=target.limits.smem_per_block, planned_smem=p["smem"],
        mma=len(_MMA.findall(sass)), mma_kind=mma_kind, planned_mma=p["mma"],
        loop_cp_async=sum("LDGSTS" in ins for ins in loop),
        loop_cp_async_128=sum("LDGSTS" in ins and ".128" in ins for ins in loop),
        loop_ldg=sum(bool(re.search(r"\bLDG\b", ins)) for ins in loop),
        narrow_loads=len(re.findall(r"\bLDG\b[\w.]*\.[US](8|16)\b", sass)),
        in_flight=in_flight, stages=1 + in_flight, ctas_per_sm=limits[limit], ctas_limit=limit,
        planned_ctas_per_sm=p["ctas_per_sm"], planned_in_flight=p["num_stages"] - 2, programs=programs,
        balance=programs / num_sms / -(-programs // num_sms), passes=p["n_head_blocks"],
        in_flight_B=in_flight * p["tile_bytes"], cache_B=cache, io_B=io, partial_B=partial, flops=flops,
        flop_per_byte=flops / (cache + io), mem_floor_s=mem_floor_s, compute_floor_s=compute_floor_s, floor_s=floor_s,
        bound="compute" if compute_floor_s > mem_floor_s else "memory", model_s=model_s, roofline_pct=roofline_pct)


def table_rows(figures):
    """The figures of each build, as rows under COLUMNS ("-" for the model's columns where there is no model)."""
    rows = []
    for f in figures:
        modelled = f["model_s"] is not None
        rows.append([
            f["shape"], f["B"], f["Lq"], f["S"], f"{f['BLOCK_M']}x{f['BLOCK_N']}, {f['warps']} warps", f["regs"],
            f"{f['stack']} B, {f['spills']} STL/LDL", f"{f['smem'] / KIB:.1f}", f"{f['mma']} {f['mma_kind']}",
            f"{f['loop_cp_async']} cp.async ({f['loop_cp_async_128']} x 128-bit), {f['loop_ldg']} LDG",
            f"{f['stages']} ({f['in_flight']} in flight)", f"{f['ctas_per_sm']} ({f['ctas_limit']})", f["programs"],
            f"{f['balance']:.2f}", f["passes"], f["in_flight_B"], f["cache_B"], f["partial_B"],
            f"{f['flop_per_byte']:.1f}", f"{f['mem_floor_s'] * 1e6:.2f}", f"{f['compute_floor_s'] * 1e6:.2f}",
            f["bound"], f"{f['model_s'] * 1e6:.2f}" if modelled else "-",
            f"{f['roofline_pct']:.1f}" if modelled else "-"])
    return rows


def failures(figures):
    """One line per build over its target's shared memory per block or with spills."""
    lines = []
    for f in figures:
        build = f"sm_{f['arch']} {f['shape']} B={f['B']} Lq={f['Lq']} S={f['S']}"
        if f["smem"] > f["smem_limit"]:
            lines.append(f"{build}: {f['smem'] / KIB:.1f} KiB of shared memory per block, over the target's "
                         f"{f['smem_limit'] / KIB:.0f} KiB")
        if f["stack"] or f["spills"]:
            lines.append(f"{build}: spills ({f['stack']} B of stack, {f['spills']} STL/LDL instructions)")
    return lines


def describe(arch):
    """One line naming sm_<arch>'s limits, its reference GPU's floor and whether the model applies."""
    t = TARGETS[arch]
    peaks = ", ".join(f"{flops / 1e12:.1f} TFLOP/s {mma}" for mma, flops in t.tensor_flops_per_s.items())
    model = "kernels.py's model" if t.modelled else "no model (kernels.py's is made for sm_90): the floor only"
    return (f"sm_{arch}: {t.limits.smem_per_block // KIB} KiB of shared memory per block, "
            f"{t.limits.smem_per_sm // KIB} KiB per SM; {t.limits.num_sms} SMs and the floor of an {t.gpu}: "
            f"{t.hbm_bytes_per_s / 1e9:,.0f} GB/s, {peaks} (bf16, float32 accumulation, dense); {model}")


def runtime_build(name, B, Lq, S, arch):
    """On a GPU of compute capability sm_<arch>: the runtime's own build of a table shape with sm_<arch>'s plan,
    loaded, as {regs, spills, dynamic_smem, ctas_per_sm}, to compare with figures_many's (the premise of the CPU
    tests)."""
    import ctypes
    _, grid, args, kwargs, _ = launch(name, B, Lq, S, arch, device="cuda")
    kernel = kernels._decode_split_kernel.warmup(*args, grid=grid, **kwargs)
    kernel._init_handles()  # loads it: the driver's registers and spills
    ctas = ctypes.c_int()
    ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(ctas), ctypes.c_void_p(kernel.function), kernel.metadata.num_warps * 32,
        ctypes.c_size_t(kernel.metadata.shared))
    return dict(regs=kernel.n_regs, spills=kernel.n_spills, dynamic_smem=kernel.metadata.shared, ctas_per_sm=ctas.value)


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
    args = parser.parse_args(argv)
    reason = unsupported()
    if reason:
        print(f"bench/gpu_build.py: {reason}", file=sys.stderr)
        sys.exit(2)
    figures = figures_many(configs(args.arch))
    rows = table_rows(figures)
    print(describe(args.arch))
    widths = [max(len(str(x)) for x in col) for col in zip(COLUMNS, *rows)]
    for r in [COLUMNS] + rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip())
    if args.output:
        write_table(args.output, COLUMNS, rows)
    bad = failures(figures)
    if bad:
        print(f"bench/gpu_build.py: {len(bad)} build(s) would not run as planned on sm_{args.arch}:\n"
              + "\n".join(bad), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
