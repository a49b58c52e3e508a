"""Loading an MLRA release checkpoint (Liu et al. 2026, github.com/SongtaoLiu0823/MLRA) with bench/release.py:
peak memory against the weights' bytes, seconds to load, and batch-1 decode speed against the weights-read floor.

Writes a random checkpoint of the preset's size in the release's layout to a temporary folder: config.json and
pytorch_model-0000k-of-0000n.bin shards of at most --shard_gb GB (5 by default, save_pretrained's) with their
pytorch_model.bin.index.json, generated and written shard by shard, so the writer holds one shard, never the model.
Then, for each dtype, one after another, a fresh Python process loads it and reports:
  - peak resident memory (VmHWM) after loading and after decoding, against the weights' bytes in that dtype,
    and the resident memory then split into anonymous and file-backed (memory-mapped .bin pages, which the kernel can
    drop and read again, and which a float32 load keeps as its parameters);
  - seconds to load;
  - tokens/s decoding one sequence through the KV cache (median of --new_tokens steps after a --prompt_len prefill),
    against the floor of reading every weight once per token: the weights' bytes / this machine's read bandwidth,
    measured first as the best of a few sums over a --bandwidth_gb GB buffer; and against the rate torch's own
    matrix-vector products read the model's weights (gemv_bandwidth), which is what a batch-1 step is made of.
The folder is deleted at the end. A busy machine slows every timing: the load average is printed beside them.

    python bench/pretrained.py [--preset paper] [--variant gla2] [--double_heads] [--n_layer N] [--n_embd N]
        [--dtypes float32 bfloat16] [--new_tokens 8] [--dir /tmp]
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import torch  # noqa: E402

import gla  # noqa: E402
from bench import release  # noqa: E402
from bench.common import machine  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
GB = 1e9  # save_pretrained's "5GB" is 5e9 bytes


def release_tensors(config):
    """[(the release's name, shape)] of a model of `config`, in the order its save_pretrained writes them (the tied
    lm_head.weight beside transformer.wte.weight, as the release's state dict holds one tensor under both): gla's
    tables inverted, each of wkv_b's latent heads a (H/g * (nope + v), r) kv_b_proj weight."""
    ours_to_release = {ours: theirs for theirs, ours in release.RELEASE_MODEL.items()}
    for theirs, ours in {**release.RELEASE_BLOCK, **release.RELEASE_ATTENTION[config.attn]}.items():
        ours_to_release[ours] = theirs
    with torch.device("meta"):
        model = gla.GPT(config)
    tensors = []
    for name, p in model.named_parameters():  # the tie appears once, as tok_emb.weight
        layer, _, rest = name.removeprefix("blocks.").partition(".")
        if name.endswith("wkv_b"):
            tensors += [(f"transformer.h.{layer}.{ours_to_release[f'attn.wkv_b.{j}']}.weight", p[j].flatten(0, 1).shape)
                        for j in range(p.shape[0])]
        elif name.startswith("blocks."):
            tensors.append((f"transformer.h.{layer}.{ours_to_release[rest.removesuffix('.weight')]}.weight", p.shape))
        else:
            tensors.append((f"{ours_to_release[name.removesuffix('.weight')]}.weight", p.shape))
            if name == "tok_emb.weight":
                tensors.append(("lm_head.weight", p.shape))
    return tensors


def config_json(config):
    """The config.json fields the release's train_*.py pass for a model of `config`."""
    c = config
    fields = dict(architectures=["GPT"], model_type="gpt2", vocab_size=c.vocab_size, n_layer=c.n_layer,
                  n_head=c.n_head, n_embd=c.n_embd, intermediate_size=c.ffn_hidden, block_size=c.block_size,
                  bias=False, dropout=0.0, torch_dtype="float32")
    if c.attn == "gqa":
        fields.update(head_dim=c.head_dim, group_size=c.n_head // c.n_kv_head)
    else:
        fields.update(q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank, qk_nope_head_dim=c.qk_nope_head_dim,
                      qk_rope_head_dim=c.qk_rope_head_dim)
    return fields


def write_checkpoint(folder, config, shard_bytes, seed=0):
    """Write a random float32 checkpoint of `config` into folder as save_pretrained(max_shard_size=shard_bytes) lays it
    out: tensors fill a shard in order until the next would pass shard_bytes (the tied matrix counted once), one file
    if they all fit, else pytorch_model-0000k-of-0000n.bin and pytorch_model.bin.index.json. Matrices N(0, 0.02), norm
    gains one. Returns the weights' bytes (the tie once)."""
    tensors = release_tensors(config)
    shards, size = [[]], 0
    for name, shape in tensors:
        nbytes = 0 if name == "lm_head.weight" else shape.numel() * 4
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    (folder / "config.json").write_text(json.dumps(config_json(config), indent=2, sort_keys=True))
    files = ["pytorch_model.bin"] if len(shards) == 1 else [f"pytorch_model-{k + 1:05d}-of-{len(shards):05d}.bin"
                                                            for k in range(len(shards))]
    generator = torch.Generator().manual_seed(seed)
    for file, shard in zip(files, shards):
        state = {}
        for name, shape in shard:
            if name == "lm_head.weight":
                state[name] = state["transformer.wte.weight"]  # one storage, saved once
            elif len(shape) == 1:
                state[name] = torch.ones(shape)
            else:
                state[name] = torch.empty(shape).normal_(0.0, 0.02, generator=generator)
        torch.save(state, folder / file)
        del state  # before the next shard is drawn
    total = sum(shape.numel() * 4 for name, shape in tensors if name != "lm_head.weight")
    if len(shards) > 1:
        weight_map = {name: file for file, shard in zip(files, shards) for name, _ in shard}
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
    return total


def read_bandwidth(gigabytes, repeats=5):
    """Bytes per second this process reads from memory: the best of `repeats` float32 sums over a buffer of
    `gigabytes` GB (filled first, so its pages exist), on the threads torch has now."""
    buffer = torch.ones(int(gigabytes * GB) // 4)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        buffer.sum().item()
        best = min(best, time.perf_counter() - t)
    return buffer.numel() * 4 / best


def memory_status():
    """This process's VmHWM (peak resident), VmRSS, RssAnon and RssFile from /proc/self/status, in bytes."""
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                status[key] = int(value.split()[0]) * 1024  # kB
    return status


def peak_anonymous(stop, peak, interval=0.01):
    """Sample this process's RssAnon every `interval` seconds until `stop` is set, keeping the largest in peak[0]:
    VmHWM counts the memory-mapped .bin pages a load has read too, which the kernel may drop and read again; the
    anonymous memory (the converted copies, the restacked wkv_b) is what the load must really hold."""
    while not stop.wait(interval):
        peak[0] = max(peak[0], memory_status()["RssAnon"])


def gemv_bandwidth(model, repeats=3):
    """Bytes per second that torch's matrix-vector product reads on this CPU: F.linear of one token over every layer's
    MLP matrices (w1, w2, w3: most of the weights) in their own dtype and memory, the best of `repeats` passes. A decode
    step at batch 1 is such products: this, not a sum's bandwidth, is the rate it can reach."""
    weights = [m.weight for block in model.blocks for m in (block.mlp.w1, block.mlp.w2, block.mlp.w3)]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            t = time.perf_counter()
            for w in weights:
                torch.nn.functional.linear(torch.ones(1, w.shape[1], dtype=w.dtype), w)
            best = min(best, time.perf_counter() - t)
    return nbytes / best


def measure(folder, dtype, prompt_len, new_tokens):
    """In this (fresh) process: load folder with release.from_pretrained in dtype, then decode new_tokens greedy
    tokens one at a time after a random prompt_len-token prompt. A dict: load seconds, memory_status before and after
    the load (with the load's sampled peak of anonymous memory) and after decoding, the median decode step's seconds,
    the weights' bytes in dtype."""
    before = memory_status()  # Python, torch and gla imported
    stop, peak = threading.Event(), [before["RssAnon"]]
    sampler = threading.Thread(target=peak_anonymous, args=(stop, peak), daemon=True)
    sampler.start()
    t = time.perf_counter()
    model = release.from_pretrained(folder, dtype=DTYPES[dtype])
    load_seconds = time.perf_counter() - t
    stop.set()
    sampler.join()
    after_load = dict(memory_status(), peak_anonymous=max(peak[0], memory_status()["RssAnon"]))
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model.setup_cache(1, prompt_len + new_tokens)
    prompt = torch.randint(model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(0))
    cached = torch.zeros(1, dtype=torch.int32)
    steps = []
    with torch.inference_mode():
        logits = model.decode(prompt, cached, max_seqlen=prompt_len)[:, -1]  # the prefill reads every weight once
        for k in range(new_tokens):
            cached.fill_(prompt_len + k)
            t = time.perf_counter()
            logits = model.decode(logits.argmax(-1, keepdim=True), cached, max_seqlen=prompt_len + k + 1)[:, -1]
            steps.append(time.perf_counter() - t)
    return dict(load_seconds=load_seconds, before=before, after_load=after_load, after_decode=memory_status(),
                step_seconds=statistics.median(steps), weight_bytes=weight_bytes, gemv=gemv_bandwidth(model))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="paper", choices=list(gla.PRESETS))
    p.add_argument("--variant", default="gla2", help="gqa, mla or gla2: the designs the release's checkpoints hold")
    p.add_argument("--double_heads", action="store_true", help="twice the query heads (the ablation's other arm)")
    p.add_argument("--n_layer", type=int, help="replace the preset's")
    p.add_argument("--n_embd", type=int, help="replace the preset's")
    p.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    p.add_argument("--shard_gb", type=float, default=5.0, help="save_pretrained's max_shard_size, in GB (1e9 bytes)")
    p.add_argument("--prompt_len", type=int, default=16)
    p.add_argument("--new_tokens", type=int, default=8, help="decode steps timed (their median)")
    p.add_argument("--bandwidth_gb", type=float, default=4.0, help="the buffer that measures read bandwidth")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the temporary checkpoint folder goes")
    p.add_argument("--measure", nargs=2, metavar=("FOLDER", "DTYPE"), help=argparse.SUPPRESS)  # the child's job
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure[0], args.measure[1], args.prompt_len, args.new_tokens)))
        return 0
    if args.variant not in gla.VARIANTS:
        p.error(f"--variant must be one of {', '.join(gla.VARIANTS)} (the release's designs gla.py loads)")
    for name in ("prompt_len", "new_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    try:
        config = gla.make_config(args.preset, args.variant, args.double_heads, n_layer=args.n_layer,
                                 n_embd=args.n_embd)
    except AssertionError as e:  # what gla cannot build, one line
        p.error(str(e))
    fp32_bytes = sum(shape.numel() * 4 for name, shape in release_tensors(config) if name != "lm_head.weight")
    if shutil.disk_usage(args.dir).free < 1.1 * fp32_bytes:
        p.error(f"{args.dir} has {shutil.disk_usage(args.dir).free / GB:.1f} GB free; the checkpoint needs "
                f"{fp32_bytes / GB:.1f} GB")
    print(f"{machine()}; {args.preset} {args.variant}{', double heads' if args.double_heads else ''}: "
          f"{config.n_layer} layers, n_embd {config.n_embd}, {fp32_bytes / 4 / 1e9:.3g}B parameters")
    before = os.getloadavg()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in before)} (1, 5, 15 min)")
    bandwidth = read_bandwidth(args.bandwidth_gb)
    print(f"read bandwidth: {bandwidth / GB:.1f} GB/s (best sum over a {args.bandwidth_gb:g} GB buffer)")
    with tempfile.TemporaryDirectory(prefix="mlra-checkpoint-", dir=args.dir) as folder:
        t = time.perf_counter()
        write_checkpoint(pathlib.Path(folder), config, args.shard_gb * GB)
        files = sorted(f.name for f in pathlib.Path(folder).glob("pytorch_model*.bin"))
        print(f"wrote {fp32_bytes / GB:.3g} GB of float32 in {time.perf_counter() - t:.0f} s: {len(files)} file(s), "
              f"{files[0]}{' ... ' + files[-1] + ' and the index' if len(files) > 1 else ''}")
        rows = []
        for dtype in args.dtypes:  # one at a time: a paper-size float32 load needs about 12 GB of memory
            cmd = [sys.executable, __file__, "--measure", folder, dtype, "--prompt_len", str(args.prompt_len),
                   "--new_tokens", str(args.new_tokens)]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                sys.exit(f"measuring {dtype} failed:\n{r.stderr}")
            rows.append((dtype, json.loads(r.stdout.strip().splitlines()[-1])))
    load = os.getloadavg()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in load)} (1, 5, 15 min)")
    print("\nMemory in GB; x: its growth over the process before loading (Python, torch), per weights' byte. Peaks: "
          "VmHWM, the memory-mapped .bin pages read included; anon: the load's sampled peak of anonymous memory.\n")
    print("| dtype | weights | before load | peak after load | its anon peak | peak after decode | anon / file-backed "
          "then | load s | decode s/token | floor s/token (weights / bandwidth) | torch's GEMV GB/s | weights / GEMV "
          "s/token | tokens/s |")
    print("|---" * 13 + "|")
    for dtype, m in rows:
        w, base = m["weight_bytes"], m["before"]["VmRSS"]
        peaks = [f"{m[when]['VmHWM'] / GB:.3g} ({(m[when]['VmHWM'] - base) / w:.2f}x)" for when in ("after_load",
                                                                                                "after_decode")]
        anon = m["after_load"]["peak_anonymous"]
        print(f"| {dtype} | {w / GB:.3g} | {base / GB:.3g} | {peaks[0]} | {anon / GB:.3g} "
              f"({(anon - m['before']['RssAnon']) / w:.2f}x) | {peaks[1]} | "
              f"{m['after_decode']['RssAnon'] / GB:.3g} / {m['after_decode']['RssFile'] / GB:.3g} "
              f"| {m['load_seconds']:.3g} | {m['step_seconds']:.3g} | {w / bandwidth:.3g} | {m['gemv'] / GB:.3g} "
              f"| {w / m['gemv']:.3g} | {1 / m['step_seconds']:.3g} |")
    if before[0] > 0.5:  # after, the load average counts this script's own threads
        print("\nThe machine was busy before (load average > 0.5): an idle one would take at most these seconds and "
              "decode at least these tokens/s; the memory figures do not depend on the load.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
