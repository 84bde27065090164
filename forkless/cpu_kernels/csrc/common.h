/* What the CPU kernels share: AVX2 detection and a horizontal sum. */
#ifndef FORKLESS_CPU_COMMON_H
#define FORKLESS_CPU_COMMON_H

#include <stdint.h>
#include <stddef.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define FORKLESS_AVX2 1
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

#ifdef FORKLESS_AVX2
ALWAYS_INLINE float hsum8(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}
#endif

#endif
