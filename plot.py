"""Plot the double-heads ablation: how much doubling the query heads helps.

For each attention variant (GQA, MLA, GLA-2) train.py trains a baseline and a
"double heads" model with twice the query heads (24 -> 48 at paper scale) and the
same KV cache (the extra attention parameters are taken from the MLP width). This script plots, per
variant, at equal training tokens t,

    dL(t) = L_val(baseline, t) - L_val(double heads, t)

against training tokens; positive means doubling the heads helped. The figure reproduces the double-heads ablation
of Liu et al., "Multi-Head Low-Rank Attention", ICLR 2026 (arXiv 2603.02188); GLA is from Zadouri, Strauss, Dao,
"Hardware-Efficient Attention for Fast Decoding", 2025 (arXiv 2505.21487).

Units: the loss is in nats per token of the run's data, which for the byte-level default data (vocabulary 256) is
nats per byte; the paper's is in nats per GPT-2 token, which we convert with BYTES_PER_GPT2_TOKEN.

Seeds: train.py writes <out_dir>/<run>/seed<seed>/ (config.json, metrics.jsonl). We pair each baseline seed with the
double-heads run of the same seed (they saw the same data in the same order, so its noise cancels in their
difference), but only where their config.json agree in everything except the query heads and the MLP width
(PAIR_MAY_DIFFER), and where every pair of the figure shares one schedule, data and model size; any other pair is
named in one line and left out. We compute dL per seed and draw each seed's thin line under the mean over seeds; the
figure's right panel zooms on the last half of training, on a linear axis, with the zero line, the paper's range and
the 95% t interval of the final dL (mean +- t(0.975, n - 1) s / sqrt(n)).

Usage: python plot.py [--out_dir out | --from_csv CSV] [--output double_heads_ablation.png]
Reads the run folders (or, with --from_csv, a CSV that plot.py wrote, to redraw its figure). A relative --output is
relative to the current directory; a CSV of the plotted values (same stem, .csv) is written beside it, with each
seed's dL. Bad input gives a one-line error on stderr and exit status 2, and no output.
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
# run name of the baseline: (legend label, colour, (line width, marker size)), the reference figure's colours.
# Widths and sizes shrink in VARIANTS' order and later variants draw on top, so curves that coincide nest (a wide
# teal line around a narrower blue one, rings of markers) and every variant stays visible.
STYLE = {"gqa": ("GQA", "teal", (3.4, 10)), "mla": ("MLA", "royalblue", (2.0, 6.5)),
         "gla2": ("GLA-2", "gray", (1.0, 3.5))}
LABEL_STYLE = {label: (colour, size) for label, colour, size in STYLE.values()}
DOUBLE_SUFFIX = "_double_heads"
SEED_PREFIX = "seed"
CSV_COLUMNS = ["variant", "tokens", "n_seeds", "unit", "val_loss_baseline", "val_loss_double_heads",
               "dL_mean", "dL_ci95_low", "dL_ci95_high"]  # then dL_seed<seed> per seed

# What a baseline and its double-heads twin may differ in: gla.make_config(preset, variant, double_heads) changes
# n_head (doubled) and ffn_hidden (the width rule) and nothing else, for every preset and variant (checked with the
# tiny, small and paper presets, P1's shape and --kv_lora_rank 16). Everything else in config.json must agree.
PAIR_MAY_DIFFER = {"model": ("n_head", "ffn_hidden"), "train": (), "data": ("source",)}
# What every pair of one figure must share, across seeds and variants: the schedule and batch (every training flag
# but the seed), the data, and the model's size (the attention's own fields differ by variant).
SHARED_TRAIN_EXCEPT = ("seed",)
SHARED_MODEL_KEYS = ("vocab_size", "block_size", "n_layer", "n_embd", "rope_theta", "norm_eps", "init_std")
BYTE_VOCAB = 256  # train.py's byte-level data: a loss per token is a loss per byte

# The paper's dL late in training, nats per GPT-2 token: every variant between about +0.002 and +0.01 (Liu et al.
# 2026, the double-heads figure; shared/figure-double-heads-ablation.md). Bytes of English per GPT-2 token, measured
# with GPT-2's BPE (tiktoken's r50k / gpt2 ranks) on the GPL-3 text (35,149 bytes, 8,075 tokens): 4.35. The same
# count gives 3.52 on train.py's default corpus (docstrings, with code) and 3.35-4.16 on other English that ships with
# Python; docs/results.md has the command. The paper's range is then +0.00046 to +0.0023 nats per byte.
PAPER_DL_PER_TOKEN = (0.002, 0.01)
BYTES_PER_GPT2_TOKEN = 4.35
# t(0.975, df), the two-sided 95% quantile of Student's t, df 1-30, to 4 decimals, as in the standard tables (e.g.
# NIST/SEMATECH e-Handbook of Statistical Methods, 1.3.6.7.2); the tests check them against the t density.
T975 = (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
        2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
        2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423)
Z975 = 1.959964


class PlotError(Exception):
    """Bad input: main() prints it as one line and returns 2."""


def warn(msg):
    """Print a note or warning about the input as one line on stderr."""
    print(f"plot.py: {msg}", file=sys.stderr)


def t975(df):
    """t(0.975, df): the 95% two-sided quantile of Student's t with df >= 1 degrees of freedom. The table T975 up to
    30; beyond, the Cornish-Fisher expansion about the normal quantile (Abramowitz & Stegun 26.7.5), within 1e-4."""
    if df < 1:
        raise ValueError(f"df={df} must be at least 1")
    if df <= len(T975):
        return T975[df - 1]
    z = Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def ci95(values):
    """(mean, low, high) of the 95% t interval of the mean of `values` over axis 0: mean -+ t975(n - 1) s / sqrt(n),
    s the sample standard deviation. With one value there is no interval: low and high are NaN."""
    values = np.asarray(values, dtype=float)
    mean = values.mean(axis=0)
    n = values.shape[0]
    if n < 2:
        nan = np.full_like(mean, np.nan)
        return mean, nan, nan
    half = t975(n - 1) * values.std(axis=0, ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half


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


def read_config(path):
    """The config.json of one run directory as train.py writes it ({"model", "train", "data"}, each a dict), or None
    if it is missing or not that (then the run cannot be checked against its twin)."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or not all(isinstance(config.get(part), dict) for part in PAIR_MAY_DIFFER):
        return None
    return config


def first_difference(a, b, parts):
    """The first setting "part.key" (and its two values) where the dicts of dicts a and b differ, over `parts`:
    {part: keys that may differ}; a key missing on one side differs. None if they agree."""
    for part, may_differ in parts.items():
        for key in sorted(a[part].keys() | b[part].keys()):
            if key in may_differ:
                continue
            if a[part].get(key, "missing") != b[part].get(key, "missing"):
                return f"{part}.{key}", a[part].get(key, "missing"), b[part].get(key, "missing")
    return None


def pair_mismatch(base, double):
    """Why the configs of a baseline and its double-heads run are not an ablation pair, in words, or None if they
    are: everything but n_head and ffn_hidden agrees (the data by its fingerprint), and n_head is doubled."""
    diff = first_difference(base, double, PAIR_MAY_DIFFER)
    if diff:
        return f"{diff[0]} is {diff[1]} in the baseline, {diff[2]} in the double-heads run"
    heads = base["model"].get("n_head"), double["model"].get("n_head")
    if not isinstance(heads[0], int) or heads[1] != 2 * heads[0]:
        return f"model.n_head goes from {heads[0]} to {heads[1]}, not doubled"
    return None


def shared_setting(config):
    """What every pair of one figure must share, from a run's config: {"train": every flag but the seed, "data":
    the fingerprint, "model": SHARED_MODEL_KEYS}."""
    train = {k: v for k, v in config["train"].items() if k not in SHARED_TRAIN_EXCEPT}
    model = {k: config["model"].get(k, "missing") for k in SHARED_MODEL_KEYS}
    return {"train": train, "data": {"fingerprint": config["data"].get("fingerprint", "missing")}, "model": model}


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
            is_seed = entry.startswith(SEED_PREFIX) and tail.isascii() and tail.isdigit()  # "seed²" is not a seed
            if is_seed and has_metrics(os.path.join(path, entry)):
                found[int(tail)] = os.path.join(path, entry)
    return dict(sorted(found.items()))


def has_metrics(path):
    """Whether the run folder `path` holds a metrics.jsonl."""
    return os.path.isfile(os.path.join(path, "metrics.jsonl"))


class Curve:
    """dL of one variant over its paired seeds, on the token counts every pair shares.

    tokens (n,) int64; delta (n_seeds, n) per-seed dL; seeds: their numbers; base, double (n,) mean validation
    losses. mean, low, high: dL's mean over seeds and its 95% t interval (t with n_seeds - 1 degrees of freedom;
    NaN with one seed).
    """

    def __init__(self, seeds, tokens, base, double, delta):
        self.seeds = list(seeds)
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.base = np.asarray(base, dtype=float)
        self.double = np.asarray(double, dtype=float)
        self.delta = np.asarray(delta, dtype=float)
        self.mean, self.low, self.high = ci95(self.delta)


class Pair:
    """One seed's baseline and double-heads run folders and their configs (None: unreadable)."""

    def __init__(self, label, seed, base_dir, double_dir):
        self.label = label
        self.seed = seed
        self.base_dir = base_dir
        self.double_dir = double_dir
        self.base_config = read_config(base_dir)
        self.double_config = read_config(double_dir)

    def name(self):
        """The two run folders as one short phrase, for messages."""
        return f"{self.base_dir} and {self.double_dir}"


def matched_pairs(found):
    """The Pairs that are ablation pairs: {label: [Pair]}, from {label: ({seed: baseline folder}, {seed: double-heads
    folder})}. A seed with one run, a pair without a readable config.json, a pair whose configs differ (pair_mismatch)
    and a pair whose schedule, data or model size differs from the most common one among the pairs is left out, each
    with one line naming the runs and the setting."""
    pairs = {}
    for label, (base_runs, double_runs) in found.items():
        for s in sorted(base_runs.keys() ^ double_runs.keys()):
            warn(f"note: {label}: seed {s} has only one of its two runs; left out")
        kept = []
        for s in sorted(base_runs.keys() & double_runs.keys()):
            pair = Pair(label, s, base_runs[s], double_runs[s])
            if pair.base_config is None or pair.double_config is None:
                missing = pair.base_dir if pair.base_config is None else pair.double_dir
                warn(f"note: {label} seed {s}: left out: {missing}/config.json is missing or unreadable, so it "
                     "cannot be checked as an ablation pair")
                continue
            why = pair_mismatch(pair.base_config, pair.double_config)
            if why:
                warn(f"note: {label} seed {s}: left out, not an ablation pair: {pair.name()} differ: {why}")
                continue
            kept.append(pair)
        pairs[label] = kept
    settings = [json.dumps(shared_setting(p.base_config), sort_keys=True) for ps in pairs.values() for p in ps]
    if not settings:
        return pairs
    common = max(settings, key=settings.count)  # ties: the first pair's, in VARIANTS' and seeds' order
    reference = json.loads(common)
    for label, ps in pairs.items():
        keep = []
        for p in ps:
            diff = first_difference(shared_setting(p.base_config), reference, {"train": (), "data": (), "model": ()})
            if diff:
                warn(f"note: {label} seed {p.seed}: left out: {p.base_dir} has {diff[0]} {diff[1]} where the other "
                     f"pairs of the figure have {diff[2]}")
            else:
                keep.append(p)
        pairs[label] = keep
    return pairs


def paired_curve(label, pairs):
    """The Curve of a variant from its Pairs, or None (with a warning) if no pair shares an evaluation.

    A pair that ends before the longest one (a seed still training, or one of its runs with no evaluation yet) is
    left out while a longer one exists, all such seeds in one line; the rest are drawn on the token counts they all
    share."""
    per_seed = {}
    lengths = {}
    for p in pairs:
        base, double = read_evaluations(p.base_dir), read_evaluations(p.double_dir)
        tokens, bl, dl, _ = delta_loss(base, double)
        per_seed[p.seed] = dict(zip(tokens.tolist(), zip(bl, dl)))
        lengths[p.seed] = (len(base), len(double), len(tokens))
    reached = {s: max(p) if p else -1 for s, p in per_seed.items()}
    last = max(reached.values())
    if last < 0:
        warn(f"warning: {label}: no seed's baseline and double heads share an evaluated token count; not plotted")
        return None
    running = sorted(s for s in per_seed if reached[s] < last)
    if running:
        counts = ", ".join(f"seed {s} at {max(reached[s], 0):,}" for s in running)
        warn(f"note: {label}: {len(running)} seed(s) still short of {last:,} tokens ({counts}); plotting the "
             f"{len(per_seed) - len(running)} that reached it")
        for s in running:
            del per_seed[s]
    for s in per_seed:
        n_base, n_double, n_common = lengths[s]
        if n_common < max(n_base, n_double):
            warn(f"note: {label} seed {s}: runs differ in length ({n_base} vs {n_double} evaluations); using the "
                 f"{n_common} in common")
    seeds = sorted(per_seed)
    common = sorted(set.intersection(*(set(p) for p in per_seed.values())))
    if any(len(p) > len(common) for p in per_seed.values()):
        warn(f"note: {label}: seeds differ in their evaluations; plotting the {len(common)} token counts all share")
    losses = np.array([[per_seed[s][t] for t in common] for s in seeds])  # (n_seeds, n, 2)
    return Curve(seeds, common, losses[..., 0].mean(axis=0), losses[..., 1].mean(axis=0),
                 losses[..., 0] - losses[..., 1])


def loss_unit(pairs):
    """"nats/byte" where the runs' vocabulary is train.py's bytes (256), else "nats/token" (e.g. GPT-2 tokens)."""
    for ps in pairs.values():
        for p in ps:
            if p.base_config["model"].get("vocab_size") != BYTE_VOCAB:
                return "nats/token"
    return "nats/byte"


def paper_range(unit):
    """The paper's late dL (PAPER_DL_PER_TOKEN) in `unit`, and its label for the legend."""
    lo, hi = PAPER_DL_PER_TOKEN
    if unit == "nats/token":
        return (lo, hi), f"paper, late in training: +{lo:g} to +{hi:g} nats/token"
    lo_b, hi_b = lo / BYTES_PER_GPT2_TOKEN, hi / BYTES_PER_GPT2_TOKEN
    return (lo_b, hi_b), (f"paper: +{lo:g} to +{hi:g} nats/GPT-2 token = +{lo_b:.5f} to +{hi_b:.4f} nats/byte "
                          f"({BYTES_PER_GPT2_TOKEN:g} bytes/token)")


def token_unit(max_tokens):
    """(scale, suffix) for an axis of tokens up to max_tokens: 1e9 "B", 1e6 "M", 1e3 "K" or 1 ""."""
    for scale, unit in [(1e9, "B"), (1e6, "M"), (1e3, "K")]:
        if max_tokens >= scale:
            return scale, unit
    return 1.0, ""


def linear_band(curves):
    """symlog's linthresh: linear within it, log beyond. With several seeds, the median spread of the seeds' dL (max
    - min at each token count) rounded up to a power of ten: dL inside the seed noise is drawn linearly, so noise
    near zero cannot swing across decades of the axis. With one seed, a power of ten at or below the smallest |mean
    dL|, at most 2 decades under the largest."""
    spreads = [np.ptp(c.delta, axis=0) for c in curves.values() if len(c.seeds) > 1]
    spreads = np.concatenate(spreads) if spreads else np.zeros(0)
    if spreads.size and np.median(spreads) > 0:
        return 10 ** math.ceil(math.log10(np.median(spreads)))
    top = max(max(np.abs(c.mean).max() for c in curves.values()), 1e-12)
    means = np.abs(np.concatenate([c.mean for c in curves.values()]))
    smallest = means[means > 0].min() if (means > 0).any() else top
    return 10 ** math.floor(math.log10(max(smallest, top * 1e-2)))


def last_half(curve):
    """Boolean mask of the curve's evaluations in the last half of its tokens (the zoom panel's)."""
    return curve.tokens >= curve.tokens[-1] / 2


def zoom_limits(curves, paper):
    """The zoom panel's y range: every seed's dL and the means over the last half of training, zero and the paper's
    range, padded by 8%; the final intervals may run past it (the legend gives their numbers)."""
    values = [np.concatenate([c.delta[:, last_half(c)].ravel(), c.mean[last_half(c)]]) for c in curves.values()]
    values = np.concatenate(values + [np.array([0.0, paper[0], paper[1]])])
    lo = float(values.min())
    hi = float(values.max())
    pad = 0.08 * max(hi - lo, 1e-4)
    return lo - pad, hi + pad


def tick_steps(span):
    """(major, minor) tick steps for an axis of `span`: a round major step (1, 2 or 5 x 10^k) giving 4 to 10 ticks,
    and a minor step of a fifth (a quarter for 2 x 10^k)."""
    power = 10 ** math.floor(math.log10(span / 4))
    for factor in (1, 2, 5, 10):
        if span / (power * factor) <= 10:
            break
    return power * factor, power * factor / (4 if factor == 2 else 5)


def symlog_ticks(lo, hi, linthresh):
    """Ticks of a symlog axis over [lo, hi]: quarters of linthresh within the linear band (matplotlib puts none
    there), then 1, 2 and 5 x 10^k beyond it."""
    ticks = [k * linthresh / 4 for k in range(-4, 5)]
    decade = linthresh
    while decade < max(abs(lo), abs(hi)):
        ticks += [sign * decade * f for f in (2, 5, 10) for sign in (-1, 1)]
        decade *= 10
    return sorted(t for t in ticks if lo <= t <= hi)


def plain_tick(value, _position):
    """A tick label without an exponent or trailing zeros."""
    return f"{value:g}"


def variant_label(label, curve):
    """The legend's line for one variant: its seeds and, with several, the final dL and its 95% t interval."""
    n = len(curve.seeds)
    if n == 1:
        return f"{label} (1 seed): final {curve.mean[-1]:+.4f}"
    return (f"{label} ({n} seeds): final {curve.mean[-1]:+.4f}, 95% t interval "
            f"[{curve.low[-1]:+.4f}, {curve.high[-1]:+.4f}]")


def draw_curves(ax, curves, scale, mask=None):
    """Each seed's thin line under the mean's thick one, per variant; mask picks the evaluations of each curve
    (a function of the curve; None: all)."""
    for z, (label, c) in enumerate(curves.items()):
        colour, (width, size) = LABEL_STYLE[label]
        keep = mask(c) if mask else np.ones(len(c.tokens), dtype=bool)
        x = c.tokens[keep] / scale
        if len(c.seeds) > 1:
            for row in c.delta:
                ax.plot(x, row[keep], color=colour, lw=0.6, alpha=0.45, zorder=2)
        ax.plot(x, c.mean[keep], color=colour, lw=width, marker="o", ms=size, zorder=3 + z)


def plot(curves, unit, path):
    """Draw {label: Curve} in two panels and save a PNG to `path` (a file name or a binary file).

    Left, the whole run on a symmetric log y axis (dL can be negative, so a plain log axis cannot hold it), linear
    within +-linear_band(curves). Right, the last half of training on a linear axis fitted to the data, with the
    zero line, the paper's range in the plotted unit and the 95% t interval of each variant's final dL (a bar at
    the last evaluation). Thin lines: each seed; thick lines with markers: the mean over seeds.
    """
    import matplotlib  # here, not at the top: a bad --out_dir fails fast

    matplotlib.use("Agg")  # files only, never a display
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, FuncFormatter, MultipleLocator

    linthresh = linear_band(curves)
    scale, suffix = token_unit(max(int(c.tokens.max()) for c in curves.values()))
    xlabel = f"Training tokens ({suffix})" if suffix else "Training tokens"
    paper, paper_text = paper_range(unit)
    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(11.0, 5.2))

    values = np.concatenate([c.delta.ravel() for c in curves.values()])
    if np.abs(values).max() > linthresh:  # dL spans decades: symlog
        ax.set_yscale("symlog", linthresh=linthresh, linscale=0.5)
        lo = min(values.min() * 1.3, -linthresh)
        hi = max(values.max() * 1.3, linthresh)
        ax.set_ylim(lo, hi)
        ax.yaxis.set_major_locator(FixedLocator(symlog_ticks(lo, hi, linthresh)))
        ax.set_title(f"Whole run (symlog: linear within ±{linthresh:g})", fontsize=10)
    else:  # all of it within the linear band: a plain axis reads better
        lo = min(values.min(), 0.0)
        hi = max(values.max(), 0.0)
        pad = 0.08 * max(hi - lo, 1e-4)
        ax.set_ylim(lo - pad, hi + pad)
        ax.yaxis.set_major_locator(MultipleLocator(tick_steps(hi - lo + 2 * pad)[0]))
        ax.set_title("Whole run (linear)", fontsize=10)
    ax.axhline(0.0, color="black", lw=0.9, zorder=1)
    draw_curves(ax, curves, scale)
    ax.yaxis.set_major_formatter(FuncFormatter(plain_tick))
    ax.set_ylabel(f"dL = L(baseline) − L(double heads), {unit}")

    zoom.axhspan(paper[0], paper[1], color="orange", alpha=0.25, lw=0, zorder=0)
    zoom.axhline(0.0, color="black", lw=0.9, zorder=1)
    draw_curves(zoom, curves, scale, last_half)
    for k, (label, c) in enumerate(curves.items()):
        if len(c.seeds) > 1:  # side by side just right of the last evaluation, so that no bar hides another
            x = c.tokens[-1] / scale * (1 + 0.012 * (k + 1))
            error = [[c.mean[-1] - c.low[-1]], [c.high[-1] - c.mean[-1]]]
            zoom.errorbar([x], [c.mean[-1]], yerr=error, color=LABEL_STYLE[label][0], capsize=4, lw=1.6,
                          marker="_", zorder=10)
    lo, hi = zoom_limits(curves, paper)
    zoom.set_ylim(lo, hi)
    major, minor = tick_steps(hi - lo)
    zoom.yaxis.set_major_locator(MultipleLocator(major))
    zoom.yaxis.set_minor_locator(MultipleLocator(minor))
    zoom.yaxis.set_major_formatter(FuncFormatter(plain_tick))
    zoom.grid(True, which="minor", alpha=0.12)
    zoom.set_title("Last half of training (linear)", fontsize=10)
    for axis in (ax, zoom):
        axis.set_xlabel(xlabel)
        axis.grid(True, which="major", alpha=0.3)

    handles = []
    for label, c in curves.items():
        colour, (width, size) = LABEL_STYLE[label]
        handles.append(Line2D([], [], color=colour, lw=width, marker="o", ms=size, label=variant_label(label, c)))
    several = any(len(c.seeds) > 1 for c in curves.values())
    if several:
        handles.append(Line2D([], [], color="gray", lw=0.6, alpha=0.6,
                              label="thin lines: each seed; bar (right): 95% t interval of the final mean"))
    handles.append(Line2D([], [], color="black", lw=0.9, label="0: above, doubling the heads helped"))
    handles.append(Patch(color="orange", alpha=0.35, label=paper_text))
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle("Double heads ablation: dL at equal training tokens", fontsize=11)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(path, dpi=150, format="png")
    plt.close(fig)


def csv_text(curves, unit):
    """The CSV of the curves: CSV_COLUMNS (the interval is the 95% t one, empty with one seed), then each seed's
    dL, dL_seed<seed> (empty where that seed is not in a variant)."""
    all_seeds = sorted({s for c in curves.values() for s in c.seeds})
    rows = [CSV_COLUMNS + [f"dL_seed{s}" for s in all_seeds]]
    for label, c in curves.items():
        for i, t in enumerate(c.tokens):
            per_seed = dict(zip(c.seeds, c.delta[:, i]))
            values = [c.base[i], c.double[i], c.mean[i], c.low[i], c.high[i]]
            cells = ["" if math.isnan(v) else repr(float(v)) for v in values]
            rows.append([label, int(t), len(c.seeds), unit] + cells
                        + [repr(float(per_seed[s])) if s in per_seed else "" for s in all_seeds])
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    return text.getvalue().encode()


def write_outputs(curves, unit, png_path, csv_path):
    """Write the PNG and the CSV of the curves, both or neither (atomic_write)."""
    os.makedirs(os.path.dirname(os.path.abspath(png_path)), exist_ok=True)
    atomic_write({png_path: functools.partial(plot, curves, unit), csv_path: csv_text(curves, unit)})


def read_csv_curves(path):
    """({label: Curve}, unit) from a CSV that plot.py wrote (this version's, or the earlier one without `unit`, whose
    runs were byte-level: nats/byte). Each variant keeps the seeds with a dL at every one of its rows."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise PlotError(f"--from_csv {path}: cannot read it ({e})") from None
    seed_columns = [k for k in (rows[0] if rows else {}) if k.startswith("dL_seed") and k[7:].isdigit()]
    if not rows or not seed_columns or "variant" not in rows[0] or "tokens" not in rows[0]:
        raise PlotError(f"--from_csv {path}: not a CSV written by plot.py (variant, tokens, dL_seed<N> columns)")
    units = {r.get("unit") or "nats/byte" for r in rows}
    if len(units) != 1 or not units <= {"nats/byte", "nats/token"}:
        got = ", ".join(sorted(units))
        raise PlotError(f"--from_csv {path}: its unit must be one of nats/byte, nats/token; got {got}")
    curves = {}
    for label in dict.fromkeys(r["variant"] for r in rows):
        if label not in LABEL_STYLE:
            raise PlotError(f"--from_csv {path}: unknown variant {label!r} (plot.py draws {', '.join(LABEL_STYLE)})")
        mine = [r for r in rows if r["variant"] == label]
        seeds = [int(k[7:]) for k in seed_columns if all(r[k] not in ("", None) for r in mine)]
        try:
            tokens = [int(r["tokens"]) for r in mine]
            delta = [[float(r[f"dL_seed{s}"]) for r in mine] for s in seeds]
            base = [float(r["val_loss_baseline"]) for r in mine]
            double = [float(r["val_loss_double_heads"]) for r in mine]
            n_seeds = {int(r["n_seeds"]) for r in mine if r.get("n_seeds")}
        except (KeyError, TypeError, ValueError) as e:
            raise PlotError(f"--from_csv {path}: {label}: a value is not a number ({e})") from None
        if tokens[0] < 0 or tokens[-1] >= 2**62 or any(a >= b for a, b in zip(tokens, tokens[1:])):
            raise PlotError(f"--from_csv {path}: {label}: tokens must be >= 0 and increase row by row, below 2**62")
        if not all(abs(x) < 1e6 for x in [*base, *double, *(d for seed in delta for d in seed)]):  # False for nan
            raise PlotError(f"--from_csv {path}: {label}: a loss or dL is not a finite number (nan, inf or >= 1e6)")
        if not seeds or n_seeds - {len(seeds)}:
            raise PlotError(f"--from_csv {path}: {label}: n_seeds does not match its dL_seed<N> columns")
        curves[label] = Curve(seeds, tokens, base, double, delta)
    return curves, units.pop()


def check_output(output):
    """Refuse an --output that is not a .png, or whose folder cannot be made because a parent is a file."""
    if os.path.splitext(output)[1].lower() != ".png":
        raise PlotError(f"--output must end in .png, got {output!r}")
    for parent in pathlib.Path(os.path.abspath(output)).parents:
        if parent.exists():
            if not parent.is_dir():
                raise PlotError(f"--output {output!r}: {parent} is a file, not a folder")
            return


def main(argv=None):
    """The command line: returns the exit status (0, or 2 after a one-line error on stderr)."""
    p = ArgumentParser(description=__doc__.splitlines()[0])  # a bad flag is one UsageError line
    source = p.add_mutually_exclusive_group()
    source.add_argument("--out_dir", help="folder holding one subfolder per run (default: out)")
    source.add_argument("--from_csv", help="redraw from a CSV that plot.py wrote (each seed's dL is in it)")
    p.add_argument("--output", help="PNG to write (relative to the current directory; default "
                   "double_heads_ablation.png, with a CSV beside it)")
    try:
        args = p.parse_args(argv)
        return run(args.out_dir or "out", args.output or "double_heads_ablation.png", args.from_csv)
    except (PlotError, UsageError, OSError) as e:
        print(f"plot.py: error: {e}", file=sys.stderr)
        return 2


def curves_from_runs(out_dir):
    """({label: Curve}, unit) of the runs in out_dir, each baseline seed paired with its double-heads seed."""
    if not os.path.isdir(out_dir):
        raise PlotError(f"--out_dir {out_dir!r} is not a directory")
    runs = {name: (seed_runs(out_dir, name), seed_runs(out_dir, name + DOUBLE_SUFFIX)) for name in VARIANTS}
    if not any(base and double for base, double in runs.values()):
        raise PlotError(f"no variant in {out_dir!r} has both its baseline and {DOUBLE_SUFFIX} run "
                        "(each needs <run>/seed<seed>/metrics.jsonl)")
    found = {}
    for name, (base, double) in runs.items():
        label = STYLE[name][0]
        for run_name, seeds in ((name, base), (name + DOUBLE_SUFFIX, double)):
            if not seeds:
                warn(f"missing run {os.path.join(out_dir, run_name)} (no metrics.jsonl); {label} is not plotted")
        if base and double:
            found[label] = (base, double)
    pairs = matched_pairs(found)
    if not any(pairs.values()):
        raise PlotError(f"no seed in {out_dir!r} has a baseline and a double-heads run that are an ablation pair "
                        "(see the notes above)")
    curves = {}
    for label, ps in pairs.items():
        curve = paired_curve(label, ps) if ps else None
        if curve is not None:
            curves[label] = curve
    if not curves:
        raise PlotError("no variant has any evaluation usable in both runs")
    return curves, loss_unit(pairs)


def run(out_dir, output, from_csv=None):
    """Read the runs in out_dir (or the CSV from_csv), write the PNG `output` and its CSV, print the final dL."""
    check_output(output)
    curves, unit = read_csv_curves(from_csv) if from_csv else curves_from_runs(out_dir)
    csv_path = os.path.splitext(output)[0] + ".csv"
    write_outputs(curves, unit, output, csv_path)
    print(f"wrote {output} and {csv_path}")
    print(f"final dL ({unit}): mean over seeds, its 95% t interval (t with n - 1 degrees of freedom), each seed")
    for label, c in curves.items():
        interval = f"[{c.low[-1]:+.4f}, {c.high[-1]:+.4f}]" if len(c.seeds) > 1 else "(one seed: no interval)"
        per_seed = ", ".join(f"{s}: {d:+.4f}" for s, d in zip(c.seeds, c.delta[:, -1]))
        above = int((c.delta[:, -1] > 0).sum())
        print(f"{label:<6} {len(c.seeds)} seed(s) at {int(c.tokens[-1]):,} tokens: {c.mean[-1]:+.4f} {interval}; "
              f"{above}/{len(c.seeds)} above 0; {per_seed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
