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
seeds that band is exactly their min-max).

Usage: python plot.py [--out_dir out] [--output double_heads_ablation.png]
Reads the metrics.jsonl files (one JSON object per evaluation, with at least
`tokens` and `val_loss`). A relative --output is relative to the current
directory; a CSV of the plotted values (same stem, .csv) is written beside it.
Bad input gives a one-line error on stderr and exit status 2, and no output.
"""
import argparse
import csv
import io
import json
import math
import os
import pathlib
import sys

import numpy as np

from harness.files import atomic_write

# The variants, in gla.py's order (we do not import gla: it needs torch).
VARIANTS = ("gqa", "mla", "gla2")
# run name of the baseline: (legend label, colour, (line width, marker size)), the reference figure's colours.
# Widths and sizes shrink in VARIANTS' order and later variants draw on top, so curves that coincide nest (a wide
# teal line around a narrower blue one, rings of markers) and every variant stays visible.
STYLE = {"gqa": ("GQA", "teal", (3.4, 10)), "mla": ("MLA", "royalblue", (2.0, 6.5)),
         "gla2": ("GLA-2", "gray", (1.0, 3.5))}
DOUBLE_SUFFIX = "_double_heads"
SEED_PREFIX = "seed"
CSV_COLUMNS = ["variant", "tokens", "n_seeds", "val_loss_baseline", "val_loss_double_heads",
               "dL_mean", "dL_low", "dL_high"]  # then dL_seed<seed> per seed


class PlotError(Exception):
    """Bad input: main() prints it as one line and returns 2."""


def warn(msg):
    print(f"plot.py: {msg}", file=sys.stderr)


def read_evaluations(path):
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
    """{seed: run folder} of one run name: each <out_dir>/<run>/seed<seed>/ with a metrics.jsonl."""
    path = os.path.join(out_dir, run_name)
    found = {}
    if os.path.isdir(path):
        for entry in os.listdir(path):
            tail = entry[len(SEED_PREFIX):]
            if entry.startswith(SEED_PREFIX) and tail.isdigit() and has_metrics(os.path.join(path, entry)):
                found[int(tail)] = os.path.join(path, entry)
    return dict(sorted(found.items()))


def has_metrics(path):
    return os.path.isfile(os.path.join(path, "metrics.jsonl"))


class Curve:
    """dL of one variant over its paired seeds, on the token counts every pair shares.

    tokens (n,) int64; delta (n_seeds, n) per-seed dL; seeds: their numbers;
    base, double (n,) mean validation losses.
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
    for s in sorted(base_runs.keys() ^ double_runs.keys()):
        warn(f"note: {label}: seed {s} has only one of its two runs; left out")
    per_seed = {}
    for s in seeds:
        base, double = read_evaluations(base_runs[s]), read_evaluations(double_runs[s])
        tokens, bl, dl, _ = delta_loss(base, double)
        if len(tokens) < max(len(base), len(double)):
            warn(f"note: {label} seed {s}: runs differ in length ({len(base)} vs "
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
    import matplotlib  # here, not at the top: a bad --out_dir fails fast

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


def write_outputs(curves, colours, png_path, csv_path):
    """Write the PNG and the CSV of the curves, both or neither (atomic_write)."""
    all_seeds = sorted({s for c in curves.values() for s in c.seeds})
    rows = [CSV_COLUMNS + [f"dL_seed{s}" for s in all_seeds]]
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out_dir", default="out", help="folder holding one subfolder per run")
    p.add_argument("--output", help="PNG to write (relative to the current directory; default "
                   "double_heads_ablation.png, with a CSV beside it)")
    args = p.parse_args(argv)
    try:
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
    found = {name: (seed_runs(out_dir, name), seed_runs(out_dir, name + DOUBLE_SUFFIX)) for name in VARIANTS}
    if not any(base and double for base, double in found.values()):
        raise PlotError(f"no variant in {out_dir!r} has both its baseline and {DOUBLE_SUFFIX} run "
                        "(each needs <run>/seed<seed>/metrics.jsonl)")
    curves, colours = {}, {}
    for name in VARIANTS:
        label, colour, size = STYLE[name]
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
