"""How a run ends: one-line errors with their exit statuses, and Ctrl-C / SIGTERM between two training steps.

Exit statuses, as a shell script or a scheduler reads them:
    0         done
    1         a run cannot go on (a NaN loss, a file it cannot write): RunError
    2         bad input (flags, data, a run folder in use, a disk or device without room): UsageError, ConfigError
    128 + N   stopped by signal N (130: Ctrl-C, 143: SIGTERM), each run checkpointed first: Interrupted
"""
import argparse
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
    """The signal that asked training to stop (0: none), read by the training loop once a step."""

    def __init__(self):
        self.received = []  # the signals this process received, in order

    @property
    def signum(self):
        return self.received[0] if self.received else 0


@contextmanager
def stop_on_signals(stop):
    """While inside: SIGINT (Ctrl-C) and SIGTERM set `stop` (each run checkpoints after its step and stops); a second
    one raises KeyboardInterrupt at once, each run's last checkpoint kept."""
    def handle(signum, frame):
        stop.received.append(signum)
        if len(stop.received) > 1:
            raise KeyboardInterrupt
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
