// One core's clock and float32 FMA peak, measured: (1) a chain of dependent integer adds (one per cycle) gives the
// clock; (2) 12 independent FMA chains on zmm (AVX-512) and on ymm (AVX2) registers give FLOP/s = 2 x lanes x FMAs.
// gcc -O2 -mavx512f -mfma bench/fma_peak.c -o /tmp/fma_peak && /tmp/fma_peak   (docs/results.md: the main job's cost)
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
// 12 independent FMA chains on registers R0-R11 += R12 * R13, R = "zmm" (AVX-512) or "ymm" (AVX2).
#define FMA1(R, n) "vfmadd231ps %%" R "12,%%" R "13,%%" R #n "\n\t"
#define FMA12(R) __asm__ volatile(FMA1(R, 0) FMA1(R, 1) FMA1(R, 2) FMA1(R, 3) FMA1(R, 4) FMA1(R, 5) FMA1(R, 6) \
    FMA1(R, 7) FMA1(R, 8) FMA1(R, 9) FMA1(R, 10) FMA1(R, 11) ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", \
    "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11")
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
        for (long i = 0; i < M; i++) FMA12("zmm");
        t = now() - t;
        if (2.0 * 16 * 12 * M / t > best512) best512 = 2.0 * 16 * 12 * M / t;
        t = now();
        for (long i = 0; i < M; i++) FMA12("ymm");
        t = now() - t;
        if (2.0 * 8 * 12 * M / t > best256) best256 = 2.0 * 8 * 12 * M / t;
    }
    printf("clock (dependent adds): %.3f GHz\n", best_clk / 1e9);
    printf("fp32 FMA, zmm (AVX-512): %.1f GFLOP/s = %.1f FLOP/cycle\n", best512 / 1e9, best512 / best_clk);
    printf("fp32 FMA, ymm (AVX2):    %.1f GFLOP/s = %.1f FLOP/cycle\n", best256 / 1e9, best256 / best_clk);
    return 0;
}
