"""The one GPU check: the bf16 decode kernel against its PyTorch reference in every launch the benchmark runs, then
the suite's CUDA tests (the compiled kernel in each dtype, the model's decode path into it, the GPU build
figures against this GPU's own build). Exits 1 on any failure, 2 without a CUDA GPU.

    python bench/gpu_check.py
"""
import argparse
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository's modules

import torch  # noqa: E402

import kernels  # noqa: E402
from bench.common import BENCH_BATCHES, BENCH_LQ, BENCH_SEQLENS, BENCH_SHAPES, bench_inputs  # noqa: E402

# Every launch the bench runs, and Lq = kernels.MAX_LQ at 4096 tokens.
CHECK_CONFIGS = ([(name, B, Lq, S) for name in BENCH_SHAPES for B in BENCH_BATCHES for S in BENCH_SEQLENS
                  for Lq in BENCH_LQ]
                 + [(name, B, kernels.MAX_LQ, 4096) for name in BENCH_SHAPES for B in BENCH_BATCHES])
# Per sequence, max |kernel - reference| / max |reference| in bf16. Emulating the kernel's roundings (bf16
# probabilities into P.V, bf16 partials with float32 log-sum-exps, bf16 output) on the bench shapes at 4096 tokens
# gave 0.24-0.42%; dropping one 16-token tile of a 4096-token sequence gave 3.2-8.7%. CHECK_TOL sits between.
CHECK_TOL = 1.5e-2



def check_one(name, B, Lq, S, dtype=torch.bfloat16, device="cuda"):
    """Failure lines of the kernel against the reference in one bench launch: ragged lengths up to S (the first S, the
    second a few tokens, in which one wrong token shows), NaN past them."""
    q, k_cache, v_cache, seqlens, qv = bench_inputs(name, B, S, Lq, dtype, device)
    seqlens = torch.randint(Lq, S + 1, (B,), dtype=torch.int32, device=device)
    seqlens[0] = S
    seqlens[1:2] = min(S, Lq + 16)
    stale = torch.arange(S, device=device)[None, :] >= seqlens[:, None]
    k_cache[stale] = float("nan")  # positions past cache_seqlens must never be read
    v_cache[stale] = float("nan")
    # The reference needs finite stale slots: it reads the NaN as 0.
    ref = kernels.decode_attention_ref(q, k_cache.nan_to_num(), v_cache.nan_to_num(), seqlens, qv).float()
    scale = ref.flatten(1).abs().amax(1)  # per sequence
    failures = []
    for how in (dict(), dict(max_seqlen=S), dict(num_splits=3)):
        out = kernels.decode_attention(q, k_cache, v_cache, seqlens, qv, **how).float()
        err = ((out - ref).flatten(1).abs().amax(1) / scale).nan_to_num(float("inf")).max().item()
        if not err <= CHECK_TOL:
            failures.append(f"MISMATCH {name} B={B} Lq={Lq} S={S} {how or 'defaults'}: relative error {err:.3g} "
                            f"> {CHECK_TOL} (NaN counts as inf)")
    return failures


def check():
    """The one GPU check: the bf16 kernel against the reference in every CHECK_CONFIGS launch,
    then the suite's CUDA tests (the compiled kernel in each dtype, the model's decode path
    into it, the GPU build figures against this GPU's own build). Exits 1 on any failure."""
    failures = []
    for name, B, Lq, S in CHECK_CONFIGS:
        try:
            failures += check_one(name, B, Lq, S)
        except Exception as e:  # report every launch, then fail
            failures.append(f"ERROR {name} B={B} Lq={Lq} S={S}: {type(e).__name__}: {e}")
        torch.cuda.empty_cache()
    if failures:
        sys.exit(f"\nKERNEL CHECK FAILED ({len(failures)}):\n" + "\n".join(failures))
    print(f"kernel check passed: {len(CHECK_CONFIGS)} launches within {CHECK_TOL} of the reference", flush=True)
    root = pathlib.Path(__file__).resolve().parents[1]
    tests = [str(root / "test_gla.py"), str(root / "bench" / "test_bench.py")]
    if subprocess.run([sys.executable, "-m", "pytest", "-q", "-k", "cuda", *tests]).returncode:
        sys.exit("\nCUDA TESTS FAILED (see above)")


def main(argv=None):
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    interpreted = kernels.triton is not None and kernels.triton.knobs.runtime.interpret
    if kernels.triton is None or not torch.cuda.is_available() or interpreted:
        print("bench/gpu_check.py needs a CUDA GPU, Triton, and TRITON_INTERPRET unset", file=sys.stderr)
        sys.exit(2)
    check()


if __name__ == "__main__":
    main()
