"""What a run is, and reading it back: its spec, its checkpoint and its metrics, each checked before we trust it.

A run folder holds config.json (the spec and the data's source), metrics.jsonl (one evaluation a line) and ckpt.pt
(weights, AdamW state, the step, the spec). train.py resumes a run only under the spec it started with, and never
erases what a run saved unless told to (--overwrite).
"""
import dataclasses
import functools
import json
import math
import os
import pathlib

import torch

from harness.files import remove_stale_temporaries, write_run_file
from harness.stops import UsageError

# The flags that define a run, besides the model: resuming under other values is refused.
TRAIN_SPEC = ("preset", "max_iters", "batch_size", "grad_accum", "learning_rate", "warmup_iters", "weight_decay",
              "grad_clip", "eval_interval", "eval_iters", "seed", "init")
CHECKPOINT_KEYS = ("model", "optimizer", "iter", "elapsed_s", "train_loss_sum", "train_loss_count", "config")


def run_spec(args, config, fingerprint, dtype):
    """What a run is: its model (a gla.GPTConfig), its training flags (TRAIN_SPEC), the autocast dtype and the data,
    by its content (a moved folder resumes). A dict of dicts, saved in config.json and in every checkpoint."""
    train = {key: getattr(args, key) for key in TRAIN_SPEC}
    train["dtype"] = str(dtype).removeprefix("torch.")
    return {"model": dataclasses.asdict(config), "train": train, "data": {"fingerprint": fingerprint}}


class RunFiles:
    """A run folder's files, written by rank 0 alone: config.json, metrics.jsonl and ckpt.pt. saved: the iteration
    of the checkpoint on disk (0: none yet), which a failed write's message names."""

    def __init__(self, folder, spec, master):
        self.folder = pathlib.Path(folder)
        self.spec = spec
        self.master = master
        self.ckpt_path = self.folder / "ckpt.pt"
        self.metrics_path = self.folder / "metrics.jsonl"
        self.saved = 0

    def kept(self):
        if self.saved:
            return f"the checkpoint of iteration {self.saved} and its metrics are kept"
        return "no checkpoint yet"

    def start(self, rows, source):
        """Write config.json (the spec and the data's source), and metrics.jsonl as `rows`, the evaluations up to the
        checkpoint we start from: a resume neither repeats nor loses one. Starting from scratch removes a stale
        checkpoint, so that it is never resumed later."""
        if not self.master:
            return
        if self.saved == 0:
            self.ckpt_path.unlink(missing_ok=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.folder, ("ckpt.pt", "config.json", "metrics.jsonl"))
        info = dict(self.spec, data={**self.spec["data"], "source": source})
        write_run_file(self.folder / "config.json", json.dumps(info, indent=2).encode(), self.kept())
        write_run_file(self.metrics_path, "".join(json.dumps(row) + "\n" for row in rows).encode(), self.kept())

    def append_metrics(self, row):
        """Append one evaluation: a kill may cut the line, which read_metrics then skips."""
        if self.master:
            write_run_file(self.metrics_path, (json.dumps(row) + "\n").encode(), self.kept(), append=True)

    def save(self, checkpoint):
        """Save a checkpoint dict atomically: a kill leaves the old one or the new one."""
        if self.master:
            write_run_file(self.ckpt_path, functools.partial(torch.save, checkpoint), self.kept())
        self.saved = checkpoint["iter"]


def saved_iter(path):
    """The iteration of the checkpoint at path, 0 if there is none or it cannot be read (resuming will say why)."""
    if not os.path.exists(path):
        return 0
    try:
        step = torch.load(path, map_location="cpu", weights_only=True, mmap=True)["iter"]
    except Exception:  # any unreadable checkpoint: load_checkpoint reports it in one line
        return 0
    return step if type(step) is int else 0


def spec_differences(saved, current):
    """Each key of the spec `current` that `saved` gives another value, as 'part.key: saved -> current'. A key only
    saved names a setting train.py no longer has, at the one value it still trains with: not a difference."""
    differences = []
    for part, values in current.items():
        for key, value in values.items():
            old = saved.get(part, {}).get(key)
            if old != value:
                differences.append(f"{part}.{key}: {old!r} -> {value!r}")
    return differences


def load_checkpoint(path, spec):
    """The checkpoint at path (weights_only: loading it cannot run code), checked: every key train.py saves, an int
    step and finite loss sums, and the spec `spec`. Raises UsageError (one line) otherwise."""
    fix = "delete it to start that run over, or use --overwrite"
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # unpickling errors come in many types; all mean the same here
        raise UsageError(f"cannot resume {path}: not a readable checkpoint of train.py ({type(e).__name__}); "
                         f"{fix}") from None
    missing = [key for key in CHECKPOINT_KEYS if not isinstance(ckpt, dict) or key not in ckpt]
    if missing:
        raise UsageError(f"cannot resume {path}: the checkpoint lacks {', '.join(missing)}; {fix}")
    numbers = (ckpt["elapsed_s"], ckpt["train_loss_sum"], ckpt["train_loss_count"])
    if (type(ckpt["iter"]) is not int or ckpt["iter"] < 0 or not isinstance(ckpt["config"], dict)
            or not all(isinstance(x, (int, float)) and math.isfinite(x) for x in numbers)):
        raise UsageError(f"cannot resume {path}: its step, loss sums or spec are not what train.py saves; {fix}")
    differences = spec_differences(ckpt["config"], spec)
    if differences:
        raise UsageError(f"cannot resume {path}: it was trained with a different setup ({', '.join(differences)}); "
                         "use --overwrite to start over, or another --out_dir")
    return ckpt


def read_metrics(path, up_to_iter=None):
    """The evaluations in metrics.jsonl (dicts with an int "iter"), up to iteration up_to_iter (None: all). Lines
    that are not such a record (the last one cut by a kill, say) are skipped. Raises UsageError if the file cannot
    be read as text."""
    if not path.exists():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {path} ({e.strerror if isinstance(e, OSError) else 'not UTF-8 text'}); "
                         "move it away, or use --overwrite to start that run over") from None
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and type(row.get("iter")) is int:
            if up_to_iter is None or row["iter"] <= up_to_iter:
                rows.append(row)
    return rows


def check_existing_run(folder, resume, overwrite, first_checkpoint):
    """Refuse (UsageError) to touch a run folder that holds saved work unless told what to do with it:
    - a checkpoint: --resume continues it, --overwrite starts it over;
    - evaluations past the first checkpoint's iteration (first_checkpoint: min(--ckpt_interval, --max_iters)) but no
      checkpoint: it was deleted (to save disk, keeping the metrics for the figure, say); --resume cannot continue
      the run and must not erase its metrics, so only --overwrite starts it over;
    - evaluations up to the first checkpoint's iteration and no checkpoint: a kill came before that checkpoint was
      written (or between its evaluation and its save); --resume starts the run over, losing nothing a checkpoint
      kept."""
    if overwrite:
        return
    has_checkpoint = (folder / "ckpt.pt").exists()
    rows = read_metrics(folder / "metrics.jsonl")
    if has_checkpoint and not resume:
        raise UsageError(f"{folder} already holds a trained run; pass --resume to continue it, --overwrite to start "
                         "over, or another --out_dir")
    if has_checkpoint or not rows:
        return
    last = max(row["iter"] for row in rows)
    if last > first_checkpoint:
        raise UsageError(f"{folder} holds {len(rows)} evaluations up to iteration {last} but no ckpt.pt: --resume "
                         "cannot continue it; pass --overwrite to start it over (its metrics are lost), or another "
                         "--out_dir")
    if not resume:
        raise UsageError(f"{folder} holds the evaluations of a run stopped before its first checkpoint; pass "
                         "--resume to start it over, --overwrite to start every run over, or another --out_dir")


def load_state(model, state, where):
    """Load a state dict into model. Raises UsageError (one line, after `where`) naming missing, unexpected or
    misshapen entries."""
    own = model.state_dict()
    problems = []
    missing = sorted(own.keys() - state.keys())
    unexpected = sorted(state.keys() - own.keys())
    misshapen = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in sorted(own.keys() & state.keys())
                 if tuple(state[k].shape) != tuple(own[k].shape)]
    for what, keys in (("missing", missing), ("unexpected", unexpected), ("shape differs", misshapen)):
        if keys:
            problems.append(f"{what}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}")
    if problems:
        raise UsageError(f"{where}: the weights do not fit this model ({'; '.join(problems)})")
    model.load_state_dict(state)
