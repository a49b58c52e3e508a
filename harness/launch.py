"""--jobs: seeds trained side by side, each in an ordinary train.py process of its own.

A tiny model uses a CPU core poorly from two threads, so on a CPU train.py trains its seeds in parallel: a child
process a seed, at most --jobs at once, each on its share of the threads. A child is `train.py` with the job's
flags and --seed S --seeds 1 --jobs 1: it checks, locks and trains its runs as any train.py does, and prints its
own lines. The launcher starts the children in its own process group and waits for them; the job ends as one
process's would:
- Ctrl-C (SIGINT) reaches the whole process group, children included; a signal to the launcher alone (`kill`) it
  relays. Either way every child checkpoints after its step and ends, and no further child starts: exit status
  128 + signal. A second signal to the launcher ends the children at once (SIGKILL), their last checkpoints kept.
- a child that fails (its own error line, exit 1 or 2) or dies (no line: kill -9, the OOM killer) ends the job: the
  others checkpoint and stop, and for a dead child one line names its seed; exit status 1 (2: bad input).
- a child whose launcher died (kill -9) stops at its next step, checkpointed (harness/stops.StopFlag's parent
  check), so that nothing trains unwatched; its run locks are its own, so a second command is refused until then.
"""
import math
import os
import signal
import subprocess
import sys
import time

from harness.stops import RunError

POLL_S = 0.2  # how often the launcher looks at its children and its stop flag


def train_in_children(script, argv, seeds, jobs, threads, stop):
    """Train each of `seeds` in a child `python script argv --seed S --seeds 1 --jobs 1`, at most `jobs` at once,
    each on threads // jobs threads; returns the job's exit status (0: every child finished). Raises RunError
    naming the seed of a child that died; KeyboardInterrupt (a second signal) after killing the children."""
    waiting = list(seeds)
    running = {}  # seed -> its child process
    ended = {}  # seed -> its exit status (negative: the signal that killed it)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads // jobs), "PYTHONUNBUFFERED": "1"}
    rounds = math.ceil(len(seeds) / jobs)
    relayed = False
    try:
        while waiting or running:
            if stop.signum or ended_badly(ended):
                waiting = []  # the job ends: no further child starts
            while waiting and len(running) < jobs:
                seed = waiting.pop(0)
                # The first child reports the job's estimate (harness/progress.py), the others nothing.
                family = ["--parent", str(os.getpid()), "--rounds", str(rounds if seed == seeds[0] else 0)]
                running[seed] = subprocess.Popen([sys.executable, script, *argv, "--seed", str(seed), "--seeds", "1",
                                                  "--jobs", "1", *family], env=env)
            time.sleep(POLL_S)
            for seed, child in list(running.items()):
                if child.poll() is not None:
                    ended[seed] = child.returncode
                    del running[seed]
            if (stop.signum or ended_badly(ended)) and not relayed:
                relayed = True
                for child in running.values():
                    child.send_signal(stop.signum or signal.SIGTERM)
    except KeyboardInterrupt:
        for child in running.values():
            child.kill()
            child.wait()
        raise
    return job_status(ended, stop.signum)


def ended_badly(ended):
    return any(status != 0 for status in ended.values())


def job_status(ended, signum):
    """The job's exit status from its children's: a dead one first (RunError, naming it: it printed nothing), then
    a failed one (it printed its line), then a stop: 128 + the signal."""
    stopped_by = {-signum, 128 + signum} if signum else set()
    for seed, status in sorted(ended.items()):
        if status < 0 and status not in stopped_by:
            raise RunError(f"the process training seed {seed} was killed by {signal.Signals(-status).name} (out of "
                           "memory?); the other runs stopped at a checkpoint: --resume continues")
    for seed, status in sorted(ended.items()):
        if status in (1, 2):
            return status
    interrupted = [status for status in ended.values() if status > 128 or status < 0]
    if signum or interrupted:
        return 128 + (signum or abs(interrupted[0]) % 128)
    return 0
