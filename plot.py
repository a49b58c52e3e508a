"""Plot the double-heads ablation: how much doubling the query heads helps.

For each attention variant (GQA, MLA, GLA-2) train.py trains a baseline and a "double heads" model with twice the
query heads and the same KV cache (the extra attention parameters are taken from the MLP width). At equal training
tokens t,

    dL(t) = L_val(baseline, t) - L_val(double heads, t)

and above zero, doubling the heads helped. The figure redraws the double-heads ablation of Liu et al., "Multi-Head
Low-Rank Attention", ICLR 2026 (arXiv 2603.02188); GLA is from Zadouri, Strauss, Dao, "Hardware-Efficient Attention
for Fast Decoding", 2025 (arXiv 2505.21487).

Seeds: train.py writes <out_dir>/<run>/seed<seed>/ (config.json, metrics.jsonl). A baseline seed is paired with the
double-heads run of the same seed (same data in the same order, so the data's noise cancels in their difference) when
their config.json agree in all but PAIR_MAY_DIFFER, and when the pair shares the schedule, data and model size of the
figure's other pairs; any other pair is named in one line and left out.

Usage: python plot.py [--out_dir out | --from_csv CSV] [--output double_heads_ablation.png]
The CSV of the plotted values (each seed's dL and the setting) is written beside the PNG with the PNG's stem;
--from_csv redraws a figure from such a CSV. Bad input: one line on stderr, exit status 2, nothing written.
"""
import csv
import functools
import io
import json
import math
import os
import pathlib
import sys

import numpy as np

from harness.files import atomic_write
from harness.stops import ArgumentParser, UsageError

# The variants, in gla.py's order (we do not import gla: it needs torch).
VARIANTS = ("gqa", "mla", "gla2")
# Baseline run name: (label, colour, (mean line width, marker size)), the paper's colours. The widths shrink in
# VARIANTS' order and later variants draw on top, so curves that coincide nest and each stays visible.
STYLE = {"gqa": ("GQA", "teal", (3.6, 9)), "mla": ("MLA", "royalblue", (2.4, 6)), "gla2": ("GLA-2", "gray", (1.4, 3.5))}
LABEL_STYLE = {label: (colour, size) for label, colour, size in STYLE.values()}
DOUBLE_SUFFIX = "_double_heads"
CSV_COLUMNS = ["variant", "tokens", "n_seeds", "unit", "setting", "val_loss_baseline", "val_loss_double_heads",
               "dL_mean", "dL_ci95_low", "dL_ci95_high"]  # then dL_seed<seed> per seed

# What a baseline and its double-heads twin may differ in: make_config(..., double_heads=True) doubles n_head and the
# width rule shrinks ffn_hidden; the data's source names a path, while its fingerprint is its content.
PAIR_MAY_DIFFER = {"model": {"n_head", "ffn_hidden"}, "train": set(), "data": {"source"}}
# What every pair of a figure shares: every training flag but the seed, the data, and the model's size (the
# attention's own fields differ by variant). n_head is the baseline's.
SHARED_MODEL_KEYS = ("vocab_size", "block_size", "n_layer", "n_embd", "n_head", "rope_theta", "norm_eps", "init_std")

# The paper's dL over training, in nats per GPT-2 token: every variant between about +0.002 and +0.01 (Liu et al.
# 2026, the double-heads ablation figure; late in training GQA ~0.006, MLA ~0.008, GLA-2 ~0.002-0.003). train.py's
# default data is bytes (vocabulary 256): its loss is in nats per byte, and GPT-2's BPE cuts English prose (the GPL-3
# text) into 4.35 bytes per token (docs/results.md, Units).
PAPER_DL_PER_TOKEN = (0.002, 0.01)
BYTES_PER_GPT2_TOKEN = 4.35
# t(0.975, df), the two-sided 95% quantile of Student's t for df 1-30 (n_seeds - 1), to 4 decimals, as in the standard
# tables (NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2); the tests check them against the t density.
T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
        2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
        2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)
Z975 = 1.959964


class PlotError(Exception):
    """Bad input: main() prints it as one line and returns 2."""


def warn(msg):
    print(f"plot.py: {msg}", file=sys.stderr)


def require(ok, message):
    """Raise ValueError(message) unless ok: a check of an input file (an assert would vanish under python -O)."""
    if not ok:
        raise ValueError(message)


def t975(df):
    """t(0.975, df) for df >= 1: the table up to 30; beyond, the Cornish-Fisher expansion about the normal quantile
    (Abramowitz & Stegun 26.7.5), within 1e-4."""
    assert df >= 1, df
    if df <= len(T975):
        return T975[df - 1]
    z = Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


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
    """{tokens: val_loss} of a run folder's metrics.jsonl (train.py appends one evaluation a line; a kill may cut the
    last line, which is skipped). Raises PlotError on any other line that is not an evaluation."""
    path = os.path.join(folder, "metrics.jsonl")
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    losses = {}
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            tokens, loss = int(row["tokens"]), float(row["val_loss"])
            require(0 <= tokens < 2**62 and abs(loss) < 1e6, "tokens or val_loss out of range, or NaN")
        except json.JSONDecodeError:
            if i == len(lines):
                continue
            raise PlotError(f"{path} line {i}: not JSON") from None
        except (KeyError, TypeError, ValueError) as e:
            raise PlotError(f"{path} line {i}: not an evaluation ({e})") from None
        losses[tokens] = loss
    return losses


def read_config(folder):
    """A run folder's config.json ({"model", "train", "data"}: dicts), or None when missing or not train.py's."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        require(all(isinstance(config[part], dict) for part in PAIR_MAY_DIFFER), "not train.py's config.json")
        setting_text(config)  # it has the fields a title names
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return config


def first_difference(a, b):
    """The first "part.key: value_a vs value_b" where the configs a and b differ, or None."""
    for part in sorted(a.keys() | b.keys()):
        for key in sorted(a.get(part, {}).keys() | b.get(part, {}).keys()):
            if a.get(part, {}).get(key) != b.get(part, {}).get(key):
                return f"{part}.{key}: {a.get(part, {}).get(key)} vs {b.get(part, {}).get(key)}"
    return None


def without(config, keys):
    """config less {part: keys}."""
    return {part: {k: v for k, v in values.items() if k not in keys.get(part, ())} for part, values in config.items()}


def shared_setting(config):
    """What every pair of one figure shares, from its baseline's config."""
    return {"train": {k: v for k, v in config["train"].items() if k != "seed"},
            "data": {"fingerprint": config["data"].get("fingerprint")},
            "model": {k: config["model"].get(k) for k in SHARED_MODEL_KEYS}}


def setting_text(config):
    """The setting a figure's title names, from a baseline's config.json."""
    m, t = config["model"], config["train"]
    return (f"preset {t['preset']}, width {m['n_embd']}, {m['n_head']} and {2 * m['n_head']} query heads, "
            f"{t['max_iters']:,} steps, lr {t['learning_rate']:g} (warm-up {t['warmup_iters']}), {t['init']} init")


def seed_folders(out_dir, run):
    """{seed: folder} of each <out_dir>/<run>/seed<seed>/ that holds a metrics.jsonl."""
    found = {}
    for folder in pathlib.Path(out_dir, run).glob("seed*/metrics.jsonl"):
        tail = folder.parent.name[4:]
        if tail.isascii() and tail.isdigit():  # "seed²" is not a seed
            found[int(tail)] = str(folder.parent)
    return found


def paired_curve(label, pairs):
    """The Curve of one variant from its pairs [(seed, baseline folder, double-heads folder)], or None. A seed whose
    pair ends before the longest one (still training) is left out, in one line; the rest are drawn on the token
    counts they all share."""
    per_seed = {}
    for seed, base_dir, double_dir in pairs:
        base, double = read_losses(base_dir), read_losses(double_dir)
        per_seed[seed] = {t: (base[t], double[t]) for t in sorted(base.keys() & double.keys())}
    last = max(max(p, default=-1) for p in per_seed.values())
    if last < 0:
        warn(f"note: {label}: no pair of runs shares an evaluation; not plotted")
        return None
    short = [s for s, p in per_seed.items() if max(p, default=-1) < last]
    if short:
        where = ", ".join(f"seed {s} at {max(per_seed[s], default=0):,}" for s in short)
        warn(f"note: {label}: {len(short)} seed(s) still short of {last:,} tokens ({where}); plotting the "
             f"{len(per_seed) - len(short)} that reached it")
    seeds = sorted(s for s in per_seed if s not in short)
    tokens = sorted(set.intersection(*(set(per_seed[s]) for s in seeds)))
    losses = np.array([[per_seed[s][t] for t in tokens] for s in seeds])  # (n_seeds, n, 2)
    return Curve(seeds, tokens, losses[..., 0].mean(0), losses[..., 1].mean(0), losses[..., 0] - losses[..., 1])


def curves_from_runs(out_dir):
    """({label: Curve}, unit, setting) of the runs in out_dir, each baseline seed paired with its double-heads seed."""
    if not os.path.isdir(out_dir):
        raise PlotError(f"--out_dir {out_dir!r} is not a directory")
    pairs = {}
    for name in VARIANTS:
        label = STYLE[name][0]
        base, double = seed_folders(out_dir, name), seed_folders(out_dir, name + DOUBLE_SUFFIX)
        for seed in sorted(base.keys() ^ double.keys()):
            missing = os.path.join(out_dir, name + DOUBLE_SUFFIX * (seed in base), f"seed{seed}")
            warn(f"note: {label}: seed {seed} has only one of its two runs ({missing} has no metrics.jsonl); left out")
        for seed in sorted(base.keys() & double.keys()):
            config, twin = read_config(base[seed]), read_config(double[seed])
            if config is None or twin is None:
                warn(f"note: {label} seed {seed}: left out: a config.json of {base[seed]} and {double[seed]} is "
                     "missing or not train.py's")
                continue
            why = first_difference(without(config, PAIR_MAY_DIFFER), without(twin, PAIR_MAY_DIFFER))
            if why:
                warn(f"note: {label} seed {seed}: left out, not an ablation pair: {base[seed]} and {double[seed]} "
                     f"differ in {why}")
                continue
            pairs.setdefault(label, []).append((seed, base[seed], double[seed], config))
    settings = [json.dumps(shared_setting(p[3]), sort_keys=True) for ps in pairs.values() for p in ps]
    if not settings:
        raise PlotError(f"no seed in {out_dir!r} has a baseline and a {DOUBLE_SUFFIX} run that are an ablation "
                        "pair (each needs <run>/seed<seed>/metrics.jsonl and config.json)")
    common = max(settings, key=settings.count)  # a tie: the first pair's, in VARIANTS' and seeds' order
    curves = {}
    for label, ps in pairs.items():
        kept = []
        for seed, base_dir, double_dir, config in ps:
            why = first_difference(shared_setting(config), json.loads(common))
            if why:
                warn(f"note: {label} seed {seed}: left out: {base_dir} differs from the figure's other pairs in {why}")
            else:
                kept.append((seed, base_dir, double_dir))
                reference = config  # a pair of the figure, for its setting and unit
        curve = paired_curve(label, kept) if kept else None
        if curve is not None:
            curves[label] = curve
    if not curves:
        raise PlotError("no pair of runs shares an evaluation")
    unit = "nats/byte" if reference["model"].get("vocab_size") == 256 else "nats/token"  # train.py: bytes, 256
    return curves, unit, setting_text(reference)


def paper_range(unit):
    """The paper's late dL (PAPER_DL_PER_TOKEN) in `unit`, and its label for the legend."""
    lo, hi = PAPER_DL_PER_TOKEN
    if unit == "nats/token":
        return (lo, hi), f"paper, over training: +{lo:g} to +{hi:g} nats/token"
    lo_b, hi_b = lo / BYTES_PER_GPT2_TOKEN, hi / BYTES_PER_GPT2_TOKEN
    return (lo_b, hi_b), (f"paper, over training: +{lo:g} to +{hi:g} nats/GPT-2 token = +{lo_b:.5f} to "
                          f"+{hi_b:.4f} nats/byte at {BYTES_PER_GPT2_TOKEN:g} bytes/token")


def seed_text(curves):
    """The figure's seeds, e.g. "seeds 1337, 1338"."""
    return "seeds " + ", ".join(str(s) for s in sorted({s for c in curves.values() for s in c.seeds}))


def token_unit(max_tokens):
    """(scale, suffix) for an axis of tokens up to max_tokens: 1e9 "B", 1e6 "M", 1e3 "K" or 1 ""."""
    for scale, suffix in [(1e9, "B"), (1e6, "M"), (1e3, "K")]:
        if max_tokens >= scale:
            return scale, suffix
    return 1, ""


def plot(curves, unit, setting, path):
    """Draw {label: Curve} and save a PNG to `path` (a file name or a binary file). Three panels on plain linear
    axes: the whole run, its last half, and the final dL of each variant (its seeds, their mean and its 95% t
    interval). Thick lines with markers: the mean over seeds; dotted: each seed."""
    import matplotlib  # here, not at the top: a bad --out_dir fails fast

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    scale, suffix = token_unit(max(int(c.tokens.max()) for c in curves.values()))
    paper, paper_text = paper_range(unit)
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
        ax.set_xlabel(f"training tokens ({suffix})" if suffix else "training tokens")
    whole.set_ylabel(f"dL = L(baseline) − L(double heads), {unit}")

    handles = [Line2D([], [], color=LABEL_STYLE[label][0], lw=LABEL_STYLE[label][1][0], marker="o",
                      ms=LABEL_STYLE[label][1][1], label=variant_label(label, c)) for label, c in curves.items()]
    handles += [Line2D([], [], color="gray", lw=0.9, ls=":", label="dotted: each seed; thick: their mean"),
                Line2D([], [], color="gray", lw=1.8, marker="s", label="final dL: the mean and its 95% t interval; "
                       "circles: each seed"),
                Line2D([], [], color="black", lw=0.9, ls="--", label="0: above it, doubling the heads helped"),
                Patch(facecolor=(1, 0.65, 0, 0.35), edgecolor="darkorange", lw=1.2, label=paper_text)]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8.5, frameon=False)
    title = "Double-heads ablation (Liu et al. 2026): dL = L(baseline) − L(double heads) at equal training tokens"
    fig.suptitle(f"{title}\n{setting}; {seed_text(curves)}", fontsize=11)
    fig.tight_layout(rect=(0, 0.17, 1, 1))
    fig.savefig(path, dpi=150, format="png")
    plt.close(fig)


def variant_label(label, curve):
    """The legend's line for one variant: its seeds and final dL, with its 95% t interval from two seeds on."""
    n = len(curve.seeds)
    if n == 1:
        return f"{label} (1 seed): final {curve.mean[-1]:+.4f}"
    return (f"{label} ({n} seeds): final {curve.mean[-1]:+.4f}, 95% t interval [{curve.low[-1]:+.4f}, "
            f"{curve.high[-1]:+.4f}]")


def csv_text(curves, unit, setting):
    """The CSV of the curves: CSV_COLUMNS (the interval empty with one seed), then each seed's dL, dL_seed<seed>
    (empty where that seed is not in a variant)."""
    all_seeds = sorted({s for c in curves.values() for s in c.seeds})
    rows = [CSV_COLUMNS + [f"dL_seed{s}" for s in all_seeds]]
    for label, c in curves.items():
        for i, t in enumerate(c.tokens):
            per_seed = dict(zip(c.seeds, c.delta[:, i]))
            values = [c.base[i], c.double[i], c.mean[i], c.low[i], c.high[i]]
            rows.append([label, int(t), len(c.seeds), unit, setting] + ["" if math.isnan(v) else repr(float(v))
                        for v in values] + [repr(float(per_seed[s])) if s in per_seed else "" for s in all_seeds])
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    return text.getvalue().encode()


def read_csv_curves(path):
    """({label: Curve}, unit, setting) from a CSV that plot.py wrote. Each variant keeps the seeds with a dL in each
    of its rows; the means and intervals are computed again from them."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
        require(rows and set(CSV_COLUMNS) <= rows[0].keys(), f"columns {', '.join(CSV_COLUMNS)}, dL_seed<seed>")
        units, settings = {r["unit"] for r in rows}, {r["setting"] for r in rows}
        require(units in ({"nats/byte"}, {"nats/token"}), "its unit must be nats/byte or nats/token, in every row")
        require(len(settings) == 1, "one setting in every row")
        curves = {}
        for label in dict.fromkeys(r["variant"] for r in rows):
            require(label in LABEL_STYLE, f"unknown variant {label!r}")
            mine = [r for r in rows if r["variant"] == label]
            seeds = [int(k[7:]) for k in mine[0] if k.startswith("dL_seed") and all(r[k] for r in mine)]
            tokens = [int(r["tokens"]) for r in mine]
            delta = [[float(r[f"dL_seed{s}"]) for r in mine] for s in seeds]
            base = [float(r["val_loss_baseline"]) for r in mine]
            double = [float(r["val_loss_double_heads"]) for r in mine]
            require(seeds and {int(r["n_seeds"]) for r in mine} == {len(seeds)}, f"{label}: n_seeds is not its seeds")
            require(0 <= tokens[0] and tokens[-1] < 2**62, f"{label}: tokens out of range")
            require(all(a < b for a, b in zip(tokens, tokens[1:])), f"{label}: tokens do not increase")
            require(np.all(np.abs([base, double, *delta]) < 1e6), f"{label}: a loss or dL is not a finite number")
            curves[label] = Curve(seeds, tokens, base, double, delta)
    except (OSError, UnicodeDecodeError, csv.Error, KeyError, TypeError, ValueError) as e:
        raise PlotError(f"--from_csv {path}: not a CSV as plot.py writes it ({e})") from None
    return curves, units.pop(), settings.pop()


def run(out_dir, output, from_csv=None):
    """Read the runs in out_dir (or the CSV from_csv), write the PNG `output` and its CSV, print the final dL."""
    csv_path = os.path.splitext(output)[0] + ".csv"
    if os.path.splitext(output)[1].lower() != ".png":
        raise PlotError(f"--output must end in .png, got {output!r}")
    if from_csv and os.path.realpath(from_csv) == os.path.realpath(csv_path):
        raise PlotError(f"--output {output} would write its CSV over the input {from_csv}; choose another --output")
    folder = pathlib.Path(os.path.abspath(output)).parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise PlotError(f"--output {output!r}: {folder} is a file, not a folder")
    curves, unit, setting = read_csv_curves(from_csv) if from_csv else curves_from_runs(out_dir)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    atomic_write({output: functools.partial(plot, curves, unit, setting), csv_path: csv_text(curves, unit, setting)})
    print(f"wrote {output} and {csv_path}")
    print(f"final dL ({unit}): mean over seeds, its 95% t interval (t with n - 1 degrees of freedom), each seed")
    for label, c in curves.items():
        interval = f"[{c.low[-1]:+.4f}, {c.high[-1]:+.4f}]" if len(c.seeds) > 1 else "(one seed: no interval)"
        per_seed = ", ".join(f"{s}: {d:+.4f}" for s, d in zip(c.seeds, c.delta[:, -1]))
        above = int((c.delta[:, -1] > 0).sum())
        print(f"{label:<6} {len(c.seeds)} seed(s) at {int(c.tokens[-1]):,} tokens: {c.mean[-1]:+.4f} {interval}; "
              f"{above}/{len(c.seeds)} above 0; {per_seed}")
    return 0


def main(argv=None):
    """The command line: returns the exit status (0, or 2 after a one-line error on stderr)."""
    p = ArgumentParser(description=__doc__.splitlines()[0])  # a bad flag is one UsageError line
    source = p.add_mutually_exclusive_group()
    source.add_argument("--out_dir", help="folder holding one subfolder per run (default: out)")
    source.add_argument("--from_csv", help="redraw from a CSV that plot.py wrote (each seed's dL is in it)")
    p.add_argument("--output", help="PNG to write, with its CSV beside it (default: double_heads_ablation.png)")
    try:
        args = p.parse_args(argv)
        return run(args.out_dir or "out", args.output or "double_heads_ablation.png", args.from_csv)
    except (PlotError, UsageError, OSError) as e:
        print(f"plot.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
