"""The decode kernel's speed on a GPU against the roofline floor, kernels.py's model, and the PyTorch reference.

For every bench shape (the GLA paper's per-device decode shapes, BENCH_SHAPES), batch 1 and 32, 8K / 32K /
128K cached tokens and Lq 1 and 2, in bf16: the median time of a call, the bytes it must read (the cache of the
valid tokens once, q, qv and the output), the GB/s that makes, its FLOP per byte, the memory floor (those bytes at
the measured copy bandwidth) and the compute floor (its FLOPs at the peak of the MMAs the plan expects,
kernels.TENSOR_FLOPS_PER_S), which one binds and the percent of it the call reaches, the time kernels.py's model
predicts, passes (how often each group's cache is read: head blocks), the speedup over decode_attention_ref, and the
largest difference from it. bench/gpu_build.py's table holds the same model for an H200.

    python bench/kernel_speed.py [--output kernel_speed.csv] [--budget_s 600]
"""
import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import torch  # noqa: E402

import kernels  # noqa: E402
from bench.common import BENCH_BATCHES, BENCH_LQ, BENCH_SEQLENS, BENCH_SHAPES, bench_inputs  # noqa: E402

COPY_BYTES = 1 << 30
MEMORY_MARGIN = 0.8  # use at most this fraction of free GPU memory
COLUMNS = ["shape", "B", "S", "Lq", "passes", "time_us", "MB_read", "GB_s", "flop_per_byte", "mem_floor_us",
           "compute_floor_us", "bound", "roofline_pct", "model_us", "speedup_vs_ref", "max_abs_err"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", help="also write the table to PATH as CSV")
    parser.add_argument("--budget_s", type=float, default=600, help="start no new row after this many seconds")
    args = parser.parse_args(argv)
    if kernels.triton is None or not torch.cuda.is_available():
        print("bench/kernel_speed.py needs a CUDA GPU and Triton", file=sys.stderr)
        sys.exit(2)
    from triton.testing import do_bench
    start, dev, dt = time.time(), torch.device("cuda"), torch.bfloat16
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_bw = 2 * COPY_BYTES / (do_bench(lambda: dst.copy_(src), return_mode="median") * 1e-3)  # reads + writes
    del src, dst
    print(f"{torch.cuda.get_device_name(dev)}: device-to-device copy bandwidth (the floor): {copy_bw / 1e9:.0f} GB/s")
    limits = kernels.device_limits(torch.cuda.current_device())  # the plan decode_attention makes on this GPU
    rows, skipped = [], []
    print("  ".join(COLUMNS))
    for name, (Hq, Hkv, Hk, Dk, Dv, use_qv) in BENCH_SHAPES.items():
        for B in BENCH_BATCHES:
            for S in BENCH_SEQLENS:
                for Lq in BENCH_LQ:
                    cache, io, _ = kernels.call_bytes(B, Lq, Hq, Hk, Hkv, Dk, Dv, use_qv, S, dt.itemsize, 1)
                    # The cache, the reference's float32 copies of K and V and the zeroed V (2x each), ~3 float32
                    # score tensors.
                    need = 5 * cache + 3 * 4 * B * Hq * Lq * S
                    if time.time() > start + args.budget_s or need > MEMORY_MARGIN * torch.cuda.mem_get_info(dev)[0]:
                        skipped.append(f"{name} B={B} S={S} Lq={Lq}")
                        continue
                    q, k, v, seqlens, qv = bench_inputs(name, B, S, Lq, dt, dev)
                    out = kernels.decode_attention(q, k, v, seqlens, qv, max_seqlen=S)
                    err = (out.float() - kernels.decode_attention_ref(q, k, v, seqlens, qv).float()).abs().max().item()
                    t = do_bench(lambda: kernels.decode_attention(q, k, v, seqlens, qv, max_seqlen=S, out=out),
                                 return_mode="median") * 1e-3
                    t_ref = do_bench(lambda: kernels.decode_attention_ref(q, k, v, seqlens, qv), return_mode="median")
                    p = kernels._plan(B, Lq, Hq, Hkv, Hk, Dk, Dv, use_qv, dt.itemsize, S, None, limits)
                    flops = kernels.call_flops(B, Lq, Hq, Dk, Dv, use_qv, S)
                    mem_floor, compute_floor = (cache + io) / copy_bw, flops / kernels.TENSOR_FLOPS_PER_S[p["mma"]]
                    rows.append([name, B, S, Lq, p["n_head_blocks"], f"{t * 1e6:.1f}", f"{(cache + io) / 1e6:.1f}",
                                 f"{(cache + io) / t / 1e9:.0f}", f"{flops / (cache + io):.1f}",
                                 f"{mem_floor * 1e6:.2f}", f"{compute_floor * 1e6:.2f}",
                                 "compute" if compute_floor > mem_floor else "memory",
                                 f"{100 * max(mem_floor, compute_floor) / t:.0f}", f"{p['seconds'] * 1e6:.1f}",
                                 f"{t_ref * 1e-3 / t:.1f}", f"{err:.2e}"])
                    print("  ".join(str(x) for x in rows[-1]), flush=True)
                    del q, k, v, seqlens, qv, out
                    torch.cuda.empty_cache()
    if skipped:
        print(f"skipped (out of time or memory): {'; '.join(skipped)}")
    if args.output:
        from bench.gpu_build import write_table
        write_table(args.output, COLUMNS, rows)


if __name__ == "__main__":
    main()
