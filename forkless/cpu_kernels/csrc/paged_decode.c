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
 * since a sequence's blocks are scattered.
 *
 * Built by forkless/cpu_kernels with the system C compiler and called through ctypes;
 * queries and outputs float32, the cache float32 or bfloat16.
 */

#include <math.h>
#include <stdlib.h>

#include "common.h"


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
    const int64_t slot_stride = (int64_t)num_kv_heads * D;
    for (int t = 0; t < ntok; t++) {
        prefetch_bytes(el_at(next, t * slot_stride, bf16), slot_stride * (bf16 ? 2 : 4));
        for (int h = 0; h < num_kv_heads; h++) {
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
        for (; t + 4 <= ntok; t += 4) {
            for (int r = 0; r < 4; r++) prefetch_bytes(el_at(next, (t + r) * slot_stride, bf16), row_bytes);
            for (int h = 0; h < num_kv_heads; h++) {
                const void *vh = el_at(v0, t * slot_stride + h * D, bf16);
                const float *ph = p + (int64_t)h * G * L + t;
                float *ah = acc + h * G * D;
                /* Each value chunk is loaded (and, in bfloat16, widened) once for the G query
                 * heads that share it. */
                for (int d = 0; d < D; d += VW) {
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

/* p[t] = exp(p[t] - max), returning the sum. */
static float softmax_numerators(float *p, int n) {
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
    return sum;
}

/* One sequence, all heads. Scratch: scores Hq * L floats, acc Hq * D, inv Hq. */
ALWAYS_INLINE void attend_sequence(const float *q, const void *k_cache, const void *v_cache,
                                   const int32_t *table, int64_t L, float *o, int num_kv_heads, int G, int D,
                                   int block_size, float scale, float *scores, float *acc, float *inv, int bf16) {
    const int64_t block_stride = (int64_t)block_size * num_kv_heads * D;
    const int num_heads = num_kv_heads * G;
    const int64_t num_blocks = (L + block_size - 1) / block_size;
    for (int64_t b = 0; b < num_blocks; b++) {
        const int64_t t0 = b * block_size;
        const int ntok = (int)(L - t0 < block_size ? L - t0 : block_size);
        const void *next = b + 1 < num_blocks ? el_at(k_cache, table[b + 1] * block_stride, bf16)
                                              : el_at(v_cache, table[0] * block_stride, bf16);
        scores_block(scores + t0, L, q, el_at(k_cache, table[b] * block_stride, bf16), next, num_kv_heads, ntok, G,
                     D, scale, bf16);
    }
    for (int j = 0; j < num_heads; j++) inv[j] = 1.0f / softmax_numerators(scores + j * L, (int)L);
    for (int i = 0; i < num_heads * D; i++) acc[i] = 0.0f;
    for (int64_t b = 0; b < num_blocks; b++) {
        const int64_t t0 = b * block_size;
        const int ntok = (int)(L - t0 < block_size ? L - t0 : block_size);
        /* The last block prefetches itself: harmless, and it keeps the loop branch-free. */
        const void *next = el_at(v_cache, table[b + 1 < num_blocks ? b + 1 : b] * block_stride, bf16);
        values_block(acc, scores + t0, L, el_at(v_cache, table[b] * block_stride, bf16), next, num_kv_heads, ntok,
                     G, D, bf16);
    }
    for (int j = 0; j < num_heads; j++)
        for (int d = 0; d < D; d++) o[j * D + d] = acc[j * D + d] * inv[j];
}

/* Attend the num_seqs decoding sequences.
 *
 * q, out:        [rows, num_heads, head_dim] contiguous; sequence i reads and writes row
 *                q_rows[i].
 * k_cache, v_cache: [num_slots, num_kv_heads, head_dim] contiguous (slot = block * block_size
 *                + offset).
 * block_tables:  [*, bt_stride] int32; sequence i uses row seq_ids[i].
 * seq_lens:      [*] int32, indexed by seq_ids[i]: keys to attend (the new token included).
 *
 * Returns 0, or -1 when a scratch allocation failed (some sequences are then left
 * unwritten).
 */
ALWAYS_INLINE int paged_decode(const float *q, const void *k_cache, const void *v_cache,
                               const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                               const int32_t *seq_ids, const int32_t *q_rows, float *out, int num_seqs,
                               int num_heads, int num_kv_heads, int head_dim, int block_size, float scale, int bf16) {
    const int G = num_heads / num_kv_heads, D = head_dim;
    const int64_t row_stride = (int64_t)num_heads * D;
    int64_t max_len = 0;
    for (int i = 0; i < num_seqs; i++) max_len = seq_lens[seq_ids[i]] > max_len ? seq_lens[seq_ids[i]] : max_len;
    int failed = 0;
    /* Sequences differ in length: hand them out one at a time. */
#pragma omp parallel if (num_seqs >= 4)
    {
        float *scratch = (float *)malloc(sizeof(float) * (size_t)num_heads * (max_len + D + 1));
        if (scratch == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int i = 0; i < num_seqs; i++) {
            if (scratch == NULL) continue;
            float *scores = scratch, *acc = scratch + num_heads * max_len, *inv = acc + num_heads * D;
            const int s = seq_ids[i];
            const float *qi = q + (int64_t)q_rows[i] * row_stride;
            float *oi = out + (int64_t)q_rows[i] * row_stride;
            const int32_t *table = block_tables + (int64_t)s * bt_stride;
            const int64_t L = seq_lens[s];
            /* The common head sizes as constants: their loops unroll. */
#define ATTEND(D_) attend_sequence(qi, k_cache, v_cache, table, L, oi, num_kv_heads, G, D_, block_size, scale, \
                                   scores, acc, inv, bf16)
            if (D == 64) ATTEND(64);
            else if (D == 128) ATTEND(128);
            else ATTEND(D);
#undef ATTEND
        }
        free(scratch);
    }
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
