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
 * float32 weights packed by forkless_linear_f32's layout, every layer's ops forkless's
 * own; every row of the step is one decoding sequence's one new token, stored at its slot.
 *
 * Built by forkless/cpu_kernels with the system C compiler and called through ctypes. */

#include <stdlib.h>
#include <string.h>

#include "common.h"

int forkless_linear_f32(const float *x, int64_t ldx, const float *packed, const float *bias, float *y, int64_t ldy,
                        int M, int K, int panels);
int forkless_linear_panel_width(void);
int forkless_rms_norm_f32(const float *x, int64_t xs_t, int64_t xs_h, const float *residual, int64_t rs_t,
                          const float *weight, float *out, float *res_out, int T, int H, int N, float eps);
int forkless_rotary_f32(float *q, int64_t qs_t, int64_t qs_h, float *k, int64_t ks_t, int64_t ks_h,
                        const float *cos_t, const float *sin_t, int64_t cs_t, int T, int Hq, int Hkv, int rotary_dim);
int forkless_silu_and_mul_f32(const float *x, int64_t xs_t, float *out, int T, int d);
int forkless_paged_decode_f32(const float *q, const float *k_cache, const float *v_cache,
                              const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                              const int32_t *seq_ids, const int32_t *q_rows, float *out, int num_seqs,
                              int num_heads, int num_kv_heads, int head_dim, int block_size, float scale);

/* One decoder layer's weights (packed projections: [panels, K, panel width] with the bias,
 * when there is one, padded to the panels' columns) and its cache. */
typedef struct {
    const float *input_norm, *post_norm; /* [hidden] */
    const float *q_norm, *k_norm;        /* [head_dim] each, or both NULL (no per-head norms) */
    const float *qkv, *qkv_bias;
    const float *o, *o_bias;
    const float *gate_up, *gate_up_bias;
    const float *down, *down_bias;
    float *k_cache, *v_cache; /* [slots, num_kv_heads, head_dim] */
} forkless_decoder_layer_f32;

/* The stack's shapes (this rank's, all of them with one) and its layers. */
typedef struct {
    int num_layers, hidden, num_heads, num_kv_heads, head_dim, rotary_dim, intermediate, block_size;
    int qkv_panels, o_panels, gate_up_panels, down_panels;
    float eps, scale;
    const float *final_norm; /* [hidden] */
    const forkless_decoder_layer_f32 *layers;
} forkless_decoder_stack_f32;

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
    const int64_t nr = forkless_linear_panel_width();
    /* Row strides of the projections' outputs: whole panels, columns past the layer's
     * width are zeros nothing reads. */
    const int64_t ld_qkv = m->qkv_panels * nr, ld_o = m->o_panels * nr, ld_gu = m->gate_up_panels * nr,
                  ld_down = m->down_panels * nr, ld_h = ld_o > ld_down ? ld_o : ld_down;
    const int64_t q_width = (int64_t)Hq * D, kv_width = (int64_t)Hkv * D;
    const size_t floats = (size_t)T * (H + H + ld_qkv + q_width + kv_width + q_width + ld_gu + I + ld_h);
    float *scratch = (float *)malloc(sizeof(float) * floats);
    if (scratch == NULL) return -1;
    float *residual = scratch, *normed = residual + (size_t)T * H, *qkv = normed + (size_t)T * H;
    float *q = qkv + (size_t)T * ld_qkv, *kn = q + (size_t)T * q_width, *attn = kn + (size_t)T * kv_width;
    float *gu = attn + (size_t)T * q_width, *act = gu + (size_t)T * ld_gu, *h = act + (size_t)T * I;
    int status = 0;

    memcpy(residual, hidden, sizeof(float) * (size_t)T * H);
    for (int l = 0; l < m->num_layers && status == 0; l++) {
        const forkless_decoder_layer_f32 *L = &m->layers[l];
        if (l == 0)
            forkless_rms_norm_f32(hidden, H, 0, NULL, 0, L->input_norm, normed, NULL, T, 1, H, m->eps);
        else /* the previous layer's MLP output h joins the residual stream */
            forkless_rms_norm_f32(h, ld_down, 0, residual, H, L->input_norm, normed, residual, T, 1, H, m->eps);
        forkless_linear_f32(normed, H, L->qkv, L->qkv_bias, qkv, ld_qkv, T, H, m->qkv_panels);
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
        forkless_linear_f32(attn, q_width, L->o, L->o_bias, h, ld_o, T, Hq * D, m->o_panels);
        forkless_rms_norm_f32(h, ld_o, 0, residual, H, L->post_norm, normed, residual, T, 1, H, m->eps);
        forkless_linear_f32(normed, H, L->gate_up, L->gate_up_bias, gu, ld_gu, T, H, m->gate_up_panels);
        forkless_silu_and_mul_f32(gu, ld_gu, act, T, I);
        forkless_linear_f32(act, I, L->down, L->down_bias, h, ld_down, T, I, m->down_panels);
    }
    if (status == 0)
        forkless_rms_norm_f32(h, ld_down, 0, residual, H, m->final_norm, hidden, residual, T, 1, H, m->eps);
    free(scratch);
    return status;
}
