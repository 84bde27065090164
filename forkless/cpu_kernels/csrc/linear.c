/* y = x w^T (+ bias) on the CPU, with w packed once into column panels.
 *
 * Packed layout: [N / NR][K][NR] (N padded to a multiple of NR): panel p holds columns
 * NR p..NR p + NR - 1 of w^T, row by row, so the kernel streams it front to back. A tile
 * is MR rows of x times one panel, NR = NV vectors wide: MR x NV accumulators, and per k
 * NV panel loads and MR broadcasts of x for MR x NV FMAs (the BLIS outer-product scheme).
 * AVX2 has 16 vector registers: 4 rows x 3 vectors (24 columns), 12 accumulators.
 * AVX-512 has 32: 6 rows x 4 vectors (64 columns), 24 accumulators, 10 loads per 24 FMAs
 * of 16 lanes (one thread on a Xeon with AMX, 16 layers' weights of SmolLM2-135M: 192
 * GFLOP/s at 1,024 rows and 165 at 128, against 185 and 160 with 8 rows x 3 vectors, 182
 * and 157 with 12 x 2; 170 and 154 with AVX2's 4 x 3 in 512-bit registers). The panel
 * width is forkless_linear_panel_width(), so the packing follows the library loaded.
 * BLAS libraries pack w on every call and tune for large M; at the 1-64 rows of a decode
 * step that costs them half their speed, while this loop reads w at memory speed. Rows of
 * x are taken in blocks that stay in L2 while every panel passes over them.
 *
 * Built by forkless/cpu_kernels with the system C compiler and called through ctypes;
 * float32 only.
 */

#include "common.h"

/* -DNV= / -DMR= override the tile (to measure others). */
#ifdef FORKLESS_AVX512
#ifndef NV
#define NV 4
#endif
#ifndef MR
#define MR 6
#endif
#else
#ifndef NV
#define NV 3
#endif
#ifndef MR
#define MR 4
#endif
#endif
#define NR (NV * VW)

int forkless_cpu_kernels_abi_version(void) { return 8; }

const char *forkless_cpu_kernels_isa(void) { return FORKLESS_ISA_NAME; }

int forkless_linear_panel_width(void) { return NR; }

#ifdef FORKLESS_SIMD
/* MB (<= MR, a constant after inlining) rows of x times one panel. */
ALWAYS_INLINE void tile(const float *x, int64_t ldx, const float *panel, const float *bias, float *y, int64_t ldy,
                        int K, int MB) {
    vec acc[MR][NV];
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < NV; j++) acc[i][j] = vzero();
    for (int k = 0; k < K; k++) {
        const float *p = panel + (int64_t)k * NR;
        vec w[NV];
        for (int j = 0; j < NV; j++) {
            w[j] = vload(p + VW * j);
            /* Keep the panel row in registers: folded into each FMA as a memory operand it
             * would be loaded MB times, and the loop would wait on loads, not FMAs. */
            __asm__("" : "+v"(w[j]));
        }
        for (int i = 0; i < MB; i++) {
            vec xi = vset1(x[i * ldx + k]);
            for (int j = 0; j < NV; j++) acc[i][j] = vfma(xi, w[j], acc[i][j]);
        }
    }
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < NV; j++) {
            vec a = acc[i][j];
            if (bias) a = vadd(a, vload(bias + VW * j));
            vstore(y + i * ldy + VW * j, a);
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

#ifdef FORKLESS_SIMD
/* One row of x times NP (<= 4, a constant after inlining) neighbouring panels at once.
 * With one row the kernel is bound by reading w, and one panel is one stream of loads:
 * four in flight read it faster (one thread, the default model's 30 layers + head, load
 * ~4.5: 45-50 ms per pass against 58-62 with one panel at a time, torch's GEMV 54-55). */
ALWAYS_INLINE void row_panels(const float *x, const float *panel, int64_t pstride, const float *bias, float *y, int K,
                              int NP) {
    vec acc[4][NV];
    for (int q = 0; q < NP; q++)
        for (int j = 0; j < NV; j++) acc[q][j] = vzero();
    for (int k = 0; k < K; k++) {
        vec xi = vset1(x[k]);
        for (int q = 0; q < NP; q++) {
            const float *p = panel + q * pstride + (int64_t)k * NR;
            for (int j = 0; j < NV; j++) acc[q][j] = vfma(xi, vload(p + VW * j), acc[q][j]);
        }
    }
    for (int q = 0; q < NP; q++)
        for (int j = 0; j < NV; j++) {
            vec a = acc[q][j];
            if (bias) a = vadd(a, vload(bias + q * NR + VW * j));
            vstore(y + q * NR + VW * j, a);
        }
}
#endif

/* y[M, NR * panels] (row stride ldy) from x[M, K] (row stride ldx). bias is NULL or
 * NR * panels floats. */
int forkless_linear_f32(const float *x, int64_t ldx, const float *packed, const float *bias, float *y, int64_t ldy,
                        int M, int K, int panels) {
    /* 128 rows of x (K floats each) stay in L2 while the panels stream past. */
    enum { M_BLOCK = 128 };
#ifdef FORKLESS_SIMD
    if (M == 1) {
        const int64_t pstride = (int64_t)K * NR;
#pragma omp parallel for schedule(static) if ((int64_t)K * panels * NR >= FORKLESS_PARALLEL_MIN_MACS)
        for (int p = 0; p < panels; p += 4) {
            const float *panel = packed + p * pstride, *bp = bias ? bias + p * NR : NULL;
            float *yp = y + p * NR;
            switch (panels - p < 4 ? panels - p : 4) {
            case 4: row_panels(x, panel, pstride, bp, yp, K, 4); break;
            case 3: row_panels(x, panel, pstride, bp, yp, K, 3); break;
            case 2: row_panels(x, panel, pstride, bp, yp, K, 2); break;
            default: row_panels(x, panel, pstride, bp, yp, K, 1); break;
            }
        }
        return 0;
    }
#endif
    for (int m0 = 0; m0 < M; m0 += M_BLOCK) {
        const int m1 = M - m0 < M_BLOCK ? M : m0 + M_BLOCK;
#pragma omp parallel for schedule(static) if ((int64_t)(m1 - m0) * K * panels * NR >= FORKLESS_PARALLEL_MIN_MACS)
        for (int p = 0; p < panels; p++) {
            const float *panel = packed + (int64_t)p * K * NR, *bp = bias ? bias + p * NR : NULL;
            for (int m = m0; m < m1; m += MR) {
                const float *xm = x + (int64_t)m * ldx;
                float *ym = y + (int64_t)m * ldy + p * NR;
                switch (m1 - m < MR ? m1 - m : MR) {
#if MR > 8
                case 12: tile(xm, ldx, panel, bp, ym, ldy, K, 12); break;
                case 11: tile(xm, ldx, panel, bp, ym, ldy, K, 11); break;
                case 10: tile(xm, ldx, panel, bp, ym, ldy, K, 10); break;
                case 9: tile(xm, ldx, panel, bp, ym, ldy, K, 9); break;
#endif
#if MR > 4
                case 8: tile(xm, ldx, panel, bp, ym, ldy, K, 8); break;
                case 7: tile(xm, ldx, panel, bp, ym, ldy, K, 7); break;
                case 6: tile(xm, ldx, panel, bp, ym, ldy, K, 6); break;
                case 5: tile(xm, ldx, panel, bp, ym, ldy, K, 5); break;
#endif
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
