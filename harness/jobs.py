"""--jobs: seeds trained side by side in worker processes that end together, or not at all.

A tiny model uses a CPU core poorly from two threads, so on a CPU train.py trains its seeds in parallel, one process
of one thread each. What the parent guarantees:
- it holds every run's lock for the whole job; on Linux the kernel kills a worker the moment its parent dies
  (kill -9 of the parent: PR_SET_PDEATHSIG), so nothing writes a run folder without the lock, and a kill -9 of the
  parent is one of the whole job: --resume continues from the last checkpoints. Elsewhere an orphan reads as
  stopped (StopFlag) and checkpoints and ends after its step;
- a signal to the parent alone or to the whole process group (Ctrl-C, `timeout`, Slurm, systemd) stops every worker
  at a checkpoint: exit status 128 + signal, as one process;
- a worker that dies (kill -9, the OOM killer) or fails is seen at once: the others checkpoint and stop, and one line
  names the run and the signal or error; exit status 1 (or 2 for bad input);
- the workers' lines reach the terminal through the parent, which alone draws the job's progress.

We use multiprocessing.Process with connection.wait rather than a pool: ProcessPoolExecutor does detect a lost
worker (BrokenProcessPool) but cannot say which one died or by which signal, and a Pool never notices one.
"""
import ctypes
import multiprocessing
import multiprocessing.connection
from multiprocessing import resource_tracker
import os
import signal
import sys
import threading

import torch
from tqdm import tqdm

from harness.data import TokenData
from harness.stops import Interrupted, RunError, StopFlag, UsageError, stop_on_signals

JOIN_TIMEOUT_S = 600  # how long a stopped worker may take to finish its step and checkpoint before we kill it
TICK_S = 1.0  # how often the parent wakes to report progress
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}  # Ctrl-C; `timeout`, Slurm, systemd
PR_SET_PDEATHSIG = 1  # prctl's option: the signal a process gets when its parent dies (linux/prctl.h)


class PipeLog:
    """A worker's log: each line goes to the parent, which prints it. Lost if the parent is gone."""

    def __init__(self, connection):
        self.connection = connection

    def __call__(self, message):
        try:
            self.connection.send(("log", message))
        except OSError:  # the parent died: the worker checkpoints and ends anyway
            pass


def die_with_parent(parent_pid):
    """Linux: ask the kernel to SIGKILL this process when its parent dies; exit now if it has died already. Elsewhere
    (no prctl) nothing: StopFlag's parent check stops an orphan after its step."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl
        os._exit(128 + signal.SIGKILL)


def _worker(train_seeds, args, seeds, ctx, fingerprint, shared_stop, parent_pid, progress, slot, connection):
    """One worker process: train_seeds(args, seeds, data, ctx, stop, progress, slot, log) on ctx.threads threads.
    Its outcome, ("done" | "interrupted" | "usage" | "run", message), goes to the parent; then it exits."""
    die_with_parent(parent_pid)
    stop = StopFlag(shared_stop, parent_pid)
    outcome = ("done", "")
    status = 0
    with stop_on_signals(stop):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked since the parent started us: now handled
        tqdm.set_lock(threading.RLock())  # not tqdm's named semaphore, which the resource tracker reports as leaked
        torch.set_num_threads(ctx.threads)
        progress.report = False  # the parent reports for the whole job
        try:
            data = TokenData.load(args.data, args.out_dir, fingerprint)  # checked by the parent; not scanned again
            train_seeds(args, seeds, data, ctx, stop, progress, slot, PipeLog(connection))
        except Interrupted as e:
            outcome = ("interrupted", str(e))
            status = 128 + e.signum
        except UsageError as e:
            outcome = ("usage", str(e))
            status = 2
        except RunError as e:
            outcome = ("run", str(e))
            status = 1
        except KeyboardInterrupt:  # a second signal: stopped at once, the last checkpoints kept
            outcome = ("interrupted", "stopped at once")
            status = 128 + (stop.signum or signal.SIGINT)
    try:
        connection.send(outcome)
    except OSError:
        pass
    sys.exit(status)


def train_in_processes(train_seeds, args, shares, ctx, fingerprint, stop, progress, log):
    """Train each list of seeds in `shares` in its own spawned process of ctx.threads threads (train_seeds, a
    function of train.py, runs there); returns when all finished. Raises Interrupted after a signal, RunError or
    UsageError after a worker's failure or death, each other worker having stopped at a checkpoint first."""
    spawn = multiprocessing.get_context("spawn")
    stop.share(spawn)  # from now on a signal to any process stops all
    progress.state = spawn.RawArray("d", list(progress.state))
    workers = []
    # While we start the workers, SIGINT and SIGTERM are blocked and ignored here; both pass through exec to the
    # workers, so that a signal cannot kill one half-started. A signal meanwhile waits, pending (a blocked signal is
    # never dropped), in us until our handler is back and in each worker until it handles them itself: either sets
    # the shared flag that the workers read before each step. multiprocessing's resource tracker, started by the first
    # spawn, would unblock them here: we start it first.
    resource_tracker.ensure_running()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    handlers = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS}
    try:
        for slot, seeds in enumerate(shares):
            receive, send = spawn.Pipe(duplex=False)
            process = spawn.Process(target=_worker, name=f"train.py seeds {seeds}",
                                    args=(train_seeds, args, seeds, ctx, fingerprint, stop.value, os.getpid(),
                                          progress, slot, send))
            process.start()
            send.close()  # ours is the reading end; the worker holds the other
            workers.append((process, receive))
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        outcomes = _wait(workers, stop, progress, log)
    finally:
        _end(workers, stop)
    _raise_for(outcomes, stop, progress)


def _read(receive, log, messages, slot):
    """Everything the worker of `slot` has sent so far: its lines to `log`, its outcome into messages[slot]."""
    while receive.poll():
        try:
            message = receive.recv()
        except EOFError:  # the worker is gone
            return
        if message[0] == "log":
            log(message[1])
        else:
            messages[slot] = message


def _wait(workers, stop, progress, log):
    """Print the workers' lines and the job's progress until every worker has ended; as soon as one fails or dies,
    stop the others (they checkpoint after their step). {slot: (outcome or None, exit code)}."""
    messages = {}
    outcomes = {}
    while len(outcomes) < len(workers):
        running = [slot for slot in range(len(workers)) if slot not in outcomes]
        handles = [workers[slot][1] for slot in running] + [workers[slot][0].sentinel for slot in running]
        multiprocessing.connection.wait(handles, timeout=TICK_S)
        for slot in running:
            process, receive = workers[slot]
            _read(receive, log, messages, slot)
            if process.is_alive():
                continue
            process.join()
            _read(receive, log, messages, slot)  # what it sent just before it ended
            outcomes[slot] = (messages.get(slot), process.exitcode)
            failed = slot not in messages or messages[slot][0] in ("usage", "run")
            if failed and not stop.value.value:
                stop.set(signal.SIGTERM)
        progress.tick(log)
    return outcomes


def _end(workers, stop):
    """After an error in the parent (a second Ctrl-C, say): let the workers checkpoint, then end the stragglers."""
    if not any(process.is_alive() for process, _ in workers):
        return
    if not stop.value.value:
        stop.set(signal.SIGTERM)
    for process, _ in workers:
        process.join(JOIN_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join()


def _raise_for(outcomes, stop, progress):
    """The job's end as one line: a dead worker first, then a failed one, then the interrupted runs."""
    for slot, (message, code) in sorted(outcomes.items()):
        if message is None:
            run = progress.current_run(slot)
            what = run.name if run is not None else "its first run"
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"ended with exit status {code}"
            raise RunError(f"the worker process training {what} {how} (out of memory?); the other runs stopped at "
                           "a checkpoint: --resume continues")
    for slot, (message, code) in sorted(outcomes.items()):
        if message[0] == "usage":
            raise UsageError(message[1])
        if message[0] == "run":
            raise RunError(message[1])
    interrupted = [message[1] for slot, (message, code) in sorted(outcomes.items()) if message[0] == "interrupted"]
    if interrupted:
        raise Interrupted(", ".join(interrupted), stop.value.value)
