/* What the CPU kernels share: the instruction set they are built for, one vector type over
 * it, a horizontal sum, exp and a prefetch.
 *
 * forkless/cpu_kernels builds these sources once per ISA level (-march=x86-64-v4 plus the
 * AVX-512 extensions the CPU has, -march=x86-64-v3, or the compiler's default target) and
 * loads the one chosen at start-up. The kernels are written once over `vec`, VW float32
 * lanes wide: a 512-bit register (16 lanes) where the compiler targets AVX-512, a 256-bit
 * one (8 lanes) where it targets AVX2 + FMA; without either (FORKLESS_SIMD undefined) they
 * take their plain C loops. */
#ifndef FORKLESS_CPU_COMMON_H
#define FORKLESS_CPU_COMMON_H

#include <stdint.h>
#include <stddef.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define FORKLESS_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define FORKLESS_AVX512 1
#endif
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Built with -fopenmp (gcc), the kernels share the OpenMP runtime torch has loaded (same
 * soname, so the same instance and threads, sized by torch.set_num_threads); without it
 * the pragmas are ignored and everything runs on the calling thread. Less work than this
 * (multiply-adds, or elements) is not worth waking the other threads for. */
#define FORKLESS_PARALLEL_MIN_MACS (1 << 22)
#define FORKLESS_PARALLEL_MIN_ELEMENTS (1 << 16)
/* A linear layer of this many weights or more is split over the threads even at one row,
 * where reading the weights is the cost and two threads read them faster than one. */
#define FORKLESS_PARALLEL_MIN_WEIGHTS (1 << 18)

/* The level the code was compiled for: forkless checks that the library it loaded is the
 * one it asked for. */
#if defined(FORKLESS_AVX512)
#define FORKLESS_ISA_NAME "avx512"
#elif defined(FORKLESS_AVX2)
#define FORKLESS_ISA_NAME "avx2"
#else
#define FORKLESS_ISA_NAME "portable"
#endif

#ifdef FORKLESS_AVX2
#define FORKLESS_SIMD 1

ALWAYS_INLINE float hsum8(__m256 v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}
#endif

#if defined(FORKLESS_AVX512)
typedef __m512 vec;
#define VW 16
ALWAYS_INLINE vec vload(const float *p) { return _mm512_loadu_ps(p); }
ALWAYS_INLINE void vstore(float *p, vec v) { _mm512_storeu_ps(p, v); }
ALWAYS_INLINE vec vset1(float x) { return _mm512_set1_ps(x); }
ALWAYS_INLINE vec vzero(void) { return _mm512_setzero_ps(); }
ALWAYS_INLINE vec vadd(vec a, vec b) { return _mm512_add_ps(a, b); }
ALWAYS_INLINE vec vsub(vec a, vec b) { return _mm512_sub_ps(a, b); }
ALWAYS_INLINE vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
ALWAYS_INLINE vec vdiv(vec a, vec b) { return _mm512_div_ps(a, b); }
ALWAYS_INLINE vec vmax(vec a, vec b) { return _mm512_max_ps(a, b); }
ALWAYS_INLINE vec vmin(vec a, vec b) { return _mm512_min_ps(a, b); }
ALWAYS_INLINE vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
ALWAYS_INLINE vec vfnma(vec a, vec b, vec c) { return _mm512_fnmadd_ps(a, b, c); }
ALWAYS_INLINE vec vfloor(vec a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
ALWAYS_INLINE float vhsum(vec v) { return _mm512_reduce_add_ps(v); }
ALWAYS_INLINE float vhmax(vec v) { return _mm512_reduce_max_ps(v); }
/* 2^n for integral n (as floats), by the exponent field. */
ALWAYS_INLINE vec vpow2i(vec n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23));
}
/* Lanes of x where a > b replaced by y. */
ALWAYS_INLINE vec vreplace_gt(vec x, vec a, vec b, vec y) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_GT_OQ), x, y);
}
/* Lanes of e where x == y zeroed. */
ALWAYS_INLINE vec vzero_eq(vec e, vec x, vec y) { return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, y, _CMP_NEQ_UQ), e); }
/* Bit i set where lane i of a is NaN / where a and b's lanes i are equal (not NaN). */
ALWAYS_INLINE unsigned vnan_bits(vec a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
ALWAYS_INLINE unsigned veq_bits(vec a, vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
#elif defined(FORKLESS_AVX2)
typedef __m256 vec;
#define VW 8
ALWAYS_INLINE vec vload(const float *p) { return _mm256_loadu_ps(p); }
ALWAYS_INLINE void vstore(float *p, vec v) { _mm256_storeu_ps(p, v); }
ALWAYS_INLINE vec vset1(float x) { return _mm256_set1_ps(x); }
ALWAYS_INLINE vec vzero(void) { return _mm256_setzero_ps(); }
ALWAYS_INLINE vec vadd(vec a, vec b) { return _mm256_add_ps(a, b); }
ALWAYS_INLINE vec vsub(vec a, vec b) { return _mm256_sub_ps(a, b); }
ALWAYS_INLINE vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
ALWAYS_INLINE vec vdiv(vec a, vec b) { return _mm256_div_ps(a, b); }
ALWAYS_INLINE vec vmax(vec a, vec b) { return _mm256_max_ps(a, b); }
ALWAYS_INLINE vec vmin(vec a, vec b) { return _mm256_min_ps(a, b); }
ALWAYS_INLINE vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
ALWAYS_INLINE vec vfnma(vec a, vec b, vec c) { return _mm256_fnmadd_ps(a, b, c); }
ALWAYS_INLINE vec vfloor(vec a) { return _mm256_floor_ps(a); }
ALWAYS_INLINE float vhsum(vec v) { return hsum8(v); }
ALWAYS_INLINE float vhmax(vec v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}
ALWAYS_INLINE vec vpow2i(vec n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
}
ALWAYS_INLINE vec vreplace_gt(vec x, vec a, vec b, vec y) { return _mm256_blendv_ps(x, y, _mm256_cmp_ps(a, b, _CMP_GT_OQ)); }
ALWAYS_INLINE vec vzero_eq(vec e, vec x, vec y) { return _mm256_andnot_ps(_mm256_cmp_ps(x, y, _CMP_EQ_OQ), e); }
ALWAYS_INLINE unsigned vnan_bits(vec a) { return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q)); }
ALWAYS_INLINE unsigned veq_bits(vec a, vec b) { return (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_EQ_OQ)); }
#else
/* The plain loops' width, where a kernel's layout is in vectors. */
#define VW 8
#endif

#ifdef FORKLESS_SIMD
/* exp(x), Cephes' single-precision polynomial: within 2 ulp for |x| <= 87; the input is
 * clamped to [-87, 88], where exp is ~1e-38 and ~1.7e38 (softmax and SiLU never need more). */
ALWAYS_INLINE vec vexp(vec x) {
    x = vmin(vmax(x, vset1(-87.0f)), vset1(88.0f));
    vec fx = vfloor(vfma(x, vset1(1.44269504088896341f), vset1(0.5f)));
    x = vfnma(fx, vset1(0.693359375f), x);
    x = vfnma(fx, vset1(-2.12194440e-4f), x);
    vec z = vmul(x, x);
    vec y = vset1(1.9875691500e-4f);
    y = vfma(y, x, vset1(1.3981999507e-3f));
    y = vfma(y, x, vset1(8.3334519073e-3f));
    y = vfma(y, x, vset1(4.1665795894e-2f));
    y = vfma(y, x, vset1(1.6666665459e-1f));
    y = vfma(y, x, vset1(5.0000001201e-1f));
    y = vfma(y, z, x);
    y = vadd(y, vset1(1.0f));
    return vmul(y, vpow2i(fx));
}
#endif

/* A bfloat16 is the top half of a float32: widening is a shift. */
ALWAYS_INLINE float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

/* Narrowing rounds to nearest, ties to even, as torch's float -> bfloat16 conversion; a NaN
 * stays a (quiet) NaN. */
ALWAYS_INLINE uint16_t f32_to_bf16(float f) {
    union { float f; uint32_t u; } v = {f};
    if ((v.u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((v.u >> 16) | 0x40u);
    return (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}

#if defined(FORKLESS_AVX512)
ALWAYS_INLINE vec vload_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
/* The bfloat16 bits of each lane, rounded as f32_to_bf16, in the low half of 32-bit lanes. */
ALWAYS_INLINE __m512i vbf16_bits(vec v) {
    __m512i u = _mm512_castps_si512(v), hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), _mm512_and_si512(hi, _mm512_set1_epi32(1)))), 16);
    return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
}
ALWAYS_INLINE void vstore_bf16(uint16_t *p, vec v) {
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(vbf16_bits(v)));
}
/* v rounded to bfloat16 precision, kept as float32. */
ALWAYS_INLINE vec vround_bf16(vec v) { return _mm512_castsi512_ps(_mm512_slli_epi32(vbf16_bits(v), 16)); }
#elif defined(FORKLESS_AVX2)
ALWAYS_INLINE vec vload_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
ALWAYS_INLINE __m256i vbf16_bits(vec v) {
    __m256i u = _mm256_castps_si256(v), hi = _mm256_srli_epi32(u, 16);
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), _mm256_and_si256(hi, _mm256_set1_epi32(1)))), 16);
    return _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)),
                              _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
ALWAYS_INLINE void vstore_bf16(uint16_t *p, vec v) {
    /* packus keeps each 128-bit half's four values; qwords 0 and 2 are the eight in order. */
    __m256i b = vbf16_bits(v);
    _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(b, b), 0x08)));
}
ALWAYS_INLINE vec vround_bf16(vec v) { return _mm256_castsi256_ps(_mm256_slli_epi32(vbf16_bits(v), 16)); }
#endif

/* Tensors (a paged KV cache, activations) of float32 (bf16 == 0) or bfloat16 (bf16 == 1)
 * elements, read and written as float32: the flag is a constant after inlining, so each
 * entry point gets its own code. */
ALWAYS_INLINE const void *el_at(const void *base, int64_t i, int bf16) {
    return (const char *)base + i * (bf16 ? 2 : 4);
}
ALWAYS_INLINE float el_get(const void *row, int64_t i, int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)row)[i]) : ((const float *)row)[i];
}
ALWAYS_INLINE void el_put(void *row, int64_t i, float v, int bf16) {
    if (bf16)
        ((uint16_t *)row)[i] = f32_to_bf16(v);
    else
        ((float *)row)[i] = v;
}
/* v as the element type holds it (a no-op for float32): where a PyTorch op on bfloat16
 * tensors rounds its result. */
ALWAYS_INLINE float el_round(float v, int bf16) { return bf16 ? bf16_to_f32(f32_to_bf16(v)) : v; }
#ifdef FORKLESS_SIMD
ALWAYS_INLINE vec el_vload(const void *row, int64_t i, int bf16) {
    return bf16 ? vload_bf16((const uint16_t *)row + i) : vload((const float *)row + i);
}
ALWAYS_INLINE void el_vstore(void *row, int64_t i, vec v, int bf16) {
    if (bf16)
        vstore_bf16((uint16_t *)row + i, v);
    else
        vstore((float *)row + i, v);
}
ALWAYS_INLINE vec el_vround(vec v, int bf16) { return bf16 ? vround_bf16(v) : v; }
#endif

/* Ask for bytes [0, n) at p ahead of their use, into L1 (prefetcht0). */
ALWAYS_INLINE void prefetch_bytes(const void *p, int64_t n) {
    for (int64_t i = 0; i < n; i += 64) __builtin_prefetch((const char *)p + i, 0, 3);
}

/* The same into L2 only (prefetcht1): for reads scattered over memory, as a paged cache's
 * blocks are. A core has far fewer L1 miss buffers than L2 ones, and prefetches into L1
 * held them while their lines came from memory: decode attention over 64 sequences of
 * 300 tokens read the cache at 7.4 GB/s on one thread with prefetcht0 and 16.6 GB/s with
 * prefetcht1 (2-core Zen 4; 2 threads 14.1 -> 25.7 GB/s); on an Intel Xeon (the H200
 * machine's host) the two were alike at 1, 2 and 8 threads. The linear kernels' weight
 * streams, which the hardware prefetchers follow, keep prefetch_bytes (no faster here). */
ALWAYS_INLINE void prefetch_bytes_l2(const void *p, int64_t n) {
    for (int64_t i = 0; i < n; i += 64) __builtin_prefetch((const char *)p + i, 0, 2);
}

#endif
