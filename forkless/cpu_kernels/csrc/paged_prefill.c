/* Prefill attention over cached context on the CPU, reading keys and values in place in the
 * paged KV cache.
 *
 * A chunk of q_len new tokens of a sequence that already holds ctx_len tokens in the cache
 * (the 2nd..Nth chunk of a long prompt, a prompt on top of a prefix-cache hit, or with
 * ctx_len 0 a fresh prompt): new token r attends causally to keys [0, ctx_len + r]; its own
 * keys are in the cache already.
 *
 * The work is cut into items of one KV head and a tile of QT new tokens: the tile's
 * M = QT * G query rows (the G = Hq / Hkv query heads of that KV head, for each token, up to
 * 144 rows) are held transposed, [head_dim][M], so M sits in the vector lanes and every key
 * and value row loaded from the cache serves all M rows. The keys are walked in tiles of KT through
 * the block table with an online softmax (running max and sum per row, the output
 * rescaled as the max grows), so the scratch is a few KB per thread whatever the length,
 * and each tile is two register-blocked products, 4 keys (or 4 output dims) x 3 vectors of
 * rows (24 with AVX2, 48 with AVX-512) in 12 accumulators, FMA-bound rather than
 * load-bound. The lanes being rows, the softmax of a tile is vertical: max, exp and sum of
 * a vector of rows at once, no horizontal reductions.
 *
 * Against gather + scaled_dot_product_attention this reads the context once and copies
 * nothing: the gather copied the whole context out of the cache on every layer (and built
 * a [q_len, seq_len] mask), which for a few new tokens costs far more than their
 * arithmetic. Items are spread over the OpenMP threads; when there are too few to keep
 * them busy (a short chunk has one tile per KV head), the context of each item is split
 * into ranges attended separately and merged by their softmax statistics.
 *
 * Built by forkless/cpu_kernels with the system C compiler and called through ctypes;
 * queries and outputs float32, the cache float32 or bfloat16 (each key and value element
 * widened as it is broadcast; products and sums in float32, as paged_decode.c).
 */

#include <math.h>
#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "common.h"

/* Keys per tile: the tile's keys, values and scores (KT x M) stay in L1 next to the
 * transposed queries and the output accumulators. */
#define KT 32
/* Tiles between asking for a tile's rows and using them (1, 2, 4 and 8 measured alike at
 * context 7,500 with the 30 layers' caches cold: 3.4 GB/s read with 4 new tokens, where
 * decode's one-token reads get about the same; 2 is the tidiest middle). */
#define PREFETCH_TILES 2
/* Query rows per item (up to): a multiple of the 24 rows a register tile covers. Every key
 * and value row is loaded from memory once per item and serves all its rows from L1, so
 * more rows mean less memory traffic: SmolLM2-135M's heads (G = 3) at context 7,500, 64 new
 * tokens, one thread, took 47-51 ms with 24 rows per item, 29-35 ms with 48, 23-29 ms with
 * 96 and 22-26 ms with 144 (24 GMAC/s, where a 512^3 matmul gets 30).
 * The scratch grows with it: (2 D + KT + 4) * 144 floats a thread. */
#define M_TARGET 144
/* Rows are padded to whole vectors (VW lanes: 8 with AVX2, 16 with AVX-512). */
#define ROUND_VW(m) (((m) + VW - 1) / VW * VW)
/* A context range attended on its own is at least this long: shorter ones are not worth
 * their merge. */
#define MIN_SPLIT_KEYS 256
/* At most this many ranges per tile (the merge keeps their weights in the scratch). */
#define MAX_PARTS 64

typedef struct {
    int seq;      /* index into the listed sequences */
    int head;     /* KV head */
    int r0, r1;   /* its new tokens [r0, r1) of the chunk */
    int first;    /* first partial result of its context ranges (with num_parts > 1) */
    int num_parts;
} Tile;

typedef struct {
    int tile;
    int part;     /* which range of the tile's keys */
    int64_t k0, k1;
} Item;

/* s[t * ldm + c * 8 + j] = sum_d k[t][d] * qt[d * ldm + c * 8 + j] for 4 keys and NC (<= 3,
 * a constant after inlining) vectors of rows. */
ALWAYS_INLINE void scores_4(float *s, int ldm, const void *const *k, const float *qt, int D, int NC, int bf16) {
#ifdef FORKLESS_SIMD
    vec acc[4][3];
    for (int t = 0; t < 4; t++)
        for (int c = 0; c < NC; c++) acc[t][c] = vzero();
    for (int d = 0; d < D; d++) {
        vec b[3];
        for (int c = 0; c < NC; c++) {
            b[c] = vload(qt + (int64_t)d * ldm + VW * c);
            /* Keep it in a register: folded into each FMA as a memory operand it would be
             * loaded 4 times, and the loop would wait on loads, not FMAs (as in linear.c). */
            __asm__("" : "+v"(b[c]));
        }
        for (int t = 0; t < 4; t++) {
            vec a = vset1(el_get(k[t], d, bf16));
            for (int c = 0; c < NC; c++) acc[t][c] = vfma(a, b[c], acc[t][c]);
        }
    }
    for (int t = 0; t < 4; t++)
        for (int c = 0; c < NC; c++) vstore(s + t * ldm + VW * c, acc[t][c]);
#else
    for (int t = 0; t < 4; t++)
        for (int j = 0; j < VW * NC; j++) {
            float sum = 0.0f;
            for (int d = 0; d < D; d++) sum += el_get(k[t], d, bf16) * qt[(int64_t)d * ldm + j];
            s[t * ldm + j] = sum;
        }
#endif
}

/* ot[(d0 + i) * ldm + c * 8 + j] = alpha * ot[...] + sum_t v[t][d0 + i] * p[t * ldm + c * 8 + j]
 * for ND (<= 4) output dims and NC (<= 3) vectors of rows (both constants after inlining). */
ALWAYS_INLINE void values_4(float *ot, int ldm, const void *const *v, int d0, const float *p, const float *alpha,
                            int ntok, int ND, int NC, int bf16) {
#ifdef FORKLESS_SIMD
    vec acc[4][3];
    for (int c = 0; c < NC; c++) {
        vec a = vload(alpha + VW * c);
        for (int i = 0; i < ND; i++) acc[i][c] = vmul(a, vload(ot + (int64_t)(d0 + i) * ldm + VW * c));
    }
    for (int t = 0; t < ntok; t++) {
        vec b[3];
        for (int c = 0; c < NC; c++) {
            b[c] = vload(p + t * ldm + VW * c);
            __asm__("" : "+v"(b[c]));
        }
        for (int i = 0; i < ND; i++) {
            vec a = vset1(el_get(v[t], d0 + i, bf16));
            for (int c = 0; c < NC; c++) acc[i][c] = vfma(a, b[c], acc[i][c]);
        }
    }
    for (int i = 0; i < ND; i++)
        for (int c = 0; c < NC; c++) vstore(ot + (int64_t)(d0 + i) * ldm + VW * c, acc[i][c]);
#else
    for (int i = 0; i < ND; i++)
        for (int j = 0; j < VW * NC; j++) {
            float sum = alpha[j] * ot[(int64_t)(d0 + i) * ldm + j];
            for (int t = 0; t < ntok; t++) sum += el_get(v[t], d0 + i, bf16) * p[t * ldm + j];
            ot[(int64_t)(d0 + i) * ldm + j] = sum;
        }
#endif
}

/* The next vector group of rows, up to 3 of the nc left: the dispatch that makes NC a
 * constant. */
#define SWITCH_NC(nc, CALL)       \
    switch ((nc) < 3 ? (nc) : 3) { \
    case 3: CALL(3); break; \
    case 2: CALL(2); break; \
    default: CALL(1); break; \
    }

/* The softmax of one tile of scores s[t * ldm + j], t < ntok, row j in the vector lanes:
 * masks keys after each row's last visible position lim[j] (only when the tile reaches
 * past first_masked), raises the running max mrow and sum lrow, leaves the numerators in s
 * (zero where masked) and in alpha the factor the row's earlier output is rescaled by. */
static void softmax_tile(float *s, int ldm, int ntok, int64_t pos0, int64_t first_masked, const float *lim,
                         float *mrow, float *lrow, float *alpha) {
    const int masked = pos0 + ntok - 1 > first_masked;
#ifdef FORKLESS_SIMD
    for (int c = 0; c < ldm; c += VW) {
        const vec vlim = vload(lim + c), minf = vset1(-INFINITY);
        const vec mold = vload(mrow + c);
        vec mx = mold;
        for (int t = 0; t < ntok; t++) {
            vec x = vload(s + t * ldm + c);
            if (masked) {
                x = vreplace_gt(x, vset1((float)(pos0 + t)), vlim, minf);
                vstore(s + t * ldm + c, x);
            }
            mx = vmax(mx, x);
        }
        /* Every row sees the item's first key, so mx is finite from the first tile on; the
         * first tile's alpha, exp(-inf), multiplies zeros. */
        vstore(alpha + c, vexp(vsub(mold, mx)));
        vec sum = vzero();
        for (int t = 0; t < ntok; t++) {
            vec x = vload(s + t * ldm + c);
            vec e = vexp(vsub(x, mx));
            /* vexp clamps its input at -87: a masked key would still weigh 1e-38. */
            if (masked) e = vzero_eq(e, x, minf);
            vstore(s + t * ldm + c, e);
            sum = vadd(sum, e);
        }
        vstore(lrow + c, vfma(vload(lrow + c), vload(alpha + c), sum));
        vstore(mrow + c, mx);
    }
#else
    for (int j = 0; j < ldm; j++) {
        float mx = mrow[j];
        for (int t = 0; t < ntok; t++) {
            if (masked && (float)(pos0 + t) > lim[j]) s[t * ldm + j] = -INFINITY;
            mx = s[t * ldm + j] > mx ? s[t * ldm + j] : mx;
        }
        alpha[j] = expf(mrow[j] - mx);
        float sum = 0.0f;
        for (int t = 0; t < ntok; t++) {
            const float x = s[t * ldm + j], e = x == -INFINITY ? 0.0f : expf(x - mx);
            s[t * ldm + j] = e;
            sum += e;
        }
        lrow[j] = lrow[j] * alpha[j] + sum;
        mrow[j] = mx;
    }
#endif
}

/* The key and value rows of positions [from, to) of one head (at offset in a slot). */
ALWAYS_INLINE void tile_rows(const void **kp, const void **vp, const void *k_cache, const void *v_cache,
                             const int32_t *table, int block_size, int64_t slot_stride, int64_t offset, int64_t from,
                             int64_t to, int bf16) {
    for (int64_t pos = from; pos < to; pos++) {
        const int64_t slot = (int64_t)table[pos / block_size] * block_size + pos % block_size;
        kp[pos - from] = el_at(k_cache, slot * slot_stride + offset, bf16);
        vp[pos - from] = el_at(v_cache, slot * slot_stride + offset, bf16);
    }
}

/* Ask for the key and value rows of positions [from, to) of one head. */
ALWAYS_INLINE void prefetch_rows(const void *k_cache, const void *v_cache, const int32_t *table, int block_size,
                                 int64_t slot_stride, int64_t offset, int64_t from, int64_t to, int D, int bf16) {
    const int64_t bytes = (int64_t)D * (bf16 ? 2 : 4);
    for (int64_t pos = from; pos < to; pos++) {
        const int64_t slot = (int64_t)table[pos / block_size] * block_size + pos % block_size;
        prefetch_bytes(el_at(k_cache, slot * slot_stride + offset, bf16), bytes);
        prefetch_bytes(el_at(v_cache, slot * slot_stride + offset, bf16), bytes);
    }
}

/* Attend keys [k0, k1) of one KV head for new tokens [r0, r1): leaves the unnormalised
 * output in ot ([D][ldm]), the running max and sum in mrow, lrow. */
ALWAYS_INLINE void attend_item(const float *q, int64_t q_row_stride, const void *k_cache, const void *v_cache,
                               const int32_t *table, int block_size, int num_kv_heads, int G, int D, float scale,
                               int head, int64_t ctx_len, int64_t q_start, int r0, int r1, int64_t k0, int64_t k1,
                               float *qt, float *s, float *ot, float *mrow, float *lrow, float *lim, float *alpha,
                               int bf16) {
    const int M = (r1 - r0) * G, ldm = ROUND_VW(M);
    for (int j = 0; j < ldm; j++) {
        const float *qj = j < M ? q + (q_start + r0 + j / G) * q_row_stride + (int64_t)(head * G + j % G) * D : NULL;
        for (int d = 0; d < D; d++) qt[(int64_t)d * ldm + j] = qj ? qj[d] * scale : 0.0f;
        mrow[j] = -INFINITY;
        lrow[j] = 0.0f;
        /* Padding rows see everything: their zero queries give finite scores. */
        lim[j] = j < M ? (float)(ctx_len + r0 + j / G) : 3e38f;
    }
    for (int64_t i = 0; i < (int64_t)D * ldm; i++) ot[i] = 0.0f;
    const int64_t slot_stride = (int64_t)num_kv_heads * D, first_masked = ctx_len + r0;
    /* The rows of the tile PREFETCH_TILES ahead are asked for while this one computes: a
     * sequence's blocks are scattered, so the hardware prefetcher cannot guess them, and
     * with few query rows a tile computes for less than a trip to memory takes. */
    const void *kp[KT], *vp[KT];
    const int64_t ahead = (int64_t)PREFETCH_TILES * KT, offset = (int64_t)head * D;
    prefetch_rows(k_cache, v_cache, table, block_size, slot_stride, offset, k0, k1 - k0 < ahead ? k1 : k0 + ahead, D,
                  bf16);
    for (int64_t pos0 = k0; pos0 < k1; pos0 += KT) {
        const int ntok = (int)(k1 - pos0 < KT ? k1 - pos0 : KT);
        tile_rows(kp, vp, k_cache, v_cache, table, block_size, slot_stride, offset, pos0, pos0 + ntok, bf16);
        if (pos0 + ahead < k1)
            prefetch_rows(k_cache, v_cache, table, block_size, slot_stride, offset, pos0 + ahead,
                          k1 - pos0 - ahead < KT ? k1 : pos0 + ahead + KT, D, bf16);
        /* Scores come 4 keys at a time: the tail repeats the last key, its rows unused. */
        for (int t = ntok; t < ((ntok + 3) & ~3); t++) kp[t] = kp[ntok - 1];
        for (int t = 0; t < ntok; t += 4)
            for (int c = 0; c < ldm / VW; c += 3) {
#define CALL(NC) scores_4(s + t * ldm + VW * c, ldm, kp + t, qt + VW * c, D, NC, bf16)
                SWITCH_NC(ldm / VW - c, CALL)
#undef CALL
            }
        softmax_tile(s, ldm, ntok, pos0, first_masked, lim, mrow, lrow, alpha);
        for (int d0 = 0; d0 < D; d0 += 4)
            for (int c = 0; c < ldm / VW; c += 3) {
#define CALL(NC)                                                                           \
    switch (D - d0 < 4 ? D - d0 : 4) {                                                     \
    case 4: values_4(ot + VW * c, ldm, vp, d0, s + VW * c, alpha + VW * c, ntok, 4, NC, bf16); break; \
    case 3: values_4(ot + VW * c, ldm, vp, d0, s + VW * c, alpha + VW * c, ntok, 3, NC, bf16); break; \
    case 2: values_4(ot + VW * c, ldm, vp, d0, s + VW * c, alpha + VW * c, ntok, 2, NC, bf16); break; \
    default: values_4(ot + VW * c, ldm, vp, d0, s + VW * c, alpha + VW * c, ntok, 1, NC, bf16); break; \
    }
                SWITCH_NC(ldm / VW - c, CALL)
#undef CALL
            }
    }
}

/* Attend the num_seqs prefill chunks.
 *
 * q, out:        [rows, num_heads, head_dim] contiguous; sequence i's new tokens are rows
 *                q_starts[i] .. q_starts[i] + q_lens[i] - 1.
 * k_cache, v_cache: [num_slots, num_kv_heads, head_dim] contiguous (slot = block * block_size
 *                + offset), the new tokens' keys and values stored already.
 * block_tables:  [*, bt_stride] int32; sequence i uses row seq_ids[i].
 * seq_lens:      [*] int32, indexed by seq_ids[i]: keys of the sequence, the new ones
 *                included (ctx_len = seq_len - q_len >= 0).
 *
 * Returns 0, or -1 when a scratch allocation failed (some rows are then left unwritten).
 */
ALWAYS_INLINE int paged_prefill(const float *q, const void *k_cache, const void *v_cache,
                                const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                                const int32_t *seq_ids, const int32_t *q_starts, const int32_t *q_lens, float *out,
                                int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size,
                                float scale, int bf16) {
    const int G = num_heads / num_kv_heads, D = head_dim;
    const int QT = M_TARGET / G > 0 ? M_TARGET / G : 1;
    const int max_ldm = ROUND_VW(QT * G);
    const int64_t row_stride = (int64_t)num_heads * D;

    /* The tiles, later tokens first: they see the most keys, and dynamic scheduling
     * balances best when the longest items go out first. */
    int num_tiles = 0;
    double work = 0.0;
    for (int i = 0; i < num_seqs; i++) {
        num_tiles += num_kv_heads * ((q_lens[i] + QT - 1) / QT);
        work += (double)q_lens[i] * num_heads * seq_lens[seq_ids[i]] * D * 2;
    }
    if (num_tiles == 0) return 0;
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    const int parallel = threads > 1 && work >= FORKLESS_PARALLEL_MIN_MACS;
    /* Enough items that the threads finish close together. */
    const int want = parallel ? 4 * threads : 1;
    Tile *tiles = (Tile *)malloc(sizeof(Tile) * (size_t)num_tiles);
    if (tiles == NULL) return -1;
    int n = 0, num_items = 0, num_partials = 0;
    for (int i = 0; i < num_seqs; i++) {
        const int64_t ctx_len = seq_lens[seq_ids[i]] - q_lens[i];
        for (int r0 = (q_lens[i] - 1) / QT * QT; r0 >= 0; r0 -= QT)
            for (int h = 0; h < num_kv_heads; h++) {
                Tile *tile = &tiles[n++];
                tile->seq = i;
                tile->head = h;
                tile->r0 = r0;
                tile->r1 = r0 + QT < q_lens[i] ? r0 + QT : q_lens[i];
                int parts = num_tiles < want ? (want + num_tiles - 1) / num_tiles : 1;
                parts = parts < MAX_PARTS ? parts : MAX_PARTS;
                const int64_t most = ctx_len / MIN_SPLIT_KEYS;
                parts = parts > most ? (int)(most > 1 ? most : 1) : parts;
                tile->num_parts = parts;
                tile->first = parts > 1 ? num_partials : -1;
                num_partials += parts > 1 ? parts : 0;
                num_items += parts;
            }
    }
    Item *items = (Item *)malloc(sizeof(Item) * (size_t)num_items);
    /* A split tile's ranges each leave [D][ldm] outputs, then ldm maxima and ldm sums. */
    const int64_t partial_size = (int64_t)(D + 2) * max_ldm;
    float *partials = num_partials ? (float *)malloc(sizeof(float) * (size_t)(partial_size * num_partials)) : NULL;
    if (items == NULL || (num_partials && partials == NULL)) {
        free(tiles);
        free(items);
        free(partials);
        return -1;
    }
    n = 0;
    for (int ti = 0; ti < num_tiles; ti++) {
        const Tile *tile = &tiles[ti];
        const int64_t ctx_len = seq_lens[seq_ids[tile->seq]] - q_lens[tile->seq];
        const int64_t end = ctx_len + tile->r1;
        /* The ranges split the context only, the last one running on to the tile's last
         * key: so every range starts at a key that all its rows see. */
        for (int p = 0; p < tile->num_parts; p++) {
            Item *it = &items[n++];
            it->tile = ti;
            it->part = p;
            it->k0 = ctx_len * p / tile->num_parts;
            it->k1 = p + 1 < tile->num_parts ? ctx_len * (p + 1) / tile->num_parts : end;
        }
    }

    int failed = 0;
#pragma omp parallel if (parallel)
    {
        /* qt and ot [D][ldm], s [KT][ldm], mrow, lrow, lim, alpha [ldm] */
        float *scratch = (float *)malloc(sizeof(float) * (size_t)max_ldm * (2 * D + KT + 4));
        if (scratch == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int ii = 0; ii < num_items; ii++) {
            if (scratch == NULL) continue;
            const Item *it = &items[ii];
            const Tile *tile = &tiles[it->tile];
            const int i = tile->seq, M = (tile->r1 - tile->r0) * G, ldm = ROUND_VW(M);
            float *qt = scratch, *ot = qt + (int64_t)D * max_ldm, *s = ot + (int64_t)D * max_ldm;
            float *mrow = s + KT * max_ldm, *lrow = mrow + max_ldm, *lim = lrow + max_ldm, *alpha = lim + max_ldm;
            if (tile->num_parts > 1) {
                /* Written where the merge reads it. */
                ot = partials + (tile->first + it->part) * partial_size;
                mrow = ot + (int64_t)D * ldm;
                lrow = mrow + ldm;
            }
            const int32_t *table = block_tables + (int64_t)seq_ids[i] * bt_stride;
            const int64_t ctx_len = seq_lens[seq_ids[i]] - q_lens[i];
#define ATTEND(D_) attend_item(q, row_stride, k_cache, v_cache, table, block_size, num_kv_heads, G, D_, scale, \
                               tile->head, ctx_len, q_starts[i], tile->r0, tile->r1, it->k0, it->k1, qt, s, ot, \
                               mrow, lrow, lim, alpha, bf16)
            /* The common head sizes as constants: their loops unroll. */
            if (D == 64) ATTEND(64);
            else if (D == 128) ATTEND(128);
            else ATTEND(D);
#undef ATTEND
            if (tile->num_parts == 1) {
                for (int j = 0; j < M; j++) {
                    float *o = out + (q_starts[i] + tile->r0 + j / G) * row_stride
                               + (int64_t)(tile->head * G + j % G) * D;
                    const float inv = 1.0f / lrow[j];
                    for (int d = 0; d < D; d++) o[d] = ot[(int64_t)d * ldm + j] * inv;
                }
            }
        }
        /* The split tiles: weigh each range by exp(its max - the overall max). */
#pragma omp for schedule(dynamic, 1)
        for (int ti = 0; ti < num_tiles; ti++) {
            const Tile *tile = &tiles[ti];
            if (tile->num_parts == 1 || scratch == NULL) continue;
            const int i = tile->seq, M = (tile->r1 - tile->r0) * G, ldm = ROUND_VW(M);
            float *w = scratch;
            for (int j = 0; j < M; j++) {
                float mx = -INFINITY, sum = 0.0f;
                for (int p = 0; p < tile->num_parts; p++) {
                    const float *part = partials + (tile->first + p) * partial_size + (int64_t)D * ldm;
                    mx = part[j] > mx ? part[j] : mx;
                }
                for (int p = 0; p < tile->num_parts; p++) {
                    const float *part = partials + (tile->first + p) * partial_size + (int64_t)D * ldm;
                    w[p] = expf(part[j] - mx);
                    sum += w[p] * part[ldm + j];
                }
                for (int p = 0; p < tile->num_parts; p++) w[p] /= sum;
                float *o = out + (q_starts[i] + tile->r0 + j / G) * row_stride + (int64_t)(tile->head * G + j % G) * D;
                for (int d = 0; d < D; d++) {
                    float acc = 0.0f;
                    for (int p = 0; p < tile->num_parts; p++)
                        acc += w[p] * partials[(tile->first + p) * partial_size + (int64_t)d * ldm + j];
                    o[d] = acc;
                }
            }
        }
        free(scratch);
    }
    free(tiles);
    free(items);
    free(partials);
    return failed ? -1 : 0;
}

int forkless_paged_prefill_f32(const float *q, const float *k_cache, const float *v_cache,
                               const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                               const int32_t *seq_ids, const int32_t *q_starts, const int32_t *q_lens, float *out,
                               int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size,
                               float scale) {
    return paged_prefill(q, k_cache, v_cache, block_tables, bt_stride, seq_lens, seq_ids, q_starts, q_lens, out,
                         num_seqs, num_heads, num_kv_heads, head_dim, block_size, scale, 0);
}

/* The same over a bfloat16 cache (q and out stay float32). */
int forkless_paged_prefill_bf16(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                                const int32_t *seq_ids, const int32_t *q_starts, const int32_t *q_lens, float *out,
                                int num_seqs, int num_heads, int num_kv_heads, int head_dim, int block_size,
                                float scale) {
    return paged_prefill(q, k_cache, v_cache, block_tables, bt_stride, seq_lens, seq_ids, q_starts, q_lens, out,
                         num_seqs, num_heads, num_kv_heads, head_dim, block_size, scale, 1);
}
