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
 * x are taken in blocks that stay in L2 while every panel passes over them; each panel is
 * prefetched 1 KB ahead as it streams in (from memory for the first row block, from L2
 * for the next: 5-7 % faster at 33-128 rows, within 3 % either way at 1,024).
 *
 * Up to 32 rows (decode steps, speculative verification: 1 + 4 drafts is 5 rows) the
 * kernel is bound by reading w, not by FMAs, and one panel read front to back is one
 * stream of loads; with several rows the loop has so much work per byte that the
 * out-of-order window keeps too few of them in flight (4-8 rows read w at 8-9 GB/s with
 * one tile per panel, one row at 13-15). So few_rows reads each panel as STREAMS = 6
 * streams at once (its K rows cut into six runs summed into the same accumulators: no
 * more registers, any block height up to MR), each prefetched 1 KB ahead, and the row
 * blocks take turns on each slab of 4 rows per stream while it is in L1, so w is read
 * from memory once. One thread, the default model's 30 layers + LM head (538 MB of
 * float32, benchmarks/cpu_linear_isa.py --threads 1 --baseline, best of 9, load 0.2-0.6;
 * Xeon with AMX, KVM, 2 cores): ms per pass at 1 / 2 / 4 / 5 / 8 / 16 rows, AVX-512 39.7 /
 * 44.7 / 42.8 / 40.8 / 49.0 / 58.1 (1.00 / 1.12 / 1.08 / 1.03 / 1.23 / 1.46x the 1-row
 * pass; one tile per panel: 40.2 / 51.3 / 59.4 / 57.7 / 73.8 / 84.9), AVX2 39.6 / 45.1 /
 * 47.1 / 45.9 / 54.6 / 71.5 (38.0 / 47.9 / 55.5 / 62.2 / 75.2 / 95.9). Four streams or
 * eight, 0.5 or 2 KB ahead, prefetching into L2 instead: no better; 2-3 rows x 2-3 panels
 * at once (the streams across panels): 10-20 % slower at 5 rows. Past 6 rows (AVX2: 4),
 * a second row block, the time grows with the FMAs: they no longer hide under the reads.
 *
 * From NEXT_PANEL_MIN_TILES = 4 row tiles per panel (19 rows in AVX-512's 6-row tiles; the
 * tile path itself starts past SMALL_M rows: 5 in AMD's AVX-512 builds, 32 in the others) the
 * tiles after a panel's first, which read it from L2, also fetch the next panel into L2,
 * each tile a share of its rows spread over its loop: the first tile of every panel read
 * it from memory at one tile's FMA rate and waited (at 35 rows, 6 tiles, one panel of 576 rows
 * is 147 KB: ~5 us from memory against ~2 us of FMAs). The default model's pass (Zen 5,
 * benchmarks/cpu_linear_isa.py --baseline): 1.07-1.08x faster at 24-64 rows on one thread,
 * 1.12-1.18x on two, prefill unchanged; an Intel Xeon with AMX 1.26-1.36x at 35-64 rows on
 * one thread, 1.11-1.27x on two; with 2-3 tiles, where the few tiles after the first
 * must pull a whole panel in at memory speed, 0.74x and 0.97x: there it stays off.
 *
 * Up to 32 rows the panels are split over threads once the layer holds 1 MB of weights
 * (PARALLEL_MIN_WEIGHTS) rather than by multiply-adds: reading w is the cost, and two
 * threads read it faster than one (two threads, same pass: 22.5 ms at one row, 26.1 at
 * five, against 37.1 and 40.7 when only layers of 4M multiply-adds were split).
 *
 * Built by forkless/cpu_kernels with the system C compiler and called through ctypes;
 * float32 only.
 */

#include "common.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* -DNV= / -DMR= override the tile, -DSMALL_M= / -DSTREAMS= / -DK_SLAB= / -DPF_AHEAD= the
 * few-row path (to measure others). */
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
/* 2..SMALL_M rows take few_rows: each panel read as STREAMS streams, several row blocks
 * taking turns on slabs of K_SLAB rows per stream; the weights are prefetched PF_AHEAD
 * bytes ahead along each stream. Up to SMALL_M rows, a layer of PARALLEL_MIN_WEIGHTS
 * floats or more is split over threads. (Builds for AMD's AVX-512 cores set SMALL_M to 5:
 * there the tile path wins from 6 rows; forkless/cpu_kernels/__init__.py.) */
#ifndef SMALL_M
#define SMALL_M 32
#endif
#ifndef STREAMS
#define STREAMS 6
#endif
#ifndef K_SLAB
#define K_SLAB 4
#endif
#ifndef PARALLEL_MIN_WEIGHTS
#define PARALLEL_MIN_WEIGHTS FORKLESS_PARALLEL_MIN_WEIGHTS
#endif
#ifndef NEXT_PANEL_MIN_TILES
#define NEXT_PANEL_MIN_TILES 4
#endif
#ifndef PF_AHEAD
#define PF_AHEAD 1024
#endif

int forkless_cpu_kernels_abi_version(void) { return 13; }

const char *forkless_cpu_kernels_isa(void) { return FORKLESS_ISA_NAME; }

int forkless_linear_panel_width(void) { return NR; }

#ifdef FORKLESS_SIMD
/* Ask for the panel row PF_AHEAD bytes past p (along one weight stream) ahead of its use. */
ALWAYS_INLINE void prefetch_ahead(const float *p) { prefetch_bytes((const char *)p + PF_AHEAD, NR * sizeof(float)); }

/* MB (<= MR, a constant after inlining) rows of x times one panel, prefetched as it
 * streams in (from memory for the first row block, from L2 for the next ones: both gain).
 * With next, rows phase, phase + every, ... of the panel at next are fetched into L2. */
ALWAYS_INLINE void tile(const float *x, int64_t ldx, const float *panel, const float *bias, float *y, int64_t ldy,
                        int K, int MB, const float *next, int phase, int every) {
    vec acc[MR][NV];
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < NV; j++) acc[i][j] = vzero();
    int countdown = phase + 1;
    for (int k = 0; k < K; k++) {
        const float *p = panel + (int64_t)k * NR;
        prefetch_ahead(p);
        if (next && --countdown == 0) {
            countdown = every;
            prefetch_bytes_l2(next + (int64_t)k * NR, NR * sizeof(float));
        }
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

/* sum[MB][NR] += MB rows of x times rows k0..k1-1 of each of NS streams of one panel, the
 * streams Kc rows apart (stream s: panel rows s Kc + k0..s Kc + k1 - 1), into the same
 * accumulators; with ahead, each stream is prefetched. MB (<= MR) and NS are constants
 * after inlining. */
ALWAYS_INLINE void tile_streams(const float *x, int64_t ldx, const float *panel, float *sum, int Kc, int k0, int k1,
                                int MB, int NS, int ahead) {
    vec acc[MR][NV];
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < NV; j++) acc[i][j] = vload(sum + i * NR + VW * j);
    for (int k = k0; k < k1; k++)
        for (int s = 0; s < NS; s++) {
            const int ks = s * Kc + k;
            const float *p = panel + (int64_t)ks * NR;
            if (ahead) prefetch_ahead(p);
            vec w[NV];
            for (int j = 0; j < NV; j++) {
                w[j] = vload(p + VW * j);
                __asm__("" : "+v"(w[j])); /* as in tile */
            }
            for (int i = 0; i < MB; i++) {
                vec xi = vset1(x[i * ldx + ks]);
                for (int j = 0; j < NV; j++) acc[i][j] = vfma(xi, w[j], acc[i][j]);
            }
        }
    for (int i = 0; i < MB; i++)
        for (int j = 0; j < NV; j++) vstore(sum + i * NR + VW * j, acc[i][j]);
}

/* tile_streams for mb rows from x's row m: a constant row count per case. */
#define STREAMS_CASE(n, xs, pn, Kc, k0, k1, ns, ahead)                                                          \
    case n: tile_streams((xs) + (int64_t)m * ldx, ldx, pn, sum[m], Kc, k0, k1, n, ns, ahead); break
#if MR > 4
#define STREAMS_ROWS(...)                                                                                      \
    switch (mb) {                                                                                              \
        STREAMS_CASE(6, __VA_ARGS__); STREAMS_CASE(5, __VA_ARGS__); STREAMS_CASE(4, __VA_ARGS__);             \
        STREAMS_CASE(3, __VA_ARGS__); STREAMS_CASE(2, __VA_ARGS__); default: STREAMS_CASE(1, __VA_ARGS__);    \
    }
#else
#define STREAMS_ROWS(...)                                                                                      \
    switch (mb) {                                                                                              \
        STREAMS_CASE(4, __VA_ARGS__); STREAMS_CASE(3, __VA_ARGS__); STREAMS_CASE(2, __VA_ARGS__);             \
        default: STREAMS_CASE(1, __VA_ARGS__);                                                                \
    }
#endif

/* y[M, NR * panels] for 2 <= M <= SMALL_M (see the top): the weights are read from memory
 * once, as STREAMS streams per panel, prefetched, while the row blocks take turns on each
 * slab of the panel (the first from memory, the others from L1). */
static void few_rows(const float *x, int64_t ldx, const float *packed, const float *bias, float *y, int64_t ldy, int M,
                     int K, int panels) {
    /* Blocks of up to MR rows, as even as they go (7 rows: 4 + 3, not 6 + 1). */
    const int blocks = (M + MR - 1) / MR, Kc = K / STREAMS, Kt = K - STREAMS * Kc;
    /* One block runs through the panel in one go; several take turns on short slabs (the
     * longer a turn from L1, the longer the reads from memory wait: 8-16 rows 3-10 % faster
     * with slabs of 4 rows per stream than of 16). */
    const int slab = blocks > 1 ? K_SLAB : Kc;
#pragma omp parallel for schedule(static) if ((int64_t)K * panels * NR >= PARALLEL_MIN_WEIGHTS)
    for (int p = 0; p < panels; p++) {
        const float *panel = packed + (int64_t)p * K * NR, *tail = panel + (int64_t)STREAMS * Kc * NR;
        float sum[SMALL_M][NR] __attribute__((aligned(64)));
        for (int i = 0; i < M; i++)
            for (int j = 0; j < NR; j++) sum[i][j] = 0.0f;
        for (int k0 = 0; k0 < Kc; k0 += slab) {
            const int k1 = Kc - k0 < slab ? Kc : k0 + slab;
            for (int b = 0, m = 0, mb; b < blocks; b++, m += mb) {
                mb = (M - m) / (blocks - b);
                if (b == 0)
                    STREAMS_ROWS(x, panel, Kc, k0, k1, STREAMS, 1)
                else
                    STREAMS_ROWS(x, panel, Kc, k0, k1, STREAMS, 0)
            }
        }
        /* The last K % STREAMS rows of the panel, as one stream. */
        for (int b = 0, m = 0, mb; Kt && b < blocks; b++, m += mb) {
            mb = (M - m) / (blocks - b);
            STREAMS_ROWS(x + STREAMS * Kc, tail, 0, 0, Kt, 1, 0)
        }
        for (int i = 0; i < M; i++)
            for (int j = 0; j < NR; j++) y[i * ldy + p * NR + j] = sum[i][j] + (bias ? bias[p * NR + j] : 0.0f);
    }
}
#else
static void tile(const float *x, int64_t ldx, const float *panel, const float *bias, float *y, int64_t ldy, int K,
                 int MB, const float *next, int phase, int every) {
    (void)next, (void)phase, (void)every;
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
        /* Each thread its own run of panels, four at a time: taken in fours before splitting,
         * 9 panels would go 8 + 1. */
#pragma omp parallel if ((int64_t)K * panels * NR >= PARALLEL_MIN_WEIGHTS)
        {
#ifdef _OPENMP
            const int t = omp_get_thread_num(), threads = omp_get_num_threads();
#else
            const int t = 0, threads = 1;
#endif
            const int p1 = (int)((int64_t)panels * (t + 1) / threads);
            for (int p = (int)((int64_t)panels * t / threads); p < p1; p += 4) {
                const float *panel = packed + p * pstride, *bp = bias ? bias + p * NR : NULL;
                float *yp = y + p * NR;
                switch (p1 - p < 4 ? p1 - p : 4) {
                case 4: row_panels(x, panel, pstride, bp, yp, K, 4); break;
                case 3: row_panels(x, panel, pstride, bp, yp, K, 3); break;
                case 2: row_panels(x, panel, pstride, bp, yp, K, 2); break;
                default: row_panels(x, panel, pstride, bp, yp, K, 1); break;
                }
            }
        }
        return 0;
    }
    if (M <= SMALL_M) {
        few_rows(x, ldx, packed, bias, y, ldy, M, K, panels);
        return 0;
    }
#endif
    for (int m0 = 0; m0 < M; m0 += M_BLOCK) {
        const int m1 = M - m0 < M_BLOCK ? M : m0 + M_BLOCK, tiles = (m1 - m0 + MR - 1) / MR;
        /* Work items are (panel, row tile), panel-major, split evenly: a thread takes each
         * panel's tiles in a row (the panel stays in L2), and a layer of few panels (9 for
         * a 576-wide output) still splits evenly (by panels alone: 5 + 4). */
#pragma omp parallel for schedule(static) if ((int64_t)(m1 - m0) * K * panels * NR >= FORKLESS_PARALLEL_MIN_MACS)
        for (int64_t item = 0; item < (int64_t)panels * tiles; item++) {
            const int p = (int)(item / tiles), m = m0 + (int)(item % tiles) * MR;
            const float *panel = packed + (int64_t)p * K * NR, *bp = bias ? bias + p * NR : NULL;
            const float *xm = x + (int64_t)m * ldx;
            float *ym = y + (int64_t)m * ldy + p * NR;
            /* Tile t > 0 of a panel fetches rows t - 1, t - 1 + (tiles - 1), ... of the next
             * panel into L2 (see the top). */
            const int t = (int)(item % tiles), phase = t - 1, every = tiles > 1 ? tiles - 1 : 1;
            const float *next = t > 0 && tiles >= NEXT_PANEL_MIN_TILES && p + 1 < panels ? panel + (int64_t)K * NR : NULL;
            switch (m1 - m < MR ? m1 - m : MR) {
#if MR > 8
            case 12: tile(xm, ldx, panel, bp, ym, ldy, K, 12, next, phase, every); break;
            case 11: tile(xm, ldx, panel, bp, ym, ldy, K, 11, next, phase, every); break;
            case 10: tile(xm, ldx, panel, bp, ym, ldy, K, 10, next, phase, every); break;
            case 9: tile(xm, ldx, panel, bp, ym, ldy, K, 9, next, phase, every); break;
#endif
#if MR > 4
            case 8: tile(xm, ldx, panel, bp, ym, ldy, K, 8, next, phase, every); break;
            case 7: tile(xm, ldx, panel, bp, ym, ldy, K, 7, next, phase, every); break;
            case 6: tile(xm, ldx, panel, bp, ym, ldy, K, 6, next, phase, every); break;
            case 5: tile(xm, ldx, panel, bp, ym, ldy, K, 5, next, phase, every); break;
#endif
            case 4: tile(xm, ldx, panel, bp, ym, ldy, K, 4, next, phase, every); break;
            case 3: tile(xm, ldx, panel, bp, ym, ldy, K, 3, next, phase, every); break;
            case 2: tile(xm, ldx, panel, bp, ym, ldy, K, 2, next, phase, every); break;
            default: tile(xm, ldx, panel, bp, ym, ldy, K, 1, next, phase, every); break;
            }
        }
    }
    return 0;
}
