"""The corpora train.py reads, and the order it reads their windows in.

Four sources, one interface (TokenData):
- the default: ~2 MB of English that ships with every Python (no download), bytes as tokens (vocabulary 256);
- a text file: its bytes, the last 10% for validation;
- a folder with nanoGPT's train.bin / val.bin: raw uint16 GPT-2 tokens;
- a folder with llm.c's token shards (*_train_*.bin, *_val_*.bin), as `dev/data/fineweb.py` writes FineWeb-Edu: a
  header of SHARD_HEADER_INTS int32 [SHARD_MAGIC, SHARD_VERSION, n_tokens, 0, ...], then n_tokens uint16 tokens.
Token files are memory-mapped: a 100B-token corpus costs no RAM.

The order: a window is block_size + 1 consecutive tokens; train.get_batch reads them pass by pass without
replacement, each pass in the order of a keyed permutation (permute): no table of N entries even at N = 48M windows.
"""
import ast
import hashlib
import os
import pathlib
import random
import sysconfig

import numpy as np

from harness.files import atomic_write, check_out_dir
from harness.stops import UsageError

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
SHARD_HEADER_INTS = 256
FINGERPRINT_BYTES = 1 << 20  # per token file, its first and last MiB (with names and sizes) identify a corpus
REGENERATE = "regenerate it with llm.c's dev/data/fineweb.py"


def stdlib_corpus():
    """~2 MB of English that ships with every Python: pydoc_data.topics and the standard library's docstrings (read
    with ast, never imported), shuffled with a fixed seed so the validation split (the last 10%) is not the
    alphabet's last modules. A byte string; another Python version gives another corpus (and fingerprint)."""
    from pydoc_data.topics import topics
    docs = [topics[key] for key in sorted(topics)]
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if parts[0] in ("site-packages", "dist-packages", "test", "idlelib", "lib2to3") or "tests" in parts:
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError, OSError):
            continue
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        for node in ast.walk(tree):
            if isinstance(node, kinds):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    docs.append(doc)
    random.Random(0).shuffle(docs)
    return "\n\n".join(docs).encode("utf-8")


def read_shard(path):
    """The tokens of one llm.c shard, uint16, memory-mapped, after checking its header. Raises UsageError."""
    header = np.fromfile(path, dtype=np.int32, count=SHARD_HEADER_INTS)
    size = os.path.getsize(path)
    offset = SHARD_HEADER_INTS * 4
    if len(header) < SHARD_HEADER_INTS or header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
        raise UsageError(f"{path}: not an llm.c token shard (a {offset}-byte header opening {SHARD_MAGIC}, "
                         f"{SHARD_VERSION}; found {header[:2].tolist()} in {size} bytes); {REGENERATE}")
    n_tokens = int(header[2])
    if n_tokens < 0 or size != offset + 2 * n_tokens:
        raise UsageError(f"{path}: header says {n_tokens} tokens but the file holds {(size - offset) / 2:g}; "
                         f"the shard is truncated or corrupt, {REGENERATE}")
    return np.memmap(path, dtype=np.uint16, mode="r", offset=offset, shape=(n_tokens,))


def read_bin(path):
    """nanoGPT's train.bin / val.bin: raw uint16 tokens, memory-mapped. Raises UsageError for an odd size."""
    size = os.path.getsize(path)
    if size % 2:
        raise UsageError(f"{path}: {size} bytes is not a whole number of uint16 tokens; the file is truncated")
    if size == 0:
        return np.zeros(0, np.uint16)
    return np.memmap(path, dtype=np.uint16, mode="r")


def fingerprint_files(paths):
    """A short hash of token files by name, size and their first and last MiB: it tells corpora apart without
    reading 200 GB at every start, and survives moving the folder."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        size = path.stat().st_size
        with open(path, "rb") as f:
            digest.update(f"{path.name}:{size}".encode())
            digest.update(f.read(FINGERPRINT_BYTES))
            f.seek(max(0, size - FINGERPRINT_BYTES))
            digest.update(f.read())
    return digest.hexdigest()[:16]


def describe_missing(path):
    """Why `path` is neither a file nor a folder, in a few words."""
    if path.is_symlink():
        return "a broken or looping symbolic link"
    if path.exists():
        return "not a regular file or folder (a device, a pipe?)"
    return "no such file or folder"


class TokenData:
    """The train and validation splits, each a list of 1-D token arrays (uint8 bytes or uint16 tokens, often
    memory-mapped shards); a window never crosses two arrays. source: a description; fingerprint: a content hash
    (a run's spec records it, so that a run resumes only on the data it started with)."""

    def __init__(self, train, val, source, fingerprint):
        self.splits = {"train": train, "val": val}
        self.source = source
        self.fingerprint = fingerprint
        self.n_tokens = {name: sum(len(a) for a in arrays) for name, arrays in self.splits.items()}

    @classmethod
    def load(cls, spec, cache_dir, fingerprint=None):
        """spec None: the stdlib corpus (built once into cache_dir); a text file (bytes, 90/10 split); a folder with
        train.bin / val.bin or llm.c shards. fingerprint: the data's, if another process computed it already (the
        files are then not read again). Raises UsageError naming --data."""
        if spec is None:
            check_out_dir(cache_dir)
            path = pathlib.Path(cache_dir) / "stdlib_corpus.txt"
            if not path.exists():
                atomic_write({path: stdlib_corpus()})
            return cls.from_bytes(path.read_bytes(), f"stdlib corpus ({path})", fingerprint)
        path = pathlib.Path(spec)
        if path.is_file():
            if path.suffix == ".bin":
                raise UsageError(f"--data {spec}: token files are read from their folder; pass --data {path.parent}")
            return cls.from_bytes(path.read_bytes(), f"text file {path}", fingerprint)
        if not path.is_dir():
            raise UsageError(f"--data {spec}: {describe_missing(path)}")
        if (path / "train.bin").is_file() and (path / "val.bin").is_file():
            train = [read_bin(path / "train.bin")]
            val = [read_bin(path / "val.bin")]
        else:
            train_files = sorted(path.glob("*_train_*.bin"))
            val_files = sorted(path.glob("*_val_*.bin"))
            if not train_files or not val_files:
                raise UsageError(f"--data {spec}: the folder has neither train.bin/val.bin nor "
                                 "*_train_*.bin/*_val_*.bin shards")
            train = [read_shard(p) for p in train_files]
            val = [read_shard(p) for p in val_files]
        if not fingerprint:
            fingerprint = fingerprint_files(path.glob("*.bin"))
        return cls(train, val, f"token files in {path}", fingerprint)

    @classmethod
    def from_bytes(cls, raw, source, fingerprint=None):
        """Bytes as tokens: the first 90% train, the rest validation."""
        if not raw:
            raise UsageError(f"{source} is empty")
        data = np.frombuffer(raw, dtype=np.uint8)
        n_train = int(0.9 * len(data))
        return cls([data[:n_train]], [data[n_train:]], source, fingerprint or hashlib.sha256(raw).hexdigest()[:16])

    def check(self, block_size, vocab_size):
        """UsageError if a split is shorter than one block + 1 or holds a token id >= vocab_size. Every token is
        scanned (~10 s for 10B memory-mapped tokens) so that bad data stops us before anything is written."""
        for name, arrays in self.splits.items():
            if max((len(a) for a in arrays), default=0) < block_size + 1:
                raise UsageError(f"{self.source}: the {name} split has no {block_size + 1} consecutive tokens "
                                 f"(one block + 1); use more data or a smaller --block_size")
            top = max(int(a.max()) for a in arrays if len(a))
            if top >= vocab_size:
                raise UsageError(f"{self.source}: {name} token id {top} >= vocab_size {vocab_size}; "
                                 f"pass --vocab_size {top + 1} or more (GPT-2 tokens: 50304)")

    def windows(self, split, block_size):
        """Per array of a split, its count of non-overlapping windows of block_size + 1 tokens: window w starts at
        token w * block_size, so its last token is the next one's first (as llm.c's loader reads)."""
        return np.array([max(len(a) - 1, 0) // block_size for a in self.splits[split]], dtype=np.int64)

    def read_rows(self, split, rows, block_size, seed):
        """The windows that global rows `rows` (int64, row j of the whole run's sequence of batches) read: row j is
        position j mod N of pass j // N over the split's N windows, each pass in the order of a permutation keyed by
        (seed, split, pass). (len(rows), block_size + 1) int64."""
        arrays = self.splits[split]
        counts = self.windows(split, block_size)
        n = int(counts.sum())
        passes, positions = np.divmod(rows, n)
        window = np.empty_like(positions)
        for p in np.unique(passes):  # a batch spans two passes only where it meets a pass's end
            here = passes == p
            window[here] = permute(positions[here], n, (seed, split == "val", int(p)))
        ends = np.cumsum(counts)
        which = np.searchsorted(ends, window, side="right")  # the array of each window
        offsets = (window - (ends - counts)[which]) * block_size
        tokens = [arrays[w][o:o + block_size + 1] for w, o in zip(which, offsets)]
        return np.stack(tokens).astype(np.int64)


def splitmix64(x):
    """splitmix64's finaliser (Steele, Lea, Flood 2014, "Fast splittable pseudorandom number generators"): a
    bijective scramble of uint64 values; products wrap around, as it intends."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def permute(i, n, key, rounds=4):
    """A pseudo-random permutation of [0, n) keyed by `key` (a tuple of ints and bools), at the int64 indices i, in
    O(len(i)) memory: a balanced Feistel network (Luby, Rackoff 1988) on the fewest even bits that hold n - 1, cycle
    walking (Black, Rogaway 2002) the values that land past n (the domain is < 4n for n >= 2: under 4 tries on
    average)."""
    half = (max(2, int(n - 1).bit_length()) + 1) // 2
    mask = np.uint64((1 << half) - 1)
    subkeys = []
    for r in range(rounds):
        digest = hashlib.blake2b(repr((key, r)).encode(), digest_size=8).digest()
        subkeys.append(np.uint64(int.from_bytes(digest, "little")))
    x = np.asarray(i, dtype=np.uint64).copy()
    todo = np.ones(len(x), dtype=bool)
    with np.errstate(over="ignore"):  # uint64 products wrap, as splitmix64 intends
        while todo.any():
            left = x[todo] >> np.uint64(half)
            right = x[todo] & mask
            for subkey in subkeys:
                left, right = right, left ^ (splitmix64(right ^ subkey) & mask)
            x[todo] = (left << np.uint64(half)) | right
            todo[todo] = x[todo] >= n
    return x.astype(np.int64)
