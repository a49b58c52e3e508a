"""The machinery around train.py, which a first reader may skip: what keeps long runs safe and lets them fit.

train.py is the lesson (the model, the batch, the schedule, one step, evaluation, the loop with its checkpoints).
Everything a run needs beyond that lives here, one topic a module:

    stops.py        how a run ends: one-line errors and their exit statuses, Ctrl-C and SIGTERM between two steps
    files.py        atomic writes and the output folder (no torch: plot.py uses it too)
    data.py         the corpora: the default stdlib corpus, text files, nanoGPT's .bin files, llm.c token shards, and
                    the keyed permutation that orders their windows
    context.py      where we compute: device, autocast dtype, the torchrun process group
    checkpoints.py  what a run is (its spec), reading its checkpoint and metrics back, refusing a mismatch
    preflight.py    checks before anything is written: the flags, the run folders, disk room, the run lock
    memory.py       the memory pre-flight: a step's peak measured on fake tensors
    progress.py     a process's plan of runs, the job's time estimate and what is left
    sampling.py     train.py --sample: loading a run, its text codec, what each tensor-parallel rank holds
"""
