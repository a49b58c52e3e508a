"""Plot the double-heads ablation: how much doubling the query heads helps.

For each attention variant (GQA, MLA, GLA-2) train.py trains a baseline and a
"double heads" model with twice the query heads (24 -> 48 at paper scale) and the
same KV cache (the extra attention parameters are taken from the MLP width). This script plots, per
variant, at equal training tokens t,

    dL(t) = L_val(baseline, t) - L_val(double heads, t)

on a log y axis against training tokens; positive means doubling the heads
helped. The figure reproduces the double-heads ablation of Liu et al.,
"Multi-Head Low-Rank Attention", ICLR 2026 (arXiv 2603.02188); GLA is from
Zadouri, Strauss, Dao, "Hardware-Efficient Attention for Fast Decoding", 2025
(arXiv 2505.21487).

Usage: python plot.py [--out_dir out] [--output double_heads_ablation.png]
Reads <out_dir>/<run>/metrics.jsonl (one JSON object per evaluation, with at
least `tokens` and `val_loss`). A relative --output is relative to the current
directory; a CSV of the plotted values (same stem, .csv) is written beside it.
Bad input gives a one-line error on stderr and exit status 2, and no output.
"""
import argparse
import csv
import json
import math
import os
import sys
import tempfile

import matplotlib
matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

# (run name of the baseline, legend label, colour), in the reference figure's order.
VARIANTS = [("gqa", "GQA", "teal"), ("mla", "MLA", "royalblue"), ("gla2", "GLA-2", "gray")]
DOUBLE_SUFFIX = "_double_heads"
CSV_COLUMNS = ["variant", "tokens", "val_loss_baseline", "val_loss_double_heads", "delta_loss"]


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


def token_unit(max_tokens):
    for scale, unit in [(1e9, "B"), (1e6, "M"), (1e3, "K")]:
        if max_tokens >= scale:
            return scale, unit
    return 1.0, ""


def plot(curves, path):
    """Draw {label: (colour, tokens, delta)} on a log y axis and save a PNG to `path`.

    A log axis cannot hold dL <= 0, yet those points must be seen. We keep the log
    axis of the reference figure (it is what makes 0.002 vs 0.008 readable) and
    plot |dL| instead, marking dL < 0 with a hollow circle; dL == 0 is drawn at a
    floor (half the smallest |dL| on the plot) with a hollow triangle. symlog would
    also work but needs a linear band around zero that flattens exactly the small
    positive values the figure is about.
    """
    mags = np.concatenate([np.abs(d) for _, _, d in curves.values()])
    floor = mags[mags > 0].min() / 2 if (mags > 0).any() else 1e-6
    scale, unit = token_unit(max(int(t.max()) for _, t, _ in curves.values()))
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    extra = {}
    for label, (colour, tokens, delta) in curves.items():
        x, y = tokens / scale, np.where(delta == 0, floor, np.abs(delta))
        ax.plot(x, y, color=colour, lw=1.6, label=label)
        # Every point gets a marker: filled where doubling the heads helped, hollow where not.
        for mask, marker, ms, filled, note in [(delta > 0, "o", 4, True, "filled: dL > 0"),
                                               (delta < 0, "o", 7, False, "hollow: dL < 0, |dL| shown"),
                                               (delta == 0, "v", 7, False, "hollow: dL = 0, drawn at floor")]:
            if mask.any():
                ax.plot(x[mask], y[mask], ls="none", marker=marker, ms=ms, mfc=colour if filled else "white",
                        mec=colour, mew=1.5, zorder=3)
                extra[note] = (marker, ms, "black" if filled else "white")
    ax.set_yscale("log")
    # The paper's figure spans about a decade (0.002-0.01) and labels 0.002, 0.004,
    # ...; we label the same minor ticks when the data span is that narrow (every
    # minor tick when narrower still), and the decades alone when it is wider.
    y_all = np.where(mags == 0, floor, mags)
    lo, hi = y_all.min(), y_all.max()
    span = max(hi / lo, 2.0)  # a single point or a flat curve still gets a range
    keep = range(1, 10) if span < 3 else (2, 4, 6, 8) if span < 30 else ()
    minor = FuncFormatter(lambda v, _: f"{v:g}" if round(v / 10 ** math.floor(
        math.log10(v) + 1e-9)) in keep else "")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(minor)
    # Headroom above the curves so the top-left legend does not cover their start.
    ax.set_ylim(lo / span ** 0.1, hi * span ** (0.35 + 0.15 * len(extra)))
    ax.set_xlabel(f"Training tokens ({unit})" if unit else "Training tokens")
    ax.set_ylabel("Loss difference (baseline - double heads, nats)")
    ax.set_title("Double heads ablation")
    ax.grid(True, which="both", alpha=0.25)
    # One legend, top left as in the paper, with the key to the hollow markers
    # appended: a second box would sit on top of some curve's points.
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], ls="none", marker=m, ms=ms, mfc=fill, mec="black", label=n)
                for n, (m, ms, fill) in extra.items()]
    ax.legend(handles=handles, loc="upper left", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=150, format="png")
    plt.close(fig)


def write_outputs(curves, losses, png_path, csv_path):
    """Write PNG and CSV under temporary names in their folder, then rename both,
    so an interrupted or failing run never leaves a half-written file behind."""
    folder = os.path.dirname(os.path.abspath(png_path))
    os.makedirs(folder, exist_ok=True)
    tmp = []
    try:
        for suffix in (".png", ".csv"):
            fd, name = tempfile.mkstemp(suffix=suffix, prefix=".plot-", dir=folder)
            os.close(fd)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(name, 0o666 & ~umask)  # mkstemp makes 0600; give the usual permissions
            tmp.append(name)
        plot(curves, tmp[0])
        with open(tmp[1], "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(CSV_COLUMNS)
            for label, (_, tokens, delta) in curves.items():
                bl, dl = losses[label]
                for row in zip(tokens, bl, dl, delta):
                    w.writerow([label, int(row[0])] + [repr(float(v)) for v in row[1:]])
        os.replace(tmp[0], png_path)
        os.replace(tmp[1], csv_path)
    finally:
        for name in tmp:
            if os.path.exists(name):
                os.remove(name)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out_dir", default="out", help="folder holding one subfolder per run")
    p.add_argument("--output", default="double_heads_ablation.png",
                   help="PNG to write (relative to the current directory); CSV beside it")
    args = p.parse_args(argv)
    try:
        return run(args.out_dir, args.output)
    except (PlotError, OSError) as e:
        print(f"plot.py: error: {e}", file=sys.stderr)
        return 2


def run(out_dir, output):
    stem, ext = os.path.splitext(output)
    if ext.lower() != ".png":
        raise PlotError(f"--output must end in .png, got {output!r}")
    if not os.path.isdir(out_dir):
        raise PlotError(f"--out_dir {out_dir!r} is not a directory")

    def has(run_name):
        return os.path.isfile(os.path.join(out_dir, run_name, "metrics.jsonl"))

    complete = [v for v in VARIANTS if has(v[0]) and has(v[0] + DOUBLE_SUFFIX)]
    if not complete:
        raise PlotError(f"no variant in {out_dir!r} has both its baseline and "
                        f"{DOUBLE_SUFFIX} run (each needs <run>/metrics.jsonl)")
    for name, label, _ in VARIANTS:
        for run_name in (name, name + DOUBLE_SUFFIX):
            if not has(run_name):
                warn(f"missing run {os.path.join(out_dir, run_name)} "
                     f"(no metrics.jsonl); {label} is not plotted")
    curves, losses = {}, {}
    for name, label, colour in complete:
        base = load_run(os.path.join(out_dir, name))
        double = load_run(os.path.join(out_dir, name + DOUBLE_SUFFIX))
        tokens, bl, dl, delta = delta_loss(base, double)
        if len(tokens) == 0:
            warn(f"warning: {label}: baseline and double heads share no evaluated "
                 "token count; not plotted")
            continue
        if len(tokens) < max(len(base), len(double)):
            warn(f"note: {label}: runs differ in length ({len(base)} vs {len(double)} "
                 f"evaluations); plotting the {len(tokens)} in common")
        curves[label], losses[label] = (colour, tokens, delta), (bl, dl)
    if not curves:
        raise PlotError("no variant has any evaluation usable in both runs")
    csv_path = stem + ".csv"
    write_outputs(curves, losses, output, csv_path)
    print(f"wrote {output} and {csv_path}")
    print(f"{'variant':<8}{'points':>8}{'last tokens':>18}{'final dL':>11}"
          f"{'mean dL, last 1/4':>19}")
    for label, (_, tokens, delta) in curves.items():
        last_quarter = tokens >= tokens[0] + 0.75 * (tokens[-1] - tokens[0])
        print(f"{label:<8}{len(tokens):>8}{int(tokens[-1]):>18,}{delta[-1]:>11.5f}"
              f"{delta[last_quarter].mean():>19.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
