"""The decode kernel's speed on a GPU against the roofline floor and the PyTorch reference.

For every bench shape (the GLA paper's per-device decode shapes, BENCH_SHAPES), batch 1 and 32, 8K / 32K /
128K cached tokens and Lq 1 and 2, in bf16: the median time of a call, the bytes it must read (the cache of the
valid tokens once, q, qv and the output), the GB/s that makes, its FLOP per byte, the memory floor (those bytes at
the measured copy bandwidth) and the compute floor (its FLOPs at an H200's peak of the MMAs its tile gets: wgmma from
64 rows on compute capability 9.0, else mma.sync; bench/roofline.py), which one binds and the percent of it the call
reaches, passes (how often each group's cache is read: head blocks), splits, the config the autotuner picked, the
speedup over decode_attention_ref, and the largest difference from it.

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
from bench.roofline import H200_TENSOR_FLOPS_PER_S, call_bytes, call_flops  # noqa: E402

COPY_BYTES = 1 << 30
MEMORY_MARGIN = 0.8  # use at most this fraction of free GPU memory
COLUMNS = ["shape", "B", "S", "Lq", "passes", "splits", "config", "time_us", "MB_read", "GB_s", "flop_per_byte",
           "mem_floor_us", "compute_floor_us", "bound", "roofline_pct", "speedup_vs_ref", "max_abs_err"]


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
    wgmma = torch.cuda.get_device_capability(dev) == (9, 0)
    rows, skipped = [], []
    print("  ".join(COLUMNS))
    for name, (Hq, Hkv, Hk, Dk, Dv, use_qv) in BENCH_SHAPES.items():
        for B in BENCH_BATCHES:
            for S in BENCH_SEQLENS:
                for Lq in BENCH_LQ:
                    nbytes = call_bytes(B, Lq, Hq, Hk, Hkv, Dk, Dv, use_qv, S, dt.itemsize)
                    # The cache, the reference's float32 copies of K and V (2x each), ~3 float32 score tensors.
                    need = 5 * nbytes + 3 * 4 * B * Hq * Lq * S
                    if time.time() > start + args.budget_s or need > MEMORY_MARGIN * torch.cuda.mem_get_info(dev)[0]:
                        skipped.append(f"{name} B={B} S={S} Lq={Lq}")
                        continue
                    q, k, v, seqlens, qv = bench_inputs(name, B, S, Lq, dt, dev)
                    out = kernels.decode_attention(q, k, v, seqlens, qv, max_seqlen=S)
                    err = (out.float() - kernels.decode_attention_ref(q, k, v, seqlens, qv).float()).abs().max().item()
                    t = do_bench(lambda: kernels.decode_attention(q, k, v, seqlens, qv, max_seqlen=S),
                                 return_mode="median") * 1e-3
                    t_ref = do_bench(lambda: kernels.decode_attention_ref(q, k, v, seqlens, qv), return_mode="median")
                    grid, _, meta, _, _ = kernels._split_launch(q, k, v, seqlens, qv, 1.0, S)
                    c = kernels._decode_split_kernel.best_config  # the autotuner's pick for this tile
                    flops = call_flops(B, Lq, Hq, Dk, Dv, use_qv, S)
                    mma = "HGMMA" if wgmma and meta["BLOCK_M"] >= 64 else "HMMA"
                    mem_floor, compute_floor = nbytes / copy_bw, flops / H200_TENSOR_FLOPS_PER_S[mma]
                    rows.append([name, B, S, Lq, grid[0], grid[1],
                                 f"N{c.kwargs['BLOCK_N']} s{c.num_stages} w{c.num_warps}", f"{t * 1e6:.1f}",
                                 f"{nbytes / 1e6:.1f}", f"{nbytes / t / 1e9:.0f}", f"{flops / nbytes:.1f}",
                                 f"{mem_floor * 1e6:.2f}", f"{compute_floor * 1e6:.2f}",
                                 "compute" if compute_floor > mem_floor else "memory",
                                 f"{100 * max(mem_floor, compute_floor) / t:.0f}", f"{t_ref * 1e-3 / t:.1f}",
                                 f"{err:.2e}"])
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
