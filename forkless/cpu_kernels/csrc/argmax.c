/* Each row's argmax on the CPU: greedy sampling's last step over a vocabulary's logits.
 *
 * torch's max(dim=-1) / argmax(dim=-1) read a [35, 49152] float32 batch at ~7 GB/s on a
 * Zen 5 core (0.9 ms, ~1 % of a decode step; 0.12 ms for one row at batch 1); this reads
 * it at memory speed: one vector pass for the row's largest value (and whether it holds a
 * NaN), then a vector scan for the first lane equal to it.
 *
 * Invariant: the index torch.argmax gives, the first of equal largest values, a NaN
 * counted larger than any number (the first NaN's index), an all -inf row's 0.
 *
 * Built by forkless/cpu_kernels with the system C compiler and called through ctypes.
 */

#include <math.h>

#include "common.h"

static int64_t row_argmax(const float *row, int64_t n) {
    int64_t i = 0;
    float m = -INFINITY;
    int nan = 0;
#if defined(FORKLESS_AVX512)
    if (n >= VW) {
        vec vm = vset1(-INFINITY);
        __mmask16 unordered = 0;
        for (; i + VW <= n; i += VW) {
            const vec v = vload(row + i);
            unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            vm = vmax(vm, v);
        }
        nan = unordered != 0;
        m = vhmax(vm);
    }
#elif defined(FORKLESS_AVX2)
    if (n >= VW) {
        vec vm = vset1(-INFINITY), unordered = vzero();
        for (; i + VW <= n; i += VW) {
            const vec v = vload(row + i);
            unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            vm = vmax(vm, v);
        }
        nan = _mm256_movemask_ps(unordered) != 0;
        m = vhmax(vm);
    }
#endif
    for (; i < n; i++) {
        nan |= isnan(row[i]);
        m = row[i] > m ? row[i] : m;
    }
    if (nan) {  /* rare: the first NaN, found plainly */
        for (i = 0; i < n; i++)
            if (isnan(row[i])) return i;
    }
    i = 0;
#if defined(FORKLESS_AVX512)
    const vec vm = vset1(m);
    for (; i + VW <= n; i += VW) {
        const __mmask16 hit = _mm512_cmp_ps_mask(vload(row + i), vm, _CMP_EQ_OQ);
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
#elif defined(FORKLESS_AVX2)
    const vec vm = vset1(m);
    for (; i + VW <= n; i += VW) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(vload(row + i), vm, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
#endif
    for (; i < n; i++)
        if (row[i] == m) return i;
    return 0;  /* unreachable: m is one of the row's values */
}

/* out[r] = the argmax of x's row r (rows of n floats, ldx apart), rows split over the
 * threads. */
int forkless_row_argmax_f32(const float *x, int64_t ldx, int64_t *out, int rows, int64_t n) {
#pragma omp parallel for schedule(static) if ((int64_t)rows * n >= FORKLESS_PARALLEL_MIN_ELEMENTS)
    for (int r = 0; r < rows; r++) out[r] = row_argmax(x + (int64_t)r * ldx, n);
    return 0;
}
