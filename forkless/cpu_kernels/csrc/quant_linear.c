/* Linear layers on GGUF-quantized weights kept quantized in memory: Q8_0 and Q4_1.
 *
 * A decode step reads every weight once, so at a few rows its time is the bytes of the
 * weights: a quarter (Q8_0: 8.5 bits a weight) or less (Q4_1: 5 bits) of float32's.
 * Each block of 32 weights of an output row is widened to float32 in registers as GGUF
 * defines it (Q8_0: w = d * q, q int8; Q4_1: w = d * q + m, q in 0..15) and multiplied into
 * float32 activations, so the result is the dequantized model's up to the order of the sums
 * (and Q4_1's d * q + m taken as one FMA). Four output rows are computed together (each
 * activation load serves four), four activation rows at a time (each widened weight serves
 * up to four); output rows are split over the threads.
 *
 * Layout (split once at load by forkless/models/layers/gguf_linear.py from the file's
 * blocks, values and bytes unchanged): the quants, Q8_0 int8 [N, K] or Q4_1 uint8 [N, K / 2]
 * (byte j of a block holds its element j in the low nibble and element j + 16 in the high
 * one, as in GGUF); the scales d and (Q4_1) mins m as float16 [N, K / 32]. Not the file's
 * interleaved blocks: there each block's float16 scale costs a load, a conversion and a
 * shuffle before it can be broadcast (measured 25 % slower); here a row group's scales are
 * widened 16 at a time into a float32 buffer on the stack and broadcast straight from it.
 * Not float32 scales in memory either: 20 % more bytes for Q4_1, and a decode step at one
 * row streams the weights from DRAM. K is a multiple of 32 (the caller checks).
 *
 * Built by forkless/cpu_kernels with the system C compiler and called through ctypes. */

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define QK 32
/* Layers of fewer weights than this run on the calling thread. */
#define QUANT_PARALLEL_MIN_WEIGHTS (1 << 16)
/* Blocks whose scales a row group widens at a time (into 4 * CHUNK floats on the stack). */
#define CHUNK 128
/* How far ahead along its row each quant stream is prefetched, in bytes. At one row a
 * layer streams from DRAM, and the hardware prefetchers alone left it at about half the
 * read bandwidth (2 threads, a Q4_1 [3072, 576] layer out of cache: 80.9 us; 2 KB ahead
 * 51.5, 4 KB ahead 50.7; [576, 1536]: 51.0 -> 22.3 us). */
#define QUANT_PF_AHEAD 4096

enum { Q8_0 = 0, Q4_1 = 1 };
/* Bytes of quants in one block. */
#define QS_BYTES(format) ((format) == Q8_0 ? QK : QK / 2)

/* An IEEE half as float32. */
ALWAYS_INLINE float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000 | (man << 13); /* inf, nan */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else { /* zero or subnormal: man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
#endif
}

/* out[i] = h[i] as float32, for i < n. */
ALWAYS_INLINE void halves_to_floats(const uint16_t *h, float *out, int n) {
    int i = 0;
#if defined(FORKLESS_AVX512)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
#elif defined(FORKLESS_AVX2)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
    for (; i < n; i++) out[i] = half_to_float(h[i]);
}

#if defined(FORKLESS_AVX512)
/* VW int8 widened to float32 lanes. */
ALWAYS_INLINE vec load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
/* A Q4_1 block's 16 possible weights, d * q + m for q = 0..15: each nibble then becomes its
 * weight in one permute (vpermps reads only the low 4 bits of each index, so neither the
 * nibble's neighbour bits nor a mask matter), instead of a widen, a convert and an FMA. */
ALWAYS_INLINE vec q4_table(float d, float m) {
    const vec iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return vfma(iota, vset1(d), vset1(m));
}
/* The weights of the low (high == 0) or high nibbles of VW bytes. */
ALWAYS_INLINE vec q4_weights(const uint8_t *p, int high, vec table, float d, float m) {
    (void)d, (void)m;
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    if (high) b = _mm_srli_epi16(b, 4);
    return _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(b), table);
}
#elif defined(FORKLESS_AVX2)
ALWAYS_INLINE vec load_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
/* AVX2's permutes index 8 floats, not 16: the nibbles are widened and converted. */
ALWAYS_INLINE vec q4_table(float d, float m) {
    (void)d, (void)m;
    return vzero();
}
ALWAYS_INLINE vec q4_weights(const uint8_t *p, int high, vec table, float d, float m) {
    (void)table;
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    if (high) b = _mm_srli_epi16(b, 4);
    const vec q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_and_si128(b, _mm_set1_epi8(15))));
    return vfma(q, vset1(d), vset1(m));
}
#endif

/* Weight k of row n, as float32 (the plain loops' version of what rows_dot widens). */
ALWAYS_INLINE float weight_at(const void *qs, const uint16_t *d, const uint16_t *m, int64_t n, int64_t K, int64_t k,
                              int format) {
    const int64_t b = n * (K / QK) + k / QK;
    const int i = (int)(k % QK);
    if (format == Q8_0) return half_to_float(d[b]) * (float)((const int8_t *)qs)[n * K + k];
    const uint8_t byte = ((const uint8_t *)qs)[b * (QK / 2) + (i & 15)];
    return fmaf((float)(i < 16 ? byte & 15 : byte >> 4), half_to_float(d[b]), half_to_float(m[b]));
}

/* sums[r][n] = x[r] . w[n0 + n] for MR_ (<= 4) rows of x and NN (<= 4) rows of w: each
 * block of a row is widened once and meets every row of x. */
ALWAYS_INLINE void rows_dot(const float *x, int64_t ldx, const void *qs, const uint16_t *d, const uint16_t *m,
                            int64_t n0, int64_t K, float sums[4][4], int MR_, int NN, int format) {
    const int64_t nb = K / QK;
#ifdef FORKLESS_SIMD
    vec acc[4][4];
    float dl[4][CHUNK], ml[4][CHUNK];
    for (int r = 0; r < MR_; r++)
        for (int n = 0; n < NN; n++) acc[r][n] = vzero();
    for (int64_t c0 = 0; c0 < nb; c0 += CHUNK) {
        const int nc = (int)(nb - c0 < CHUNK ? nb - c0 : CHUNK);
        for (int n = 0; n < NN; n++) {
            halves_to_floats(d + (n0 + n) * nb + c0, dl[n], nc);
            if (format == Q4_1) halves_to_floats(m + (n0 + n) * nb + c0, ml[n], nc);
        }
        for (int64_t b = c0; b < c0 + nc; b++) {
            for (int n = 0; n < NN; n++) {
                const char *q = (const char *)qs + ((n0 + n) * nb + b) * QS_BYTES(format);
                if ((b & (64 / QS_BYTES(format) - 1)) == 0) __builtin_prefetch(q + QUANT_PF_AHEAD, 0, 3);
                const float dn = dl[n][b - c0], mn = format == Q4_1 ? ml[n][b - c0] : 0.0f;
                const vec table = format == Q4_1 ? q4_table(dn, mn) : vzero(), dv = vset1(dn);
                vec wv[QK / VW];
                for (int c = 0; c < QK; c += VW)
                    wv[c / VW] = format == Q8_0 ? vmul(load_i8((const int8_t *)q + c), dv)
                                                /* elements c.. are low nibbles of bytes c..; 16 + c.. the high ones */
                                                : q4_weights((const uint8_t *)q + (c & 15), c >= 16, table, dn, mn);
                for (int r = 0; r < MR_; r++) {
                    const float *xb = x + r * ldx + b * QK;
                    for (int c = 0; c < QK; c += VW) acc[r][n] = vfma(wv[c / VW], vload(xb + c), acc[r][n]);
                }
            }
        }
    }
    for (int r = 0; r < MR_; r++)
        for (int n = 0; n < NN; n++) sums[r][n] = vhsum(acc[r][n]);
#else
    for (int r = 0; r < MR_; r++)
        for (int n = 0; n < NN; n++) {
            float s = 0.0f;
            for (int64_t k = 0; k < K; k++) s += weight_at(qs, d, m, n0 + n, K, k, format) * x[r * ldx + k];
            sums[r][n] = s;
        }
#endif
}

/* One group of four output rows (fewer at the end) for every row of x: y[:, n0..n0+nn). */
ALWAYS_INLINE void row_group(const float *x, int64_t ldx, const void *qs, const uint16_t *d, const uint16_t *m,
                             const float *bias, float *y, int64_t ldy, int M, int K, int N, int g, int format) {
    const int n0 = g * 4, nn = N - n0 < 4 ? N - n0 : 4;
    for (int r0 = 0; r0 < M; r0 += 4) {
        const int mr = M - r0 < 4 ? M - r0 : 4;
        float sums[4][4];
        const float *xr = x + (int64_t)r0 * ldx;
        /* Constant shapes for the common cases: their loops unroll. */
        if (mr == 4 && nn == 4) rows_dot(xr, ldx, qs, d, m, n0, K, sums, 4, 4, format);
        else if (mr == 1 && nn == 4) rows_dot(xr, ldx, qs, d, m, n0, K, sums, 1, 4, format);
        else if (mr == 2 && nn == 4) rows_dot(xr, ldx, qs, d, m, n0, K, sums, 2, 4, format);
        else if (mr == 3 && nn == 4) rows_dot(xr, ldx, qs, d, m, n0, K, sums, 3, 4, format);
        else rows_dot(xr, ldx, qs, d, m, n0, K, sums, mr, nn, format);
        for (int r = 0; r < mr; r++)
            for (int n = 0; n < nn; n++) y[(int64_t)(r0 + r) * ldy + n0 + n] = sums[r][n] + (bias ? bias[n0 + n] : 0.0f);
    }
}

/* y[M, N] (row stride ldy) = x[M, K] (row stride ldx) w^T + bias. Each format has its own
 * parallel loop: OpenMP outlines a loop body once, so one loop shared by both would test
 * the format inside it instead of compiling each format's code. */
int forkless_linear_q8_0(const float *x, int64_t ldx, const int8_t *qs, const uint16_t *d, const float *bias, float *y,
                         int64_t ldy, int M, int K, int N) {
#pragma omp parallel for schedule(static) if ((int64_t)N * K >= QUANT_PARALLEL_MIN_WEIGHTS)
    for (int g = 0; g < (N + 3) / 4; g++) row_group(x, ldx, qs, d, NULL, bias, y, ldy, M, K, N, g, Q8_0);
    return 0;
}

int forkless_linear_q4_1(const float *x, int64_t ldx, const uint8_t *qs, const uint16_t *d, const uint16_t *m,
                         const float *bias, float *y, int64_t ldy, int M, int K, int N) {
#pragma omp parallel for schedule(static) if ((int64_t)N * K >= QUANT_PARALLEL_MIN_WEIGHTS)
    for (int g = 0; g < (N + 3) / 4; g++) row_group(x, ldx, qs, d, m, bias, y, ldy, M, K, N, g, Q4_1);
    return 0;
}

/* ---- int8 activations (forkless_linear_q8_0_i8 / _q4_1_i8) ----
 *
 * At a few rows the kernels above are bound by their instructions, not the weights' bytes
 * (benchmarks/README.md, "On the Zen 4": a Q4_1 [3072, 576] layer took 98 us in cache and
 * 105 streaming): every weight is widened to a float32 lane and meets every activation in
 * its own FMA. Here, as llama.cpp does for these formats, each activation row's block of 32
 * is first rounded to int8 with one float32 scale (s = max |x| / 127, q = round(x / s)), and
 * a block's dot product is taken in integers: 32 unsigned 4-bit (Q4_1) or sign-folded
 * 8-bit (Q8_0) weights against 32 int8 activations in one multiply-add of bytes into int32
 * lanes (VPMADDUBSW + VPMADDWD; VPDPBUSD where the CPU has AVX512-VNNI), then one FMA with
 * the product of the two blocks' scales. Q4_1's minimum m meets the block's exact float
 * sum and a correction that centres the weights (rows_dot_i8). The error is the
 * activations' rounding (at most s / 2 an element, ~0.4 % of the block's largest);
 * forkless/models/layers/gguf_linear.py chooses this route (FORKLESS_GGUF_ACTIVATIONS) and
 * the tests hold its logits to the float32 route's. Rows are quantized once a call, into one heap buffer,
 * before the output rows are split over the threads. */

#if defined(FORKLESS_AVX2)
/* 32 unsigned bytes times 32 signed ones, summed in fours into 8 int32 lanes. */
ALWAYS_INLINE __m256i dot_u8_i8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    /* Pairs of products saturate at 2 * 255 * 127 > 32767 only for 8-bit u over 128: Q4_1's
     * u is at most 15 and Q8_0's |w| at most 128. */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
/* A Q4_1 block's 16 bytes as its 32 nibbles in element order (low nibbles, then high). */
ALWAYS_INLINE __m256i q4_nibbles(const uint8_t *p) {
    const __m128i b = _mm_loadu_si128((const __m128i *)p), low = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), low), _mm_and_si128(b, low));
}
#endif

/* With AVX512-VNNI in a 512-bit build, blocks go two at a time: one VPDPBUSD of 64 bytes
 * per pair of blocks and row, and one scale vector, halving the operations per weight of
 * the 256-bit route (on an Intel Xeon, two threads, the default model's layers at 4-16
 * rows: 0.74-0.78x the float32 route's speed one block at a time, 0.93-0.97x in pairs;
 * benchmarks/README.md). A Q4_1 pair's 32 bytes unpack to
 * [low nibbles of b, of b + 1, high nibbles of b, of b + 1], so Q4_1 activations are stored
 * pair by pair in that order (I8_PAIRED); an odd last block stays in element order and
 * goes alone. */
#if defined(FORKLESS_AVX512) && defined(__AVX512VNNI__)
#define I8_PAIRS 1
/* A pair of blocks' int32 lane sums (VPDPBUSD: 16 lanes of 4 products) for Q4_1 (lanes
 * 0-3, 8-11 of block b, 4-7, 12-15 of b + 1, x paired) or Q8_0 (lanes 0-7 of b, 8-15 of
 * b + 1, x in element order). */
ALWAYS_INLINE __m512i pair_dot(__m512i w, __m512i xv, int format) {
    if (format == Q4_1) return _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, xv);
    /* |w| (unsigned) against x with w's sign. */
    const __mmask64 neg = _mm512_movepi8_mask(w);
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w),
                               _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv));
}
/* A pair's weights: Q4_1's 32 bytes of quants unpacked as pair_dot takes them, Q8_0's 64. */
ALWAYS_INLINE __m512i pair_weights(const char *q, int format) {
    if (format == Q8_0) return _mm512_loadu_si512((const void *)q);
    const __m256i b = _mm256_loadu_si256((const __m256i *)q), low = _mm256_set1_epi8(15);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(b, low)),
                              _mm256_and_si256(_mm256_srli_epi16(b, 4), low), 1);
}
/* Two floats p[0], p[1] spread over a pair's lanes as pair_dot lays them out. */
ALWAYS_INLINE __m512 pair_spread(const float *p, int format) {
    const __m512i idx = format == Q4_1 ? _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1)
                                       : _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)p))));
}
#else
#define I8_PAIRS 0
#endif

/* Activation rows rounded to int8 per block of 32, for one call: row r's quants
 * q[r * K ...], and per block b its scale s[r * nb + b], its exact float sum and
 * corr = 8 * (sum(x) - s * sum(q)), 8 times what the rounding lost over the block. Q4_1's
 * minimum meets the exact sum; corr makes its products those of weights centred on 0 (see
 * rows_dot_i8). sum and corr rows are nbp = nb rounded up to 8 long (zeros past nb), for
 * whole vectors. One heap buffer holds all four. */
typedef struct {
    int8_t *q;
    float *s, *sum, *corr;
    int K, nb, nbp;
} i8_rows;

ALWAYS_INLINE int round8(int n) { return (n + 7) & ~7; }

/* r's view of rows: its first row is rows' r-th. */
ALWAYS_INLINE i8_rows i8_rows_from(const i8_rows *rows, int r) {
    const int64_t o = (int64_t)r * rows->nbp;
    return (i8_rows){rows->q + (int64_t)r * rows->K, rows->s + (int64_t)r * rows->nb, rows->sum + o, rows->corr + o,
                     rows->K, rows->nb, rows->nbp};
}

static void quantize_rows(const float *x, int64_t ldx, int M, const i8_rows *out, int paired) {
    const int K = out->K, nb = out->nb, nbp = out->nbp;
    for (int r = 0; r < M; r++) {
        for (int b = nb; b < nbp; b++) out->sum[(int64_t)r * nbp + b] = out->corr[(int64_t)r * nbp + b] = 0.0f;
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (int64_t)r * ldx + (int64_t)b * QK;
            int8_t *qb = out->q + (int64_t)r * K + (int64_t)b * QK;
            float a, sum, qsum;
#if defined(FORKLESS_AVX2)
            __m256 v[4], amax = _mm256_setzero_ps(), vsum = _mm256_setzero_ps();
            const __m256 sign = _mm256_set1_ps(-0.0f);
            for (int i = 0; i < 4; i++) {
                v[i] = _mm256_loadu_ps(xb + 8 * i);
                amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
                vsum = _mm256_add_ps(vsum, v[i]);
            }
            __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
            m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            a = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
            const __m256 inv = _mm256_set1_ps(a > 0.0f ? 127.0f / a : 0.0f);
            __m256i q[4];
            for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv)); /* nearest, ties even */
            /* packs work within 128-bit halves: the permute puts the 32 bytes back in order. */
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)qb, _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            sum = hsum8(vsum);
            qsum = hsum8(_mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]))));
#else
            a = sum = qsum = 0.0f;
            for (int i = 0; i < QK; i++) {
                a = fabsf(xb[i]) > a ? fabsf(xb[i]) : a;
                sum += xb[i];
            }
            const float inv = a > 0.0f ? 127.0f / a : 0.0f;
            for (int i = 0; i < QK; i++) qsum += qb[i] = (int8_t)nearbyintf(xb[i] * inv);
#endif
            if (paired && (b & 1)) { /* blocks b - 1, b: [x0 0..15, x0 16..31, x1 0..15, ...] -> x1 0..15 second */
                char t[16];
                memcpy(t, qb - 16, 16);
                memcpy(qb - 16, qb, 16);
                memcpy(qb, t, 16);
            }
            const float s = a / 127.0f;
            out->s[(int64_t)r * nb + b] = s;
            out->sum[(int64_t)r * nbp + b] = sum;
            out->corr[(int64_t)r * nbp + b] = 8.0f * (sum - s * qsum);
        }
    }
}

/* sums[r][n] = the int8 route's x[r] . w[n0 + n] for MR_ (<= 4) rows and NN (<= 4) weight
 * rows: each weight block is loaded (and Q4_1's unpacked) once and meets every row.
 *
 * Q4_1: w = d * q + m, q in 0..15, and x ~ s * q_x; the integers multiply q unsigned (one
 * instruction), but the error is then that of d * q, up to twice |w|. Taken as
 * d * (q - 8) + (m + 8 d) instead, the same sums are d * s * (q . q_x) + m * sum(x) +
 * d * corr (corr as i8_rows says), whose error is that of weights centred on 0: a quarter
 * of the KL divergence from the float32 route's logits (benchmarks/README.md). */
ALWAYS_INLINE void rows_dot_i8(const i8_rows *x, const void *qs, const uint16_t *d, const uint16_t *m, int64_t n0,
                               float sums[4][4], int MR_, int NN, int format) {
    const int K = x->K, nb = x->nb, nbp = x->nbp;
    /* The NN rows' scales (and mins) as float32, row n's at n * ds: with a single chunk
     * (nb <= CHUNK, every layer of the default model) the rows' halves are contiguous and
     * widen in one call, whose cost per element is far lower than NN short calls' (the
     * short calls took a sixth of the layer's time at K = 576). 8 more for the zeros the
     * Q4_1 terms' last vector meets. */
    float dl[4 * CHUNK + 8], ml[4 * CHUNK + 8];
    const int ds = nb <= CHUNK ? nb : CHUNK;
#if I8_PAIRS
    /* 16 lanes; what is computed on 8 (a lone block, the Q4_1 terms) is zero-extended. */
    __m512 acc[4][4];
    for (int r = 0; r < MR_; r++)
        for (int n = 0; n < NN; n++) acc[r][n] = _mm512_setzero_ps();
#define ACC8(r, n, v) (acc[r][n] = _mm512_add_ps(acc[r][n], _mm512_zextps256_ps512(v)))
#define ACC8_FMA(r, n, a, b) ACC8(r, n, _mm256_mul_ps(a, b))
#elif defined(FORKLESS_AVX2)
    __m256 acc[4][4];
    for (int r = 0; r < MR_; r++)
        for (int n = 0; n < NN; n++) acc[r][n] = _mm256_setzero_ps();
#define ACC8(r, n, v) (acc[r][n] = _mm256_add_ps(acc[r][n], (v)))
#define ACC8_FMA(r, n, a, b) (acc[r][n] = _mm256_fmadd_ps(a, b, acc[r][n]))
#else
    for (int r = 0; r < MR_; r++)
        for (int n = 0; n < NN; n++) sums[r][n] = 0.0f;
#endif
    for (int c0 = 0; c0 < nb; c0 += CHUNK) {
        const int nc = nb - c0 < CHUNK ? nb - c0 : CHUNK;
        if (ds == nb) {
            halves_to_floats(d + n0 * nb, dl, NN * nb);
            if (format == Q4_1) halves_to_floats(m + n0 * nb, ml, NN * nb);
        } else {
            for (int n = 0; n < NN; n++) {
                halves_to_floats(d + (n0 + n) * nb + c0, dl + n * ds, nc);
                if (format == Q4_1) halves_to_floats(m + (n0 + n) * nb + c0, ml + n * ds, nc);
            }
        }
        if (format == Q4_1) {
            /* m * sum(x) + d * corr over the chunk's blocks, straight into the accumulators.
             * A row's last vector reads past nc into the next row's values or the zeros
             * here, and meets x's zero padding. */
            for (int b = (NN - 1) * ds + nc; b < (NN - 1) * ds + round8(nc); b++) dl[b] = ml[b] = 0.0f;
            for (int n = 0; n < NN; n++)
                for (int r = 0; r < MR_; r++) {
                    const float *xsum = x->sum + (int64_t)r * nbp + c0, *corr = x->corr + (int64_t)r * nbp + c0;
                    const float *mn = ml + n * ds, *dn = dl + n * ds;
#if defined(FORKLESS_AVX2)
                    __m256 t = _mm256_setzero_ps();
                    for (int b = 0; b < nc; b += 8)
                        t = _mm256_fmadd_ps(_mm256_loadu_ps(mn + b), _mm256_loadu_ps(xsum + b),
                                            _mm256_fmadd_ps(_mm256_loadu_ps(dn + b), _mm256_loadu_ps(corr + b), t));
                    ACC8(r, n, t);
#else
                    for (int b = 0; b < nc; b++) sums[r][n] += mn[b] * xsum[b] + dn[b] * corr[b];
#endif
                }
        }
        int b = c0;
#if I8_PAIRS
        for (; b + 1 < c0 + nc; b += 2) {
            __m512i w[4];
            __m512 dv[4];
            for (int n = 0; n < NN; n++) {
                const char *q = (const char *)qs + ((n0 + n) * nb + b) * QS_BYTES(format);
                if ((b & (64 / QS_BYTES(format) - 1)) == 0) __builtin_prefetch(q + QUANT_PF_AHEAD, 0, 3);
                w[n] = pair_weights(q, format);
                dv[n] = pair_spread(dl + n * ds + b - c0, format);
            }
            for (int r = 0; r < MR_; r++) {
                const __m512i xv = _mm512_loadu_si512((const void *)(x->q + (int64_t)r * K + (int64_t)b * QK));
                const __m512 sv = pair_spread(x->s + (int64_t)r * nb + b, format);
                for (int n = 0; n < NN; n++)
                    acc[r][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pair_dot(w[n], xv, format)), _mm512_mul_ps(dv[n], sv),
                                                acc[r][n]);
            }
        }
#endif
        for (; b < c0 + nc; b++) {
#if defined(FORKLESS_AVX2)
            __m256i w[4];
            for (int n = 0; n < NN; n++) {
                const char *q = (const char *)qs + ((n0 + n) * nb + b) * QS_BYTES(format);
                if ((b & (64 / QS_BYTES(format) - 1)) == 0) __builtin_prefetch(q + QUANT_PF_AHEAD, 0, 3);
                w[n] = format == Q4_1 ? q4_nibbles((const uint8_t *)q) : _mm256_loadu_si256((const __m256i *)q);
            }
            for (int r = 0; r < MR_; r++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q + (int64_t)r * K + (int64_t)b * QK));
                const float sx = x->s[(int64_t)r * nb + b];
                for (int n = 0; n < NN; n++) {
                    /* Q8_0: |w| (unsigned) against x with w's sign. */
                    const __m256i p = format == Q4_1 ? dot_u8_i8(w[n], xv)
                                                     : dot_u8_i8(_mm256_sign_epi8(w[n], w[n]), _mm256_sign_epi8(xv, w[n]));
                    ACC8_FMA(r, n, _mm256_cvtepi32_ps(p), _mm256_set1_ps(dl[n * ds + b - c0] * sx));
                }
            }
#else
            for (int n = 0; n < NN; n++) {
                const char *q = (const char *)qs + ((n0 + n) * nb + b) * QS_BYTES(format);
                for (int r = 0; r < MR_; r++) {
                    const int8_t *xb = x->q + (int64_t)r * K + (int64_t)b * QK;
                    int32_t dot = 0;
                    for (int i = 0; i < QK; i++) {
                        const int wq = format == Q8_0 ? ((const int8_t *)q)[i]
                                                      : (i < 16 ? ((const uint8_t *)q)[i] & 15 : ((const uint8_t *)q)[i - 16] >> 4);
                        dot += wq * xb[i];
                    }
                    sums[r][n] += (float)dot * dl[n * ds + b - c0] * x->s[(int64_t)r * nb + b];
                }
            }
#endif
        }
    }
#if I8_PAIRS
    for (int r = 0; r < MR_; r++)
        for (int n = 0; n < NN; n++) sums[r][n] = _mm512_reduce_add_ps(acc[r][n]);
#elif defined(FORKLESS_AVX2)
    for (int r = 0; r < MR_; r++)
        for (int n = 0; n < NN; n++) sums[r][n] = hsum8(acc[r][n]);
#endif
#undef ACC8
#undef ACC8_FMA
}

ALWAYS_INLINE void row_group_i8(const i8_rows *x, const void *qs, const uint16_t *d, const uint16_t *m,
                                const float *bias, float *y, int64_t ldy, int M, int N, int g, int format) {
    const int n0 = g * 4, nn = N - n0 < 4 ? N - n0 : 4;
    for (int r0 = 0; r0 < M; r0 += 4) {
        const int mr = M - r0 < 4 ? M - r0 : 4;
        float sums[4][4];
        const i8_rows xr = i8_rows_from(x, r0);
        if (mr == 4 && nn == 4) rows_dot_i8(&xr, qs, d, m, n0, sums, 4, 4, format);
        else if (mr == 1 && nn == 4) rows_dot_i8(&xr, qs, d, m, n0, sums, 1, 4, format);
        else if (mr == 2 && nn == 4) rows_dot_i8(&xr, qs, d, m, n0, sums, 2, 4, format);
        else if (mr == 3 && nn == 4) rows_dot_i8(&xr, qs, d, m, n0, sums, 3, 4, format);
        else rows_dot_i8(&xr, qs, d, m, n0, sums, mr, nn, format);
        for (int r = 0; r < mr; r++)
            for (int n = 0; n < nn; n++) y[(int64_t)(r0 + r) * ldy + n0 + n] = sums[r][n] + (bias ? bias[n0 + n] : 0.0f);
    }
}

/* x's rows rounded (i8_rows) into one new heap buffer, rows->q; 0, or -1 without memory. */
static int quantized_rows(const float *x, int64_t ldx, int M, int K, i8_rows *rows, int paired) {
    const int nb = K / QK, nbp = round8(nb);
    const int64_t nq = (int64_t)M * K, ns = (int64_t)M * nb, nsp = (int64_t)M * nbp;
    int8_t *buf = malloc((size_t)(nq + (ns + 2 * nsp) * (int64_t)sizeof(float)));
    if (!buf) return -1;
    float *f = (float *)(buf + nq);
    *rows = (i8_rows){buf, f, f + ns, f + ns + nsp, K, nb, nbp};
    quantize_rows(x, ldx, M, rows, paired);
    return 0;
}

/* y[M, N] (row stride ldy) = x[M, K] (row stride ldx, rounded to int8 per block) w^T + bias.
 * Returns 0, or -1 when the activations' buffer cannot be allocated. */
int forkless_linear_q8_0_i8(const float *x, int64_t ldx, const int8_t *qs, const uint16_t *d, const float *bias,
                            float *y, int64_t ldy, int M, int K, int N) {
    i8_rows rows;
    if (quantized_rows(x, ldx, M, K, &rows, 0)) return -1;
#pragma omp parallel for schedule(static) if ((int64_t)N * K >= QUANT_PARALLEL_MIN_WEIGHTS)
    for (int g = 0; g < (N + 3) / 4; g++) row_group_i8(&rows, qs, d, NULL, bias, y, ldy, M, N, g, Q8_0);
    free(rows.q);
    return 0;
}

int forkless_linear_q4_1_i8(const float *x, int64_t ldx, const uint8_t *qs, const uint16_t *d, const uint16_t *m,
                            const float *bias, float *y, int64_t ldy, int M, int K, int N) {
    i8_rows rows;
    if (quantized_rows(x, ldx, M, K, &rows, I8_PAIRS)) return -1;
#pragma omp parallel for schedule(static) if ((int64_t)N * K >= QUANT_PARALLEL_MIN_WEIGHTS)
    for (int g = 0; g < (N + 3) / 4; g++) row_group_i8(&rows, qs, d, m, bias, y, ldy, M, N, g, Q4_1);
    free(rows.q);
    return 0;
}

/* The instruction the int8 route's block products use in this build. */
const char *forkless_quant_i8_route(void) {
#if defined(FORKLESS_AVX2) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return "vpdpbusd (AVX512-VNNI)";
#elif defined(FORKLESS_AVX2)
    return "vpmaddubsw (AVX2)";
#else
    return "plain C";
#endif
}
