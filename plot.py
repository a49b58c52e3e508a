"""Plot the double-heads ablation of Liu et al., "Multi-Head Low-Rank Attention", ICLR 2026 (arXiv 2603.02188).

For each variant train.py trains a baseline and a model with twice the query heads (same KV cache and parameters).
At equal training tokens t, dL(t) = L_val(baseline, t) - L_val(double heads, t): above zero, doubling the heads
helped. Each baseline run <out_dir>/<run>/seed<seed>/ is paired with the double-heads run of its seed: both read the
same batches, so part of the data's noise cancels in their difference. The figure draws each pair's dL and their
mean, with the final dL's 95% t interval in its legend; a CSV of the values is written beside it.
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

VARIANTS = ("gqa", "mla", "gla2")  # gla.VARIANTS (we do not import gla: it needs torch)
# Baseline run name: (label, colour, (mean line width, marker size)), the paper's colours. The widths shrink in
# VARIANTS' order and later variants draw on top, so curves that coincide nest and each stays visible.
STYLE = {
    "gqa": ("GQA", "teal", (3.6, 9)),
    "mla": ("MLA", "royalblue", (2.4, 6)),
    "gla2": ("GLA-2", "gray", (1.4, 3.5)),
}
LABEL_STYLE = {label: (colour, size) for label, colour, size in STYLE.values()}
DOUBLE_SUFFIX = "_double_heads"
CSV_COLUMNS = ["variant", "tokens", "n_seeds", "unit", "setting", "val_loss_baseline", "val_loss_double_heads",
               "dL_mean", "dL_ci95_low", "dL_ci95_high"]  # then dL_seed<seed> per seed

# The fields the two arms of a pair differ in: doubling n_head, the width rule shrinks ffn_hidden.
ARMS_MAY_DIFFER = ("n_head", "ffn_hidden")

# The paper's dL over training: +0.002 to +0.01 nats per GPT-2 token for every variant (Liu et al. 2026). On bytes the
# band is converted at 4.35 bytes a GPT-2 token (one English text's; FineWeb-Edu's not measured).
PAPER_DL_PER_TOKEN = (0.002, 0.01)
BYTES_PER_GPT2_TOKEN = 4.35
# t(0.975, df), the two-sided 95% quantile of Student's t for df 1-30 (n_seeds - 1), as in the standard tables
# (NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2).
T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
        2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
        2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)


def t975(df):
    """t(0.975, df) for df >= 1; beyond the table, df 30's: an interval a little too wide, never too narrow."""
    return T975[min(df, len(T975)) - 1]


def ci95(values):
    """(mean, low, high) over axis 0 of `values`: the mean and its 95% t interval, mean -+ t975(n - 1) s / sqrt(n)
    (s: the sample standard deviation); NaN bounds for one value."""
    values = np.asarray(values, dtype=float)
    mean = values.mean(axis=0)
    if len(values) < 2:
        return mean, mean * np.nan, mean * np.nan
    half = t975(len(values) - 1) * values.std(axis=0, ddof=1) / math.sqrt(len(values))
    return mean, mean - half, mean + half


class Curve:
    """dL of one variant: delta (n_seeds, n), each seed's dL at tokens (n,); base, double: the mean validation losses;
    mean, low, high: dL's mean and its 95% t interval."""

    def __init__(self, seeds, tokens, base, double, delta):
        self.seeds = list(seeds)
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.base = np.asarray(base, dtype=float)
        self.double = np.asarray(double, dtype=float)
        self.delta = np.asarray(delta, dtype=float)
        self.mean, self.low, self.high = ci95(self.delta)


def read_run(folder):
    """(config.json as a dict, {training tokens: validation loss}) of a run folder of train.py."""
    config = json.loads((folder / "config.json").read_text())
    losses = {}
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        losses[row["tokens"]] = row["val_loss"]
    return config, losses


def arms_differ(a, b):
    """The first "part.key: value in a vs value in b" where the config.json of a pair's two runs differ in more than
    doubling the heads changes (ARMS_MAY_DIFFER, and the data's source: a path), or None."""
    for part in ("data", "model", "train"):
        for key in sorted(a[part].keys() | b[part].keys()):
            may_differ = key == "source" if part == "data" else part == "model" and key in ARMS_MAY_DIFFER
            if not may_differ and a[part].get(key) != b[part].get(key):
                return f"{part}.{key}: {a[part].get(key)} vs {b[part].get(key)}"
    return None


def setting_text(config):
    """The setting a figure's title names, from a baseline's config.json."""
    m, t = config["model"], config["train"]
    return (f"preset {t['preset']}, width {m['n_embd']}, {m['n_head']} and {2 * m['n_head']} query heads, "
            f"{t['max_iters']:,} steps, lr {t['learning_rate']:g} (warm-up {t['warmup_iters']}), {t['init']} init")


def curves_from_runs(out_dir):
    """({label: Curve}, unit, setting) of the runs in out_dir, each baseline seed paired with its double-heads seed.
    A seed is left out, in one line, when a run of its pair cannot be read, the two share no evaluation, or they
    differ in more than doubling the heads changes. The first pair's setting names the figure's."""
    curves = {}
    reference = None  # the figure's setting: its first pair's baseline config
    for name in VARIANTS:
        label = STYLE[name][0]
        pairs = []  # (seed, {tokens: (baseline loss, double-heads loss)})
        seeds = sorted(int(d.name[4:]) for d in pathlib.Path(out_dir, name).glob("seed*") if d.name[4:].isdecimal())
        for seed in seeds:
            base_dir = pathlib.Path(out_dir, name, f"seed{seed}")
            double_dir = pathlib.Path(out_dir, name + DOUBLE_SUFFIX, base_dir.name)
            try:
                config, base = read_run(base_dir)
                twin, double = read_run(double_dir)
                shared = {t: (base[t], double[t]) for t in base.keys() & double.keys()}
                why = arms_differ(config, twin) or ("" if shared else "its two runs share no evaluation yet")
                unit = "nats/byte" if config["data"]["tokenizer"] == "bytes" else "nats/token"
            except (OSError, ValueError, LookupError, TypeError, AttributeError) as e:  # missing, cut, not train.py's
                why = f"{type(e).__name__}: {e}"
            if why:
                print(f"plot.py: note: {label} {base_dir.name} left out: {why}", file=sys.stderr)
                continue
            if reference is None:
                reference = config
                figure_unit = unit
            pairs.append((seed, shared))
        tokens = sorted(set.intersection(*(set(losses) for _, losses in pairs))) if pairs else []
        if tokens:  # the evaluations every pair has
            losses = np.array([[losses[t] for t in tokens] for _, losses in pairs])  # (n_seeds, n, 2)
            curves[label] = Curve([seed for seed, _ in pairs], tokens, losses[..., 0].mean(0), losses[..., 1].mean(0),
                                  losses[..., 0] - losses[..., 1])
    if not curves:
        raise SystemExit(f"plot.py: no seed in {out_dir!r} has a baseline and a {DOUBLE_SUFFIX} run that pair up")
    return curves, figure_unit, setting_text(reference)


def paper_range(unit):
    """The paper's dL over training (PAPER_DL_PER_TOKEN) in `unit`, and its label for the legend."""
    lo, hi = PAPER_DL_PER_TOKEN
    if unit == "nats/token":
        return (lo, hi), f"paper, over training: +{lo:g} to +{hi:g} nats/GPT-2 token"
    lo_b, hi_b = lo / BYTES_PER_GPT2_TOKEN, hi / BYTES_PER_GPT2_TOKEN
    return (lo_b, hi_b), (f"paper, over training: +{lo:g} to +{hi:g} nats/GPT-2 token\n(= +{lo_b:.2g} to "
                          f"+{hi_b:.2g} nats/byte at {BYTES_PER_GPT2_TOKEN:g} bytes a token of English prose)")


def variant_label(label, curve):
    """The legend's line for one variant: its seeds and final dL, with its 95% t interval from two seeds on."""
    n = len(curve.seeds)
    if n == 1:
        return f"{label} (1 seed): final {curve.mean[-1]:+.4f}"
    return (f"{label} ({n} seeds): final {curve.mean[-1]:+.4f}, 95% t interval [{curve.low[-1]:+.4f}, "
            f"{curve.high[-1]:+.4f}]")


def plot(curves, unit, setting, path):
    """Draw {label: Curve} as a PNG into `path` (a file name or a binary file): each variant's dL over training, the
    mean over seeds and each seed's; the legend gives the final dL and its 95% t interval."""
    import matplotlib  # here, not at the top: a bad --out_dir fails fast

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    paper, paper_text = paper_range(unit)
    most = max(int(c.tokens.max()) for c in curves.values())
    scale, scale_name = (1e9, "billions") if most >= 1e9 else (1e6, "millions")  # the paper's runs: 98B tokens
    fig, ax = plt.subplots(figsize=(11, 6))
    # The band's edge keeps it visible where the axis is so tall that the band is thinner than a pixel; the zero line,
    # dashed, shows through it there.
    ax.axhspan(*paper, facecolor=(1, 0.65, 0, 0.35), edgecolor="darkorange", lw=1.2, zorder=0)
    ax.axhline(0.0, color="black", lw=0.9, ls="--", zorder=1)
    ax.grid(True, alpha=0.3)
    handles = []
    for k, (label, c) in enumerate(curves.items()):
        colour, (width, size) = LABEL_STYLE[label]
        if len(c.seeds) > 1:
            for row in c.delta:
                ax.plot(c.tokens / scale, row, color=colour, lw=0.9, ls=":", zorder=2)
        ax.plot(c.tokens / scale, c.mean, color=colour, lw=width, marker="o", ms=size, zorder=3 + k)
        handles.append(Line2D([], [], color=colour, lw=width, marker="o", ms=size, label=variant_label(label, c)))
    ax.set_xlabel(f"training tokens ({scale_name})")
    ax.set_ylabel(f"dL = L(baseline) − L(double heads), {unit}")
    handles += [
        Line2D([], [], color="gray", lw=0.9, ls=":", label="dotted: each seed; thick: their mean"),
        Line2D([], [], color="black", lw=0.9, ls="--", label="0: above it, doubling the heads helped"),
        Patch(facecolor=(1, 0.65, 0, 0.35), edgecolor="darkorange", lw=1.2, label=paper_text),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8.5, frameon=False)
    seeds = ", ".join(str(s) for s in sorted({s for c in curves.values() for s in c.seeds}))
    title = "Double-heads ablation (Liu et al. 2026): dL = L(baseline) − L(double heads) at equal training tokens"
    fig.suptitle(f"{title}\n{setting}; seeds {seeds}", fontsize=10)
    fig.tight_layout(rect=(0, 0.15, 1, 1))
    fig.savefig(path, dpi=150, format="png")
    plt.close(fig)


def csv_text(curves, unit, setting):
    """The CSV of the curves: CSV_COLUMNS (the interval empty with one seed), then each seed's dL, dL_seed<seed>
    (empty where that seed is not in a variant)."""
    all_seeds = sorted({s for c in curves.values() for s in c.seeds})
    rows = [CSV_COLUMNS + [f"dL_seed{s}" for s in all_seeds]]
    for label, c in curves.items():
        for i, t in enumerate(c.tokens):
            per_seed = dict(zip(c.seeds, c.delta[:, i]))
            values = [c.base[i], c.double[i], c.mean[i], c.low[i], c.high[i]]
            row = [label, int(t), len(c.seeds), unit, setting]
            row += ["" if math.isnan(v) else repr(float(v)) for v in values]
            row += [repr(float(per_seed[s])) if s in per_seed else "" for s in all_seeds]
            rows.append(row)
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    return text.getvalue()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out_dir", default="out")
    p.add_argument("--output", default="double_heads_ablation.png", help="the PNG; its CSV goes beside it")
    args = p.parse_args(argv)
    curves, unit, setting = curves_from_runs(args.out_dir)
    # Both drawn before either is written: a failure leaves neither.
    table = csv_text(curves, unit, setting)
    png = io.BytesIO()
    plot(curves, unit, setting, png)
    csv_path = os.path.splitext(args.output)[0] + ".csv"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        pathlib.Path(csv_path).write_bytes(table.encode())
        pathlib.Path(args.output).write_bytes(png.getvalue())
    except OSError as e:
        raise SystemExit(f"plot.py: {e}") from None
    print(f"wrote {args.output} and {csv_path}")


if __name__ == "__main__":
    main()
