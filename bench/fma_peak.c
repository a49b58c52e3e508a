// One core's clock and float32 FMA peak, measured: (1) a chain of dependent integer adds (one per cycle) gives the
// clock; (2) 12 independent FMA chains on zmm (AVX-512) and on ymm (AVX2) registers give FLOP/s = 2 x lanes x FMAs.
// gcc -O2 -mavx512f -mfma bench/fma_peak.c -o /tmp/fma_peak && /tmp/fma_peak   (docs/results.md: the main job's cost)
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(void) {
    const long N = 40000000L;  // ~10-20 ms a rep: the best of many short reps dodges time slices of other work
    double best_clk = 0, best512 = 0, best256 = 0;
    for (int rep = 0; rep < 300; rep++) {
        long x = 0;
        double t = now();
        for (long i = 0; i < N; i += 8)
            __asm__ volatile("add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\t"
                             "add $1,%0\n\tadd $1,%0\n\tadd $1,%0\n\tadd $1,%0" : "+r"(x));
        t = now() - t;  // the loop's own inc/cmp/branch run beside the chain
        if (N / t > best_clk) best_clk = N / t;
        const long M = 1000000L;
        t = now();
        for (long i = 0; i < M; i++)  // 12 independent chains, zmm0-11 += zmm12 * zmm13
            __asm__ volatile(
                "vfmadd231ps %%zmm12,%%zmm13,%%zmm0\n\tvfmadd231ps %%zmm12,%%zmm13,%%zmm1\n\t"
                "vfmadd231ps %%zmm12,%%zmm13,%%zmm2\n\tvfmadd231ps %%zmm12,%%zmm13,%%zmm3\n\t"
                "vfmadd231ps %%zmm12,%%zmm13,%%zmm4\n\tvfmadd231ps %%zmm12,%%zmm13,%%zmm5\n\t"
                "vfmadd231ps %%zmm12,%%zmm13,%%zmm6\n\tvfmadd231ps %%zmm12,%%zmm13,%%zmm7\n\t"
                "vfmadd231ps %%zmm12,%%zmm13,%%zmm8\n\tvfmadd231ps %%zmm12,%%zmm13,%%zmm9\n\t"
                "vfmadd231ps %%zmm12,%%zmm13,%%zmm10\n\tvfmadd231ps %%zmm12,%%zmm13,%%zmm11"
                ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                "xmm11");
        t = now() - t;
        if (2.0 * 16 * 12 * M / t > best512) best512 = 2.0 * 16 * 12 * M / t;
        t = now();
        for (long i = 0; i < M; i++)
            __asm__ volatile(
                "vfmadd231ps %%ymm12,%%ymm13,%%ymm0\n\tvfmadd231ps %%ymm12,%%ymm13,%%ymm1\n\t"
                "vfmadd231ps %%ymm12,%%ymm13,%%ymm2\n\tvfmadd231ps %%ymm12,%%ymm13,%%ymm3\n\t"
                "vfmadd231ps %%ymm12,%%ymm13,%%ymm4\n\tvfmadd231ps %%ymm12,%%ymm13,%%ymm5\n\t"
                "vfmadd231ps %%ymm12,%%ymm13,%%ymm6\n\tvfmadd231ps %%ymm12,%%ymm13,%%ymm7\n\t"
                "vfmadd231ps %%ymm12,%%ymm13,%%ymm8\n\tvfmadd231ps %%ymm12,%%ymm13,%%ymm9\n\t"
                "vfmadd231ps %%ymm12,%%ymm13,%%ymm10\n\tvfmadd231ps %%ymm12,%%ymm13,%%ymm11"
                ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                "xmm11");
        t = now() - t;
        if (2.0 * 8 * 12 * M / t > best256) best256 = 2.0 * 8 * 12 * M / t;
    }
    printf("clock (dependent adds): %.3f GHz\n", best_clk / 1e9);
    printf("fp32 FMA, zmm (AVX-512): %.1f GFLOP/s = %.1f FLOP/cycle\n", best512 / 1e9, best512 / best_clk);
    printf("fp32 FMA, ymm (AVX2):    %.1f GFLOP/s = %.1f FLOP/cycle\n", best256 / 1e9, best256 / best_clk);
    return 0;
}
