"""What the decode kernel compiles to on an H100/H200 (sm_90), without a GPU, and the memory model fed by it.

Triton compiles ahead of time for sm_90 on a CPU, and its wheel ships cuobjdump (registers, spill stack) and
nvdisasm (SASS) to read the result. Compiled with the specialisation the runtime would pick for the launch
arguments of the bench shapes (built as meta tensors, bf16), the SASS is what an H100/H200 would run. For every bench
shape, batch, query length and cache length the table prints the build (tile, registers, spills, shared memory, MMA
instructions, how K/V reach the main loop, stages, CTAs/SM, programs, balance, passes) and kernels.py's model fed by
it (K/V bytes in flight per program, cache and partial bytes), against the roofline: FLOP per byte read, the memory
floor (bytes / HBM bandwidth) and the compute floor (FLOPs at the peak of the MMA instructions in the SASS: HGMMA,
Hopper's wgmma, or the older HMMA, mma.sync, at 2/3 of it), which one binds, the modelled time and the percent of the
binding floor it reaches.

    python bench/sm90.py [--output sass.csv]

The analysis follows the internals of Triton 3.9 (the runtime's specialisation); with another version it refuses
(and the tests skip) instead of printing wrong figures.
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

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9's default, said out loud (it warns otherwise)

import torch  # noqa: E402

import kernels  # noqa: E402
from bench.common import BENCH_BATCHES, BENCH_LQ, BENCH_SEQLENS, BENCH_SHAPES, bench_inputs  # noqa: E402
from kernels import (DEFAULT_NUM_SMS, HBM_BYTES_PER_S, SM90_SMEM_PER_SM, SM90_SMEM_RESERVED_PER_CTA,  # noqa: E402
                     TENSOR_FLOPS_PER_S, triton)

# sm_90 limits: CUDA C++ Programming Guide, "Technical Specifications per Compute Capability" (9.0): 64K 32-bit
# registers, 2048 threads, 32 CTAs per SM, 227 KiB of shared memory per CTA. A warp's registers come in units of 256
# (the CUDA Occupancy Calculator's "register allocation unit size").
SM90_REGS_PER_SM = 65536
SM90_REG_ALLOC_UNIT = 256
SM90_MAX_THREADS_PER_SM = 2048
SM90_MAX_CTAS_PER_SM = 32
SM90_SMEM_PER_CTA = 227 * 1024
SASS_TOOLS = ("ptxas", "cuobjdump", "nvdisasm")
TRITON_VERSION = "3.9"  # the internals _runtime_specialization mirrors
_MMA = re.compile(r"\b(HGMMA|HMMA)\b")
COLUMNS = ["shape", "B", "Lq", "S", "tile", "regs", "spills", "smem_KiB", "MMA", "K/V in loop", "stages", "CTAs/SM",
           "programs", "balance", "passes", "in_flight_B", "cache_B", "partial_B", "flop_per_byte", "mem_floor_us",
           "compute_floor_us", "bound", "model_us", "roofline_pct"]
CONFIGS = [(name, B, Lq, S, None) for name in BENCH_SHAPES for B in BENCH_BATCHES for Lq in BENCH_LQ
           for S in BENCH_SEQLENS]  # (shape, B, Lq, S, num_stages: None for the plan's)


def unsupported():
    """None if this machine can build and read the sm_90 figures, else the one-line reason it cannot."""
    if triton is None:
        return "the sm_90 build needs Triton"
    if not triton.__version__.startswith(TRITON_VERSION + "."):
        return (f"the sm_90 build analysis follows Triton {TRITON_VERSION}'s internals (the runtime's "
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
def _sm90_compile(key):
    """Compile the split kernel for sm_90 from a (signature, constexprs, attrs, options) key of item tuples; return
    the cubin and the dynamic shared bytes. Triton's compiler is not thread-safe: call this from one thread."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    signature, constexprs, attrs, options = (dict(x) for x in key)
    src = ASTSource(_split_kernel_jit(), signature, constexprs, {k: list(map(list, v)) for k, v in attrs.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
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
        raise RuntimeError(f"cuobjdump or nvdisasm failed on the sm_90 build (exit {[r.returncode for r in runs]})")
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


_FIGURES = {}  # (name, B, Lq, S, num_stages) -> figures


def figures_many(configs):
    """What the split kernel compiles to on an H100/H200 for each (name, B, Lq, S, num_stages) of configs (bf16, all B
    sequences at S cached tokens; num_stages None: the plan's), each computed once, as dicts: regs, stack (spill
    bytes), spills (STL/LDL instructions), smem (bytes per CTA), mma (HGMMA/HMMA instructions), loop_cp_async /
    loop_ldg (K/V loads in the main loop by cp.async / plain loads), narrow_loads (global loads under 32 bits),
    in_flight (K/V tiles still arriving while the loop computes: the smallest `DEPBAR.LE SB0, N` in the loop over the
    cp.async groups it commits per iteration), stages (1 + in_flight), ctas_per_sm (from registers, shared memory and
    threads) and its limit, programs, balance (mean over max programs per SM), passes (head blocks), the plan's
    figures (planned_mma: the MMA kind the plan expects); and the model fed by this build: in_flight_B (K/V bytes in
    flight per program), cache_B, io_B, partial_B, flops, flop_per_byte (over cache_B + io_B), mem_floor_s,
    compute_floor_s (at the peak of mma_kind), floor_s (the larger), bound ("memory" or "compute"), model_s and
    roofline_pct (100 floor_s / model_s).

    Under TRITON_INTERPRET=1 (the CPU tests) Triton's compiler cannot run in this process (its code generator would
    call the interpreter's tl.max, tl.sum and co.), so we compute them in one child process without that variable."""
    configs = [tuple(c) for c in configs]
    missing = [c for c in dict.fromkeys(configs) if c not in _FIGURES]
    if missing and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        code = "import json, sys; from bench import sm90; print(json.dumps(sm90.figures_many(json.loads(sys.argv[1]))))"
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        child = subprocess.run([sys.executable, "-c", code, json.dumps(missing)], capture_output=True, text=True,
                               env=env, cwd=pathlib.Path(__file__).resolve().parents[1])
        if child.returncode:
            raise RuntimeError(f"the sm_90 build failed in a child process:\n{child.stderr[-3000:]}")
        _FIGURES.update(zip(missing, json.loads(child.stdout.splitlines()[-1])))
    missing = [c for c in missing if c not in _FIGURES]
    builds = {c: _build(*c) for c in missing}
    # Bench shapes that specialise alike share one compile. Compiles run here, one after another, while the
    # cubins already built are read by the tools side by side (threads that wait on subprocesses).
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool:
        reads = {}
        for _, _, key in builds.values():
            if key not in reads:
                cubin, dynamic_smem = _sm90_compile(key)
                reads[key] = (pool.submit(_read_cubin, cubin), dynamic_smem)
        for c, (p, grid, key) in builds.items():
            (usage, sass), dynamic_smem = reads[key][0].result(), reads[key][1]
            _FIGURES[c] = _figures(*c[:4], p, grid, usage, sass, dynamic_smem)
    return [_FIGURES[c] for c in configs]


def launch(name, B, Lq, S, device="meta"):
    """decode_attention's launch of a bench shape (plan, grid, args, kwargs, o_part), on meta tensors by default."""
    q, k_cache, v_cache, seqlens, qv = bench_inputs(name, B, S, Lq, torch.bfloat16, device)
    scale = kernels._default_scale(q.shape[3], v_cache.shape[3], qv)
    p, grid, args, kwargs, o_part, _ = kernels._split_launch(q, k_cache, v_cache, seqlens, qv, scale, S, None,
                                                             DEFAULT_NUM_SMS)
    return p, grid, args, kwargs, o_part


def _build(name, B, Lq, S, num_stages):
    """The plan, grid and _sm90_compile key of a bench shape's launch (num_stages None: the plan's)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    p, grid, args, kwargs, _ = launch(name, B, Lq, S)
    options = (("num_warps", kwargs.pop("num_warps")), ("num_stages", num_stages or kwargs.pop("num_stages")))
    kwargs.pop("num_stages", None)
    signature, constexprs, attrs = _runtime_specialization(_split_kernel_jit(), args, kwargs,
                                                           make_backend(GPUTarget("cuda", 90, 32)))
    return p, grid, (tuple(signature.items()), tuple(constexprs.items()),
                     tuple((k, tuple(map(tuple, v))) for k, v in attrs.items()), options)


def _figures(name, B, Lq, S, p, grid, usage, sass, dynamic_smem):
    """figures_many's dict of one build: its plan and grid, cuobjdump's usage, the SASS, the dynamic shared bytes."""
    regs, stack, static_smem = (int(re.search(key + r":(\d+)", usage).group(1)) for key in ("REG", "STACK", "SHARED"))
    smem = static_smem + dynamic_smem
    warps = p["num_warps"]
    warp_regs = -(-regs * 32 // SM90_REG_ALLOC_UNIT) * SM90_REG_ALLOC_UNIT
    limits = {"regs": SM90_REGS_PER_SM // (warps * warp_regs),
              "smem": SM90_SMEM_PER_SM // (smem + SM90_SMEM_RESERVED_PER_CTA),
              "threads": SM90_MAX_THREADS_PER_SM // (warps * 32), "CTAs": SM90_MAX_CTAS_PER_SM}
    limit = min(limits, key=limits.get)
    loop = _sass_main_loop(sass)
    waits = [int(n, 16) for ins in loop for n in re.findall(r"\bDEPBAR\.LE SB0, (0x[0-9a-f]+)", ins)]
    groups = sum("LDGDEPBAR" in ins for ins in loop)
    in_flight = min(waits) // groups if waits and groups else 0
    programs = math.prod(grid)
    Hq, Hkv, Hk, Dk, Dv, use_qv = BENCH_SHAPES[name]
    cache, io, partial = kernels.call_bytes(B, Lq, Hq, Hk, Hkv, Dk, Dv, use_qv, S, 2, p["n_splits"])
    flops = kernels.call_flops(B, Lq, Hq, Dk, Dv, use_qv, S)
    mma_kind = "HGMMA" if "HGMMA" in sass else "HMMA" if "HMMA" in sass else "none"
    if mma_kind == "none":
        raise RuntimeError(f"the sm_90 build of {name} B={B} Lq={Lq} S={S} has no tensor-core MMA")
    model_s, _ = kernels.modelled_seconds(cache + io + partial, flops, mma_kind, programs, limits[limit],
                                          in_flight * p["tile_bytes"])
    mem_floor_s, compute_floor_s = (cache + io) / HBM_BYTES_PER_S, flops / TENSOR_FLOPS_PER_S[mma_kind]
    floor_s = max(mem_floor_s, compute_floor_s)
    return dict(
        shape=name, B=B, Lq=Lq, S=S, BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"], warps=warps, regs=regs,
        stack=stack, spills=len(re.findall(r"\b(STL|LDL)\b", sass)), smem=smem, dynamic_smem=dynamic_smem,
        mma=len(_MMA.findall(sass)), mma_kind=mma_kind, planned_mma=p["mma"],
        loop_cp_async=sum("LDGSTS" in ins for ins in loop),
        loop_cp_async_128=sum("LDGSTS" in ins and ".128" in ins for ins in loop),
        loop_ldg=sum(bool(re.search(r"\bLDG\b", ins)) for ins in loop),
        narrow_loads=len(re.findall(r"\bLDG\b[\w.]*\.[US](8|16)\b", sass)),
        in_flight=in_flight, stages=1 + in_flight, ctas_per_sm=limits[limit], ctas_limit=limit,
        planned_ctas_per_sm=p["ctas_per_sm"], planned_in_flight=p["num_stages"] - 2, programs=programs,
        balance=programs / DEFAULT_NUM_SMS / -(-programs // DEFAULT_NUM_SMS), passes=p["n_head_blocks"],
        in_flight_B=in_flight * p["tile_bytes"], cache_B=cache, io_B=io, partial_B=partial, flops=flops,
        flop_per_byte=flops / (cache + io), mem_floor_s=mem_floor_s, compute_floor_s=compute_floor_s, floor_s=floor_s,
        bound="compute" if compute_floor_s > mem_floor_s else "memory", model_s=model_s,
        roofline_pct=100 * floor_s / model_s)


def table():
    """The figures of every CONFIGS row, as rows under COLUMNS."""
    return [[f["shape"], f["B"], f["Lq"], f["S"], f"{f['BLOCK_M']}x{f['BLOCK_N']}, {f['warps']} warps", f["regs"],
             f"{f['stack']} B, {f['spills']} STL/LDL", f"{f['smem'] / 1024:.1f}", f"{f['mma']} {f['mma_kind']}",
             f"{f['loop_cp_async']} cp.async ({f['loop_cp_async_128']} x 128-bit), {f['loop_ldg']} LDG",
             f"{f['stages']} ({f['in_flight']} in flight)", f"{f['ctas_per_sm']} ({f['ctas_limit']})", f["programs"],
             f"{f['balance']:.2f}", f["passes"], f["in_flight_B"], f["cache_B"], f["partial_B"],
             f"{f['flop_per_byte']:.1f}", f"{f['mem_floor_s'] * 1e6:.2f}", f"{f['compute_floor_s'] * 1e6:.2f}",
             f["bound"], f"{f['model_s'] * 1e6:.2f}", f"{f['roofline_pct']:.1f}"] for f in figures_many(CONFIGS)]


def runtime_build(name, B, Lq, S):
    """On a GPU: the runtime's own build of a bench shape, loaded, as {regs, spills, dynamic_smem, ctas_per_sm}, to
    compare with figures_many's (the premise of the CPU tests)."""
    import ctypes
    _, grid, args, kwargs, _ = launch(name, B, Lq, S, device="cuda")
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
    parser.add_argument("--output", help="also write the table to PATH as CSV")
    args = parser.parse_args(argv)
    reason = unsupported()
    if reason:
        print(f"bench/sm90.py: {reason}", file=sys.stderr)
        sys.exit(2)
    rows = table()
    widths = [max(len(str(x)) for x in col) for col in zip(COLUMNS, *rows)]
    for r in [COLUMNS] + rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip())
    if args.output:
        write_table(args.output, COLUMNS, rows)


if __name__ == "__main__":
    main()
