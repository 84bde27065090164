/* Decode attention on the CPU, reading keys and values in place in the paged KV cache.
 *
 * One query token per sequence, all heads of a sequence together: pass 1 walks the block
 * table and scores every query head against each key row (a token's keys for all KV heads
 * are one contiguous row, and the G = Hq / Hkv query heads of a KV head share each key
 * load), pass 2 takes the softmax of each head's scores, pass 3 walks the blocks again and
 * sums the value rows weighted by them. Every key and value is read from memory once and
 * nothing is copied out of the cache first, which is what makes this faster than gather +
 * scaled_dot_product_attention: decode attention is bound by reading the cache, and the
 * gather read it twice and wrote it once. The next block is prefetched while one computes,
 * since a sequence's blocks are scattered, into L2 (prefetch_bytes_l2: 1.8x the read rate
 * of prefetching into L1), a few lines at a time spread evenly over the loops (one head's
 * keys per head scored, 4 tokens' values over the heads' chunks): issued a row or four at
 * once, the prefetches filled the miss queue and stalled the loop (one thread, Zen 5, the
 * default model at 64 x 300-1,000 tokens: 1.11-1.20x faster spread, outputs bit-identical).
 *
 * Built by forkless/cpu_kernels with the system C compiler and called through ctypes;
 * queries and outputs float32, the cache float32 or bfloat16.
 */

#include <math.h>
#include <stdlib.h>

#include "common.h"

#ifdef _OPENMP
#include <omp.h>
#endif


/* sh[g * L] = scale * (q_g . k) for the NQ (<= 4, a constant after inlining) query heads
 * starting at qh: one load of each key chunk serves all of them. */
ALWAYS_INLINE void head_scores(float *sh, int64_t L, const float *qh, const void *k, int D, float scale, int NQ,
                               int bf16) {
#ifdef FORKLESS_SIMD
    if (D % VW == 0) {
        vec acc[4];
        for (int g = 0; g < NQ; g++) acc[g] = vzero();
        for (int d = 0; d < D; d += VW) {
            vec kv = el_vload(k, d, bf16);
            for (int g = 0; g < NQ; g++) acc[g] = vfma(vload(qh + g * D + d), kv, acc[g]);
        }
        for (int g = 0; g < NQ; g++) sh[g * L] = vhsum(acc[g]) * scale;
        return;
    }
#endif
    for (int g = 0; g < NQ; g++) {
        float sum = 0.0f;
        for (int d = 0; d < D; d++) sum += qh[g * D + d] * el_get(k, d, bf16);
        sh[g * L] = sum * scale;
    }
}

/* s[(h * G + g) * L + t] = scale * (q_hg . k_th) for the block's tokens, all heads of a
 * token at once: a token's keys are one contiguous row, read front to back. */
ALWAYS_INLINE void scores_block(float *s, int64_t L, const float *q, const void *k0, const void *next,
                                int num_kv_heads, int ntok, int G, int D, float scale, int bf16) {
    const int64_t slot_stride = (int64_t)num_kv_heads * D, head_bytes = (int64_t)D * (bf16 ? 2 : 4);
    for (int t = 0; t < ntok; t++) {
        for (int h = 0; h < num_kv_heads; h++) {
            prefetch_bytes_l2(el_at(next, t * slot_stride + h * D, bf16), head_bytes);
            const void *k = el_at(k0, t * slot_stride + h * D, bf16);
            for (int g = 0; g < G; g += 4) {
                const float *qh = q + (int64_t)(h * G + g) * D;
                float *sh = s + (int64_t)(h * G + g) * L + t;
                switch (G - g < 4 ? G - g : 4) {
                case 4: head_scores(sh, L, qh, k, D, scale, 4, bf16); break;
                case 3: head_scores(sh, L, qh, k, D, scale, 3, bf16); break;
                case 2: head_scores(sh, L, qh, k, D, scale, 2, bf16); break;
                default: head_scores(sh, L, qh, k, D, scale, 1, bf16); break;
                }
            }
        }
    }
}

/* acc[j * D + d] += sum over the block's tokens of p[j * L + t] * v_t[d], for every query
 * head j (KV head j / G). Token-major, so the cache is read front to back; four tokens per
 * pass over the accumulators, which live in L1, so each load and store of one serves four
 * FMAs. */
ALWAYS_INLINE void values_block(float *acc, const float *p, int64_t L, const void *v0, const void *next,
                                int num_kv_heads, int ntok, int G, int D, int bf16) {
    const int64_t row_bytes = (int64_t)num_kv_heads * D * (bf16 ? 2 : 4);
    const int64_t slot_stride = (int64_t)num_kv_heads * D;
    int t = 0;
#ifdef FORKLESS_SIMD
    if (D % VW == 0) {
        const int64_t pf_chunk = ((4 * row_bytes / (num_kv_heads * (D / VW)) + 63) / 64) * 64;
        for (; t + 4 <= ntok; t += 4) {
            const char *pf = (const char *)el_at(next, t * slot_stride, bf16), *pf_end = pf + 4 * row_bytes;
            for (int h = 0; h < num_kv_heads; h++) {
                const void *vh = el_at(v0, t * slot_stride + h * D, bf16);
                const float *ph = p + (int64_t)h * G * L + t;
                float *ah = acc + h * G * D;
                /* Each value chunk is loaded (and, in bfloat16, widened) once for the G query
                 * heads that share it. */
                for (int d = 0; d < D; d += VW) {
                    if (pf < pf_end) prefetch_bytes_l2(pf, pf_chunk), pf += pf_chunk;
                    const vec v0_ = el_vload(vh, d, bf16), v1_ = el_vload(vh, slot_stride + d, bf16);
                    const vec v2_ = el_vload(vh, 2 * slot_stride + d, bf16), v3_ = el_vload(vh, 3 * slot_stride + d, bf16);
                    for (int g = 0; g < G; g++) {
                        const float *pj = ph + (int64_t)g * L;
                        float *aj = ah + g * D + d;
                        vec a = vload(aj);
                        a = vfma(vset1(pj[0]), v0_, a);
                        a = vfma(vset1(pj[1]), v1_, a);
                        a = vfma(vset1(pj[2]), v2_, a);
                        a = vfma(vset1(pj[3]), v3_, a);
                        vstore(aj, a);
                    }
                }
            }
        }
    }
#endif
    for (; t < ntok; t++) {
        for (int j = 0; j < num_kv_heads * G; j++) {
            const float w = p[j * L + t];
            const void *vh = el_at(v0, t * slot_stride + (j / G) * D, bf16);
            for (int d = 0; d < D; d++) acc[j * D + d] += w * el_get(vh, d, bf16);
        }
    }
}

/* p[t] = exp(p[t] - max), returning the sum; the max in *max_out. */
static float softmax_numerators(float *p, int n, float *max_out) {
    float m = -INFINITY, sum = 0.0f;
    int t = 0;
#ifdef FORKLESS_SIMD
    if (n >= VW) {
        vec vm = vload(p);
        for (t = VW; t + VW <= n; t += VW) vm = vmax(vm, vload(p + t));
        m = vhmax(vm);
    }
#endif
    for (; t < n; t++) m = p[t] > m ? p[t] : m;
    t = 0;
#ifdef FORKLESS_SIMD
    vec vm = vset1(m), vs = vzero();
    for (; t + VW <= n; t += VW) {
        vec e = vexp(vsub(vload(p + t), vm));
        vstore(p + t, e);
        vs = vadd(vs, e);
    }
    sum = vhsum(vs);
#endif
    for (; t < n; t++) {
        p[t] = expf(p[t] - m);
        sum += p[t];
    }
    *max_out = m;
    return sum;
}

/* One sequence's blocks b0..b1 (of L tokens in all), all heads: acc[j * D + d] = the sum
 * over those tokens of exp(s_jt - mx[j]) v_t[d] and sum[j] = the sum of exp(s_jt - mx[j]),
 * mx[j] the largest score s_jt of head j among them. Scratch: scores, num_heads * (tokens
 * in the range) floats. */
ALWAYS_INLINE void attend_range(const float *q, const void *k_cache, const void *v_cache, const int32_t *table,
                                int64_t L, int64_t b0, int64_t b1, int num_kv_heads, int G, int D, int block_size,
                                float scale, float *scores, float *acc, float *mx, float *sum, int bf16) {
    const int64_t block_stride = (int64_t)block_size * num_kv_heads * D;
    const int num_heads = num_kv_heads * G;
    const int64_t num_blocks = (L + block_size - 1) / block_size;
    const int64_t T0 = b0 * block_size, Lp = (L < b1 * block_size ? L : b1 * block_size) - T0;
    for (int64_t b = b0; b < b1; b++) {
        const int64_t t0 = b * block_size;
        const int ntok = (int)(L - t0 < block_size ? L - t0 : block_size);
        const void *next = b + 1 < num_blocks ? el_at(k_cache, table[b + 1] * block_stride, bf16)
                                              : el_at(v_cache, table[b0] * block_stride, bf16);
        scores_block(scores + (t0 - T0), Lp, q, el_at(k_cache, table[b] * block_stride, bf16), next, num_kv_heads,
                     ntok, G, D, scale, bf16);
    }
    for (int j = 0; j < num_heads; j++) sum[j] = softmax_numerators(scores + j * Lp, (int)Lp, &mx[j]);
    for (int i = 0; i < num_heads * D; i++) acc[i] = 0.0f;
    for (int64_t b = b0; b < b1; b++) {
        const int64_t t0 = b * block_size;
        const int ntok = (int)(L - t0 < block_size ? L - t0 : block_size);
        /* The last block prefetches itself: harmless, and it keeps the loop branch-free. */
        const void *next = el_at(v_cache, table[b + 1 < b1 ? b + 1 : b] * block_stride, bf16);
        values_block(acc, scores + (t0 - T0), Lp, el_at(v_cache, table[b] * block_stride, bf16), next, num_kv_heads,
                     ntok, G, D, bf16);
    }
}

/* Blocks per part below which a sequence is not split over threads. */
#define MIN_SPLIT_BLOCKS 4

/* Attend the num_seqs decoding sequences.
 *
 * q, out:        [rows, num_heads, head_dim] contiguous; sequence i reads and writes row
 *                q_rows[i].
 * k_cache, v_cache: [num_slots, num_kv_heads, head_dim] contiguous (slot = block * block_size
 *                + offset).
 * block_tables:  [*, bt_stride] int32; sequence i uses row seq_ids[i].
 * seq_lens:      [*] int32, indexed by seq_ids[i]: keys to attend (the new token included).
 *
 * Work items are whole sequences, handed out one at a time (they differ in length). With
 * fewer sequences than threads (one request alone, say) each sequence's blocks are split
 * into parts, one item each, and the parts' results merged as in split-KV attention:
 * out = sum_p e^(mx_p - M) acc_p / sum_p e^(mx_p - M) sum_p, M the largest mx_p.
 *
 * Returns 0, or -1 when a scratch allocation failed (some sequences are then left
 * unwritten).
 */
ALWAYS_INLINE int paged_decode(const float *q, const void *k_cache, const void *v_cache,
                               const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                               const int32_t *seq_ids, const int32_t *q_rows, float *out, int num_seqs,
                               int num_heads, int num_kv_heads, int head_dim, int block_size, float scale, int bf16) {
    if (num_seqs <= 0) return 0;
    const int G = num_heads / num_kv_heads, D = head_dim;
    const int64_t row_stride = (int64_t)num_heads * D;
    int64_t max_len = 0;
    for (int i = 0; i < num_seqs; i++) max_len = seq_lens[seq_ids[i]] > max_len ? seq_lens[seq_ids[i]] : max_len;
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif
    int parts = num_seqs < threads ? threads / num_seqs : 1;
    const int64_t max_blocks = (max_len + block_size - 1) / block_size;
    if (max_blocks < (int64_t)parts * MIN_SPLIT_BLOCKS) parts = (int)(max_blocks / MIN_SPLIT_BLOCKS);
    if (parts < 1) parts = 1;
    const int items = num_seqs * parts;
    /* Each part's acc, mx and sum (split sequences only). */
    const int64_t part_floats = (int64_t)num_heads * (D + 2);
    float *partial = parts > 1 ? (float *)malloc(sizeof(float) * (size_t)(items * part_floats)) : NULL;
    if (parts > 1 && partial == NULL) return -1;
    const int64_t scores_len = (max_len + (int64_t)block_size * (parts - 1)) / parts + block_size;
    int failed = 0;
#pragma omp parallel if (items >= 2)
    {
        float *scratch = (float *)malloc(sizeof(float) * (size_t)(num_heads * (scores_len + D + 2)));
        if (scratch == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int it = 0; it < items; it++) {
            if (scratch == NULL) continue;
            const int i = it / parts, p = it % parts;
            const int s = seq_ids[i];
            const float *qi = q + (int64_t)q_rows[i] * row_stride;
            const int32_t *table = block_tables + (int64_t)s * bt_stride;
            const int64_t L = seq_lens[s], nb = (L + block_size - 1) / block_size;
            const int64_t b0 = nb * p / parts, b1 = nb * (p + 1) / parts;
            float *scores = scratch, *acc = scratch + num_heads * scores_len, *mx = acc + num_heads * D,
                  *sum = mx + num_heads;
            if (parts > 1) acc = partial + it * part_floats, mx = acc + num_heads * D, sum = mx + num_heads;
            if (b1 > b0) {
                /* Each dtype and common head size as constants: their loops unroll (one
                 * outlined parallel region serves both dtypes, so the branch is here). */
#define ATTEND(D_, BF16_) attend_range(qi, k_cache, v_cache, table, L, b0, b1, num_kv_heads, G, D_, block_size, \
                                       scale, scores, acc, mx, sum, BF16_)
                if (bf16) {
                    if (D == 64) ATTEND(64, 1);
                    else if (D == 128) ATTEND(128, 1);
                    else ATTEND(D, 1);
                } else {
                    if (D == 64) ATTEND(64, 0);
                    else if (D == 128) ATTEND(128, 0);
                    else ATTEND(D, 0);
                }
#undef ATTEND
            } else { /* an empty part: nothing to merge */
                for (int j = 0; j < num_heads; j++) mx[j] = -INFINITY, sum[j] = 0.0f;
                for (int k = 0; k < num_heads * D; k++) acc[k] = 0.0f;
            }
            if (parts == 1) {
                float *oi = out + (int64_t)q_rows[i] * row_stride;
                for (int j = 0; j < num_heads; j++) {
                    const float inv = 1.0f / sum[j];
                    for (int d = 0; d < D; d++) oi[j * D + d] = acc[j * D + d] * inv;
                }
            }
        }
        free(scratch);
    }
    if (parts > 1 && !failed) {
        for (int i = 0; i < num_seqs; i++) {
            float *oi = out + (int64_t)q_rows[i] * row_stride;
            for (int j = 0; j < num_heads; j++) {
                float M = -INFINITY, total = 0.0f;
                for (int p = 0; p < parts; p++) {
                    const float m = partial[(i * parts + p) * part_floats + num_heads * D + j];
                    M = m > M ? m : M;
                }
                for (int d = 0; d < D; d++) oi[j * D + d] = 0.0f;
                for (int p = 0; p < parts; p++) {
                    const float *part = partial + (i * parts + p) * part_floats;
                    const float m = part[num_heads * D + j];
                    if (m == -INFINITY) continue;
                    const float w = expf(m - M);
                    total += w * part[num_heads * D + num_heads + j];
                    for (int d = 0; d < D; d++) oi[j * D + d] += w * part[j * D + d];
                }
                const float inv = 1.0f / total;
                for (int d = 0; d < D; d++) oi[j * D + d] *= inv;
            }
        }
    }
    free(partial);
    if (failed) return -1;
    return 0;
}

int forkless_paged_decode_f32(const float *q, const float *k_cache, const float *v_cache,
                              const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                              const int32_t *seq_ids, const int32_t *q_rows, float *out, int num_seqs,
                              int num_heads, int num_kv_heads, int head_dim, int block_size, float scale) {
    return paged_decode(q, k_cache, v_cache, block_tables, bt_stride, seq_lens, seq_ids, q_rows, out, num_seqs,
                        num_heads, num_kv_heads, head_dim, block_size, scale, 0);
}

/* The same over a bfloat16 cache (q and out stay float32; products and sums in float32). */
int forkless_paged_decode_bf16(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                               const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                               const int32_t *seq_ids, const int32_t *q_rows, float *out, int num_seqs,
                               int num_heads, int num_kv_heads, int head_dim, int block_size, float scale) {
    return paged_decode(q, k_cache, v_cache, block_tables, bt_stride, seq_lens, seq_ids, q_rows, out, num_seqs,
                        num_heads, num_kv_heads, head_dim, block_size, scale, 1);
}
