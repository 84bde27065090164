/* y = x w^T (+ bias) on the CPU, with w packed once into column panels.
 *
 * Packed layout: [N / 24][K][24] (N padded to a multiple of 24): panel p holds columns
 * 24p..24p+23 of w^T, row by row, so the kernel streams it front to back. A tile is 4
 * rows of x times one panel: 12 AVX2 accumulators, and per k 3 panel loads and 4
 * broadcasts of x for 12 FMAs (the BLIS outer-product scheme). BLAS libraries pack w on
 * every call and tune for large M; at the 1-64 rows of a decode step that costs them
 * half their speed, while this loop reads w at memory speed. Rows of x are taken in
 * blocks that stay in L2 while every panel passes over them.
 *
 * Built by forkless/cpu_kernels with the system C compiler and called through ctypes;
 * float32 only.
 */

#include "common.h"

#define NR 24

int forkless_cpu_kernels_abi_version(void) { return 6; }

int forkless_linear_panel_width(void) { return NR; }

#ifdef FORKLESS_AVX2
/* MB (<= 4, a constant after inlining) rows of x times one panel. */
ALWAYS_INLINE void tile(const float *x, int64_t ldx, const float *panel, const float *bias, float *y, int64_t ldy,
                        int K, int MB) {
    __m256 acc[4][3];
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < 3; j++) acc[i][j] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++) {
        const float *p = panel + (int64_t)k * NR;
        __m256 w0 = _mm256_loadu_ps(p), w1 = _mm256_loadu_ps(p + 8), w2 = _mm256_loadu_ps(p + 16);
        /* Keep the panel row in registers: folded into each FMA as a memory operand it
         * would be loaded MB times, and the loop would wait on loads, not FMAs. */
        __asm__("" : "+x"(w0), "+x"(w1), "+x"(w2));
        for (int i = 0; i < MB; i++) {
            __m256 xi = _mm256_broadcast_ss(x + i * ldx + k);
            acc[i][0] = _mm256_fmadd_ps(xi, w0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(xi, w1, acc[i][1]);
            acc[i][2] = _mm256_fmadd_ps(xi, w2, acc[i][2]);
        }
    }
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < 3; j++) {
            __m256 a = acc[i][j];
            if (bias) a = _mm256_add_ps(a, _mm256_loadu_ps(bias + 8 * j));
            _mm256_storeu_ps(y + i * ldy + 8 * j, a);
        }
}
#else
static void tile(const float *x, int64_t ldx, const float *panel, const float *bias, float *y, int64_t ldy, int K,
                 int MB) {
    for (int i = 0; i < MB; i++) {
        float acc[NR] = {0};
        for (int k = 0; k < K; k++)
            for (int j = 0; j < NR; j++) acc[j] += x[i * ldx + k] * panel[(int64_t)k * NR + j];
        for (int j = 0; j < NR; j++) y[i * ldy + j] = bias ? acc[j] + bias[j] : acc[j];
    }
}
#endif

/* y[M, 24 * panels] (row stride ldy) from x[M, K] (row stride ldx). bias is NULL or
 * 24 * panels floats. */
int forkless_linear_f32(const float *x, int64_t ldx, const float *packed, const float *bias, float *y, int64_t ldy,
                        int M, int K, int panels) {
    /* 128 rows of x (K floats each) stay in L2 while the panels stream past. */
    enum { M_BLOCK = 128 };
    for (int m0 = 0; m0 < M; m0 += M_BLOCK) {
        const int m1 = M - m0 < M_BLOCK ? M : m0 + M_BLOCK;
#pragma omp parallel for schedule(static) if ((int64_t)(m1 - m0) * K * panels * NR >= FORKLESS_PARALLEL_MIN_MACS)
        for (int p = 0; p < panels; p++) {
            const float *panel = packed + (int64_t)p * K * NR, *bp = bias ? bias + p * NR : NULL;
            for (int m = m0; m < m1; m += 4) {
                const float *xm = x + (int64_t)m * ldx;
                float *ym = y + (int64_t)m * ldy + p * NR;
                switch (m1 - m < 4 ? m1 - m : 4) {
                case 4: tile(xm, ldx, panel, bp, ym, ldy, K, 4); break;
                case 3: tile(xm, ldx, panel, bp, ym, ldy, K, 3); break;
                case 2: tile(xm, ldx, panel, bp, ym, ldy, K, 2); break;
                default: tile(xm, ldx, panel, bp, ym, ldy, K, 1); break;
                }
            }
        }
    }
    return 0;
}
