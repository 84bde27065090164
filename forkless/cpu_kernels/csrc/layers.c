/* The element-wise parts of a decoder layer, one pass each: RMSNorm (with the residual add
 * folded in), rotary embeddings in place, SiLU-and-mul.
 *
 * As PyTorch ops, each of these is several passes over the activations and, at decode
 * time, several dispatches of a few microseconds for a few kilobytes of work. The
 * arithmetic follows the PyTorch layers (same products, same rounding of each), except
 * that sums and exp() take another order or polynomial: float32 rounding apart.
 *
 * Built by forkless/cpu_kernels with the system C compiler and called through ctypes;
 * float32 only.
 */

#include <math.h>

#include "common.h"

static float sum_of_squares(const float *v, int n) {
    int i = 0;
    float s = 0.0f;
#ifdef FORKLESS_SIMD
    vec a0 = vzero(), a1 = vzero();
    for (; i + 2 * VW <= n; i += 2 * VW) {
        vec x0 = vload(v + i), x1 = vload(v + i + VW);
        a0 = vfma(x0, x0, a0);
        a1 = vfma(x1, x1, a1);
    }
    s = vhsum(vadd(a0, a1));
#endif
    for (; i < n; i++) s += v[i] * v[i];
    return s;
}

/* out[t, h] = x[t, h] * rsqrt(mean(x[t, h]^2) + eps) * weight, where with a
 * residual x[t] is first replaced by x[t] + residual[t], which is also written to res_out
 * (H must be 1 then). out and res_out are contiguous; x rows have strides xs_t, xs_h. */
int forkless_rms_norm_f32(const float *x, int64_t xs_t, int64_t xs_h, const float *residual, int64_t rs_t,
                          const float *weight, float *out, float *res_out, int T, int H, int N, float eps) {
#pragma omp parallel for schedule(static) if ((int64_t)T * H * N >= FORKLESS_PARALLEL_MIN_ELEMENTS)
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++) {
            const float *v = x + t * xs_t + h * xs_h;
            float *o = out + ((int64_t)t * H + h) * N;
            if (residual) {
                float *r = res_out + (int64_t)t * N;
                const float *rin = residual + t * rs_t;
                for (int i = 0; i < N; i++) r[i] = v[i] + rin[i];
                v = r;
            }
            const float scale = 1.0f / sqrtf(sum_of_squares(v, N) / (float)N + eps);
            for (int i = 0; i < N; i++) o[i] = (v[i] * scale) * weight[i];
        }
    }
    return 0;
}

/* q [T, Hq, D] and k [T, Hkv, D] (strides qs_t, qs_h / ks_t, ks_h; head
 * dimension contiguous): the first rotary_dim channels of each head are rotated by cos/sin
 * [T, >= rotary_dim / 2] (row stride cs_t; only the first half of each row is read, the
 * tables being cat(freqs, freqs)). */
int forkless_rotary_f32(float *q, int64_t qs_t, int64_t qs_h, float *k, int64_t ks_t, int64_t ks_h,
                        const float *cos_t, const float *sin_t, int64_t cs_t, int T, int Hq, int Hkv, int rotary_dim) {
    const int half = rotary_dim / 2;
#pragma omp parallel for schedule(static) if ((int64_t)T * (Hq + Hkv) * rotary_dim >= FORKLESS_PARALLEL_MIN_ELEMENTS)
    for (int t = 0; t < T; t++) {
        const float *c = cos_t + t * cs_t, *s = sin_t + t * cs_t;
        for (int h = 0; h < Hq + Hkv; h++) {
            float *x = h < Hq ? q + t * qs_t + h * qs_h : k + t * ks_t + (h - Hq) * ks_h;
            for (int i = 0; i < half; i++) {
                const float x1 = x[i], x2 = x[i + half];
                x[i] = x1 * c[i] - x2 * s[i];
                x[i + half] = x2 * c[i] + x1 * s[i];
            }
        }
    }
    return 0;
}

/* out[t, i] = silu(x[t, i]) * x[t, d + i] (x rows of stride xs_t, out
 * contiguous [T, d]). */
int forkless_silu_and_mul_f32(const float *x, int64_t xs_t, float *out, int T, int d) {
#pragma omp parallel for schedule(static) if ((int64_t)T * d >= FORKLESS_PARALLEL_MIN_ELEMENTS)
    for (int t = 0; t < T; t++) {
        const float *g = x + t * xs_t, *u = g + d;
        float *o = out + (int64_t)t * d;
        int i = 0;
#ifdef FORKLESS_SIMD
        const vec one = vset1(1.0f), zero = vzero();
        for (; i + VW <= d; i += VW) {
            vec gv = vload(g + i);
            vec silu = vdiv(gv, vadd(one, vexp(vsub(zero, gv))));
            vstore(o + i, vmul(silu, vload(u + i)));
        }
#endif
        for (; i < d; i++) o[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
    }
    return 0;
}
