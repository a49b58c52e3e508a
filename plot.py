"""Plot the double-heads ablation: how much doubling the query heads helps.

For each attention variant (GQA, MLA, GLA-2) train.py trains a baseline and a
"double heads" model with twice the query heads (24 -> 48 at paper scale) and the
same KV cache (the extra attention parameters are taken from the MLP width). This script plots, per
variant, at equal training tokens t,

    dL(t) = L_val(baseline, t) - L_val(double heads, t)

on a symmetric-log y axis against training tokens; positive means doubling the
heads helped. The figure reproduces the double-heads ablation of Liu et al.,
"Multi-Head Low-Rank Attention", ICLR 2026 (arXiv 2603.02188); GLA is from
Zadouri, Strauss, Dao, "Hardware-Efficient Attention for Fast Decoding", 2025
(arXiv 2505.21487).

Seeds: train.py writes <out_dir>/<run>/seed<seed>/metrics.jsonl. We pair each
baseline seed with the double-heads run of the same seed (they saw the same data
in the same order, so its noise cancels in their difference), compute dL per
seed, and draw the mean over seeds with a band of +-1 standard error (with two
seeds that band is exactly their min-max). A run folder holding metrics.jsonl
directly (the layout before seeds) counts as one seed.

Usage: python plot.py [--out_dir out] [--output double_heads_ablation.png]
Reads the metrics.jsonl files (one JSON object per evaluation, with at least
`tokens` and `val_loss`). A relative --output is relative to the current
directory; a CSV of the plotted values (same stem, .csv) is written beside it.
Bad input gives a one-line error on stderr and exit status 2, and no output.

    python plot.py --roofline [--output decode_roofline.png]

draws instead the arithmetic intensity (FLOP per byte read) of one decode step of
each paper-scale design, on one device and per device under TP-2, against the
ridge points of an H100's and an H200's roofline (roofline_rows), and prints it.
"""
import argparse
import csv
import io
import json
import math
import os
import pathlib
import sys
import tempfile

import numpy as np

# (run name of the baseline, legend label, colour, (line width, marker size)), in the
# reference figure's order. Widths and sizes shrink down the list and later variants
# draw on top, so curves that coincide nest (a wide teal line around a narrower blue
# one, rings of markers) and every variant stays visible.
VARIANTS = [("gqa", "GQA", "teal", (3.4, 10)), ("mla", "MLA", "royalblue", (2.0, 6.5)),
            ("gla2", "GLA-2", "gray", (1.0, 3.5))]
DOUBLE_SUFFIX = "_double_heads"
SEED_PREFIX = "seed"
CSV_COLUMNS = ["variant", "tokens", "n_seeds", "val_loss_baseline", "val_loss_double_heads",
               "dL_mean", "dL_low", "dL_high"]  # then dL_seed<seed> per seed


class PlotError(Exception):
    """Bad input: main() prints it as one line and returns 2."""


def warn(msg):
    print(f"plot.py: {msg}", file=sys.stderr)


def load_run(path):
    """Evaluations of one run directory, as dicts sorted by `tokens`.

    A cut last line (a run killed mid-write) is skipped with a warning; invalid
    JSON on any other line raises PlotError naming the file and line. Points
    with a NaN/inf val_loss are dropped with a warning, and of several
    evaluations at the same token count we keep the last one written.
    """
    fname = os.path.join(path, "metrics.jsonl")
    try:
        with open(fname, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise PlotError(f"{fname}: not UTF-8 text ({e.reason})") from None
    lines = [(i, s) for i, s in enumerate(text.splitlines(), 1) if s.strip()]
    by_tokens, n_bad = {}, 0
    for k, (lineno, text) in enumerate(lines):
        try:
            rec = json.loads(text)
            tokens, loss = int(rec["tokens"]), float(rec["val_loss"])
            if not 0 <= tokens < 2**63:
                raise ValueError(f"tokens={tokens} out of range")
        except (ValueError, TypeError, KeyError, OverflowError) as e:
            if k == len(lines) - 1 and isinstance(e, json.JSONDecodeError):
                warn(f"warning: {fname} line {lineno} is cut off (killed run?); skipped")
                continue
            raise PlotError(f"{fname} line {lineno}: not a metrics record ({e})") from None
        if not math.isfinite(loss) or abs(loss) > 1e6:  # 1e308 - (-1e308) would overflow dL
            n_bad += 1
            continue
        by_tokens[tokens] = dict(rec, tokens=tokens, val_loss=loss)  # last one wins
    if n_bad:
        warn(f"warning: {path}: skipped {n_bad} evaluation(s) with NaN/inf or absurd val_loss")
    return [by_tokens[t] for t in sorted(by_tokens)]


def delta_loss(base, double):
    """dL at the token counts both runs evaluated at: (tokens, base_loss, double_loss, delta).

    We align on the intersection of the two token grids rather than interpolating:
    both runs share eval_interval and batch size, so their grids coincide and the
    intersection is simply the overlap of runs of different lengths, and every
    plotted value is a measured loss, never an invented one.
    """
    b = {r["tokens"]: r["val_loss"] for r in base}
    d = {r["tokens"]: r["val_loss"] for r in double}
    tokens = np.array(sorted(b.keys() & d.keys()), dtype=np.int64)
    bl = np.array([b[t] for t in tokens], dtype=float)
    dl = np.array([d[t] for t in tokens], dtype=float)
    return tokens, bl, dl, bl - dl


def seed_runs(out_dir, run_name):
    """{seed: run folder} of one run name: <out_dir>/<run>/seed<seed>/ with a
    metrics.jsonl, or {None: <out_dir>/<run>} for the single-seed layout."""
    path = os.path.join(out_dir, run_name)
    found = {}
    if os.path.isdir(path):
        for entry in os.listdir(path):
            tail = entry[len(SEED_PREFIX):]
            if entry.startswith(SEED_PREFIX) and tail.isdigit() and has_metrics(os.path.join(path, entry)):
                found[int(tail)] = os.path.join(path, entry)
    if not found and has_metrics(path):
        found[None] = path
    return dict(sorted(found.items()))


def has_metrics(path):
    return os.path.isfile(os.path.join(path, "metrics.jsonl"))


class Curve:
    """dL of one variant over its paired seeds, on the token counts every pair shares.

    tokens (n,) int64; delta (n_seeds, n) per-seed dL; seeds: their labels (None
    for the single-seed layout); base, double (n,) mean validation losses.
    mean, low, high: dL mean over seeds and its band, mean -+ one standard error
    (sample std / sqrt(n_seeds); with 2 seeds exactly their min and max; with 1
    seed no band).
    """

    def __init__(self, seeds, tokens, base, double, delta):
        self.seeds, self.tokens, self.base, self.double, self.delta = seeds, tokens, base, double, delta
        self.mean = delta.mean(axis=0)
        n = len(seeds)
        se = delta.std(axis=0, ddof=1) / math.sqrt(n) if n > 1 else np.zeros_like(self.mean)
        self.low, self.high = self.mean - se, self.mean + se


def paired_curve(label, base_runs, double_runs):
    """The Curve of a variant from {seed: folder} of its baseline and double-heads
    runs, or None (with a warning) if no seed pair shares an evaluation."""
    seeds = [s for s in base_runs if s in double_runs]
    for s in sorted(base_runs.keys() ^ double_runs.keys(), key=str):
        warn(f"note: {label}: seed {s} has only one of its two runs; left out")
    per_seed = {}
    for s in seeds:
        base, double = load_run(base_runs[s]), load_run(double_runs[s])
        tokens, bl, dl, _ = delta_loss(base, double)
        if len(tokens) < max(len(base), len(double)):
            warn(f"note: {label}{'' if s is None else f' seed {s}'}: runs differ in length ({len(base)} vs "
                 f"{len(double)} evaluations); using the {len(tokens)} in common")
        per_seed[s] = dict(zip(tokens.tolist(), zip(bl, dl)))
    common = sorted(set.intersection(*(set(p) for p in per_seed.values()))) if per_seed else []
    if not common:
        warn(f"warning: {label}: baseline and double heads share no evaluated token count; not plotted")
        return None
    if any(len(p) > len(common) for p in per_seed.values()):
        warn(f"note: {label}: seeds differ in their evaluations; plotting the {len(common)} token counts all share")
    losses = np.array([[per_seed[s][t] for t in common] for s in seeds])  # (n_seeds, n, 2)
    return Curve(seeds, np.array(common, dtype=np.int64), losses[..., 0].mean(axis=0),
                 losses[..., 1].mean(axis=0), losses[..., 0] - losses[..., 1])


def token_unit(max_tokens):
    for scale, unit in [(1e9, "B"), (1e6, "M"), (1e3, "K")]:
        if max_tokens >= scale:
            return scale, unit
    return 1.0, ""


def band_note(curves):
    """How the band was drawn, for the legend: +-1 s.e. over n seeds (2 seeds: min-max)."""
    counts = sorted({len(c.seeds) for c in curves.values()})
    if counts == [1]:
        return None
    n = "/".join(map(str, counts))
    return f"band: mean ± 1 s.e. over {n} seeds" + (" (2 seeds: min–max)" if 2 in counts else "")


def linear_band(curves):
    """symlog's linthresh: linear within it, log beyond. With seed bands, their median width rounded up to a power of
    ten: dL inside the seed noise is drawn linearly, so noise near zero cannot swing across decades of the axis.
    With one seed (no band), a power of ten at or below the smallest |mean dL|, at most 2 decades under the largest."""
    widths = np.concatenate([c.high - c.low for c in curves.values() if len(c.seeds) > 1] or [np.zeros(0)])
    if widths.size and np.median(widths) > 0:
        return 10 ** math.ceil(math.log10(np.median(widths)))
    top = max(max(np.abs(c.mean).max() for c in curves.values()), 1e-12)
    means = np.abs(np.concatenate([c.mean for c in curves.values()]))
    smallest = means[means > 0].min() if (means > 0).any() else top
    return 10 ** math.floor(math.log10(max(smallest, top * 1e-2)))


def plot(curves, colours, path):
    """Draw {label: Curve} on a symmetric log y axis and save a PNG to `path` (a file name or a binary file).

    dL can be negative at small scale, and a band can straddle zero, so a plain log axis (the reference figure's)
    cannot hold the data: we use symlog, linear within +-linear_band(curves). Every point keeps a marker; the dashed
    line at 0 separates "doubling helped" (above) from "doubling hurt" (below).
    """
    import matplotlib  # here, not at the top: train.py imports this module for atomic_write alone

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    values = np.concatenate([np.concatenate([c.mean, c.low, c.high]) for c in curves.values()])
    linthresh = linear_band(curves)
    scale, unit = token_unit(max(int(c.tokens.max()) for c in curves.values()))
    fig, ax = plt.subplots(figsize=(6.6, 4.6))
    ax.set_yscale("symlog", linthresh=linthresh, linscale=0.5)
    ax.axhline(0.0, color="black", lw=0.8, ls="--", zorder=1)
    for z, (label, c) in enumerate(curves.items()):
        colour, (width, size) = colours[label]
        x = c.tokens / scale
        name = label if len(c.seeds) == 1 else f"{label} ({len(c.seeds)} seeds)"
        ax.plot(x, c.mean, color=colour, lw=width, marker="o", ms=size, label=name, zorder=3 + z)
        if len(c.seeds) > 1:
            ax.fill_between(x, c.low, c.high, color=colour, alpha=0.18, lw=0, zorder=2)
    lo, hi = values.min(), values.max()
    # Headroom above for the top-left legend; below, at least the linear band so 0 shows.
    ax.set_ylim(min(-linthresh, lo * 1.5 if lo < 0 else -linthresh), max(hi, linthresh) * 30)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel(f"Training tokens ({unit})" if unit else "Training tokens")
    ax.set_ylabel("Loss difference (baseline − double heads)")
    ax.set_title("Double heads ablation")
    ax.grid(True, which="major", alpha=0.25)
    handles, _ = ax.get_legend_handles_labels()
    note = band_note(curves)
    if note:
        handles.append(Patch(color="gray", alpha=0.25, label=note))
    handles.append(Line2D([], [], color="black", lw=0.8, ls="--",
                          label=f"above 0: doubling helped (symlog: linear within ±{linthresh:g})"))
    ax.legend(handles=handles, loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=150, format="png")
    plt.close(fig)


def atomic_write(writers):
    """Write each file of {path: write(binary file)} under a temporary name in its folder and fsync it, then rename
    them all into place: a kill or an error leaves each file old or new, never half written, and an error while
    writing (a plot that raises, a full disk) replaces none of them. train.py writes its runs with it too."""
    tmp = {}
    try:
        for path, write in writers.items():
            path = pathlib.Path(path)
            fd, tmp[path] = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())  # on disk before it replaces the old file, even if the machine dies
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp[path], 0o666 & ~umask)  # mkstemp makes 0600; give the usual permissions
        for path, name in tmp.items():
            os.replace(name, path)
    finally:
        for name in tmp.values():
            if os.path.exists(name):
                os.remove(name)


def write_outputs(curves, colours, png_path, csv_path):
    """Write the PNG and the CSV of the curves, both or neither (atomic_write)."""
    all_seeds = sorted({s for c in curves.values() for s in c.seeds}, key=lambda s: -1 if s is None else s)
    rows = [CSV_COLUMNS + ["dL" if s is None else f"dL_seed{s}" for s in all_seeds]]
    for label, c in curves.items():
        for i, t in enumerate(c.tokens):
            per_seed = dict(zip(c.seeds, c.delta[:, i]))
            values = [c.base[i], c.double[i], c.mean[i], c.low[i], c.high[i]]
            rows.append([label, int(t), len(c.seeds)] + [repr(float(v)) for v in values]
                        + [repr(float(per_seed[s])) if s in per_seed else "" for s in all_seeds])
    text = io.StringIO()
    csv.writer(text).writerows(rows)
    os.makedirs(os.path.dirname(os.path.abspath(png_path)), exist_ok=True)
    atomic_write({png_path: lambda f: plot(curves, colours, f), csv_path: lambda f: f.write(text.getvalue().encode())})


# The decode roofline. A design's arithmetic intensity (Zadouri, Strauss, Dao 2025, arXiv 2505.21487, Sec. 3) is the
# kernel's FLOPs over the bytes it reads, kernels.call_flops / call_bytes, the formulas of bench/sm90.py's table; a
# GPU's ridge point is its tensor-core peak over its memory bandwidth: above it a step is compute-bound.
ROOFLINE_LQ = (1, 2, 4, 8, 16)
ROOFLINE_SEQLEN = 32768  # cached tokens: q, qv and the output add a few percent to the bytes at 8K, less beyond
ROOFLINE_TP = (1, 2)
H100_HBM_BYTES_PER_S = 3.35e12  # H100 SXM, NVIDIA's datasheet; the H200's 4.8 TB/s and both peaks are in kernels.py


def roofline_rows():
    """One decode step (batch 1, ROOFLINE_SEQLEN cached tokens, bf16) of each paper-scale design at each Lq of
    ROOFLINE_LQ, on each device under tp in ROOFLINE_TP (gla.tp_share: GQA's 6 KV heads split, MLA's latent
    duplicated, GLA-2's latent heads split): dicts of label, variant, tp, n_head and groups (KV or latent heads) per
    device, Lq, flops, bytes (the cache, q, qv and the output) and flop_per_byte."""
    import gla
    import kernels

    rows = []
    for variant, label, *_ in VARIANTS:
        for tp in ROOFLINE_TP:
            config = gla.tp_share(gla.make_config("paper", variant), 0, tp).config
            (Hk, Dk), (Hkv, Dv) = config.kv_cache_shapes
            has_qv = config.attn != "gqa"  # the latent designs' absorbed query
            for Lq in ROOFLINE_LQ:
                flops = kernels.call_flops(1, Lq, config.n_head, Dk, Dv, has_qv, ROOFLINE_SEQLEN)
                cache, io, _ = kernels.call_bytes(1, Lq, config.n_head, Hk, Hkv, Dk, Dv, has_qv, ROOFLINE_SEQLEN, 2, 1)
                rows.append(dict(label=label, variant=variant, tp=tp, n_head=config.n_head, groups=config.n_groups,
                                 Lq=Lq, flops=flops, bytes=cache + io, flop_per_byte=flops / (cache + io)))
    return rows


def ridges():
    """{label: FLOP per byte at which a step turns compute-bound} on an H100 and an H200 (SXM), at the dense bf16
    peak of wgmma and at mma.sync's (our kernel's tiles under 64 rows), from kernels.TENSOR_FLOPS_PER_S."""
    import kernels

    return {f"{gpu} ridge, {mma} ({name}) peak": kernels.TENSOR_FLOPS_PER_S[mma] / bandwidth
            for gpu, bandwidth in (("H100", H100_HBM_BYTES_PER_S), ("H200", kernels.HBM_BYTES_PER_S))
            for mma, name in (("HGMMA", "wgmma"), ("HMMA", "mma.sync"))}


def plot_roofline(rows, path):
    """Draw roofline_rows() against ridges(): FLOP per byte (log) over Lq (log 2), one line per design and
    tensor-parallel degree; save a PNG to path (a file name or a binary file)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {label: colour for _, label, colour, _ in VARIANTS}
    fig, ax = plt.subplots(figsize=(7.6, 5.4))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    for gpu_label, ridge in ridges().items():
        h100, wgmma = gpu_label.startswith("H100"), "wgmma" in gpu_label
        colour = "firebrick" if h100 else "black"
        below = h100 and not wgmma  # H100's 197 sits just under H200's 206: its label goes under its line
        ax.axhline(ridge, color=colour, lw=1.0, ls="-" if wgmma else ":", zorder=1)
        ax.annotate(f"{gpu_label}: {ridge:.0f} FLOP/byte", (ROOFLINE_LQ[0], ridge), xytext=(0, -2 if below else 2),
                    textcoords="offset points", fontsize=7, color=colour, va="top" if below else "bottom")
    for label in colours:
        for tp in ROOFLINE_TP:
            line = [r for r in rows if r["label"] == label and r["tp"] == tp]
            devices = "1 device" if tp == 1 else f"TP-{tp}, per device"
            ax.plot([r["Lq"] for r in line], [r["flop_per_byte"] for r in line], color=colours[label],
                    ls="-" if tp == 1 else "--", marker="o" if tp == 1 else "s", ms=5 if tp == 1 else 4, lw=1.6,
                    label=f"{label}, {devices}: {line[0]['n_head']} heads, {line[0]['groups']} "
                          f"{'KV' if line[0]['variant'] == 'gqa' else 'latent'} head"
                          f"{'s' if line[0]['groups'] > 1 else ''}", zorder=3)
    ax.set_xticks(ROOFLINE_LQ, [str(n) for n in ROOFLINE_LQ])
    ax.set_xlabel("new tokens per step, Lq (1: plain decoding; more: speculative drafts)")
    ax.set_ylabel("FLOP per byte read")
    ax.set_title(f"Decode at paper scale against the roofline (bf16, {ROOFLINE_SEQLEN // 1024}K cached tokens)",
                 fontsize=10)
    ax.text(0.99, 0.02, "above a ridge line: compute-bound on that GPU; below: memory-bound", fontsize=7,
            transform=ax.transAxes, ha="right", va="bottom")
    ax.grid(True, which="major", alpha=0.25)
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=150, format="png")
    plt.close(fig)


def run_roofline(output):
    """Write the roofline PNG to output (atomic_write) and print its numbers."""
    if os.path.splitext(output)[1].lower() != ".png":
        raise PlotError(f"--output must end in .png, got {output!r}")
    rows = roofline_rows()
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    atomic_write({output: lambda f: plot_roofline(rows, f)})
    print(f"wrote {output}\nFLOP per byte of one decode step, Lq {', '.join(map(str, ROOFLINE_LQ))}:")
    for r in rows[::len(ROOFLINE_LQ)]:
        same = [x["flop_per_byte"] for x in rows if (x["label"], x["tp"]) == (r["label"], r["tp"])]
        print(f"  {r['label']:<6} tp {r['tp']} ({r['n_head']:>2} heads): " + " ".join(f"{v:6.1f}" for v in same))
    for label, ridge in ridges().items():
        print(f"  {label}: {ridge:.0f}")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out_dir", default="out", help="folder holding one subfolder per run")
    p.add_argument("--output", help="PNG to write (relative to the current directory; default "
                   "double_heads_ablation.png, with a CSV beside it, or decode_roofline.png with --roofline)")
    p.add_argument("--roofline", action="store_true", help="draw the decode roofline of the paper-scale designs "
                   "instead (no runs needed)")
    args = p.parse_args(argv)
    try:
        if args.roofline:
            return run_roofline(args.output or "decode_roofline.png")
        return run(args.out_dir, args.output or "double_heads_ablation.png")
    except (PlotError, OSError) as e:
        print(f"plot.py: error: {e}", file=sys.stderr)
        return 2


def run(out_dir, output):
    stem, ext = os.path.splitext(output)
    if ext.lower() != ".png":
        raise PlotError(f"--output must end in .png, got {output!r}")
    if not os.path.isdir(out_dir):
        raise PlotError(f"--out_dir {out_dir!r} is not a directory")
    found = {name: (seed_runs(out_dir, name), seed_runs(out_dir, name + DOUBLE_SUFFIX)) for name, *_ in VARIANTS}
    if not any(base and double for base, double in found.values()):
        raise PlotError(f"no variant in {out_dir!r} has both its baseline and {DOUBLE_SUFFIX} run "
                        "(each needs <run>/seed<seed>/metrics.jsonl)")
    curves, colours = {}, {}
    for name, label, colour, size in VARIANTS:
        base, double = found[name]
        for run_name, runs in ((name, base), (name + DOUBLE_SUFFIX, double)):
            if not runs:
                warn(f"missing run {os.path.join(out_dir, run_name)} (no metrics.jsonl); {label} is not plotted")
        if base and double:
            curve = paired_curve(label, base, double)
            if curve is not None:
                curves[label], colours[label] = curve, (colour, size)
    if not curves:
        raise PlotError("no variant has any evaluation usable in both runs")
    csv_path = stem + ".csv"
    write_outputs(curves, colours, output, csv_path)
    print(f"wrote {output} and {csv_path}")
    print(f"{'variant':<8}{'seeds':>6}{'points':>8}{'last tokens':>14}{'final dL (mean, band)':>34}"
          f"{'mean dL, last 1/4':>19}")
    for label, c in curves.items():
        last_quarter = c.tokens >= c.tokens[0] + 0.75 * (c.tokens[-1] - c.tokens[0])
        final = f"{c.mean[-1]:+.5f} [{c.low[-1]:+.5f}, {c.high[-1]:+.5f}]"
        print(f"{label:<8}{len(c.seeds):>6}{len(c.tokens):>8}{int(c.tokens[-1]):>14,}{final:>34}"
              f"{c.mean[last_quarter].mean():>+19.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
