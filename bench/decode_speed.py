"""The thesis measured: one decode step of one layer of each of the ablation's six models (GQA, MLA, GLA-2; baseline
and double heads) at the paper preset's dims, against this machine's own roofs, measured by the same command.

Each model is gla.make_config("paper", variant, double_heads) cut to one layer and a 256-token head (a 50,304-token
head would outweigh the layer). A step is GPT.decode of Lq new tokens after S cached ones in each of B sequences: the
model's own decode path (the absorbed form, the cache; on a CPU kernels.decode_attention_ref in float32, on a GPU the
Triton kernel in bf16). At batch 1 a layer's weights (0.5 GB in float32) outweigh its cache until tens of thousands of
tokens, so each row gives the whole step and the cache's part of it: the layer's decode attention over the cache
(KVCache.attend, the call the step makes), timed by itself. (The step at S less the step at S = 1, the earlier
measure, is the difference of two noisy times: below about 8K tokens it fell under its own floor and even below 0.)

Per row: milliseconds (median of --repeats interleaved calls), bytes read, FLOPs, FLOP/byte, the floor
max(bytes / bandwidth, FLOPs / peak) and the fraction of it reached. The roofs: the read bandwidth of a sum over a
buffer as large as what the row reads (its cache, or weights and cache), and the matmul peak (float32 1024^3 on a
CPU, bf16 8192^3 on a GPU) at the threads used. On a CPU a last table times the attention's matrix products alone at
the two largest lengths: what torch's GEMMs give at a decode step's few rows, against the floor. --tp 2 times one
rank's shard (gla.tp_share: its heads, its share of the cache), as a rank of a tensor-parallel decode runs it, without
the all-reduce. --clock cpu times this process's CPU seconds instead of wall time (one thread): on a machine shared
with other work, the time on a core. Writes the figure (the cache's part against S, one line per model, its floor
dashed) to --output.

    python bench/decode_speed.py [--threads 1] [--clock cpu] [--batch 1 8] [--lq 1 2] [--max_tokens 32768]
        [--repeats 5] [--tp 2] [--variants gqa mla gla2] [--output assets/decode_speed.png]
"""
import argparse
import csv
import itertools
import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import gla  # noqa: E402
import kernels  # noqa: E402
import plot  # noqa: E402
from bench.common import machine, time_interleaved  # noqa: E402
from bench.roofline import call_bytes, call_flops  # noqa: E402

HEAD_VOCAB = 256  # the one-layer model's head: the tiny preset's byte vocabulary


def layer_config(variant, double_heads, tp=1):
    """The one-layer GPTConfig of a model of the ablation at paper dims; with tp > 1, rank 0's shard (gla.tp_share)."""
    config = gla.make_config("paper", variant, double_heads, n_layer=1, vocab_size=HEAD_VOCAB)
    return gla.tp_share(config, 0, tp).config if tp > 1 else config


# ---- The arithmetic: bytes and FLOPs of a decode call ----------------------------------------------------------------
def cache_cost(config, B, Lq, seqlen, elem_bytes):
    """(bytes, FLOPs) of one decode attention call of every layer of config: B sequences of seqlen cached tokens (the
    Lq new ones included) read once, and bench.roofline.call_flops (the two products of the absorbed form: per query
    head, new token and cached token 2 (Dk + Dv) FLOPs, GQA; 2 (Dk + 2 Dv), MLA / GLA)."""
    (Hk, Dk), (Hkv, Dv) = config.kv_cache_shapes
    has_qv = config.attn != "gqa"
    nbytes = call_bytes(B, 0, config.n_head, Hk, Hkv, Dk, Dv, has_qv, seqlen, elem_bytes)  # Lq 0: the cache alone
    return config.n_layer * nbytes, config.n_layer * call_flops(B, Lq, config.n_head, Dk, Dv, has_qv, seqlen)


def weights_cost(config, B, Lq, elem_bytes):
    """(bytes, FLOPs) of a decode call's weights: each weight read once (the tied embedding with the head), and 2
    FLOPs per weight of a matrix (embedding excluded, head included) and new token. The absorbed form uses each
    weight once per token, as the naive form does."""
    with torch.device("meta"):
        model = gla.GPT(config)
    matrices = sum(p.numel() for p in model.parameters() if p.dim() >= 2)  # the tied embedding once: as the head
    return model.num_params() * elem_bytes, 2 * B * Lq * matrices


def step_cost(config, B, Lq, S, elem_bytes):
    """(bytes, FLOPs) of GPT.decode of Lq new tokens after S cached in each of B sequences: weights and cache
    (activations, a few MB, left out)."""
    w, c = weights_cost(config, B, Lq, elem_bytes), cache_cost(config, B, Lq, S + Lq, elem_bytes)
    return w[0] + c[0], w[1] + c[1]


def floor_seconds(nbytes, flops, bandwidth, peak):
    """The roofline floor max(bytes / bandwidth, FLOPs / peak) in seconds, and which roof sets it."""
    memory, compute = nbytes / bandwidth, flops / peak
    return (memory, "memory") if memory >= compute else (compute, "compute")


# ---- The roofs -------------------------------------------------------------------------------------------------------
class Roofs:
    """This machine's roofs on the threads torch has now, timed by clock as the steps are: the matmul peak (FLOP/s;
    float32 1024^3 on a CPU, bf16 8192^3 on a GPU), and the read bandwidth (bytes/s) of a sum over a buffer of a
    given size, the leading part of one buffer allocated for the largest."""
    def __init__(self, device, dtype, max_bytes, clock, repeats=5):
        self.device, self.clock, self.repeats = device, clock, repeats
        self.buffer = torch.randn(max_bytes // 4 + 1, device=device)  # float32, pages written
        self.memo = {}
        n = 8192 if device.type == "cuda" else 1024
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        self.peak = 2 * n**3 / min(self._time(lambda: a @ b) for _ in range(repeats))

    def _time(self, fn):
        fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t = self.clock()
        fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return self.clock() - t

    def bandwidth(self, nbytes):
        """Read bytes/s of a sum over nbytes (fastest of repeats; sizes to 1% share a figure)."""
        key = float(f"{nbytes:.2g}")
        if key not in self.memo:
            part = self.buffer[:max(nbytes // 4, 1)]
            self.memo[key] = part.numel() * 4 / min(self._time(part.sum) for _ in range(self.repeats))
        return self.memo[key]


def products_seconds(config, B, S, repeats, dtype, clock):
    """Seconds of the matrix products alone of one decode attention call on a CPU (Lq 1; no softmax, no mask): the
    scores, each product in the faster of two orientations (q @ K^T: a group's rows against the cache; K @ q^T: the
    cache as the tall operand), then P @ V. GQA: each KV head's G query heads against its keys, then its values; MLA /
    GLA: all query heads against the rope key, each group against its latent, then P against the latent. The floor
    assumes the matmul peak's rate; this is what torch's GEMMs give at a decode step's few rows."""
    (Hk, Dk), (Hkv, Dv) = config.kv_cache_shapes
    G = config.n_head // Hkv
    scores = [(Hk, config.n_head // Hk, Dk)]  # (heads, rows, dim): the keys (GQA) or the shared rope key
    if config.attn != "gqa":
        scores.append((Hkv, G, Dv))  # each group against its latent head
    seconds = 0.0
    for heads, rows, dim in scores:
        q, k = torch.randn(B, heads, rows, dim, dtype=dtype), torch.randn(B, heads, S, dim, dtype=dtype)
        times = time_interleaved({"wide": lambda: q @ k.transpose(2, 3), "tall": lambda: k @ q.transpose(2, 3)},
                                 repeats, clock=clock)
        seconds += min(statistics.median(t) for t in times.values())
    p, v = torch.randn(B, Hkv, G, S, dtype=dtype), torch.randn(B, Hkv, S, Dv, dtype=dtype)
    return seconds + statistics.median(time_interleaved({"pv": lambda: p @ v}, repeats, clock=clock)["pv"])


# ---- The measurement -------------------------------------------------------------------------------------------------
def random_cache(model, B, max_seq_len):
    """Set up model's cache (one layer) for B sequences of max_seq_len tokens, filled with random values, not zeros:
    zeroed pages could be read for free. Returns the layer's KVCache."""
    model.setup_cache(B, max_seq_len)
    cache = model.blocks[0].attn.cache
    cache.k_cache.normal_()
    cache.v_cache.normal_()
    return cache


def time_steps(config, B, Lq, seqlens, repeats, device, dtype, clock):
    """{S: median seconds of GPT.decode of Lq tokens after S cached, in each of B sequences} for S in seqlens, the
    calls interleaved (each rewrites the same Lq cache slots: the same work every call). The cache is filled with
    random values first: zeroed pages could be read for free."""
    model = gla.GPT(config).to(device=device, dtype=dtype).eval()
    cache = random_cache(model, B, max(seqlens) + Lq)
    idx = torch.randint(config.vocab_size, (B, Lq), device=device)

    def step(S):
        lengths = torch.full((B,), S, dtype=torch.int32, device=device)

        def call():
            model.decode(idx, lengths, max_seqlen=S + Lq)
            if device.type == "cuda":
                torch.cuda.synchronize()
        return call
    times = time_interleaved({S: step(S) for S in seqlens}, repeats, clock=clock)
    del model, cache
    return {S: statistics.median(t) for S, t in times.items()}


def time_attention(config, B, Lq, seqlens, repeats, device, dtype, clock):
    """{S: median seconds of the layer's decode attention alone (KVCache.attend, as a step calls it) of Lq new tokens
    after S cached, in each of B sequences}, the calls interleaved, over a cache of random values."""
    (Hk, Dk), (Hkv, Dv) = config.kv_cache_shapes
    cache = gla.KVCache(B, max(seqlens) + Lq, (Hk, Dk), (Hkv, Dv), device, dtype)
    cache.k_cache.normal_()
    cache.v_cache.normal_()
    q = torch.randn(B, Lq, config.n_head, Dk, device=device, dtype=dtype)  # GQA's query, or the rope query
    qv = None if config.attn == "gqa" else torch.randn(B, Lq, config.n_head, Dv, device=device, dtype=dtype)

    def attend(S):
        positions = S + torch.arange(Lq, device=device).expand(B, Lq)

        def call():
            cache.attend(q, positions, S + Lq, qv)
            if device.type == "cuda":
                torch.cuda.synchronize()
        return call
    times = time_interleaved({S: attend(S) for S in seqlens}, repeats, clock=clock)
    return {S: statistics.median(t) for S, t in times.items()}


def measure_rows(models, batches, lqs, seqlens, repeats, tp, device, dtype, roofs):
    """One dict per (model, B, Lq, S): the step and its cache part, each with ms, bytes, flops, floor_ms, bound."""
    elem = torch.empty(0, dtype=dtype).element_size()
    rows = []
    for variant, double_heads in models:
        config = layer_config(variant, double_heads, tp)
        for B in batches:
            for Lq in lqs:
                seconds = time_steps(config, B, Lq, seqlens, repeats, device, dtype, roofs.clock)
                attention = time_attention(config, B, Lq, seqlens, repeats, device, dtype, roofs.clock)
                for S in seqlens:
                    step = step_cost(config, B, Lq, S, elem)
                    part = cache_cost(config, B, Lq, S + Lq, elem)
                    row = dict(variant=variant, double_heads=double_heads, n_head=config.n_head,
                               elems=config.kv_cache_elems_per_token_per_layer, B=B, Lq=Lq, S=S)
                    for name, (nbytes, flops), t in (("step", step, seconds[S]), ("cache", part, attention[S])):
                        floor, bound = floor_seconds(nbytes, flops, roofs.bandwidth(nbytes), roofs.peak)
                        row.update({f"{name}_ms": t * 1e3, f"{name}_bytes": nbytes, f"{name}_flops": flops,
                                    f"{name}_floor_ms": floor * 1e3, f"{name}_bound": bound})
                    rows.append(row)
                    print_row(row)
    return rows


def model_label(variant, double_heads):
    return plot.STYLE[variant][0] + (" x2 heads" if double_heads else "")


TABLE_HEAD = ("| model | heads | B | Lq | S | step ms | step floor ms | of floor | cache part ms | cache MB | "
              "cache GFLOP | FLOP/byte | cache floor ms | of floor |\n" + "|---" * 14 + "|")


def print_row(r):
    print(f"| {model_label(r['variant'], r['double_heads'])} | {r['n_head']} | {r['B']} | {r['Lq']} | {r['S']} | "
          f"{r['step_ms']:.1f} | {r['step_floor_ms']:.1f} {r['step_bound']} | "
          f"{r['step_floor_ms'] / r['step_ms']:.0%} | "
          f"{r['cache_ms']:.1f} | {r['cache_bytes'] / 1e6:.0f} | {r['cache_flops'] / 1e9:.2f} | "
          f"{r['cache_flops'] / r['cache_bytes']:.1f} | {r['cache_floor_ms']:.1f} {r['cache_bound']} | "
          f"{r['cache_floor_ms'] / r['cache_ms']:.0%} |", flush=True)


def plot_rows(rows, title, path):
    """The cache's part of a step (ms, log) against cached tokens (log 2) at the smallest Lq: a panel per batch size
    (rows) and head count (columns: baseline, double heads), in each a solid line per design and its floor dashed in
    the same colour; a PNG to path."""
    batches, lq = sorted({r["B"] for r in rows}), min(r["Lq"] for r in rows)
    heads = sorted({r["double_heads"] for r in rows})
    fig, axes = plt.subplots(len(batches), len(heads), figsize=(5.6 * len(heads), 3.9 * len(batches)), squeeze=False,
                             sharex=True)
    for (i, B), (j, double_heads) in itertools.product(enumerate(batches), enumerate(heads)):
        ax = axes[i][j]
        for variant in dict.fromkeys(r["variant"] for r in rows):
            line = [r for r in rows if (r["variant"], r["double_heads"], r["B"], r["Lq"]) ==
                    (variant, double_heads, B, lq)]
            if not line:
                continue
            S = [r["S"] for r in line]
            colour = plot.STYLE[variant][1]
            ax.plot(S, [r["cache_ms"] for r in line], color=colour, lw=2, marker="o", ms=4,
                    label=f"{plot.STYLE[variant][0]}, {line[0]['elems']} elements/token")
            ax.plot(S, [r["cache_floor_ms"] for r in line], color=colour, lw=1.2, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(S, [f"{n // 1024}K" if n >= 1024 else str(n) for n in S])
        ax.set_title(f"batch {B}, {line[0]['n_head']} query heads" + (" (double heads)" if double_heads else ""),
                     fontsize=10)
        ax.grid(True, which="major", alpha=0.25)
        ax.legend(fontsize=8, loc="upper left")
        if i == len(batches) - 1:
            ax.set_xlabel("cached tokens")
        if j == 0:
            ax.set_ylabel("ms of the step's attention over the cache")
    fig.suptitle(f"{title}\nsolid: measured; dashed: the floor, max(bytes / bandwidth, FLOPs / peak); "
                 f"{lq} new token{'s' if lq > 1 else ''} a step", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=150, format="png")
    plt.close(fig)


def write_rows(rows, title, path):
    """The rows as CSV, the title on its first line, so that --from_csv can redraw the figure without measuring."""
    with open(path, "w", newline="") as f:
        f.write(title.replace("\n", " | ") + "\n")
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_rows(path):
    """(rows, title) of a CSV write_rows wrote, its numbers parsed back."""
    with open(path, newline="") as f:
        title = f.readline().rstrip("\n").replace(" | ", "\n")
        rows = []
        for row in csv.DictReader(f):
            for key, value in row.items():
                if key == "double_heads":
                    row[key] = value == "True"
                elif key not in ("variant",) and not key.endswith("_bound"):
                    row[key] = float(value) if "." in value or "e" in value else int(value)
            rows.append(row)
    return rows, title


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=list(gla.VARIANTS), choices=gla.VARIANTS)
    p.add_argument("--heads", nargs="+", default=["baseline", "double"], choices=["baseline", "double"])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--lq", type=int, nargs="+", default=[1, 2], help="new tokens a step (<= kernels.MAX_LQ)")
    p.add_argument("--min_tokens", type=int, default=1024, help="smallest cached length S (then doubling)")
    p.add_argument("--max_tokens", type=int, default=32768, help="largest cached length S")
    p.add_argument("--repeats", type=int, default=5, help="interleaved timed calls per length (median)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice, all cores)")
    p.add_argument("--tp", type=int, default=1, help="time rank 0's shard of a tp-way tensor-parallel model")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                   help="cpu: this process's CPU seconds, for a machine shared with other work (needs --threads 1)")
    p.add_argument("--output", default="decode_speed.png", help="PNG to write, its rows in a CSV beside it")
    p.add_argument("--from_csv", help="redraw --output from the rows of an earlier run, measuring nothing")
    args = p.parse_args(argv)
    if args.from_csv:
        plot_rows(*read_rows(args.from_csv), args.output)
        print(f"wrote {args.output}")
        return 0
    for name in ("min_tokens", "repeats", "threads", "tp"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.max_tokens < args.min_tokens:
        p.error(f"--max_tokens {args.max_tokens} must be >= --min_tokens {args.min_tokens}")
    if min(args.batch) < 1 or not 1 <= min(args.lq) <= max(args.lq) <= kernels.MAX_LQ:
        p.error(f"--batch must be >= 1 and --lq in [1, {kernels.MAX_LQ}]")
    if os.path.splitext(args.output)[1].lower() != ".png":
        p.error(f"--output must end in .png, got {args.output!r}")
    if args.clock == "cpu" and (args.threads != 1 or args.device != "cpu"):
        p.error("--clock cpu times one thread on the CPU: add --threads 1 (and --device cpu)")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA GPU here")
    models = [(v, h == "double") for h in args.heads for v in args.variants]
    try:
        for variant, double_heads in models:
            layer_config(variant, double_heads, args.tp)
    except AssertionError as e:  # what gla cannot build, one line
        p.error(str(e))
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    seqlens = [args.min_tokens]
    while seqlens[-1] * 2 <= args.max_tokens:
        seqlens.append(seqlens[-1] * 2)
    elem = torch.empty(0, dtype=dtype).element_size()
    largest = max(step_cost(layer_config(v, h, args.tp), max(args.batch), max(args.lq), seqlens[-1], elem)[0]
                  for v, h in models)
    roofs = Roofs(device, dtype, largest, time.process_time if args.clock == "cpu" else time.perf_counter)
    where = machine(args.device)
    tp = f", TP-{args.tp}: rank 0's shard" if args.tp > 1 else ""
    print(f"Decode step of one layer at paper dims on {where}{tp}, {str(dtype).removeprefix('torch.')}; matmul peak "
          f"{roofs.peak / 1e9:.0f} GFLOP/s, read bandwidth {roofs.bandwidth(largest) / 1e9:.1f} GB/s over "
          f"{largest / 1e9:.2f} GB (each row's own below); median of {args.repeats} interleaved calls, "
          f"{'CPU' if args.clock == 'cpu' else 'wall'} time\n")
    print(TABLE_HEAD)
    rows = measure_rows(models, args.batch, args.lq, seqlens, args.repeats, args.tp, device, dtype, roofs)
    print("\nread bandwidth by size: " + ", ".join(f"{n / 1e6:g} MB {b / 1e9:.1f} GB/s"
                                                   for n, b in sorted(roofs.memo.items())))
    if device.type == "cpu" and 1 in args.lq:
        print("\nThe attention's matrix products alone at the step's few rows (products_seconds: the scores, each in "
              "its faster orientation, and P @ V; no softmax) against the cache's part of the step and its floor, "
              "Lq 1:\n")
        print("| model | B | S | products ms | cache part ms | cache floor ms | floor / products |")
        print("|---" * 7 + "|")
        for r in rows:
            if r["Lq"] == 1 and r["S"] in seqlens[-2:]:
                config = layer_config(r["variant"], r["double_heads"], args.tp)
                ms = products_seconds(config, r["B"], r["S"], args.repeats, dtype, roofs.clock) * 1e3
                print(f"| {model_label(r['variant'], r['double_heads'])} | {r['B']} | {r['S']} | {ms:.1f} | "
                      f"{r['cache_ms']:.1f} | {r['cache_floor_ms']:.1f} | {r['cache_floor_ms'] / ms:.0%} |",
                      flush=True)
    title = (f"One layer's decode attention over its cache at paper dims, against its floor\n{where}{tp}; matmul "
             f"peak {roofs.peak / 1e9:.0f} GFLOP/s (the best of 5 calls), read bandwidth measured at each size")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    plot_rows(rows, title, args.output)
    write_rows(rows, title, os.path.splitext(args.output)[0] + ".csv")
    print(f"wrote {args.output} and its rows, {os.path.splitext(args.output)[0]}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
