"""Files that survive a kill: atomic writes, appends whose cut last line readers skip, and the output folder.

No torch here: plot.py writes its PNG and CSV with atomic_write and must start without torch.
"""
import errno
import os
import pathlib
import tempfile

from harness.stops import RunError, UsageError


def atomic_write(writers):
    """Write each file of {path: bytes, or a function that writes to the binary file} to a fsynced temporary in its
    folder, then rename all into place: a kill leaves each file old or new; an error while writing (a full disk)
    replaces none. Raises what a writer raises (OSError for a full disk or a lost permission)."""
    temporaries = {}
    try:
        for path, write in writers.items():
            path = pathlib.Path(path)
            temporaries[path] = path.with_name(f".{path.name}.{os.urandom(4).hex()}")  # random: writers never collide
            with open(temporaries[path], "xb") as f:  # a new file (O_EXCL), with the umask's usual permissions
                if isinstance(write, bytes):
                    f.write(write)
                else:
                    write(f)
                f.flush()
                os.fsync(f.fileno())  # on disk before it replaces the old file, even if the machine dies
        for path, temporary in temporaries.items():
            os.replace(temporary, path)
    finally:
        for temporary in temporaries.values():
            temporary.unlink(missing_ok=True)


def remove_stale_temporaries(folder, names):
    """Delete the temporaries of the files `names` in folder (".<name>.<random>") that atomic_write left behind when
    a kill came between its write and its rename. Call it only while no other process writes there."""
    for name in names:
        for temporary in pathlib.Path(folder).glob(f".{name}.*"):
            temporary.unlink()


def write_run_file(path, content, kept, append=False):
    """atomic_write({path: content}) for a run's files (content: bytes, or a function that writes to the binary
    file), or with append=True the bytes appended. A full disk or a lost permission raises RunError, one line naming
    the file, what is kept (`kept`, e.g. "the checkpoint of iteration 100 and its metrics are kept") and what to do.
    torch.save reports an OSError inside a RuntimeError: we look for it there too."""
    try:
        if append:
            with open(path, "ab") as f:
                f.write(content)
        else:
            atomic_write({path: content})
    except (OSError, RuntimeError) as e:
        error = e if isinstance(e, OSError) else e.__context__
        if not isinstance(error, OSError):
            raise
        fix = "free space" if error.errno in (errno.ENOSPC, errno.EDQUOT) else "make it writable"
        raise RunError(f"cannot write {path}: {error.strerror or error}; {kept}: {fix}, then --resume") from None


def check_out_dir(out_dir):
    """Make out_dir if needed and check that we can write there. Raises UsageError, naming the flag."""
    if not str(out_dir):
        raise UsageError("--out_dir is empty; give a folder, e.g. --out_dir out")
    try:
        pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out_dir).close()
    except OSError as e:
        raise UsageError(f"--out_dir {out_dir} is not a writable folder ({e.strerror}); choose another") from None
