"""The decode roofline: the arithmetic intensity (FLOP per byte read) of one decode step of each paper-scale design,
on one device and per device under TP-2, against the ridge points of an H100's and an H200's roofline. Writes the
PNG (README's assets/decode_roofline.png) and prints the numbers.

    python bench/roofline.py [--output decode_roofline.png]
"""
import argparse
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import gla  # noqa: E402
import plot  # noqa: E402

# The decode roofline. A design's arithmetic intensity (Zadouri, Strauss, Dao 2025, arXiv 2505.21487, Sec. 3) is the
# kernel's FLOPs over the bytes it reads, call_flops / call_bytes, the formulas of bench/gpu_build.py's and
# bench/kernel_speed.py's floors; a GPU's ridge point is its tensor-core peak over its memory bandwidth: above it a step
# is compute-bound.
ROOFLINE_LQ = (1, 2, 4, 8, 16)
ROOFLINE_SEQLEN = 32768  # cached tokens: q, qv and the output add a few percent to the bytes at 8K, less beyond
ROOFLINE_TP = (1, 2)
H100_HBM_BYTES_PER_S = 3.35e12  # H100 SXM, NVIDIA's datasheet
H200_HBM_BYTES_PER_S = 4.8e12  # H200 SXM, NVIDIA's datasheet
# An H100 or H200 SXM does 989 TFLOP/s of dense bf16 (NVIDIA's datasheets: 1979 with 2:4 sparsity) through wgmma
# (HGMMA in SASS, which Triton issues for tiles of 64 rows or more), and mma.sync (HMMA) reaches about 2/3 of that
# peak (Shah et al., FlashAttention-3, arXiv 2407.08608, Sec. 2.2).
H200_TENSOR_FLOPS_PER_S = {"HGMMA": 989e12, "HMMA": 989e12 * 2 / 3}


def call_bytes(B, Lq, Hq, Hk, Hkv, Dk, Dv, has_qv, seqlen, elem_bytes):
    """Bytes one decode call must move: the cached K and V (B sequences of seqlen tokens, read once), q, qv and the
    output."""
    return (B * seqlen * (Hk * Dk + Hkv * Dv) + B * Lq * Hq * (Dk + has_qv * Dv + Dv)) * elem_bytes


def call_flops(B, Lq, Hq, Dk, Dv, has_qv, seqlen):
    """FLOPs of one call's two products as the kernel does them, 2 a multiply-add: per row (query head x new token)
    and cached token (B sequences of seqlen), the scores over Dk (+ Dv with qv) and P.V over Dv."""
    return 2 * B * Lq * Hq * seqlen * (Dk + has_qv * Dv + Dv)


def roofline_rows():
    """One decode step (batch 1, ROOFLINE_SEQLEN cached tokens, bf16) of each paper-scale design at each Lq of
    ROOFLINE_LQ, on each device under tp in ROOFLINE_TP (gla.tp_share: GQA's 6 KV heads split, MLA's latent
    duplicated, GLA-2's latent heads split): dicts of label, variant, tp, n_head and groups (KV or latent heads) per
    device, Lq, flops, bytes (the cache, q, qv and the output) and flop_per_byte."""
    rows = []
    for variant in gla.VARIANTS:
        label = plot.STYLE[variant][0]
        for tp in ROOFLINE_TP:
            config = gla.tp_share(gla.make_config("paper", variant), 0, tp).config
            (Hk, Dk), (Hkv, Dv) = config.kv_cache_shapes
            has_qv = config.attn != "gqa"  # the latent designs' absorbed query
            for Lq in ROOFLINE_LQ:
                flops = call_flops(1, Lq, config.n_head, Dk, Dv, has_qv, ROOFLINE_SEQLEN)
                nbytes = call_bytes(1, Lq, config.n_head, Hk, Hkv, Dk, Dv, has_qv, ROOFLINE_SEQLEN, 2)
                rows.append(dict(label=label, variant=variant, tp=tp, n_head=config.n_head, groups=config.n_groups,
                                 Lq=Lq, flops=flops, bytes=nbytes, flop_per_byte=flops / nbytes))
    return rows


def ridges():
    """{label: FLOP per byte at which a step turns compute-bound} on an H100 and an H200 (SXM), at the dense bf16
    peak of wgmma and at mma.sync's (our kernel's tiles under 64 rows), from H200_TENSOR_FLOPS_PER_S."""
    return {f"{gpu} ridge, {mma} ({name}) peak": H200_TENSOR_FLOPS_PER_S[mma] / bandwidth
            for gpu, bandwidth in (("H100", H100_HBM_BYTES_PER_S), ("H200", H200_HBM_BYTES_PER_S))
            for mma, name in (("HGMMA", "wgmma"), ("HMMA", "mma.sync"))}


def plot_roofline(rows, path):
    """Draw roofline_rows() against ridges(): FLOP per byte (log) over Lq (log 2), one line per design and
    tensor-parallel degree; save a PNG to path (a file name or a binary file)."""
    colours = dict(plot.STYLE[v][:2] for v in gla.VARIANTS)
    fig, ax = plt.subplots(figsize=(7.6, 5.4))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    for gpu_label, ridge in ridges().items():
        h100, wgmma = gpu_label.startswith("H100"), "wgmma" in gpu_label
        colour = "firebrick" if h100 else "black"
        below = h100 and not wgmma  # H100's 197 sits just under H200's 206: its label goes under its line
        ax.axhline(ridge, color=colour, lw=1.0, ls="-" if wgmma else ":", zorder=1)
        ax.annotate(f"{gpu_label}: {ridge:.0f} FLOP/byte", (ROOFLINE_LQ[0], ridge), xytext=(0, -2 if below else 2),
                    textcoords="offset points", fontsize=7, color=colour, va="top" if below else "bottom")
    for label in colours:
        for tp in ROOFLINE_TP:
            line = [r for r in rows if r["label"] == label and r["tp"] == tp]
            devices = "1 device" if tp == 1 else f"TP-{tp}, per device"
            ax.plot([r["Lq"] for r in line], [r["flop_per_byte"] for r in line], color=colours[label],
                    ls="-" if tp == 1 else "--", marker="o" if tp == 1 else "s", ms=5 if tp == 1 else 4, lw=1.6,
                    label=f"{label}, {devices}: {line[0]['n_head']} heads, {line[0]['groups']} "
                          f"{'KV' if line[0]['variant'] == 'gqa' else 'latent'} head"
                          f"{'s' if line[0]['groups'] > 1 else ''}", zorder=3)
    ax.set_xticks(ROOFLINE_LQ, [str(n) for n in ROOFLINE_LQ])
    ax.set_xlabel("new tokens per step, Lq (1: plain decoding; more: speculative drafts)")
    ax.set_ylabel("FLOP per byte read")
    ax.set_title(f"Decode at paper scale against the roofline (bf16, {ROOFLINE_SEQLEN // 1024}K cached tokens)",
                 fontsize=10)
    ax.text(0.99, 0.02, "above a ridge line: compute-bound on that GPU; below: memory-bound", fontsize=7,
            transform=ax.transAxes, ha="right", va="bottom")
    ax.grid(True, which="major", alpha=0.25)
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=150, format="png")
    plt.close(fig)


def run_roofline(output):
    """Write the roofline PNG to output and print its numbers."""
    if os.path.splitext(output)[1].lower() != ".png":
        raise SystemExit(f"bench/roofline.py: error: --output must end in .png, got {output!r}")
    rows = roofline_rows()
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    plot_roofline(rows, output)
    print(f"wrote {output}\nFLOP per byte of one decode step, Lq {', '.join(map(str, ROOFLINE_LQ))}:")
    for r in rows[::len(ROOFLINE_LQ)]:
        same = [x["flop_per_byte"] for x in rows if (x["label"], x["tp"]) == (r["label"], r["tp"])]
        print(f"  {r['label']:<6} tp {r['tp']} ({r['n_head']:>2} heads): " + " ".join(f"{v:6.1f}" for v in same))
    for label, ridge in ridges().items():
        print(f"  {label}: {ridge:.0f}")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default="decode_roofline.png", help="PNG to write (default: %(default)s)")
    return run_roofline(p.parse_args(argv).output)


if __name__ == "__main__":
    sys.exit(main())
