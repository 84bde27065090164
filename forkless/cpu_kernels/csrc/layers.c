/* The element-wise parts of a decoder layer, one pass each: RMSNorm (with the residual add
 * folded in), rotary embeddings in place, SiLU-and-mul; over float32 or bfloat16 tensors.
 *
 * As PyTorch ops, each of these is several passes over the activations and, at decode
 * time, several dispatches of a few microseconds for a few kilobytes of work. The
 * arithmetic follows the PyTorch layers (same products, same rounding of each: in
 * bfloat16, every op's result is rounded to bfloat16 where PyTorch's is, el_round), except
 * that sums and exp() take another order or polynomial: float32 rounding apart.
 *
 * Built by forkless/cpu_kernels with the system C compiler and called through ctypes.
 */

#include <math.h>

#include "common.h"

ALWAYS_INLINE float sum_of_squares(const void *v, int n, int bf16) {
    int i = 0;
    float s = 0.0f;
#ifdef FORKLESS_SIMD
    vec a0 = vzero(), a1 = vzero();
    for (; i + 2 * VW <= n; i += 2 * VW) {
        vec x0 = el_vload(v, i, bf16), x1 = el_vload(v, i + VW, bf16);
        a0 = vfma(x0, x0, a0);
        a1 = vfma(x1, x1, a1);
    }
    s = vhsum(vadd(a0, a1));
#endif
    for (; i < n; i++) {
        const float x = el_get(v, i, bf16);
        s += x * x;
    }
    return s;
}

/* out[t, h] = x[t, h] * rsqrt(mean(x[t, h]^2) + eps) * weight, where with a
 * residual x[t] is first replaced by x[t] + residual[t], which is also written to res_out
 * (H must be 1 then). out and res_out are contiguous; x rows have strides xs_t, xs_h (in
 * elements). In bfloat16 the sum, x * rsqrt and the product with weight are each rounded,
 * as the PyTorch layer does (its statistics are float32). */
ALWAYS_INLINE void rms_norm(const void *x, int64_t xs_t, int64_t xs_h, const void *residual, int64_t rs_t,
                            const void *weight, void *out, void *res_out, int T, int H, int N, float eps, int bf16) {
#pragma omp parallel for schedule(static) if ((int64_t)T * H * N >= FORKLESS_PARALLEL_MIN_ELEMENTS)
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++) {
            const void *v = el_at(x, t * xs_t + h * xs_h, bf16);
            void *o = (void *)el_at(out, ((int64_t)t * H + h) * N, bf16);
            if (residual) {
                void *r = (void *)el_at(res_out, (int64_t)t * N, bf16);
                const void *rin = el_at(residual, t * rs_t, bf16);
                int i = 0;
#ifdef FORKLESS_SIMD
                for (; i + VW <= N; i += VW) el_vstore(r, i, vadd(el_vload(v, i, bf16), el_vload(rin, i, bf16)), bf16);
#endif
                for (; i < N; i++) el_put(r, i, el_get(v, i, bf16) + el_get(rin, i, bf16), bf16);
                v = r;
            }
            const float scale = 1.0f / sqrtf(sum_of_squares(v, N, bf16) / (float)N + eps);
            int i = 0;
#ifdef FORKLESS_SIMD
            const vec vscale = vset1(scale);
            for (; i + VW <= N; i += VW)
                el_vstore(o, i, vmul(el_vround(vmul(el_vload(v, i, bf16), vscale), bf16), el_vload(weight, i, bf16)),
                          bf16);
#endif
            for (; i < N; i++)
                el_put(o, i, el_round(el_get(v, i, bf16) * scale, bf16) * el_get(weight, i, bf16), bf16);
        }
    }
}

int forkless_rms_norm_f32(const float *x, int64_t xs_t, int64_t xs_h, const float *residual, int64_t rs_t,
                          const float *weight, float *out, float *res_out, int T, int H, int N, float eps) {
    rms_norm(x, xs_t, xs_h, residual, rs_t, weight, out, res_out, T, H, N, eps, 0);
    return 0;
}

int forkless_rms_norm_bf16(const uint16_t *x, int64_t xs_t, int64_t xs_h, const uint16_t *residual, int64_t rs_t,
                           const uint16_t *weight, uint16_t *out, uint16_t *res_out, int T, int H, int N, float eps) {
    rms_norm(x, xs_t, xs_h, residual, rs_t, weight, out, res_out, T, H, N, eps, 1);
    return 0;
}

/* q [T, Hq, D] and k [T, Hkv, D] (strides qs_t, qs_h / ks_t, ks_h in elements; head
 * dimension contiguous): the first rotary_dim channels of each head are rotated by cos/sin
 * [T, >= rotary_dim / 2] (row stride cs_t; only the first half of each row is read, the
 * tables being cat(freqs, freqs)). In bfloat16 each product and the sum are rounded. */
ALWAYS_INLINE void rotary(void *q, int64_t qs_t, int64_t qs_h, void *k, int64_t ks_t, int64_t ks_h,
                          const void *cos_t, const void *sin_t, int64_t cs_t, int T, int Hq, int Hkv, int rotary_dim,
                          int bf16) {
    const int half = rotary_dim / 2;
#pragma omp parallel for schedule(static) if ((int64_t)T * (Hq + Hkv) * rotary_dim >= FORKLESS_PARALLEL_MIN_ELEMENTS)
    for (int t = 0; t < T; t++) {
        const void *c = el_at(cos_t, t * cs_t, bf16), *s = el_at(sin_t, t * cs_t, bf16);
        for (int h = 0; h < Hq + Hkv; h++) {
            void *x = h < Hq ? (void *)el_at(q, t * qs_t + h * qs_h, bf16)
                             : (void *)el_at(k, t * ks_t + (h - Hq) * ks_h, bf16);
            int i = 0;
#ifdef FORKLESS_SIMD
            for (; i + VW <= half; i += VW) {
                const vec x1 = el_vload(x, i, bf16), x2 = el_vload(x, i + half, bf16);
                const vec ci = el_vload(c, i, bf16), si = el_vload(s, i, bf16);
                const vec y1 = vsub(el_vround(vmul(x1, ci), bf16), el_vround(vmul(x2, si), bf16));
                const vec y2 = vadd(el_vround(vmul(x2, ci), bf16), el_vround(vmul(x1, si), bf16));
                el_vstore(x, i, y1, bf16);
                el_vstore(x, i + half, y2, bf16);
            }
#endif
            for (; i < half; i++) {
                const float x1 = el_get(x, i, bf16), x2 = el_get(x, i + half, bf16);
                const float ci = el_get(c, i, bf16), si = el_get(s, i, bf16);
                el_put(x, i, el_round(x1 * ci, bf16) - el_round(x2 * si, bf16), bf16);
                el_put(x, i + half, el_round(x2 * ci, bf16) + el_round(x1 * si, bf16), bf16);
            }
        }
    }
}

int forkless_rotary_f32(float *q, int64_t qs_t, int64_t qs_h, float *k, int64_t ks_t, int64_t ks_h,
                        const float *cos_t, const float *sin_t, int64_t cs_t, int T, int Hq, int Hkv, int rotary_dim) {
    rotary(q, qs_t, qs_h, k, ks_t, ks_h, cos_t, sin_t, cs_t, T, Hq, Hkv, rotary_dim, 0);
    return 0;
}

int forkless_rotary_bf16(uint16_t *q, int64_t qs_t, int64_t qs_h, uint16_t *k, int64_t ks_t, int64_t ks_h,
                         const uint16_t *cos_t, const uint16_t *sin_t, int64_t cs_t, int T, int Hq, int Hkv,
                         int rotary_dim) {
    rotary(q, qs_t, qs_h, k, ks_t, ks_h, cos_t, sin_t, cs_t, T, Hq, Hkv, rotary_dim, 1);
    return 0;
}

/* out[t, i] = silu(x[t, i]) * x[t, d + i] (x rows of stride xs_t elements, out contiguous
 * [T, d]). In bfloat16 silu's result and the product are each rounded. */
ALWAYS_INLINE void silu_and_mul(const void *x, int64_t xs_t, void *out, int T, int d, int bf16) {
#pragma omp parallel for schedule(static) if ((int64_t)T * d >= FORKLESS_PARALLEL_MIN_ELEMENTS)
    for (int t = 0; t < T; t++) {
        const void *g = el_at(x, t * xs_t, bf16), *u = el_at(g, d, bf16);
        void *o = (void *)el_at(out, (int64_t)t * d, bf16);
        int i = 0;
#ifdef FORKLESS_SIMD
        const vec one = vset1(1.0f), zero = vzero();
        for (; i + VW <= d; i += VW) {
            vec gv = el_vload(g, i, bf16);
            vec silu = el_vround(vdiv(gv, vadd(one, vexp(vsub(zero, gv)))), bf16);
            el_vstore(o, i, vmul(silu, el_vload(u, i, bf16)), bf16);
        }
#endif
        for (; i < d; i++) {
            const float gi = el_get(g, i, bf16);
            el_put(o, i, el_round(gi / (1.0f + expf(-gi)), bf16) * el_get(u, i, bf16), bf16);
        }
    }
}

int forkless_silu_and_mul_f32(const float *x, int64_t xs_t, float *out, int T, int d) {
    silu_and_mul(x, xs_t, out, T, d, 0);
    return 0;
}

int forkless_silu_and_mul_bf16(const uint16_t *x, int64_t xs_t, uint16_t *out, int T, int d) {
    silu_and_mul(x, xs_t, out, T, d, 1);
    return 0;
}
