"""How a run ends: one-line errors with their exit statuses, and Ctrl-C / SIGTERM between two training steps.

Exit statuses, as a shell script or a scheduler reads them:
    0         done
    1         a run cannot go on (a NaN loss, a file it cannot write, a --jobs worker killed): RunError
    2         bad input (flags, data, a run folder in use, a disk or device without room): UsageError, ConfigError
    128 + N   stopped by signal N (130: Ctrl-C, 143: SIGTERM), each run checkpointed first: Interrupted
"""
import argparse
import ctypes
import os
import signal
import sys
from contextlib import contextmanager

EXIT_USAGE = 2
EXIT_RUN = 1


class UsageError(Exception):
    """Bad input: printed as one line, exit status 2, nothing written."""


class RunError(Exception):
    """A run cannot go on (a NaN loss, a file it cannot write): one line, exit status 1, earlier checkpoints kept."""


class Interrupted(Exception):
    """SIGINT / SIGTERM stopped training between two steps, checkpointed: one line, exit status 128 + signal.
    signum: the signal; 0 where another process received it (a torchrun peer) reads as SIGINT."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.signum = signum or signal.SIGINT


class ArgumentParser(argparse.ArgumentParser):
    """argparse, whose errors are one UsageError line instead of its usage block and exit status."""

    def error(self, message):
        raise UsageError(message)


class StopFlag:
    """The signal that asked training to stop (0: none), read by the training loop between two steps.

    One process keeps it in a C int; --jobs workers share their parent's (a multiprocessing RawValue, made only
    there: it needs /dev/shm), so that a signal to any of them stops them all. A worker whose parent died also
    reads as stopped (SIGTERM): an orphan checkpoints and ends instead of training without its parent's lock."""

    def __init__(self, shared=None, parent_pid=None):
        self.value = ctypes.c_int(0) if shared is None else shared
        self.parent_pid = parent_pid
        self.received = 0  # signals this process received: its own, not shared

    @property
    def signum(self):
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            return signal.SIGTERM
        return self.value.value

    def set(self, signum):
        self.value.value = signum

    def share(self, context):
        """From now on keep the flag in shared memory (context.RawValue), which worker processes can read. A signal
        handled while we make it sets the old value (kept) or the new one: it is not lost."""
        local = self.value
        self.value = context.RawValue("i", 0)
        if local.value:
            self.value.value = local.value


@contextmanager
def stop_on_signals(stop):
    """While inside: SIGINT (Ctrl-C) and SIGTERM set `stop` (each run checkpoints after its step and stops); a second
    one to this process raises KeyboardInterrupt at once, each run's last checkpoint kept. (A signal to the whole
    process group reaches each --jobs process once: it is a first signal in each, whoever set the shared flag.)"""
    def handle(signum, frame):
        stop.received += 1
        if stop.received > 1:
            raise KeyboardInterrupt
        if not stop.value.value:
            stop.set(signum)
    previous = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_command(main, argv, prog, stop):
    """main(argv) with its errors as one line on stderr (under torchrun, with the rank); returns the exit status
    (module docstring). KeyboardInterrupt: a second signal, or Ctrl-C before training started."""
    rank = f"rank {os.environ['RANK']}: " if int(os.environ.get("WORLD_SIZE", 1)) > 1 else ""
    try:
        return main(argv)
    except UsageError as e:
        print(f"{prog}: error: {rank}{e}", file=sys.stderr)
        return EXIT_USAGE
    except RunError as e:
        print(f"{prog}: error: {rank}{e}", file=sys.stderr)
        return EXIT_RUN
    except Interrupted as e:
        print(f"{prog}: {rank}{e}: --resume continues", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        if stop.signum:
            print(f"{prog}: {rank}stopped at once: --resume continues from the last checkpoints", file=sys.stderr)
        else:
            print(f"{prog}: {rank}interrupted", file=sys.stderr)
        return 128 + (stop.signum or signal.SIGINT)
