/* y = x w^T (+ bias) in bfloat16 on the CPU, with w packed once into column panels of
 * bfloat16 pairs, for CPUs with AVX512-BF16 (vdpbf16ps) and without AMX.
 *
 * Packed layout: [N / NR][K / 2][NR][2] (N padded to a multiple of NR, K even): panel p
 * holds columns NR p..NR p + NR - 1 of w^T, two rows of K at a time, each column's pair
 * (k even, k odd) in one 32-bit lane, the layout vdpbf16ps multiplies by a broadcast pair
 * of x. A tile is MR rows of x times one panel: MR x NV float32 accumulators, and per pair
 * of K NV panel loads, MR broadcasts and MR x NV dot products of 16 lanes x 2 (the outer
 * product of linear.c, on pairs). Sums are float32; each output is rounded to bfloat16
 * once, after the bias (float32) is added, as oneDNN's bfloat16 matmul does.
 *
 * Why not oneDNN (through torch, as OneDNNLinear runs it): at decode sizes it is well
 * behind on a CPU without AMX. All 30 layers and the LM head of SmolLM2-135M, 2 threads,
 * 2-core AMD EPYC Zen 4 (AVX512-BF16, no AMX), this tile against prepacked oneDNN, ms a
 * pass: 1 row 11.4 / 23.1, 8 rows 10.6 / 18.6, 35 rows 30.1 / 38.3, 64 rows 45.8 / 60.4,
 * 512 rows 335 / 397, 2,048 rows 1,322 / 1,415 (417 against 389 GFLOP/s); 3 x 8 and
 * 2 x 12 tiles were within noise of 4 x 6. On a CPU with AMX oneDNN's tiles are 3-12x this
 * kernel from 35 rows up (16-core Xeon, 2 and 8 threads; this kernel ahead only at 1-8 rows):
 * there forkless keeps oneDNN (cpu_linear.py).
 *
 * Without AVX512-BF16 the same entry point runs plain loops (correct, slow: for tests
 * and the portable build; forkless_linear_bf16_native() says which). */

#include <string.h>

#include "common.h"

#if defined(FORKLESS_AVX512) && defined(__AVX512BF16__)
#define BF16_NATIVE 1
#define NV_BF16 4
#define MR_BF16 6
#define NR_BF16 (NV_BF16 * 16)
#else
#define BF16_NATIVE 0
#define NR_BF16 16
#endif

int forkless_linear_bf16_native(void) { return BF16_NATIVE; }

int forkless_linear_bf16_panel_width(void) { return NR_BF16; }

#if BF16_NATIVE
/* MB (<= MR_BF16, a constant after inlining) rows of x times one panel. */
ALWAYS_INLINE void tile_bf16(const uint16_t *x, int64_t ldx, const uint32_t *panel, const float *bias, uint16_t *y,
                             int64_t ldy, int K2, int MB) {
    __m512 acc[MR_BF16][NV_BF16];
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < NV_BF16; j++) acc[i][j] = _mm512_setzero_ps();
    for (int k = 0; k < K2; k++) {
        const uint32_t *p = panel + (int64_t)k * NR_BF16;
        /* The panel streams in front to back: ask for it 1 KB ahead. */
        prefetch_bytes((const char *)p + 1024, NR_BF16 * 4);
        __m512i w[NV_BF16];
        for (int j = 0; j < NV_BF16; j++) {
            w[j] = _mm512_loadu_si512(p + 16 * j);
            /* Keep the panel row in registers (as linear.c's tile: loaded once, not MB times). */
            __asm__("" : "+v"(w[j]));
        }
        for (int i = 0; i < MB; i++) {
            uint32_t pair;
            memcpy(&pair, x + i * ldx + 2 * k, sizeof pair);
            const __m512bh xi = (__m512bh)_mm512_set1_epi32((int)pair);
            for (int j = 0; j < NV_BF16; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xi, (__m512bh)w[j]);
        }
    }
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < NV_BF16; j++) {
            __m512 a = acc[i][j];
            if (bias) a = _mm512_add_ps(a, _mm512_loadu_ps(bias + 16 * j));
            _mm256_storeu_si256((__m256i *)(y + i * ldy + 16 * j), (__m256i)_mm512_cvtneps_pbh(a));
        }
}
#else
#define MR_BF16 1
static void tile_bf16(const uint16_t *x, int64_t ldx, const uint32_t *panel, const float *bias, uint16_t *y,
                      int64_t ldy, int K2, int MB) {
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < NR_BF16; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K2; k++) {
                const uint32_t w = panel[(int64_t)k * NR_BF16 + j];
                acc += bf16_to_f32(x[i * ldx + 2 * k]) * bf16_to_f32((uint16_t)w) +
                       bf16_to_f32(x[i * ldx + 2 * k + 1]) * bf16_to_f32((uint16_t)(w >> 16));
            }
            y[i * ldy + j] = f32_to_bf16(bias ? acc + bias[j] : acc);
        }
}
#endif

/* y[M, NR_BF16 * panels] (row stride ldy) from x[M, K] (row stride ldx, K even). bias is
 * NULL or NR_BF16 * panels floats. Returns 0. */
int forkless_linear_bf16(const uint16_t *x, int64_t ldx, const uint32_t *packed, const float *bias, uint16_t *y,
                         int64_t ldy, int M, int K, int panels) {
    /* 128 rows of x stay in L2 while the panels stream past. */
    enum { M_BLOCK = 128 };
    const int K2 = K / 2;
    for (int m0 = 0; m0 < M; m0 += M_BLOCK) {
        const int m1 = M - m0 < M_BLOCK ? M : m0 + M_BLOCK, tiles = (m1 - m0 + MR_BF16 - 1) / MR_BF16;
        /* Work items are (panel, row tile), panel-major, split evenly (as linear.c's); a large
         * layer is split even at one row (FORKLESS_PARALLEL_MIN_WEIGHTS). */
#pragma omp parallel for schedule(static) if ((int64_t)(m1 - m0) * K * panels * NR_BF16 >= FORKLESS_PARALLEL_MIN_MACS \
                                              || (int64_t)K * panels * NR_BF16 >= FORKLESS_PARALLEL_MIN_WEIGHTS)
        for (int64_t item = 0; item < (int64_t)panels * tiles; item++) {
            const int p = (int)(item / tiles), m = m0 + (int)(item % tiles) * MR_BF16;
            const uint32_t *panel = packed + (int64_t)p * K2 * NR_BF16;
            const float *bp = bias ? bias + p * NR_BF16 : NULL;
            const uint16_t *xm = x + (int64_t)m * ldx;
            uint16_t *ym = y + (int64_t)m * ldy + p * NR_BF16;
#if BF16_NATIVE
            switch (m1 - m < MR_BF16 ? m1 - m : MR_BF16) {
            case 6: tile_bf16(xm, ldx, panel, bp, ym, ldy, K2, 6); break;
            case 5: tile_bf16(xm, ldx, panel, bp, ym, ldy, K2, 5); break;
            case 4: tile_bf16(xm, ldx, panel, bp, ym, ldy, K2, 4); break;
            case 3: tile_bf16(xm, ldx, panel, bp, ym, ldy, K2, 3); break;
            case 2: tile_bf16(xm, ldx, panel, bp, ym, ldy, K2, 2); break;
            default: tile_bf16(xm, ldx, panel, bp, ym, ldy, K2, 1); break;
            }
#else
            tile_bf16(xm, ldx, panel, bp, ym, ldy, K2, 1);
#endif
        }
    }
    return 0;
}
