// The AVX-512 kernels (16 floats per vector), compiled with -mavx512f -mavx512bw
// -mavx512vl -mfma -mf16c and run only when cpuid reports AVX512F+BW+VL (optim.cc
// checks). Partial vectors use masked loads (zero fill) and masked stores, so they run
// the very same instructions as full ones.
//
// bf16 rounding uses integer ops, not VCVTNE2PS2BF16: that instruction treats fp32
// subnormal inputs as zero (measured on this Zen 5: 0x00400000 -> 0x0000 where round to
// nearest even gives 0x0040), so it would make the AVX-512 path differ from the others.
// fp16 uses VCVTPS2PH with round-to-nearest-even, which matches convert.h bit for bit.
// Formula: include/strata/optim.h.
#include <immintrin.h>

#include <cstdint>

#include "cpu_optim/int8_templates.h"
#include "cpu_optim/kernel_templates.h"
#include "cpu_optim/kernels.h"

namespace strata::cpu_optim {
namespace {

struct Avx512Vec {
  static constexpr size_t kWidth = 16;
  using F = __m512;
  struct Tail {
    __mmask16 mask = 0xffff;
  };
  static Tail MakeTail(size_t count) { return Tail{static_cast<__mmask16>((1u << count) - 1u)}; }
  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static F Sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }

  template <bool kTail>
  static F LoadF32(const float* p, const Tail& t) {
    if constexpr (kTail) return _mm512_maskz_loadu_ps(t.mask, p);
    return _mm512_loadu_ps(p);
  }
  template <bool kTail>
  static __m256i Load16(const uint16_t* p, const Tail& t) {
    if constexpr (kTail) return _mm256_maskz_loadu_epi16(t.mask, p);
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  template <bool kTail>
  static void Store16(uint16_t* p, __m256i x, const Tail& t) {
    if constexpr (kTail) {
      _mm256_mask_storeu_epi16(p, t.mask, x);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x);
    }
  }
  template <bool kTail>
  static F LoadBf16(const uint16_t* p, const Tail& t) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(Load16<kTail>(p, t)), 16));
  }
  template <bool kTail>
  static F LoadFp16(const uint16_t* p, const Tail& t) {
    return _mm512_cvtph_ps(Load16<kTail>(p, t));
  }
  template <bool kTail>
  static void StoreF32(float* p, F x, const Tail& t) {
    if constexpr (kTail) {
      _mm512_mask_storeu_ps(p, t.mask, x);
    } else {
      _mm512_storeu_ps(p, x);
    }
  }
  template <bool kTail>
  static void StoreBf16(uint16_t* p, F x, const Tail& t) {
    const __m512i b = _mm512_castps_si512(x);
    const __m512i hi = _mm512_srli_epi32(b, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, is_nan, hi, _mm512_set1_epi32(0x40));
    Store16<kTail>(p, _mm512_cvtepi32_epi16(r), t);
  }
  template <bool kTail>
  static void StoreFp16(uint16_t* p, F x, const Tail& t) {
    Store16<kTail>(p, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), t);
  }
  template <bool kTail>
  static void StoreTrunc16(uint16_t* p, F x, const Tail& t) {
    Store16<kTail>(p, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16)), t);
  }
  using R = __m512i;
  static R RandomBits(uint32_t first, uint32_t key) { return Mix(LaneIndex(first + key)); }
  static R LaneIndex(uint32_t first) {
    return _mm512_add_epi32(
        _mm512_set1_epi32(static_cast<int>(first)),
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  }
  static R Mix(R x) {
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  }
  template <bool kHigh, bool kTail>
  static void StoreBf16Stochastic(uint16_t* p, F x, R r, const Tail& t) {
    const __m512i b = _mm512_castps_si512(x);
    const __m512i add =
        kHigh ? _mm512_srli_epi32(r, 16) : _mm512_and_si512(r, _mm512_set1_epi32(0xffff));
    __m512i out = _mm512_srli_epi32(_mm512_add_epi32(b, add), 16);
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    out = _mm512_mask_or_epi32(out, is_nan, _mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
    Store16<kTail>(p, _mm512_cvtepi32_epi16(out), t);
  }  // Integer lanes for int8_templates.h; a mask lane is all ones or 0.
  static R Bits(F x) { return _mm512_castps_si512(x); }
  static F FromBits(R x) { return _mm512_castsi512_ps(x); }
  static R And(R a, R b) { return _mm512_and_si512(a, b); }
  static R Or(R a, R b) { return _mm512_or_si512(a, b); }
  static R AndNot(R a, R b) { return _mm512_andnot_si512(a, b); }
  template <int kN>
  static R ShrL(R a) {
    return _mm512_srli_epi32(a, kN);
  }
  template <int kN>
  static R ShrA(R a) {
    return _mm512_srai_epi32(a, kN);
  }
  template <int kN>
  static R Shl(R a) {
    return _mm512_slli_epi32(a, kN);
  }
  static R AddI(R a, R b) { return _mm512_add_epi32(a, b); }
  static R SubI(R a, R b) { return _mm512_sub_epi32(a, b); }
  static R Set1I(uint32_t x) { return _mm512_set1_epi32(static_cast<int>(x)); }
  static R MinI(R a, R b) { return _mm512_min_epi32(a, b); }
  static R MaxI(R a, R b) { return _mm512_max_epi32(a, b); }
  static R AllOnes(__mmask16 m) { return _mm512_maskz_mov_epi32(m, _mm512_set1_epi32(-1)); }
  static R CmpGtI(R a, R b) { return AllOnes(_mm512_cmpgt_epi32_mask(a, b)); }
  static R CmpEqI(R a, R b) { return AllOnes(_mm512_cmpeq_epi32_mask(a, b)); }
  static R CmpLtF(F a, F b) { return AllOnes(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ)); }
  static F CvtI(R a) { return _mm512_cvtepi32_ps(a); }
  static R TruncI(F a) { return _mm512_cvttps_epi32(a); }
  static F FromHalf(R x) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x)); }
  // Once per block: through memory (GCC 12 warns inside _mm512_reduce_max_epi32).
  static uint32_t HMaxI(R a) {
    alignas(64) int32_t lanes[16];
    _mm512_store_si512(lanes, a);
    int32_t m = lanes[0];
    for (int32_t x : lanes) m = x > m ? x : m;
    return static_cast<uint32_t>(m);
  }
  template <bool kTail>
  static R LoadU8(const uint8_t* p, const Tail& t) {
    if constexpr (kTail) return _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(t.mask, p));
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  template <bool kTail>
  static void StoreU8(uint8_t* p, R x, const Tail& t) {
    const __m128i b = _mm512_cvtepi32_epi8(x);
    if constexpr (kTail) {
      _mm_mask_storeu_epi8(p, t.mask, b);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), b);
    }
  }
};

template <FloatFormat G>
void NormBlockAvx512(const void* grad, size_t begin, size_t end, double* sum_squares,
                     uint64_t* non_finite) {
  __m512d lo_acc = _mm512_setzero_pd();  // lanes 0-7
  __m512d hi_acc = _mm512_setzero_pd();  // lanes 8-15
  uint64_t bad = 0;
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  auto step = [&](__m512 x) {
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    lo_acc = _mm512_fmadd_pd(lo, lo, lo_acc);  // exact square: fma == add
    hi_acc = _mm512_fmadd_pd(hi, hi, hi_acc);
    const __m512i e = _mm512_and_si512(_mm512_castps_si512(x), exp_mask);
    bad += static_cast<uint64_t>(__builtin_popcount(_mm512_cmpeq_epi32_mask(e, exp_mask)));
  };
  size_t i = begin;
  const Avx512Vec::Tail full{};
  for (; i + 16 <= end; i += 16) step(LoadGrad<Avx512Vec, G, false>(grad, i, full));
  if (i < end) step(LoadGrad<Avx512Vec, G, true>(grad, i, Avx512Vec::MakeTail(end - i)));
  // l[i] + l[i+8]; + l[i+4]; + l[i+2]; l[0] + l[1] (ReduceNormLanes' tree).
  const __m512d s = _mm512_add_pd(lo_acc, hi_acc);
  const __m256d s4 = _mm256_add_pd(_mm512_castpd512_pd256(s), _mm512_extractf64x4_pd(s, 1));
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s4), _mm256_extractf128_pd(s4, 1));
  *sum_squares = _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
  *non_finite = bad;
}

void NormBlockDispatch(const void* grad, FloatFormat format, size_t begin, size_t end,
                       double* sum_squares, uint64_t* non_finite) {
  switch (format) {
    case FloatFormat::kFp32:
      return NormBlockAvx512<FloatFormat::kFp32>(grad, begin, end, sum_squares, non_finite);
    case FloatFormat::kBf16:
      return NormBlockAvx512<FloatFormat::kBf16>(grad, begin, end, sum_squares, non_finite);
    case FloatFormat::kFp16:
      return NormBlockAvx512<FloatFormat::kFp16>(grad, begin, end, sum_squares, non_finite);
  }
}

}  // namespace

const IsaKernels& Avx512Kernels() {
  static const IsaKernels kernels{CpuIsa::kAvx512,
                                  &AdamDispatch<Avx512Vec>,
                                  &TrafficDispatch<Avx512Vec>,
                                  &NormBlockDispatch,
                                  &ScaleDispatch<Avx512Vec>,
                                  &ConvertDispatch<Avx512Vec>,
                                  &AdamInt8Dispatch<Avx512Vec>,
                                  &TrafficInt8Dispatch<Avx512Vec>};
  return kernels;
}

}  // namespace strata::cpu_optim
