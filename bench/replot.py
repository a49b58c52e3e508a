"""Redraw the double-heads figure from the CSV that plot.py wrote beside it.

The runs are not needed: each seed's dL is in the CSV, so the means and their 95% t intervals are computed again, and
the title's setting is the CSV's. Only the PNG is written: the CSV is the input and stays as it is.

    python bench/replot.py assets/double_heads_P1.csv [--output assets/double_heads_P1.png]

--output defaults to the CSV's path with .png. Bad input: one line on stderr, exit status 2, nothing written.
"""
import argparse
import csv
import io
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import numpy as np  # noqa: E402

import plot  # noqa: E402


class ReplotError(Exception):
    """Bad input: main() prints it as one line and returns 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors raise ReplotError (one line, exit status 2) instead of printing its usage block."""

    def error(self, message):
        raise ReplotError(message)


def require(ok, message):
    """Raise ValueError(message) unless ok: a check of the input (an assert would vanish under python -O)."""
    if not ok:
        raise ValueError(message)


def read_csv_curves(path):
    """({label: Curve}, unit, setting) from a CSV that plot.py wrote. Each variant keeps the seeds with a dL in each
    of its rows; the means and intervals are computed again from them. A CSV edited into something plot.py would not
    write (an unknown variant, a value that is not a finite number, tokens not increasing, two units or settings)
    raises ReplotError."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
        columns = plot.CSV_COLUMNS
        require(rows and set(columns) <= rows[0].keys(), f"columns {', '.join(columns)}, dL_seed<seed>")
        units, settings = {r["unit"] for r in rows}, {r["setting"] for r in rows}
        require(units in ({"nats/byte"}, {"nats/token"}), "its unit must be nats/byte or nats/token, in every row")
        require(len(settings) == 1, "one setting in every row")
        curves = {}
        for label in dict.fromkeys(r["variant"] for r in rows):
            require(label in plot.LABEL_STYLE, f"unknown variant {label!r}")
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
            curves[label] = plot.Curve(seeds, tokens, base, double, delta)
    except (OSError, UnicodeDecodeError, csv.Error, KeyError, TypeError, ValueError) as e:
        raise ReplotError(f"{path}: not a CSV as plot.py writes it ({e})") from None
    return curves, units.pop(), settings.pop()


def write_png(curves, unit, setting, output):
    """Draw the figure (plot.plot) and write it to the PNG `output`, drawn whole before anything is written; then print
    each variant's final dL: the mean over seeds, its 95% t interval, and each seed's."""
    png = io.BytesIO()
    plot.plot(curves, unit, setting, png)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    pathlib.Path(output).write_bytes(png.getvalue())
    print(f"wrote {output}")
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
    p.add_argument("csv", help="a CSV that plot.py wrote")
    p.add_argument("--output", help="PNG to write (default: the CSV's path with .png)")
    try:
        args = p.parse_args(argv)
        output = args.output or str(pathlib.Path(args.csv).with_suffix(".png"))
        if os.path.splitext(output)[1].lower() != ".png":  # before anything is read
            raise ReplotError(f"--output must end in .png, got {output!r}")
        curves, unit, setting = read_csv_curves(args.csv)
        write_png(curves, unit, setting, output)
    except (ReplotError, OSError) as e:
        print(f"replot.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
