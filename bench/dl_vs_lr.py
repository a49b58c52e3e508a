"""dL against the learning rate at P1 (800 warm-up steps), from the runs docs/results.md reports, and the schedule
rule blind to dL. Reads assets/schedule_sweeps.csv (the P1 and tiny schedule tables of docs/results.md, one row per
setting and seed, or per setting and seed pair for tiny), draws the figure and prints its numbers:

    python bench/dl_vs_lr.py [--output assets/dl_vs_lr_P1.png]

Each point is the mean final dL over the seeds measured at that rate, with its 95% t interval (t with n - 1 degrees
of freedom); each seed is a small marker (circle: the AMD EPYC guest, triangle: the Intel Xeon). A seed measured on
both machines at one rate (seed 1337 at lr 8e-3) counts once, from the machine that ran the most seeds there (the
Xeon, whose four seeds are assets/double_heads_P1_xeon.csv: README's P1 figure before the width rule made the arms
equal in parameters). Only measured values are plotted.

The baselines' mean final loss of a setting, which a rule blind to dL compares, follows from the tables: the six
runs' mean is (sum of the three baselines + sum of the three doubled models) / 6, and each doubled model's loss is its
baseline's - dL, so the baselines' mean = the six runs' mean + mean(dL) / 2.
"""
import argparse
import csv
import math
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import numpy as np  # noqa: E402

import plot  # noqa: E402

SWEEPS_CSV = pathlib.Path(__file__).resolve().parents[1] / "assets" / "schedule_sweeps.csv"
WARMUP = 800
RATES = (2e-3, 4e-3, 8e-3, 1.6e-2)
VARIANT_COLUMNS = {"GQA": "dL_gqa", "MLA": "dL_mla", "GLA-2": "dL_gla2"}
MACHINE_MARKERS = {"EPYC": "o", "Xeon": "^"}
TARGET_HALF_WIDTH = 0.005  # the 95% interval that would resolve the paper's size of effect
Z975 = 1.959964  # the normal distribution's two-sided 95% quantile


def read_sweeps(path=SWEEPS_CSV):
    """The rows of assets/schedule_sweeps.csv, with warmup_iters an int, learning_rate and the losses floats (the mean
    final loss None where the notebook does not give it)."""
    rows = []
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            row["warmup_iters"] = int(row["warmup_iters"])
            row["learning_rate"] = float(row["learning_rate"])
            loss = row["mean_final_val_loss"]
            row["mean_final_val_loss"] = float(loss) if loss else None
            for column in VARIANT_COLUMNS.values():
                row[column] = float(row[column])
            rows.append(row)
    return rows


def p1_seeds_at(rows, rate):
    """P1's rows at WARMUP steps and `rate`, one per seed: where a seed ran on two machines, the row of the machine
    that ran the most seeds at that rate."""
    mine = [r for r in rows if r["sweep"] == "P1" and r["warmup_iters"] == WARMUP and r["learning_rate"] == rate]
    machines = [r["machine"] for r in mine]
    by_seed = {}
    for r in mine:
        kept = by_seed.get(r["seeds"])
        if kept is None or machines.count(r["machine"]) > machines.count(kept["machine"]):
            by_seed[r["seeds"]] = r
    return [by_seed[s] for s in sorted(by_seed)]


def machines(seeds):
    """Where a rate's seeds ran: "EPYC", "Xeon", or e.g. "1 EPYC + 3 Xeon"."""
    names = [r["machine"] for r in seeds]
    if len(set(names)) == 1:
        return names[0]
    return " + ".join(f"{names.count(m)} {m}" for m in MACHINE_MARKERS if m in names)


def y_range(points, paper):
    """The y axis' range: zero, the paper's band, every mean and every seed but outliers (beyond 3 interquartile
    ranges of all the seeds: at lr 1.6e-2 MLA's seed 1338, -0.0564, would stretch the axis to twice the rest), padded
    by 8%."""
    values = np.array([r[column] for rate in RATES for r in points[rate] for column in VARIANT_COLUMNS.values()])
    q1, q3 = np.percentile(values, [25, 75])
    inside = values[(values >= q1 - 3 * (q3 - q1)) & (values <= q3 + 3 * (q3 - q1))]
    means = [np.mean([r[c] for r in points[rate]]) for rate in RATES for c in VARIANT_COLUMNS.values()]
    lo, hi = min(inside.min(), *means, 0.0), max(inside.max(), *means, paper[1])
    return lo - 0.08 * (hi - lo), hi + 0.08 * (hi - lo)


def draw(points, path):
    """The figure: per variant, the mean final dL at each rate with its 95% t interval, and each seed's marker. A line
    joins two neighbouring rates only where both ran on one machine (the machine alone moves a seed's dL by up to
    0.015). An outlier seed beyond y_range is a triangle on the axis' edge with its value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(9.2, 4.8))
    paper, paper_text = plot.paper_range("nats/byte")
    ax.axhspan(paper[0], paper[1], color="orange", alpha=0.35, lw=0, zorder=0)
    ax.axhline(0.0, color="black", lw=0.9, ls="--", zorder=1)
    lo, hi = y_range(points, paper)
    where = [machines(points[rate]) for rate in RATES]
    for k, label in enumerate(VARIANT_COLUMNS):
        colour = plot.LABEL_STYLE[label][0]
        shift = 2 ** (0.09 * (k - 1))  # side by side on the log axis
        means = []
        for rate in RATES:
            seeds = points[rate]
            mean, low, high = plot.ci95([r[VARIANT_COLUMNS[label]] for r in seeds])
            ax.errorbar([rate * shift], [mean], yerr=[[mean - low], [high - mean]], color=colour, capsize=4, lw=1.4,
                        marker="s", ms=6, zorder=4)
            for r in seeds:
                value = r[VARIANT_COLUMNS[label]]
                x, y = rate * shift * 1.04, np.clip(value, lo, hi)
                if lo <= value <= hi:
                    ax.plot([x], [y], marker=MACHINE_MARKERS[r["machine"]], ms=4, color=colour, alpha=0.6, zorder=3)
                else:  # an outlier: a triangle on the edge, pointing to it, and its value
                    ax.plot([x], [y], marker="v" if value < lo else "^", ms=7, color=colour, zorder=5, clip_on=False)
                    ax.annotate(f"{label} seed {r['seeds']} ({r['machine']}): {value:+.4f}", (x, y), xytext=(-6, 4),
                                textcoords="offset points", ha="right", fontsize=7, color=colour)
            means.append(mean)
        for i in range(len(RATES) - 1):
            if where[i] == where[i + 1] and where[i] in MACHINE_MARKERS:
                ax.plot([RATES[i] * shift, RATES[i + 1] * shift], means[i:i + 2], color=colour, lw=1.0, alpha=0.7,
                        zorder=2)
    ax.set_ylim(lo, hi)
    ax.set_xscale("log", base=2)
    ax.set_xticks(RATES)
    ax.set_xticklabels([f"{rate:g}\n{len(points[rate])} seeds\n{w}" for rate, w in zip(RATES, where)])
    ax.minorticks_off()
    ax.set_xlabel("peak learning rate (800 warm-up steps, cosine to 0.1x over 3,000 steps), seeds, their machine")
    ax.set_ylabel("final dL = L(baseline) − L(double heads), nats/byte")
    ax.set_title("P1 (0.43M parameters, 6.1M tokens): final dL against the learning rate", fontsize=10)
    ax.grid(True, alpha=0.3)
    handles = [Line2D([], [], color=plot.LABEL_STYLE[label][0], marker="s", lw=1.4, label=label)
               for label in VARIANT_COLUMNS]
    handles.append(Line2D([], [], color="gray", marker="s", lw=1.4, label="mean over seeds, 95% t interval"))
    handles.append(Line2D([], [], color="gray", lw=1.0, alpha=0.7, label="line: rates run on one machine"))
    handles += [Line2D([], [], color="gray", marker=m, ls="none", alpha=0.6, label=f"one seed ({machine})")
                for machine, m in MACHINE_MARKERS.items()]
    handles.append(Patch(color="orange", alpha=0.35, label="paper, converted: +0.00046 to +0.0023"))
    ax.legend(handles=handles, fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=150, format="png")
    plt.close(fig)


def seeds_needed(sd, half_width=TARGET_HALF_WIDTH):
    """The smallest n whose 95% t interval of a mean, t975(n - 1) sd / sqrt(n), is at most half_width."""
    n = 2
    while plot.t975(n - 1) * sd / math.sqrt(n) > half_width:
        n += 1
    return n


def report(rows, points):
    """Print the figure's numbers, the falls from lr 2e-3 to 8e-3, the seeds a +-0.005 interval needs, and the
    baselines' mean final loss of every setting (the rule blind to dL)."""
    print(f"P1, {WARMUP} warm-up steps: final dL, mean [95% t interval] over seeds; each seed (machine)")
    for rate in RATES:
        for label, column in VARIANT_COLUMNS.items():
            values = np.array([r[column] for r in points[rate]])
            mean, low, high = plot.ci95(values)
            seeds = ", ".join(f"{r['seeds']} {r[column]:+.4f} ({r['machine']})" for r in points[rate])
            print(f"  lr {rate:<7g}{label:<6} n={len(values)} {mean:+.4f} [{low:+.4f}, {high:+.4f}]; {seeds}")
    falls = 0
    pairs = 0
    for label, column in VARIANT_COLUMNS.items():
        before = {r["seeds"]: r[column] for r in points[2e-3]}
        for r in points[8e-3]:
            if r["seeds"] in before:
                pairs += 1
                falls += r[column] < before[r["seeds"]]
    print(f"dL falls from lr 2e-3 to 8e-3 in {falls} of {pairs} seed x variant pairs")
    sds = [float(np.std([r[column] for r in points[rate]], ddof=1)) for rate in RATES for column in
           VARIANT_COLUMNS.values()]
    pooled = math.sqrt(sum(s * s for s in sds) / len(sds))
    z_seeds = (2 * Z975 * pooled / TARGET_HALF_WIDTH) ** 2 / 4
    print(f"seed SD of final dL at P1 (4 rates x 3 variants, 3 df each): {min(sds):.4f} to {max(sds):.4f}, pooled "
          f"{pooled:.4f}; a 95% interval of +-{TARGET_HALF_WIDTH} needs n = (2 x 1.96 x {pooled:.4f} / "
          f"{TARGET_HALF_WIDTH})^2 / 4 = {z_seeds:.1f} seeds (normal), {seeds_needed(pooled)} (t), "
          f"{seeds_needed(min(sds))}-{seeds_needed(max(sds))} over the measured SDs")
    print("baselines' mean final loss = the six runs' mean + mean(dL) / 2 (the rule blind to dL), per setting:")
    for r in rows:
        if r["mean_final_val_loss"] is None:
            continue
        mean_dl = sum(r[c] for c in VARIANT_COLUMNS.values()) / 3
        baselines = r["mean_final_val_loss"] + mean_dl / 2
        print(f"  {r['sweep']:<5}{r['warmup_iters']:>5} {r['learning_rate']:<7g}{r['seeds']:<10}{r['machine']:<5} "
              f"six {r['mean_final_val_loss']:.4f}  baselines {baselines:.4f}")


def main(argv=None):
    """Draw the figure to --output and print its numbers; 0, or 2 with one line for an --output that is not .png."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", default="dl_vs_lr_P1.png", help="PNG to write (default dl_vs_lr_P1.png)")
    args = p.parse_args(argv)
    if not args.output.lower().endswith(".png"):
        print(f"dl_vs_lr.py: error: --output must end in .png, got {args.output!r}", file=sys.stderr)
        return 2
    rows = read_sweeps()
    points = {rate: p1_seeds_at(rows, rate) for rate in RATES}
    try:
        draw(points, args.output)
    except OSError as e:
        print(f"dl_vs_lr.py: error: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}")
    report(rows, points)
    return 0


if __name__ == "__main__":
    sys.exit(main())
