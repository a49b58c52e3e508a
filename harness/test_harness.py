"""Tests for the machinery around train.py (harness/): one-line errors for bad input, signals, full disks, run locks,
the memory pre-flight and the job's estimate. test_gla.py tests what a reader reads.

python -m pytest -q    # from the repository root, with test_gla.py
"""
# First test_gla, which sets up Triton's interpreter where there is no GPU before anything imports kernels.py (train.py
# does); then the training tests' runs and fixtures (corpus, text_file: pytest finds them by name here).
from test_gla import FAST, NARROW, REPO, SEED, corpus, metrics, rdir, strip_timing, text_file  # noqa: F401
from test_gla import write_tokens

import dataclasses
import errno
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import weakref

import numpy as np
import pytest
import torch

import gla
import train
from bench import memory as memory_bench
from harness import checkpoints, context, files, memory, preflight, progress, stops
import harness.data
from harness.data import TokenData


# The smallest runs: the tests of the machinery check what it does, not what the model learns.
TINY = ["--batch_size", "4", "--block_size", "16", "--eval_iters", "1", "--warmup_iters", "2", "--seeds", "1", *NARROW]


def has_rows(path):
    """metrics.jsonl holds an evaluation (the run trains)."""
    return path.exists() and path.stat().st_size > 0


def one_line_error(err):
    """One error line (progress bars aside, which tqdm draws with carriage returns)."""
    lines = [line for line in err.splitlines() if "error" in line]
    return len(lines) == 1 and lines[0].startswith("train.py: error:") and "Traceback" not in err


def bad_inputs(tmp_path):
    """argv -> the words the error must contain."""
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "short.txt").write_bytes(b"too short for a block")
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "train.bin").write_bytes(b"\x00" * 1001)
    (odd / "val.bin").write_bytes(b"\x00" * 1000)
    big = tmp_path / "big"
    big.mkdir()
    write_tokens(big / "train.bin", [1000] * 600)
    write_tokens(big / "val.bin", [7] * 600)
    (tmp_path / "a_file").write_text("x")
    for name, header, n in [("magic", [123, 1, 600], 600), ("version", [20240520, 2, 600], 600),
                            ("length", [20240520, 1, 900], 600), ("negative", [20240520, 1, -5], 600)]:
        d = tmp_path / name
        d.mkdir()
        write_tokens(d / "fw_train_000001.bin", [1] * n, header)
        write_tokens(d / "fw_val_000000.bin", [1] * 600, [20240520, 1, 600])
    stub = tmp_path / "stub"  # 8 bytes: the right magic and version, then nothing
    stub.mkdir()
    (stub / "fw_train_000001.bin").write_bytes(np.array([20240520, 1], dtype=np.int32).tobytes())
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    write_tokens(stub / "fw_val_000000.bin", [1] * 600, [20240520, 1, 600])
    cases = {
        ("--attn", "foo"): "invalid choice",
        ("--preset", "huge"): "invalid choice",
        ("--attn", "gla2", "--n_head", "5"): "GLA-2 cannot split n_head=5",
        ("--attn", "gqa", "--n_head", "6", "--n_kv_head", "4"): "n_kv_head=4",
        ("--data", str(tmp_path / "missing.txt")): "no such file",
        ("--data", str(tmp_path / "empty.txt")): "empty",
        ("--data", str(tmp_path / "short.txt")): "one block",
        ("--data", str(odd)): "whole number of uint16",
        ("--data", str(big)): "token id 1000 >= vocab_size 256",
        ("--data", str(tmp_path / "magic")): "found [123, 1]",
        ("--data", str(tmp_path / "version")): "found [20240520, 2]",
        ("--data", str(tmp_path / "length")): "truncated",
        ("--data", str(tmp_path / "negative")): "header says -5 tokens",
        ("--data", str(stub)): "found [20240520, 1] in 8 bytes",
        ("--max_iters", "0"): "--max_iters must be positive",
        ("--batch_size", "-2"): "--batch_size must be positive",
        ("--block_size", "0"): "--block_size must be positive",
        ("--eval_interval", "0"): "--eval_interval must be positive",
        ("--batch_size", "6", "--grad_accum", "4"): "not divisible",
        ("--out_dir", str(tmp_path / "a_file" / "out")): "not a writable folder",
        ("--data", str(tmp_path / "magic" / "fw_train_000001.bin")): "pass --data",
        ("--grad_clip", "-1"): "--grad_clip must be a positive finite number",
        ("--learning_rate", "inf"): "--learning_rate must be a positive finite number",
        ("--weight_decay", "nan"): "--weight_decay must be a finite number",
        ("--seed", "-1"): "= [0, 4294967295], got -1",
        ("--seed", str(2**32)): "= [0, 4294967295], got 4294967296",
        ("--seed", str(2**32 - 1), "--seeds", "2"): "= [0, 4294967294], got 4294967295",
        ("--seeds", "0"): "--seeds must be positive",
        ("--warmup_iters", "-1"): "--warmup_iters must be zero or more",
        ("--resume", "--overwrite"): "argument --overwrite: not allowed with argument --resume",
        ("--attn", "all", "--double_heads"): "--double_heads picks one arm of a variant",
        ("--attn", "gqa", "--kv_lora_rank", "16"): "GQA has none",
        ("--out_dir", ""): "--out_dir is empty",
        # The baseline builds; its double-heads twin, which --init coupled draws against, does not.
        ("--attn", "mla", "--n_embd", "32", "--head_dim", "8", "--n_layer", "1", "--n_head", "6"): "mla_double_heads",
        ("--data", str(loop)): "a broken or looping symbolic link",
        ("--data", "/dev/null"): "not a regular file or folder",
        ("--temperature", "0.5"): "unrecognized arguments: --temperature 0.5",
        ("--tp", "2"): "unrecognized arguments: --tp 2",
    }
    if not torch.cuda.is_available():
        cases[("--device", "cuda")] = "CUDA is not available"
    return cases


def test_bad_input_one_line_error_and_nothing_written(tmp_path, text_file, capsys):
    for argv, words in bad_inputs(tmp_path).items():
        out = tmp_path / "runs"
        defaults = ["--max_iters", "30", "--data", str(text_file), "--out_dir", str(out), "--seeds", "1"]
        argv = [*defaults, *argv]  # later flags win: the bad value is the one parsed
        assert train.cli(argv) == 2, argv
        err = capsys.readouterr().err
        assert one_line_error(err), (argv, err)
        assert words in err, (argv, err)
        assert not list(out.glob("**/metrics.jsonl")) and not list(out.glob("**/ckpt.pt")), argv
        assert not list(out.glob("**/.lock")), argv  # refused before any run folder was claimed


def test_bad_input_from_the_command_line(tmp_path):
    out = subprocess.run([sys.executable, "train.py", "--attn", "gla2", "--n_head", "3", "--out_dir",
                          str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and one_line_error(out.stderr), out.stderr
    assert not (tmp_path / "o").exists()


def test_diverging_loss_stops_and_keeps_last_good_checkpoint(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    argv = ["--out_dir", str(out), "--data", str(text_file), "--learning_rate", "1e30", "--warmup_iters", "0",
            "--ckpt_interval", "1", "--max_iters", "20", "--batch_size", "4", "--block_size", "32", "--seeds", "1",
            *NARROW]
    assert train.cli(argv) == 1
    err = capsys.readouterr().err
    assert one_line_error(err) and "at iteration" in err, err
    failed_at = int(err.split("at iteration ")[1].split(";")[0])
    ckpt = torch.load(rdir(out, "gqa") / "ckpt.pt", weights_only=True)
    assert 0 < ckpt["iter"] <= failed_at  # saved before the failure, and kept
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


def test_atomic_write_keeps_old_file_when_interrupted(tmp_path):
    path = tmp_path / "ckpt.pt"
    path.write_bytes(b"old")

    def broken(f):
        f.write(b"half of the new")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        files.atomic_write({path: broken})
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["ckpt.pt"]


def test_metrics_without_a_checkpoint_are_never_erased_without_overwrite(tmp_path, text_file, capsys):
    """A finished run whose ckpt.pt was deleted (to save disk, keeping the metrics for the figure): neither a plain
    start nor --resume may empty its metrics.jsonl; one line names --overwrite. A run killed before its first
    checkpoint (evaluations up to that iteration only) is started over by --resume."""
    args = ["--attn", "gqa", "--data", str(text_file), "--max_iters", "20", "--eval_interval", "5",
            "--ckpt_interval", "10", *TINY]
    out = tmp_path / "out"
    assert train.cli([*args, "--out_dir", str(out)]) == 0
    folder = rdir(out, "gqa")
    (folder / "ckpt.pt").unlink()
    kept = (folder / "metrics.jsonl").read_bytes()
    for extra in ([], ["--resume"]):
        assert train.cli([*args, "--out_dir", str(out), *extra]) == 2
        err = capsys.readouterr().err
        assert one_line_error(err) and "holds 4 evaluations up to iteration 20 but no ckpt.pt" in err, err
        assert "pass --overwrite to start it over" in err
        assert (folder / "metrics.jsonl").read_bytes() == kept
    assert train.cli([*args, "--out_dir", str(out), "--overwrite"]) == 0
    assert [r["iter"] for r in metrics(out, "gqa")] == [5, 10, 15, 20]

    early = [json.dumps(row) for row in metrics(out, "gqa")[:2]]  # a kill between the evaluation and the save at 10
    (folder / "ckpt.pt").unlink()
    (folder / "metrics.jsonl").write_text("\n".join(early) + "\n")
    assert train.cli([*args, "--out_dir", str(out)]) == 2
    assert "stopped before its first checkpoint; pass --resume" in capsys.readouterr().err
    assert train.cli([*args, "--out_dir", str(out), "--resume"]) == 0
    assert [r["iter"] for r in metrics(out, "gqa")] == [5, 10, 15, 20]


class FullDisk:
    """A file on a disk that fills after `room` bytes: a write past it raises ENOSPC."""

    def __init__(self, f, room):
        self.f, self.room = f, room

    def write(self, b):
        if len(b) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(b)
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_full_disk_at_a_checkpoint_keeps_the_last_one_and_resume_matches(tmp_path, text_file, capsys, monkeypatch):
    args = ["--attn", "gqa", "--data", str(text_file), "--max_iters", "30", "--eval_interval", "5", "--ckpt_interval",
            "10", *TINY]
    assert train.cli([*args, "--out_dir", str(tmp_path / "ref")]) == 0
    real, checkpoints = files.atomic_write, []

    def full_at_the_second_checkpoint(writers):
        for path, write in list(writers.items()):
            if path.name == "ckpt.pt":
                checkpoints.append(path)
                if len(checkpoints) == 2:  # torch.save itself meets the full disk, 1 kB into the file
                    writers[path] = lambda f: write(FullDisk(f, 1000))
        real(writers)

    monkeypatch.setattr(files, "atomic_write", full_at_the_second_checkpoint)
    out = tmp_path / "full"
    folder = rdir(out, "gqa")
    assert train.cli([*args, "--out_dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert one_line_error(err) and f"cannot write {folder / 'ckpt.pt'}: No space left on device; the checkpoint of " \
        "iteration 10 and its metrics are kept: free space, then --resume" in err, err
    assert torch.load(folder / "ckpt.pt", weights_only=True)["iter"] == 10  # the last one, whole
    assert not list(folder.glob(".*.pt.*"))
    assert [r["iter"] for r in metrics(out, "gqa")] == [5, 10, 15, 20]  # 15 and 20: past the checkpoint
    monkeypatch.setattr(files, "atomic_write", real)  # room again
    assert train.cli([*args, "--out_dir", str(out), "--resume"]) == 0
    assert strip_timing(metrics(out, "gqa")) == strip_timing(metrics(tmp_path / "ref", "gqa"))


def test_a_failed_metrics_append_is_one_line_naming_the_file(tmp_path, text_file, capsys, monkeypatch):
    def read_only(path, mode="r", *args, **kwargs):
        if mode == "ab":
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return open(path, mode, *args, **kwargs)

    monkeypatch.setattr(files, "open", read_only, raising=False)
    out = tmp_path / "out"
    argv = ["--attn", "gqa", "--data", str(text_file), "--max_iters", "5", "--eval_interval", "5", *TINY]
    assert train.cli([*argv, "--out_dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert one_line_error(err) and f"cannot write {rdir(out, 'gqa') / 'metrics.jsonl'}: Read-only file system; no " \
        "checkpoint yet: make it writable, then --resume" in err, err


def test_a_disk_without_room_for_the_runs_is_refused_before_anything_is_written(tmp_path, text_file, capsys,
                                                                                monkeypatch):
    out = tmp_path / "out"
    argv = ["--attn", "all", "--out_dir", str(out), "--data", str(text_file), *FAST]
    args = train.get_args(argv)
    runs = [(train.run_dir(out, v, d, s), train.model_config(args, v, d)) for v, d, s in train.runs_of(args)]
    sizes = [12 * gla.GPT(c).num_params() + preflight.CKPT_SLACK for _, c in runs]
    # every checkpoint, a copy of the largest while it is replaced, 4 metrics rows (iterations 10, 20, 30) per run
    need = sum(sizes) + max(sizes) + len(runs) * 4 * preflight.METRICS_ROW_BYTES
    free = [need]
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 0, free[0]))
    out.mkdir()
    preflight.check_disk(out, runs, 4)  # room enough
    free[0] = need - 1
    with pytest.raises(stops.UsageError, match=f"{len(runs)} run"):
        preflight.check_disk(out, runs, 4)
    rdir(out, "gqa").mkdir(parents=True)
    (rdir(out, "gqa") / "ckpt.pt").write_bytes(b"\0" * 1000)  # a run already there needs less
    preflight.check_disk(out, runs, 4)
    shutil.rmtree(out)
    free[0] = 2**20
    assert train.cli(argv) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and f"need {need / 2**20:,.1f} MiB of disk" in err, err
    assert "but 1.0 MiB are free; free space or choose another --out_dir" in err
    assert not list(out.glob("*/seed*"))


def test_a_second_process_into_a_run_is_refused_and_the_first_is_unharmed(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    args = ["--attn", "mla", "--data", str(text_file), "--max_iters", "20", "--eval_interval", "5", "--ckpt_interval",
            "1000", "--out_dir", str(out), *TINY]
    first = subprocess.Popen([sys.executable, "train.py", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (rdir(out, "mla") / "config.json").exists() and time.time() < deadline and first.poll() is None:
            time.sleep(0.02)
        first.send_signal(signal.SIGSTOP)  # holding its run, stopped: the second comes while it trains
        written = {p: p.read_bytes() for p in rdir(out, "mla").iterdir()}
        for second in ([], ["--overwrite"], ["--attn", "all"]):  # --attn all holds gqa, gqa_double_heads, then mla
            assert train.cli([*args, *second]) == 2
            err = capsys.readouterr().err
            assert one_line_error(err) and f"{rdir(out, 'mla')} is being trained by process {first.pid} on " in err, err
            assert "wait for it to finish, stop it, or choose another --out_dir" in err
            assert {p: p.read_bytes() for p in rdir(out, "mla").iterdir()} == written  # nothing written
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=300) == 0, first.stderr.read()
    assert [r["iter"] for r in metrics(out, "mla")] == [5, 10, 15, 20]
    assert torch.load(rdir(out, "mla") / "ckpt.pt", weights_only=True)["iter"] == 20


def test_sigint_checkpoints_and_resume_gives_identical_metrics(tmp_path, text_file):
    args = ["--attn", "gla2", "--data", str(text_file), "--max_iters", "30", "--eval_interval", "5", "--ckpt_interval",
            "1000", *TINY]  # no checkpoint before the end but the one that the interrupt writes
    assert train.cli([*args, "--out_dir", str(tmp_path / "ref")]) == 0
    out = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, "train.py", *args, "--out_dir", str(out)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not has_rows(rdir(out, "gla2") / "metrics.jsonl") and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    stopped = re.fullmatch(r"train\.py: gla2 seed 1337: interrupted at iteration (\d+): --resume continues\n", err)
    assert proc.returncode == 130 and stopped, err
    at = int(stopped[1])
    assert 5 <= at < 30, "the run finished before the signal; the test proves nothing"
    assert torch.load(rdir(out, "gla2") / "ckpt.pt", weights_only=True)["iter"] == at
    assert train.cli([*args, "--out_dir", str(out), "--resume"]) == 0
    assert strip_timing(metrics(out, "gla2")) == strip_timing(metrics(tmp_path / "ref", "gla2"))


def test_sigterm_to_the_group_checkpoints_and_resume_finishes_every_run(tmp_path, text_file):
    """`timeout` signals the whole process group with SIGTERM, as a terminal's Ctrl-C does with SIGINT: the run in
    training checkpoints after its step and says so in one line, exit 143; --resume finishes it and the runs after
    it."""
    out = tmp_path / "out"
    args = ["--attn", "all", "--data", str(text_file), "--max_iters", "12", "--eval_interval", "4", *TINY,
            "--out_dir", str(out)]
    # a session of its own, so that the signal reaches the whole process group as `timeout`'s does
    proc = subprocess.Popen([sys.executable, "train.py", *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    try:
        while not has_rows(rdir(out, "gqa") / "metrics.jsonl") and time.time() < deadline and proc.poll() is None:
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGTERM)
        err = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stopped = re.fullmatch(r"train\.py: (\w+) seed 1337: interrupted at iteration (\d+): --resume continues\n", err)
    assert proc.returncode == 128 + signal.SIGTERM and stopped, err
    assert torch.load(rdir(out, stopped[1]) / "ckpt.pt", weights_only=True)["iter"] == int(stopped[2]) <= 12
    assert train.cli(args + ["--resume"]) == 0
    folders = list(out.glob("*/seed*"))
    assert len(folders) == 2 * len(gla.VARIANTS)
    for folder in folders:
        assert [json.loads(line)["iter"] for line in (folder / "metrics.jsonl").open()] == [4, 8, 12], folder


def test_resume_refuses_a_different_setup(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    base = ["--attn", "gqa", "--out_dir", str(out), "--data", str(text_file), *FAST]
    assert train.cli(base) == 0
    capsys.readouterr()
    assert train.cli([*base, "--resume", "--n_head", "8"]) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "model.n_head: 4 -> 8" in err, err
    other = tmp_path / "other.txt"
    other.write_bytes(text_file.read_bytes()[::-1])
    assert train.cli([*base, "--resume", "--data", str(other)]) == 2
    assert "data." in capsys.readouterr().err


def test_corrupt_checkpoint_is_a_one_line_error(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    rdir(out, "gqa").mkdir(parents=True)
    (rdir(out, "gqa") / "ckpt.pt").write_bytes(b"garbage")
    (rdir(out, "gqa") / "metrics.jsonl").write_text('[1, 2]\n{"iter": "x"}\n')
    assert train.cli(["--out_dir", str(out), "--data", str(text_file), "--resume", *FAST]) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "not a readable checkpoint" in err, err
    assert checkpoints.read_metrics(rdir(out, "gqa") / "metrics.jsonl", 100) == []  # odd lines are skipped, not fatal


def test_resume_frees_the_loaded_checkpoint(tmp_path, text_file, monkeypatch):
    out = tmp_path / "out"
    argv = ["--attn", "mla", "--out_dir", str(out), "--data", str(text_file), *FAST, "--ckpt_interval", "10"]
    real_step, steps = train.train_step, []

    def interrupted(*args):  # a kill at step 15, after the checkpoint of step 10
        steps.append(1)
        if len(steps) > 15:
            raise KeyboardInterrupt
        return real_step(*args)

    monkeypatch.setattr(train, "train_step", interrupted)
    assert train.cli(argv) == 130  # stopped at once, as by a second Ctrl-C
    assert torch.load(rdir(out, "mla") / "ckpt.pt", weights_only=True)["iter"] == 10

    real_load, loaded = checkpoints.load_checkpoint, []

    def spy(*args):
        ckpt = real_load(*args)
        loaded.append(weakref.ref(ckpt["model"]["blocks.0.attn.wkv_b"]))
        return ckpt

    def check_freed(*args):
        assert loaded and loaded[0]() is None, "the loaded checkpoint is still held while training resumes"
        return real_step(*args)

    monkeypatch.setattr(checkpoints, "load_checkpoint", spy)
    monkeypatch.setattr(train, "train_step", check_freed)
    assert train.cli(argv + ["--resume"]) == 0
    assert [r["iter"] for r in metrics(out, "mla")] == [10, 20, 30]


def test_load_state_errors_are_one_line():
    model = gla.GPT(gla.make_config("tiny", "gqa"))
    state = model.state_dict()
    with pytest.raises(stops.UsageError,
                       match=r"^run.pt: the weights do not fit this model \(missing: blocks.0.attn.wq.weight\)$"):
        checkpoints.load_state(model, {k: v for k, v in state.items() if k != "blocks.0.attn.wq.weight"}, "run.pt")
    wrong = dict(state, **{"norm.weight": torch.ones(3)})
    with pytest.raises(stops.UsageError, match=r"shape differs: norm.weight \(3,\) vs \(256,\)"):
        checkpoints.load_state(model, wrong, "run.pt")


def test_spec_differences_name_changed_keys_and_ignore_removed_settings():
    saved = {"model": {"n_head": 4}, "train": {"seed": 1, "decay": "all"}}  # "decay": a flag train.py no longer has
    current = {"model": {"n_head": 8}, "train": {"seed": 1, "init": "coupled"}}
    assert checkpoints.spec_differences(saved, current) == ["model.n_head: 4 -> 8", "train.init: None -> 'coupled'"]
    assert checkpoints.spec_differences(current, current) == []


def test_run_reports_its_passes_and_paper_refuses_to_repeat(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    assert train.cli(["--attn", "gqa", "--data", str(text_file), "--out_dir", str(out), *FAST]) == 0
    n_windows = (90_000 - 1) // 64  # text_file: 100 KB, 90% of it the train split
    assert (f"training: 15,360 tokens per run = {30 * 8 * 64 / (n_windows * 64):.2f} passes over "
            f"{n_windows * 64:,}") in capsys.readouterr().out
    shards = tmp_path / "shards"
    shards.mkdir()
    write_tokens(shards / "fw_train_000000.bin", np.arange(5000) % 50000, [20240520, 1, 5000])
    write_tokens(shards / "fw_val_000000.bin", np.arange(600), [20240520, 1, 600])
    small_paper = ["--attn", "gqa", "--preset", "paper", "--data", str(shards), "--n_layer", "1", "--n_embd", "64",
                   "--head_dim", "16", "--block_size", "32", "--batch_size", "8", "--out_dir", str(out / "paper")]
    assert train.cli([*small_paper, "--max_iters", "20"]) == 2  # 20 x 8 x 32 tokens: more than one pass
    err = capsys.readouterr().err
    assert one_line_error(err) and "5,120 tokens per run are 1.03 passes over the 4,992" in err, err
    assert "--allow_repeats" in err and not list(out.glob("paper/*/*/metrics.jsonl"))
    data = TokenData.load(str(shards), None)
    for argv, report in ([["--max_iters", "19"], "4,864 tokens per run = 0.97 passes over 4,992"],
                         [["--max_iters", "20", "--allow_repeats"], "5,120 tokens per run = 1.03 passes over 4,992"]):
        assert preflight.check_passes(train.get_args([*small_paper, *argv]), data, 32) == report


def test_seed_range_both_ends():
    for argv in (["--seed", "0"], ["--seed", str(2**32 - 1), "--seeds", "1"],
                 ["--seed", str(2**32 - 2), "--seeds", "2"]):
        train.get_args(argv)  # accepted: every seed of the run is in [0, 2**32)


def test_a_run_that_cannot_fit_in_memory_is_refused_before_building(tmp_path, text_file, capsys, monkeypatch):
    # The paper preset on this host: 2.9B parameters need ~46 GB of weights, gradients and AdamW state alone.
    assert train.cli(["--attn", "gqa", "--preset", "paper", "--data", str(text_file),
                      "--out_dir", str(tmp_path / "paper")]) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and "GiB are free" in err and "measured" in err and "bench/memory.py" in err, err
    assert not list((tmp_path / "paper").glob("*/*/metrics.jsonl"))
    # A preset past tiny, at FAST's sizes (gqa, 8 sequences a step). A host with room for a step of 2 sequences, not
    # of 4, is told to accumulate 4 micro-batches, and that advice runs.
    small = [*FAST, "--preset", "small", "--n_layer", "2", "--vocab_size", "256"]
    config, f32 = train.model_config(train.get_args(small), "gqa", False), torch.float32
    two, four, eight = (memory.train_peak(config, m, 8, f32, False) for m in (2, 4, 8))
    assert two < four < eight
    monkeypatch.setattr(memory, "device_memory", lambda device: (two + four) / 2 / (1 - memory.MEMORY_MARGIN))
    argv = ["--data", str(text_file), "--out_dir", str(tmp_path / "small"), *small, "--max_iters", "2"]
    assert train.cli(argv) == 2
    err = capsys.readouterr().err
    assert one_line_error(err) and f"needs {eight / 2**30:.1f} GiB" in err and "--grad_accum 4 (2 sequences" in err
    assert train.cli([*argv, "--grad_accum", "4"]) == 0
    # The tiny preset cannot run out of a CPU's memory: not checked there (it would be refused here), but on a GPU.
    tiny = ["--data", str(text_file), "--out_dir", str(tmp_path / "tiny"), *FAST, "--max_iters", "2", "--device", "cpu"]
    assert train.cli(tiny) == 0
    args = train.get_args(tiny)
    gpu = context.Context(torch.device("cuda"), torch.float32)
    with pytest.raises(stops.UsageError, match="--grad_accum 4 "):
        train.check_memory(args, [train.model_config(args, "gqa", False)], gpu)
    monkeypatch.setattr(memory, "device_memory", lambda device: 2 * eight)  # room for one process, not four
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # as torchrun --nproc_per_node=4 on this host (gloo)
    assert train.cli([*argv, "--out_dir", str(tmp_path / "four")]) == 2
    assert "(measured: 4 process(es)" in capsys.readouterr().err


def test_measured_peak_memory_counts_what_a_step_holds():
    config = gla.make_config("tiny", "mla", double_heads=True, n_layer=4, block_size=64)
    f32, n = torch.float32, gla.GPT(config).num_params()
    # Extrapolated from 1 and 2 layers, as a deep model is measured, equals measuring all 4 layers.
    full = memory._tracked_peak(tuple(dataclasses.asdict(config).items()), 4, f32, True, False)
    assert abs(memory.peak_bytes(config, 4, f32) - full) <= 0.01 * full
    step, ev = memory.peak_bytes(config, 4, f32), memory.peak_bytes(config, 4, f32, train=False)
    # float32 weights and AdamW's two moments, plus the logits (4 x 64 x 256 float32) that the loss needs
    assert step > 12 * n + 4 * 64 * 256 * 4
    assert 4 * n + 4 * 64 * 256 * 4 < ev < step
    assert memory.peak_bytes(config, 8, f32) > step  # activations grow with the micro-batch
    assert memory.peak_bytes(config, 4, torch.bfloat16) < step  # bf16 activations
    # A later micro-batch of --grad_accum starts with the step's float32 gradients held: it peaks about 4n higher
    # (under the peak of one whose gradients build up as its activations are freed, a little less than 4n).
    held = memory.peak_bytes(config, 4, f32, grads_held=True)
    assert step + 3.5 * n < held <= step + 4 * n
    assert memory.train_peak(config, 4, 4, f32, False) == step  # one micro-batch per step
    assert memory.train_peak(config, 4, 8, f32, False) == held  # --grad_accum 2: the second micro-batch
    assert memory.train_peak(config, 4, 4, f32, True) == held  # DDP: gradients live in its buckets (views)


def test_memory_plan_gives_peaks_and_the_largest_micro_batch(capsys, monkeypatch):
    argv = ["--attn", "gla2", "--double_heads", "--block_size", "64", "--batch_size", "48", "--grad_accum", "3"]
    monkeypatch.setenv("WORLD_SIZE", "4")  # the default of --world_size
    assert memory_bench.main(argv) == 0
    monkeypatch.delenv("WORLD_SIZE")
    argv += ["--world_size", "4"]
    assert memory_bench.main(argv) == 0
    line, again = map(json.loads, capsys.readouterr().out.splitlines())
    assert line == again
    config = gla.make_config("tiny", "gla2", double_heads=True, block_size=64)
    bf16 = torch.bfloat16  # planned for GPUs unless --device cpu
    assert line["run"] == "gla2_double_heads" and line["world_size"] == 4 and line["micro_batch"] == 4
    assert line["peak_train_bytes"] == memory.train_peak(config, 4, 12, bf16, True)
    assert line["peak_eval_bytes"] == memory.peak_bytes(config, 4, bf16, train=False)
    # A device with room for 5 sequences per micro-batch: 12 per process -> the largest divisor that fits is 4.
    five, six = (memory.train_peak(config, m, 12, bf16, True) for m in (5, 6))
    gib = (five + six) / 2 / (1 - memory.MEMORY_MARGIN) / 2**30
    assert memory_bench.main([*argv, "--device_memory", str(gib)]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["max_micro_batch"] == 4 and line["grad_accum"] == 3
    assert memory_bench.main([*argv, "--device_memory", "1e-6"]) == 0
    assert json.loads(capsys.readouterr().out)["max_micro_batch"] == 0
    assert memory_bench.main([*argv, "--device", "cpu"]) == 0  # train.py's --device, not --device_memory
    assert json.loads(capsys.readouterr().out)["dtype"] == "float32"
    for bad, match in [(["--world_size", "5"], "--batch_size 48 is not divisible by 5 process(es)"),
                       (["--world_size", "x"], "invalid int value"), (["--device_memory", "0"], "must be positive"),
                       (["--attn", "gla0"], "invalid choice")]:
        assert memory_bench.main([*argv, *bad]) == 2
        err = capsys.readouterr().err
        assert match in err and err.count("\n") == 1 and err.startswith("bench/memory.py: error:"), err


def test_only_rank_zero_reads_and_checks_the_data(text_file, monkeypatch):
    sent = []
    monkeypatch.setattr(preflight.dist, "broadcast_object_list", lambda objs, src: objs.__setitem__(
        slice(None), [None, ("f00d", "passes from rank 0")]) or sent.append(src))
    monkeypatch.setattr(TokenData, "check", lambda *a: pytest.fail("rank 1 scanned the data"))
    monkeypatch.setattr(harness.data.hashlib, "sha256", lambda *a: pytest.fail("rank 1 hashed the data"))
    args = train.get_args(["--data", str(text_file)])
    ctx = context.Context(torch.device("cpu"), torch.float32, rank=1, world_size=2)
    data, passes = preflight.load_data(args, ctx, 64, 256)
    assert sent == [0] and data.fingerprint == "f00d" and passes == "passes from rank 0"
    monkeypatch.setattr(preflight.dist, "broadcast_object_list", lambda objs, src: objs.__setitem__(
        slice(None), ["rank 0 found a bad token", None]))
    with pytest.raises(stops.UsageError, match="rank 0 found a bad token"):
        preflight.load_data(args, ctx, 64, 256)


def test_errors_under_torchrun_name_their_rank(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert train.cli(["--batch_size", "6"]) == 2  # 6 sequences cannot be split over 4 processes
    err = capsys.readouterr().err
    assert one_line_error(err) and err.startswith("train.py: error: rank 3: --batch_size 6"), err


def test_resume_refuses_another_autocast_dtype(tmp_path, text_file, capsys):
    argv = ["--data", str(text_file), "--out_dir", str(tmp_path), *FAST, "--max_iters", "2"]
    assert train.cli(argv) == 0
    assert train.cli([*argv, "--resume", "--max_iters", "4", "--dtype", "bfloat16"]) == 2
    assert "train.dtype: 'float32' -> 'bfloat16'" in capsys.readouterr().err


def test_llm_c_shards_are_read_in_sequence(tmp_path):
    d = tmp_path / "fineweb"
    d.mkdir()
    for i in range(3):  # shard i holds tokens 100 i .. 100 i + 49: a window shows its shard
        write_tokens(d / f"fw_train_{i:06d}.bin", 100 * i + np.arange(500) % 50, [20240520, 1, 500])
    write_tokens(d / "fw_val_000000.bin", 7 + np.arange(300) % 3, [20240520, 1, 300])
    data = TokenData.load(str(d), None)
    data.check(block_size=32, vocab_size=50304)
    assert data.n_tokens == {"train": 1500, "val": 300}
    x, y = train.get_batch(data, "train", 0, 64, 32, seed=0)
    shard = x // 100
    assert (shard == shard[:, :1]).all()  # no window crosses two shards
    assert set(shard[:, 0].tolist()) == {0, 1, 2}  # all shards are used
    assert ((y - x) % 50 == 1).all()


# ----------------------------------------------------------------------------
# The whole job's estimate (harness/progress.py)


class FakeClock:
    """time.time for harness.progress, moved by hand."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_training_flops_per_token_counts_parameters_and_attention():
    config = gla.make_config("tiny", "gqa")
    n_params = gla.GPT(config).num_params()
    attention = 6 * config.n_layer * config.n_head * config.block_size * 2 * config.head_dim
    assert progress.training_flops_per_token(config) == 6 * n_params + attention
    mla = gla.make_config("tiny", "mla")
    d_qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    attention = 6 * mla.n_layer * mla.n_head * mla.block_size * (d_qk + mla.v_head_dim)
    assert progress.training_flops_per_token(mla) == 6 * gla.GPT(mla).num_params() + attention


def test_the_estimate_counts_what_each_run_has_left_at_the_measured_rate(monkeypatch):
    """The rate counts from the end of the first step (it compiles and warms up); a resumed run counts only its steps
    left (and their evaluations); a process that does not report (torchrun's ranks but 0) prints nothing."""
    clock = FakeClock()
    monkeypatch.setattr(progress.time, "time", clock)
    config = gla.make_config("tiny", "gqa", n_embd=64, head_dim=16)
    fresh = progress.plan_run("gqa seed 1", config, 100, 4, 25, 2, 100)
    resumed = progress.plan_run("gqa seed 2", config, 30, 4, 25, 2, 100)
    assert (fresh.evals, resumed.evals) == (4, 2)  # 25, 50, 75, 100; and 75, 100 of a run resumed at 70
    assert fresh.eval_flops == pytest.approx(fresh.step_flops / 3 * 2)  # a forward of eval_iters batches
    job = progress.JobProgress([fresh, resumed], tokens_per_step=4 * 128)
    job.begin_run()
    lines = []
    for k in range(11):  # a step every two seconds
        job.stepped()
        clock.now += 2
        job.tick(lines.append)
    rate = 10 * fresh.step_flops / 22  # 10 steps in the 22 s since the first ended
    assert job.rates()[0] == pytest.approx(rate)
    assert job.seconds_left(rate) == pytest.approx((fresh.flops + resumed.flops - 11 * fresh.step_flops) / rate)
    # printed once, when the rate is trusted: 3 steps of 512 tokens in the 8 s since the first step ended
    assert len(lines) == 1 and lines[0].startswith("estimate: 2 run(s) of 30/100 steps, 66,560 tokens at 192 "
                                                   "tokens/s on this machine: about"), lines
    quiet = progress.JobProgress([fresh], 4 * 128, report=False)
    quiet.begin_run()
    for k in range(11):
        quiet.stepped()
        clock.now += 2
        quiet.tick(pytest.fail)


def test_train_prints_the_estimate_after_its_first_steps(tmp_path, text_file, capsys, monkeypatch):
    monkeypatch.setattr(progress, "ESTIMATE_AFTER_S", 0.0)
    args = ["--attn", "all", "--data", str(text_file), "--max_iters", "10", "--eval_interval", "5", *TINY,
            "--out_dir", str(tmp_path)]
    assert train.cli(args) == 0
    out = capsys.readouterr().out
    estimates = [line for line in out.splitlines() if line.startswith("estimate:")]
    runs = 2 * len(gla.VARIANTS)
    assert len(estimates) == 1 and f"{runs} run(s) of 10 steps, {runs * 10 * 4 * 16:,} tokens at" in estimates[0], out
    first_run_done = out.index("gqa seed 1337 iter 10:")
    assert out.index("estimate:") < first_run_done  # within the first run: before the wait, not after
