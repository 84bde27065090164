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
    unsigned nan = 0;
#ifdef FORKLESS_SIMD
    if (n >= VW) {
        vec vm = vset1(-INFINITY);
        for (; i + VW <= n; i += VW) {
            const vec v = vload(row + i);
            nan |= vnan_bits(v);
            vm = vmax(vm, v);
        }
        m = vhmax(vm);
    }
#endif
    for (; i < n; i++) {
        nan |= isnan(row[i]) != 0;
        m = row[i] > m ? row[i] : m;
    }
    if (nan) {  /* rare: the first NaN, found plainly */
        for (i = 0; i < n; i++)
            if (isnan(row[i])) return i;
    }
    i = 0;
#ifdef FORKLESS_SIMD
    for (const vec vm = vset1(m); i + VW <= n; i += VW) {
        const unsigned hit = veq_bits(vload(row + i), vm);
        if (hit) return i + __builtin_ctz(hit);
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
