/* What the CPU kernels share: AVX2 detection, a horizontal sum, exp and a prefetch. */
#ifndef FORKLESS_CPU_COMMON_H
#define FORKLESS_CPU_COMMON_H

#include <stdint.h>
#include <stddef.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define FORKLESS_AVX2 1
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Built with -fopenmp (gcc), the kernels share the OpenMP runtime torch has loaded (same
 * soname, so the same instance and threads, sized by torch.set_num_threads); without it
 * the pragmas are ignored and everything runs on the calling thread. Less work than this
 * (multiply-adds, or elements) is not worth waking the other threads for. */
#define FORKLESS_PARALLEL_MIN_MACS (1 << 22)
#define FORKLESS_PARALLEL_MIN_ELEMENTS (1 << 16)

#ifdef FORKLESS_AVX2
ALWAYS_INLINE float hsum8(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

/* exp(x), Cephes' single-precision polynomial: within 2 ulp for |x| <= 87; the input is
 * clamped to [-87, 88], where exp is ~1e-38 and ~1.7e38 (softmax and SiLU never need more). */
ALWAYS_INLINE __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, z, x);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
#endif

/* Ask for row t (row floats long) of next ahead of its use: a sequence's blocks are
 * scattered in the paged cache, so the hardware prefetcher cannot guess them. */
ALWAYS_INLINE void prefetch_row(const float *next, int64_t t, int64_t row) {
#ifdef FORKLESS_AVX2
    const char *p = (const char *)(next + t * row);
    for (int64_t i = 0; i < row * (int64_t)sizeof(float); i += 64) _mm_prefetch(p + i, _MM_HINT_T0);
#else
    (void)next;
    (void)t;
    (void)row;
#endif
}

#endif
