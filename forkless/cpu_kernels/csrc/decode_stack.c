/* A decode step through a whole stack of Llama-family decoder layers, in one call.
 *
 * The model's Python forward calls one C kernel (or torch op) per operation: some fifteen
 * a layer, ~450 a step for a 30-layer model, each a few microseconds of dispatch and
 * argument conversion around work that, at decode batch sizes, takes about as long. This
 * runs the same kernels in the same order with the same arguments (RMSNorm with the
 * residual add, the packed QKV projection, the per-head query/key norms where the model
 * has them, rotary embeddings, the KV-cache store, paged decode attention, the output
 * projection, RMSNorm, gate/up, SiLU-and-mul, down; then the final norm), so its results
 * are bit-identical to the Python path's; only the dispatch between them is gone.
 *
 * Invariants (checked by forkless/models/layers/cpu_decode_stack.py, which calls this):
 * float32 activations; projections packed for forkless_linear_f32 or in GGUF Q8_0 / Q4_1
 * blocks (forkless_linear_q8_0 / _q4_1), any mix; every layer's ops forkless's own; every row of the step is one decoding
 * sequence's one new token, stored at its slot.
 *
 * Built by forkless/cpu_kernels with the system C compiler and called through ctypes. */

#include <stdlib.h>
#include <string.h>

#include "common.h"

int forkless_linear_f32(const float *x, int64_t ldx, const float *packed, const float *bias, float *y, int64_t ldy,
                        int M, int K, int panels);
int forkless_linear_panel_width(void);
int forkless_linear_q8_0(const float *x, int64_t ldx, const int8_t *qs, const uint16_t *d, const float *bias, float *y,
                         int64_t ldy, int M, int K, int N);
int forkless_linear_q4_1(const float *x, int64_t ldx, const uint8_t *qs, const uint16_t *d, const uint16_t *m,
                         const float *bias, float *y, int64_t ldy, int M, int K, int N);
int forkless_rms_norm_f32(const float *x, int64_t xs_t, int64_t xs_h, const float *residual, int64_t rs_t,
                          const float *weight, float *out, float *res_out, int T, int H, int N, float eps);
int forkless_rotary_f32(float *q, int64_t qs_t, int64_t qs_h, float *k, int64_t ks_t, int64_t ks_h,
                        const float *cos_t, const float *sin_t, int64_t cs_t, int T, int Hq, int Hkv, int rotary_dim);
int forkless_silu_and_mul_f32(const float *x, int64_t xs_t, float *out, int T, int d);
int forkless_paged_decode_f32(const float *q, const float *k_cache, const float *v_cache,
                              const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                              const int32_t *seq_ids, const int32_t *q_rows, float *out, int num_seqs,
                              int num_heads, int num_kv_heads, int head_dim, int block_size, float scale);

/* A projection's weights: float32 packed panels ([panels, K, panel width], the bias, when
 * there is one, padded to the panels' columns; out_cols = panels * panel width) or GGUF
 * quants with their scales (and mins) as forkless_linear_q8_0 / _q4_1 take them
 * (out_cols = N). out_cols is also the
 * row stride of its output. */
enum { PROJ_F32 = 0, PROJ_Q8_0 = 1, PROJ_Q4_1 = 2 };
typedef struct {
    int format, out_cols;
    const void *w;
    const uint16_t *scales, *mins; /* float16, GGUF only */
    const float *bias;
} forkless_projection;

/* One decoder layer's weights and its cache. */
typedef struct {
    const float *input_norm, *post_norm; /* [hidden] */
    const float *q_norm, *k_norm;        /* [head_dim] each, or both NULL (no per-head norms) */
    forkless_projection qkv, o, gate_up, down;
    float *k_cache, *v_cache; /* [slots, num_kv_heads, head_dim] */
} forkless_decoder_layer_f32;

/* The stack's shapes (this rank's, all of them with one) and its layers. */
typedef struct {
    int num_layers, hidden, num_heads, num_kv_heads, head_dim, rotary_dim, intermediate, block_size;
    float eps, scale;
    const float *final_norm; /* [hidden] */
    const forkless_decoder_layer_f32 *layers;
} forkless_decoder_stack_f32;

/* y[T, out] (row stride p->out_cols) = x[T, K] (row stride ldx) w^T + bias. */
static void project(const forkless_projection *p, const float *x, int64_t ldx, float *y, int T, int K, int N) {
    if (p->format == PROJ_Q8_0)
        forkless_linear_q8_0(x, ldx, (const int8_t *)p->w, p->scales, p->bias, y, p->out_cols, T, K, N);
    else if (p->format == PROJ_Q4_1)
        forkless_linear_q4_1(x, ldx, (const uint8_t *)p->w, p->scales, p->mins, p->bias, y, p->out_cols, T, K, N);
    else
        forkless_linear_f32(x, ldx, (const float *)p->w, p->bias, y, p->out_cols, T, K,
                            p->out_cols / forkless_linear_panel_width());
}

/* hidden [T, hidden] (contiguous): the step's token embeddings in, the final norm's output
 * out. cos/sin [T, >= rotary_dim / 2] of each row's position (row stride cs_t); row t's
 * key and value go to slot slots[t]; attention reads row t's sequence seq_ids[t] of
 * block_tables / seq_lens (as forkless_paged_decode_f32, with q_rows[t] = t).
 *
 * Returns 0, or -1 when scratch memory could not be allocated (hidden is then undefined). */
int forkless_decode_stack_f32(const forkless_decoder_stack_f32 *m, float *hidden, int T, const float *cos_t,
                              const float *sin_t, int64_t cs_t, const int64_t *slots, const int32_t *block_tables,
                              int64_t bt_stride, const int32_t *seq_lens, const int32_t *seq_ids,
                              const int32_t *q_rows) {
    const int H = m->hidden, Hq = m->num_heads, Hkv = m->num_kv_heads, D = m->head_dim, I = m->intermediate;
    /* The projections' outputs have row strides of their out_cols (float32: whole panels,
     * columns past the layer's width are zeros nothing reads): buffers of the widest. */
    int64_t max_qkv = 0, max_gu = 0, max_h = 0;
    for (int l = 0; l < m->num_layers; l++) {
        const forkless_decoder_layer_f32 *L = &m->layers[l];
        max_qkv = L->qkv.out_cols > max_qkv ? L->qkv.out_cols : max_qkv;
        max_gu = L->gate_up.out_cols > max_gu ? L->gate_up.out_cols : max_gu;
        max_h = L->o.out_cols > max_h ? L->o.out_cols : max_h;
        max_h = L->down.out_cols > max_h ? L->down.out_cols : max_h;
    }
    const int64_t q_width = (int64_t)Hq * D, kv_width = (int64_t)Hkv * D;
    const size_t floats = (size_t)T * (H + H + max_qkv + q_width + kv_width + q_width + max_gu + I + max_h);
    float *scratch = (float *)malloc(sizeof(float) * floats);
    if (scratch == NULL) return -1;
    float *residual = scratch, *normed = residual + (size_t)T * H, *qkv = normed + (size_t)T * H;
    float *q = qkv + (size_t)T * max_qkv, *kn = q + (size_t)T * q_width, *attn = kn + (size_t)T * kv_width;
    float *gu = attn + (size_t)T * q_width, *act = gu + (size_t)T * max_gu, *h = act + (size_t)T * I;
    int status = 0;
    int64_t ld_h = 0; /* the row stride of h: the last projection's that wrote it */

    memcpy(residual, hidden, sizeof(float) * (size_t)T * H);
    for (int l = 0; l < m->num_layers && status == 0; l++) {
        const forkless_decoder_layer_f32 *L = &m->layers[l];
        const int64_t ld_qkv = L->qkv.out_cols;
        if (l == 0)
            forkless_rms_norm_f32(hidden, H, 0, NULL, 0, L->input_norm, normed, NULL, T, 1, H, m->eps);
        else /* the previous layer's MLP output h joins the residual stream */
            forkless_rms_norm_f32(h, ld_h, 0, residual, H, L->input_norm, normed, residual, T, 1, H, m->eps);
        project(&L->qkv, normed, H, qkv, T, H, (int)(q_width + 2 * kv_width));
        const float *k, *v = qkv + q_width + kv_width;
        int64_t ks_t;
        if (L->q_norm != NULL) {
            /* Per-head norms write q and k contiguous, then the rotation works on those. */
            forkless_rms_norm_f32(qkv, ld_qkv, D, NULL, 0, L->q_norm, q, NULL, T, Hq, D, m->eps);
            forkless_rms_norm_f32(qkv + q_width, ld_qkv, D, NULL, 0, L->k_norm, kn, NULL, T, Hkv, D, m->eps);
            forkless_rotary_f32(q, q_width, D, kn, kv_width, D, cos_t, sin_t, cs_t, T, Hq, Hkv, m->rotary_dim);
            k = kn;
            ks_t = kv_width;
        } else {
            forkless_rotary_f32(qkv, ld_qkv, D, qkv + q_width, ld_qkv, D, cos_t, sin_t, cs_t, T, Hq, Hkv,
                                m->rotary_dim);
            for (int t = 0; t < T; t++) memcpy(q + t * q_width, qkv + t * ld_qkv, sizeof(float) * q_width);
            k = qkv + q_width;
            ks_t = ld_qkv;
        }
        for (int t = 0; t < T; t++) {
            memcpy(L->k_cache + slots[t] * kv_width, k + t * ks_t, sizeof(float) * kv_width);
            memcpy(L->v_cache + slots[t] * kv_width, v + t * ld_qkv, sizeof(float) * kv_width);
        }
        status = forkless_paged_decode_f32(q, L->k_cache, L->v_cache, block_tables, bt_stride, seq_lens, seq_ids,
                                           q_rows, attn, T, Hq, Hkv, D, m->block_size, m->scale);
        project(&L->o, attn, q_width, h, T, Hq * D, H);
        forkless_rms_norm_f32(h, L->o.out_cols, 0, residual, H, L->post_norm, normed, residual, T, 1, H, m->eps);
        project(&L->gate_up, normed, H, gu, T, H, 2 * I);
        forkless_silu_and_mul_f32(gu, L->gate_up.out_cols, act, T, I);
        project(&L->down, act, I, h, T, I, H);
        ld_h = L->down.out_cols;
    }
    if (status == 0)
        forkless_rms_norm_f32(h, ld_h, 0, residual, H, m->final_norm, hidden, residual, T, 1, H, m->eps);
    free(scratch);
    return status;
}
