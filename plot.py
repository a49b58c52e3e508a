"""Plot the double-heads ablation: how much doubling the query heads helps.

For each attention variant (GQA, MLA, GLA-2) train.py trains a baseline and a "double heads" model with twice the
query heads and the same KV cache (the extra attention parameters are taken from the MLP width). At equal training
tokens t,

    dL(t) = L_val(baseline, t) - L_val(double heads, t)

and above zero, doubling the heads helped. The figure redraws the double-heads ablation of Liu et al., "Multi-Head
Low-Rank Attention", ICLR 2026 (arXiv 2603.02188); GLA is from Zadouri, Strauss, Dao, "Hardware-Efficient Attention
for Fast Decoding", 2025 (arXiv 2505.21487).

Seeds: train.py writes <out_dir>/<run>/seed<seed>/ (config.json, metrics.jsonl). A baseline seed is paired with the
double-heads run of the same seed: both read the same data in the same order, so the data's noise cancels in their
difference. The figure draws each pair's dL, their mean and its 95% t interval. A seed is left out, in one line, when
one of its two runs (or its config.json) is missing, the two differ in more than doubling the heads changes, its
setting is not that of the figure's other pairs, or it is still training.

Usage: python plot.py [--out_dir out] [--output double_heads_ablation.png]
The CSV of the plotted values (each seed's dL and the setting) is written beside the PNG with the PNG's stem;
bench/replot.py redraws the figure from it. Bad input: one line on stderr, exit status 2, nothing written.
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

# The variants, in gla.py's order (we do not import gla: it needs torch).
VARIANTS = ("gqa", "mla", "gla2")
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

# The model fields the two arms of a pair differ in: make_config(..., double_heads=True) doubles n_head, and the width
# rule shrinks ffn_hidden to keep the parameters equal.
ARMS_MAY_DIFFER = ("n_head", "ffn_hidden")
# The model's size, which all pairs of a figure share (the attention's own fields differ by variant); n_head is the
# baseline's.
SIZE_KEYS = ("vocab_size", "block_size", "n_layer", "n_embd", "n_head", "rope_theta", "norm_eps", "init_std")

# The paper's dL over training: every variant between about +0.002 and +0.01 nats per GPT-2 token (Liu et al. 2026,
# the double-heads ablation figure). train.py's default data is bytes (vocabulary 256), its loss in nats per byte, so
# the band is converted at BYTES_PER_GPT2_TOKEN: a conversion, not a measurement on the paper's data. 4.35 is what
# GPT-2's tokenizer gives on one English text, the GPL-3 license (docs/results.md, Units); this repository's default
# corpus, Python's documentation, gives 3.52 bytes a token (a band 24% higher).
PAPER_DL_PER_TOKEN = (0.002, 0.01)
BYTES_PER_GPT2_TOKEN = 4.35
# t(0.975, df), the two-sided 95% quantile of Student's t for df 1-30 (n_seeds - 1), to 4 decimals, as in the standard
# tables (NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2); the tests check them against the t density.
T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
        2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
        2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)


class PlotError(Exception):
    """Bad input: main() prints it as one line and returns 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors raise PlotError (one line, exit status 2) instead of printing its usage block."""

    def error(self, message):
        raise PlotError(message)


def note(label, seed, why):
    """Say on stderr that a seed of a variant is left out of the figure, and why."""
    print(f"plot.py: note: {label} seed {seed}: left out: {why}", file=sys.stderr)


def t975(df):
    """t(0.975, df) for df >= 1. Beyond the table (more than 31 seeds) the df-30 value, at most 4% above the true
    one (1.96 at infinite df): the interval is then slightly wider than it need be, never narrower."""
    assert df >= 1, df
    return T975[min(df, len(T975)) - 1]


def ci95(values):
    """(mean, low, high) over axis 0 of `values`: the mean and its 95% t interval, mean -+ t975(n - 1) s / sqrt(n)
    with s the sample standard deviation; with one value low and high are NaN."""
    values = np.asarray(values, dtype=float)
    mean = values.mean(axis=0)
    if len(values) < 2:
        return mean, mean * np.nan, mean * np.nan
    half = t975(len(values) - 1) * values.std(axis=0, ddof=1) / math.sqrt(len(values))
    return mean, mean - half, mean + half


class Curve:
    """dL of one variant over its paired seeds. tokens (n,) int64; delta (n_seeds, n): each seed's dL; base, double
    (n,): the mean validation losses; mean, low, high (n,): dL's mean over seeds and its 95% t interval."""

    def __init__(self, seeds, tokens, base, double, delta):
        self.seeds = list(seeds)
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.base = np.asarray(base, dtype=float)
        self.double = np.asarray(double, dtype=float)
        self.delta = np.asarray(delta, dtype=float)
        self.mean, self.low, self.high = ci95(self.delta)


def read_losses(folder):
    """{tokens: val_loss} of a run folder's metrics.jsonl, one evaluation a line. Raises PlotError for a line that is
    not one, or a loss that is not finite."""
    path = os.path.join(folder, "metrics.jsonl")
    losses = {}
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            try:
                row = json.loads(line)
                tokens = int(row["tokens"])
                losses[tokens] = float(row["val_loss"])
            except (KeyError, TypeError, ValueError) as e:  # json.JSONDecodeError is a ValueError
                raise PlotError(f"{path} line {i}: not an evaluation ({e})") from None
            if not math.isfinite(losses[tokens]):
                raise PlotError(f"{path} line {i}: val_loss {losses[tokens]}: the run diverged")
    return losses


def read_config(folder):
    """A run folder's config.json ({"model", "train", "data"}: dicts, with the fields the title names), or None when
    it is missing or not train.py's."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        if not all(isinstance(config[part], dict) for part in ("model", "train", "data")):
            return None
        setting_text(config)  # raises if a field the title names is missing
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return config


def difference(a, b, arms):
    """The first "part.key: value in a vs value in b" where two runs' config.json a and b differ, or None. The data's
    "source" is text that may name a path, so the data is compared by the rest of "data" (a fingerprint, or token
    counts). The two arms of a pair (arms=True) may differ in ARMS_MAY_DIFFER too; two pairs of a figure (arms=False,
    their baselines) in the seed and in the model's fields but SIZE_KEYS."""
    for part in ("data", "model", "train"):
        for key in sorted(a[part].keys() | b[part].keys()):
            if part == "data":
                may_differ = key == "source"
            elif part == "model":
                may_differ = key in ARMS_MAY_DIFFER if arms else key not in SIZE_KEYS
            else:
                may_differ = key == "seed" and not arms
            if not may_differ and a[part].get(key) != b[part].get(key):
                return f"{part}.{key}: {a[part].get(key)} vs {b[part].get(key)}"
    return None


def setting_text(config):
    """The setting a figure's title names, from a baseline's config.json."""
    m, t = config["model"], config["train"]
    return (f"preset {t['preset']}, width {m['n_embd']}, {m['n_head']} and {2 * m['n_head']} query heads, "
            f"{t['max_iters']:,} steps, lr {t['learning_rate']:g} (warm-up {t['warmup_iters']}), {t['init']} init")


def seed_folders(out_dir, run):
    """{seed: folder} of each <out_dir>/<run>/seed<seed>/ that holds a metrics.jsonl."""
    found = {}
    for path in pathlib.Path(out_dir, run).glob("seed*/metrics.jsonl"):
        tail = path.parent.name[4:]
        if tail.isascii() and tail.isdigit():  # "seed²" is not a seed
            found[int(tail)] = str(path.parent)
    return found


def paired_curve(label, pairs):
    """The Curve of one variant from its pairs [(seed, baseline folder, double-heads folder)], or None. A pair's dL is
    taken where both runs have an evaluation; a seed whose pair ends before the variant's longest is still training
    and left out. The rest are drawn on the token counts they all share."""
    per_seed = {}
    for seed, base_dir, double_dir in pairs:
        base, double = read_losses(base_dir), read_losses(double_dir)
        per_seed[seed] = {t: (base[t], double[t]) for t in sorted(base.keys() & double.keys())}
    reached = {seed: max(losses, default=-1) for seed, losses in per_seed.items()}
    last = max(reached.values())
    for seed in sorted(per_seed):
        if reached[seed] < 0:
            note(label, seed, "its two runs share no evaluation yet")
        elif reached[seed] < last:
            note(label, seed, f"still training (at {reached[seed]:,} tokens, the others at {last:,})")
    seeds = [seed for seed in sorted(per_seed) if 0 <= reached[seed] == last]
    if not seeds:
        return None
    tokens = sorted(set.intersection(*(set(per_seed[s]) for s in seeds)))
    losses = np.array([[per_seed[s][t] for t in tokens] for s in seeds])  # (n_seeds, n, 2)
    return Curve(seeds, tokens, losses[..., 0].mean(0), losses[..., 1].mean(0), losses[..., 0] - losses[..., 1])


def curves_from_runs(out_dir):
    """({label: Curve}, unit, setting) of the runs in out_dir, each baseline seed paired with its double-heads seed."""
    if not os.path.isdir(out_dir):
        raise PlotError(f"--out_dir {out_dir!r} is not a directory")
    pairs = []  # (label, seed, baseline folder, double-heads folder, baseline's config)
    for name in VARIANTS:
        label = STYLE[name][0]
        base, double = seed_folders(out_dir, name), seed_folders(out_dir, name + DOUBLE_SUFFIX)
        for seed in sorted(base.keys() | double.keys()):
            if seed not in base or seed not in double:
                missing = os.path.join(out_dir, name if seed in double else name + DOUBLE_SUFFIX, f"seed{seed}")
                note(label, seed, f"{missing} has no metrics.jsonl")
                continue
            config, twin = read_config(base[seed]), read_config(double[seed])
            if config is None or twin is None:
                bad = base[seed] if config is None else double[seed]
                note(label, seed, f"{os.path.join(bad, 'config.json')} is missing or not train.py's")
                continue
            why = difference(config, twin, arms=True)
            if why:
                note(label, seed, f"{base[seed]} and {double[seed]} differ in {why}")
                continue
            pairs.append((label, seed, base[seed], double[seed], config))
    if not pairs:
        raise PlotError(f"no seed in {out_dir!r} has a baseline and a {DOUBLE_SUFFIX} run that are an ablation "
                        "pair (each needs <run>/seed<seed>/metrics.jsonl and config.json)")
    reference = pairs[0][-1]  # the figure's setting: its first pair's, in VARIANTS' and seeds' order
    kept = {}
    for label, seed, base_dir, double_dir, config in pairs:
        why = difference(config, reference, arms=False)
        if why:
            note(label, seed, f"{base_dir} differs from the figure's other pairs in {why}")
        else:
            kept.setdefault(label, []).append((seed, base_dir, double_dir))
    curves = {}
    for label, variant_pairs in kept.items():
        curve = paired_curve(label, variant_pairs)
        if curve is not None:
            curves[label] = curve
    if not curves:
        raise PlotError("no pair of runs shares an evaluation")
    unit = "nats/byte" if reference["model"].get("vocab_size") == 256 else "nats/token"  # train.py's bytes: 256
    return curves, unit, setting_text(reference)


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
    """Draw {label: Curve} and save a PNG to `path` (a file name or a binary file). Three panels on plain linear
    axes: the whole run, its last half, and the final dL of each variant (its seeds, their mean and its 95% t
    interval). Thick lines with markers: the mean over seeds; dotted: each seed."""
    import matplotlib  # here, not at the top: a bad --out_dir fails fast

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    paper, paper_text = paper_range(unit)
    most = max(int(c.tokens.max()) for c in curves.values())
    scale, scale_name = (1e9, "billions") if most >= 1e9 else (1e6, "millions")  # the paper's runs: 98B tokens
    fig, (whole, late, final) = plt.subplots(1, 3, figsize=(14, 5.6), gridspec_kw={"width_ratios": [4, 4, 2.2]})
    for ax in (whole, late, final):
        # The band's edge keeps it visible where the axis is so tall that the band is thinner than a pixel; the zero
        # line, dashed, shows through it there.
        ax.axhspan(*paper, facecolor=(1, 0.65, 0, 0.35), edgecolor="darkorange", lw=1.2, zorder=0)
        ax.axhline(0.0, color="black", lw=0.9, ls="--", zorder=1)
        ax.grid(True, alpha=0.3)
    for k, (label, c) in enumerate(curves.items()):
        colour, (width, size) = LABEL_STYLE[label]
        for ax, keep in ((whole, slice(None)), (late, c.tokens >= c.tokens[-1] / 2)):
            if len(c.seeds) > 1:
                for row in c.delta:
                    ax.plot(c.tokens[keep] / scale, row[keep], color=colour, lw=0.9, ls=":", zorder=2)
            ax.plot(c.tokens[keep] / scale, c.mean[keep], color=colour, lw=width, marker="o", ms=size, zorder=3 + k)
        final.plot([k + 0.25] * len(c.seeds), c.delta[:, -1], ls="none", marker="o", ms=5, mfc="none", color=colour)
        error = [[c.mean[-1] - c.low[-1]], [c.high[-1] - c.mean[-1]]] if len(c.seeds) > 1 else None
        final.errorbar([k], [c.mean[-1]], yerr=error, color=colour, marker="s", ms=7, capsize=6, lw=1.8, capthick=1.8)
    final.set_xticks(range(len(curves)), list(curves))
    final.set_xlim(-0.6, len(curves) - 0.4)
    whole.set_title("Whole run", fontsize=10)
    late.set_title("Last half of training", fontsize=10)
    final.set_title("Final dL", fontsize=10)
    for ax in (whole, late):
        ax.set_xlabel(f"training tokens ({scale_name})")
    whole.set_ylabel(f"dL = L(baseline) − L(double heads), {unit}")

    handles = []
    for label, c in curves.items():
        colour, (width, size) = LABEL_STYLE[label]
        handles.append(Line2D([], [], color=colour, lw=width, marker="o", ms=size, label=variant_label(label, c)))
    handles += [
        Line2D([], [], color="gray", lw=0.9, ls=":", label="dotted: each seed; thick: their mean"),
        Line2D([], [], color="gray", lw=1.8, marker="s", label="final dL: the mean and its 95% t interval; circles: "
               "each seed"),
        Line2D([], [], color="black", lw=0.9, ls="--", label="0: above it, doubling the heads helped"),
        Patch(facecolor=(1, 0.65, 0, 0.35), edgecolor="darkorange", lw=1.2, label=paper_text),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8.5, frameon=False)
    seeds = ", ".join(str(s) for s in sorted({s for c in curves.values() for s in c.seeds}))
    title = "Double-heads ablation (Liu et al. 2026): dL = L(baseline) − L(double heads) at equal training tokens"
    fig.suptitle(f"{title}\n{setting}; seeds {seeds}", fontsize=11)
    fig.tight_layout(rect=(0, 0.17, 1, 1))
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
    return text.getvalue().encode()


def check_output(output):
    """Refuse, before anything is read, an --output that is not a .png."""
    if os.path.splitext(output)[1].lower() != ".png":
        raise PlotError(f"--output must end in .png, got {output!r}")


def write_figure(curves, unit, setting, output, csv_path=None):
    """Write the figure to the PNG `output` and its CSV to csv_path (unless None), then print each variant's final
    dL: the mean over seeds, its 95% t interval, and each seed's."""
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    plot(curves, unit, setting, output)
    if csv_path:
        with open(csv_path, "wb") as f:
            f.write(csv_text(curves, unit, setting))
    print(f"wrote {output}" + (f" and {csv_path}" if csv_path else ""))
    print(f"final dL ({unit}): mean over seeds, its 95% t interval (t with n - 1 degrees of freedom), each seed")
    for label, c in curves.items():
        interval = f"[{c.low[-1]:+.4f}, {c.high[-1]:+.4f}]" if len(c.seeds) > 1 else "(one seed: no interval)"
        per_seed = ", ".join(f"{s}: {d:+.4f}" for s, d in zip(c.seeds, c.delta[:, -1]))
        above = int((c.delta[:, -1] > 0).sum())
        print(f"{label:<6} {len(c.seeds)} seed(s) at {int(c.tokens[-1]):,} tokens: {c.mean[-1]:+.4f} {interval}; "
              f"{above}/{len(c.seeds)} above 0; {per_seed}")


def main(argv=None):
    """The command line: returns the exit status (0, or 2 after a one-line error on stderr)."""
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out_dir", default="out", help="folder holding one subfolder per run (default: out)")
    p.add_argument("--output", default="double_heads_ablation.png",
                   help="PNG to write, with its CSV beside it (default: double_heads_ablation.png)")
    try:
        args = p.parse_args(argv)
        check_output(args.output)
        curves, unit, setting = curves_from_runs(args.out_dir)
        write_figure(curves, unit, setting, args.output, os.path.splitext(args.output)[0] + ".csv")
    except (PlotError, OSError) as e:
        print(f"plot.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
