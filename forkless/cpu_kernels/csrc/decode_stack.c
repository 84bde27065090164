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
 * Two entry points, one body: float32 (forkless_decode_stack_f32) and bfloat16
 * (forkless_decode_stack_bf16), whose activations, norms, cos/sin tables and cache are all
 * of that dtype and rounded where the Python path's bfloat16 tensors are (the element-wise
 * kernels' bfloat16 variants; attention's query widened to float32 and its output rounded
 * once, as the CPU attention backend does).
 *
 * Invariants (checked by forkless/models/layers/cpu_decode_stack.py, which calls this):
 * float32 stacks' projections packed for forkless_linear_f32 or in GGUF Q8_0 / Q4_1 blocks
 * (forkless_linear_q8_0 / _q4_1), any mix; bfloat16 stacks' packed for forkless_linear_bf16;
 * every layer's ops forkless's own; every row of the step is one decoding sequence's one
 * new token, stored at its slot.
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
int forkless_linear_q8_0_i8(const float *x, int64_t ldx, const int8_t *qs, const uint16_t *d, const float *bias,
                            float *y, int64_t ldy, int M, int K, int N);
int forkless_linear_q4_1_i8(const float *x, int64_t ldx, const uint8_t *qs, const uint16_t *d, const uint16_t *m,
                            const float *bias, float *y, int64_t ldy, int M, int K, int N);
int forkless_linear_bf16(const uint16_t *x, int64_t ldx, const uint32_t *packed, const float *bias, uint16_t *y,
                         int64_t ldy, int M, int K, int panels);
int forkless_linear_bf16_panel_width(void);
/* The element-wise kernels and decode attention of either dtype, called through pointer
 * types over void (the dtypes' variants differ only in their element pointers' types),
 * so one body serves both; the dtype picks the symbol. */
typedef int (*rms_norm_fn)(const void *x, int64_t xs_t, int64_t xs_h, const void *residual, int64_t rs_t,
                           const void *weight, void *out, void *res_out, int T, int H, int N, float eps);
typedef int (*rotary_fn)(void *q, int64_t qs_t, int64_t qs_h, void *k, int64_t ks_t, int64_t ks_h, const void *cos_t,
                         const void *sin_t, int64_t cs_t, int T, int Hq, int Hkv, int rotary_dim);
typedef int (*silu_and_mul_fn)(const void *x, int64_t xs_t, void *out, int T, int d);
typedef int (*paged_decode_fn)(const float *q, const void *k_cache, const void *v_cache, const int32_t *block_tables,
                               int64_t bt_stride, const int32_t *seq_lens, const int32_t *seq_ids,
                               const int32_t *q_rows, float *out, int num_seqs, int num_heads, int num_kv_heads,
                               int head_dim, int block_size, float scale);
int forkless_rms_norm_f32(const float *x, int64_t xs_t, int64_t xs_h, const float *residual, int64_t rs_t,
                          const float *weight, float *out, float *res_out, int T, int H, int N, float eps);
int forkless_rms_norm_bf16(const uint16_t *x, int64_t xs_t, int64_t xs_h, const uint16_t *residual, int64_t rs_t,
                           const uint16_t *weight, uint16_t *out, uint16_t *res_out, int T, int H, int N, float eps);
int forkless_rotary_f32(float *q, int64_t qs_t, int64_t qs_h, float *k, int64_t ks_t, int64_t ks_h,
                        const float *cos_t, const float *sin_t, int64_t cs_t, int T, int Hq, int Hkv, int rotary_dim);
int forkless_rotary_bf16(uint16_t *q, int64_t qs_t, int64_t qs_h, uint16_t *k, int64_t ks_t, int64_t ks_h,
                         const uint16_t *cos_t, const uint16_t *sin_t, int64_t cs_t, int T, int Hq, int Hkv,
                         int rotary_dim);
int forkless_silu_and_mul_f32(const float *x, int64_t xs_t, float *out, int T, int d);
int forkless_silu_and_mul_bf16(const uint16_t *x, int64_t xs_t, uint16_t *out, int T, int d);
int forkless_paged_decode_f32(const float *q, const float *k_cache, const float *v_cache,
                              const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                              const int32_t *seq_ids, const int32_t *q_rows, float *out, int num_seqs,
                              int num_heads, int num_kv_heads, int head_dim, int block_size, float scale);
int forkless_paged_decode_bf16(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                               const int32_t *block_tables, int64_t bt_stride, const int32_t *seq_lens,
                               const int32_t *seq_ids, const int32_t *q_rows, float *out, int num_seqs,
                               int num_heads, int num_kv_heads, int head_dim, int block_size, float scale);

/* A projection's weights: float32 packed panels ([panels, K, panel width], the bias, when
 * there is one, padded to the panels' columns; out_cols = panels * panel width), bfloat16
 * packed pair panels (forkless_linear_bf16's layout, float32 bias; out_cols likewise), or
 * GGUF quants with their scales (and mins) as forkless_linear_q8_0 / _q4_1 take them
 * (out_cols = N), with float32 or (the _I8 formats, forkless_linear_q8_0_i8 / _q4_1_i8)
 * int8 activations. out_cols is also the row stride of its output. */
enum { PROJ_F32 = 0, PROJ_Q8_0 = 1, PROJ_Q4_1 = 2, PROJ_BF16 = 3, PROJ_Q8_0_I8 = 4, PROJ_Q4_1_I8 = 5 };
typedef struct {
    int format, out_cols;
    const void *w;
    const uint16_t *scales, *mins; /* float16, GGUF only */
    const float *bias;
} forkless_projection;

/* One decoder layer's weights and its cache, in the stack's dtype (biases float32). */
typedef struct {
    const void *input_norm, *post_norm; /* [hidden] */
    const void *q_norm, *k_norm;        /* [head_dim] each, or both NULL (no per-head norms) */
    forkless_projection qkv, o, gate_up, down;
    void *k_cache, *v_cache; /* [slots, num_kv_heads, head_dim] */
} forkless_decoder_layer;

/* The stack's shapes (this rank's, all of them with one) and its layers. */
typedef struct {
    int num_layers, hidden, num_heads, num_kv_heads, head_dim, rotary_dim, intermediate, block_size;
    float eps, scale;
    const void *final_norm; /* [hidden] */
    const forkless_decoder_layer *layers;
} forkless_decoder_stack;

/* y[T, out] (row stride p->out_cols) = x[T, K] (row stride ldx) w^T + bias, in the x's and
 * y's dtype (bfloat16 for PROJ_BF16, float32 otherwise). Returns the kernel's status. */
static int project(const forkless_projection *p, const void *x, int64_t ldx, void *y, int T, int K, int N) {
    switch (p->format) {
    case PROJ_Q8_0:
        return forkless_linear_q8_0(x, ldx, (const int8_t *)p->w, p->scales, p->bias, y, p->out_cols, T, K, N);
    case PROJ_Q4_1:
        return forkless_linear_q4_1(x, ldx, (const uint8_t *)p->w, p->scales, p->mins, p->bias, y, p->out_cols, T, K, N);
    case PROJ_Q8_0_I8:
        return forkless_linear_q8_0_i8(x, ldx, (const int8_t *)p->w, p->scales, p->bias, y, p->out_cols, T, K, N);
    case PROJ_Q4_1_I8:
        return forkless_linear_q4_1_i8(x, ldx, (const uint8_t *)p->w, p->scales, p->mins, p->bias, y, p->out_cols, T,
                                       K, N);
    case PROJ_BF16:
        return forkless_linear_bf16(x, ldx, (const uint32_t *)p->w, p->bias, y, p->out_cols, T, K,
                                    p->out_cols / forkless_linear_bf16_panel_width());
    default:
        return forkless_linear_f32(x, ldx, (const float *)p->w, p->bias, y, p->out_cols, T, K,
                                   p->out_cols / forkless_linear_panel_width());
    }
}

/* hidden [T, hidden] (contiguous): the step's token embeddings in, the final norm's output
 * out. cos/sin [T, >= rotary_dim / 2] of each row's position (row stride cs_t); row t's
 * key and value go to slot slots[t]; attention reads row t's sequence seq_ids[t] of
 * block_tables / seq_lens (as forkless_paged_decode_f32, with q_rows[t] = t). All of the
 * stack's dtype: bf16 is a constant after inlining.
 *
 * Returns 0, or -1 when scratch memory could not be allocated (hidden is then undefined). */
ALWAYS_INLINE int decode_stack(const forkless_decoder_stack *m, void *hidden, int T, const void *cos_t,
                               const void *sin_t, int64_t cs_t, const int64_t *slots, const int32_t *block_tables,
                               int64_t bt_stride, const int32_t *seq_lens, const int32_t *seq_ids,
                               const int32_t *q_rows, int bf16) {
    const rms_norm_fn rms_norm = bf16 ? (rms_norm_fn)forkless_rms_norm_bf16 : (rms_norm_fn)forkless_rms_norm_f32;
    const rotary_fn rotary = bf16 ? (rotary_fn)forkless_rotary_bf16 : (rotary_fn)forkless_rotary_f32;
    const silu_and_mul_fn silu_and_mul =
        bf16 ? (silu_and_mul_fn)forkless_silu_and_mul_bf16 : (silu_and_mul_fn)forkless_silu_and_mul_f32;
    const paged_decode_fn paged_decode =
        bf16 ? (paged_decode_fn)forkless_paged_decode_bf16 : (paged_decode_fn)forkless_paged_decode_f32;
    const size_t es = bf16 ? 2 : 4; /* bytes per element */
    const int H = m->hidden, Hq = m->num_heads, Hkv = m->num_kv_heads, D = m->head_dim, I = m->intermediate;
    /* The projections' outputs have row strides of their out_cols (packed: whole panels,
     * columns past the layer's width are zeros nothing reads): buffers of the widest. */
    int64_t max_qkv = 0, max_gu = 0, max_h = 0;
    for (int l = 0; l < m->num_layers; l++) {
        const forkless_decoder_layer *L = &m->layers[l];
        max_qkv = L->qkv.out_cols > max_qkv ? L->qkv.out_cols : max_qkv;
        max_gu = L->gate_up.out_cols > max_gu ? L->gate_up.out_cols : max_gu;
        max_h = L->o.out_cols > max_h ? L->o.out_cols : max_h;
        max_h = L->down.out_cols > max_h ? L->down.out_cols : max_h;
    }
    const int64_t q_width = (int64_t)Hq * D, kv_width = (int64_t)Hkv * D;
    /* Activations in the stack's dtype; in bfloat16 also attention's float32 query and output. */
    const size_t elements = (size_t)T * (H + H + max_qkv + q_width + kv_width + q_width + max_gu + I + max_h);
    const size_t f32_extra = bf16 ? (size_t)T * 2 * q_width : 0;
    /* The float32 part starts on a cache line: after an odd count of bfloat16 elements its
     * floats would be misaligned. */
    const size_t f32_start = (es * elements + 63) / 64 * 64;
    char *scratch = (char *)malloc(f32_start + sizeof(float) * f32_extra);
    if (scratch == NULL) return -1;
#define AT(base, n) ((char *)(base) + (size_t)(n) * es)
    char *residual = scratch, *normed = AT(residual, T * H), *qkv = AT(normed, T * H);
    char *q = AT(qkv, T * max_qkv), *kn = AT(q, T * q_width), *attn = AT(kn, T * kv_width);
    char *gu = AT(attn, T * q_width), *act = AT(gu, T * max_gu), *h = AT(act, T * I);
    /* float32 attention query / output: q and attn themselves in a float32 stack. */
    float *qf = bf16 ? (float *)(scratch + f32_start) : (float *)q;
    float *of = bf16 ? qf + (size_t)T * q_width : (float *)attn;
    int status = 0;
    int64_t ld_h = 0; /* the row stride of h: the last projection's that wrote it */

    memcpy(residual, hidden, es * (size_t)T * H);
    for (int l = 0; l < m->num_layers && status == 0; l++) {
        const forkless_decoder_layer *L = &m->layers[l];
        const int64_t ld_qkv = L->qkv.out_cols;
        if (l == 0)
            rms_norm(hidden, H, 0, NULL, 0, L->input_norm, normed, NULL, T, 1, H, m->eps);
        else /* the previous layer's MLP output h joins the residual stream */
            rms_norm(h, ld_h, 0, residual, H, L->input_norm, normed, residual, T, 1, H, m->eps);
        status |= project(&L->qkv, normed, H, qkv, T, H, (int)(q_width + 2 * kv_width));
        const char *k, *v = AT(qkv, q_width + kv_width);
        int64_t ks_t;
        if (L->q_norm != NULL) {
            /* Per-head norms write q and k contiguous, then the rotation works on those. */
            rms_norm(qkv, ld_qkv, D, NULL, 0, L->q_norm, q, NULL, T, Hq, D, m->eps);
            rms_norm(AT(qkv, q_width), ld_qkv, D, NULL, 0, L->k_norm, kn, NULL, T, Hkv, D, m->eps);
            rotary(q, q_width, D, kn, kv_width, D, cos_t, sin_t, cs_t, T, Hq, Hkv, m->rotary_dim);
            k = kn;
            ks_t = kv_width;
        } else {
            rotary(qkv, ld_qkv, D, AT(qkv, q_width), ld_qkv, D, cos_t, sin_t, cs_t, T, Hq, Hkv, m->rotary_dim);
            for (int t = 0; t < T; t++) memcpy(AT(q, t * q_width), AT(qkv, t * ld_qkv), es * q_width);
            k = AT(qkv, q_width);
            ks_t = ld_qkv;
        }
        for (int t = 0; t < T; t++) {
            memcpy(AT(L->k_cache, slots[t] * kv_width), k + (size_t)t * ks_t * es, es * kv_width);
            memcpy(AT(L->v_cache, slots[t] * kv_width), v + (size_t)t * ld_qkv * es, es * kv_width);
        }
        if (bf16) /* the query widened, as the attention backend's q.float() */
            for (int64_t i = 0; i < (int64_t)T * q_width; i++) qf[i] = bf16_to_f32(((const uint16_t *)q)[i]);
        status |= paged_decode(qf, L->k_cache, L->v_cache, block_tables, bt_stride, seq_lens, seq_ids, q_rows, of, T,
                              Hq, Hkv, D, m->block_size, m->scale);
        if (bf16) /* and its output rounded once */
            for (int64_t i = 0; i < (int64_t)T * q_width; i++) ((uint16_t *)attn)[i] = f32_to_bf16(of[i]);
        status |= project(&L->o, attn, q_width, h, T, Hq * D, H);
        rms_norm(h, L->o.out_cols, 0, residual, H, L->post_norm, normed, residual, T, 1, H, m->eps);
        status |= project(&L->gate_up, normed, H, gu, T, H, 2 * I);
        silu_and_mul(gu, L->gate_up.out_cols, act, T, I);
        status |= project(&L->down, act, I, h, T, I, H);
        ld_h = L->down.out_cols;
    }
#undef AT
    if (status == 0) rms_norm(h, ld_h, 0, residual, H, m->final_norm, hidden, residual, T, 1, H, m->eps);
    free(scratch);
    return status;
}

int forkless_decode_stack_f32(const forkless_decoder_stack *m, float *hidden, int T, const float *cos_t,
                              const float *sin_t, int64_t cs_t, const int64_t *slots, const int32_t *block_tables,
                              int64_t bt_stride, const int32_t *seq_lens, const int32_t *seq_ids,
                              const int32_t *q_rows) {
    return decode_stack(m, hidden, T, cos_t, sin_t, cs_t, slots, block_tables, bt_stride, seq_lens, seq_ids, q_rows,
                        0);
}

/* The same in bfloat16: hidden, cos/sin, norms and caches bfloat16, projections PROJ_BF16. */
int forkless_decode_stack_bf16(const forkless_decoder_stack *m, uint16_t *hidden, int T, const uint16_t *cos_t,
                               const uint16_t *sin_t, int64_t cs_t, const int64_t *slots, const int32_t *block_tables,
                               int64_t bt_stride, const int32_t *seq_lens, const int32_t *seq_ids,
                               const int32_t *q_rows) {
    return decode_stack(m, hidden, T, cos_t, sin_t, cs_t, slots, block_tables, bt_stride, seq_lens, seq_ids, q_rows,
                        1);
}
