// The AVX2 kernels (8 floats per vector), compiled with -mavx2 -mfma -mf16c and run only
// when cpuid reports those (optim.cc checks). Partial vectors at the end of a range go
// through a zero-filled stack buffer so they execute the very same vector instructions.
// bf16 rounding is done with integer ops (round to nearest even, NaN kept quiet);
// fp16 uses VCVTPS2PH with round-to-nearest-even, which matches convert.h bit for bit.
// Formula: include/strata/optim.h.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu_optim/convert.h"
#include "cpu_optim/int8_templates.h"
#include "cpu_optim/kernel_templates.h"
#include "cpu_optim/kernels.h"

namespace strata::cpu_optim {
namespace {

struct Avx2Vec {
  static constexpr size_t kWidth = 8;
  using F = __m256;
  struct Tail {
    size_t count = 8;
  };
  static Tail MakeTail(size_t count) { return Tail{count}; }
  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static F Sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }

  template <bool kTail>
  static F LoadF32(const float* p, const Tail& t) {
    if constexpr (kTail) {
      alignas(32) float buf[8] = {};
      std::memcpy(buf, p, t.count * sizeof(float));
      return _mm256_load_ps(buf);
    } else {
      return _mm256_loadu_ps(p);
    }
  }
  template <bool kTail>
  static __m128i Load16(const uint16_t* p, const Tail& t) {
    if constexpr (kTail) {
      alignas(16) uint16_t buf[8] = {};
      std::memcpy(buf, p, t.count * sizeof(uint16_t));
      return _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
    } else {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    }
  }
  template <bool kTail>
  static void Store16(uint16_t* p, __m128i x, const Tail& t) {
    if constexpr (kTail) {
      alignas(16) uint16_t buf[8];
      _mm_store_si128(reinterpret_cast<__m128i*>(buf), x);
      std::memcpy(p, buf, t.count * sizeof(uint16_t));
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), x);
    }
  }
  template <bool kTail>
  static F LoadBf16(const uint16_t* p, const Tail& t) {
    const __m256i w = _mm256_cvtepu16_epi32(Load16<kTail>(p, t));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  template <bool kTail>
  static F LoadFp16(const uint16_t* p, const Tail& t) {
    return _mm256_cvtph_ps(Load16<kTail>(p, t));
  }
  template <bool kTail>
  static void StoreF32(float* p, F x, const Tail& t) {
    if constexpr (kTail) {
      alignas(32) float buf[8];
      _mm256_store_ps(buf, x);
      std::memcpy(p, buf, t.count * sizeof(float));
    } else {
      _mm256_storeu_ps(p, x);
    }
  }
  // 8 x uint32 holding values <= 0xffff -> 8 x uint16.
  static __m128i Narrow(__m256i r) {
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }
  template <bool kTail>
  static void StoreBf16(uint16_t* p, F x, const Tail& t) {
    const __m256i b = _mm256_castps_si256(x);
    const __m256i hi = _mm256_srli_epi32(b, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i quiet_nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256i r = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet_nan), is_nan));
    Store16<kTail>(p, Narrow(r), t);
  }
  template <bool kTail>
  static void StoreFp16(uint16_t* p, F x, const Tail& t) {
    Store16<kTail>(p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), t);
  }
  template <bool kTail>
  static void StoreTrunc16(uint16_t* p, F x, const Tail& t) {
    Store16<kTail>(p, Narrow(_mm256_srli_epi32(_mm256_castps_si256(x), 16)), t);
  }
  using R = __m256i;
  static R RandomBits(uint32_t first, uint32_t key) { return Mix(LaneIndex(first + key)); }
  static R LaneIndex(uint32_t first) {
    return _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(first)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static R Mix(R x) {
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  }
  template <bool kHigh, bool kTail>
  static void StoreBf16Stochastic(uint16_t* p, F x, R r, const Tail& t) {
    const __m256i b = _mm256_castps_si256(x);
    const __m256i add =
        kHigh ? _mm256_srli_epi32(r, 16) : _mm256_and_si256(r, _mm256_set1_epi32(0xffff));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(b, add), 16);
    const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
    const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256i out = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet_nan), is_nan));
    Store16<kTail>(p, Narrow(out), t);
  }
  // Integer lanes for int8_templates.h; a mask lane is all ones or 0.
  static R Bits(F x) { return _mm256_castps_si256(x); }
  static F FromBits(R x) { return _mm256_castsi256_ps(x); }
  static R And(R a, R b) { return _mm256_and_si256(a, b); }
  static R Or(R a, R b) { return _mm256_or_si256(a, b); }
  static R AndNot(R a, R b) { return _mm256_andnot_si256(a, b); }
  template <int kN>
  static R ShrL(R a) {
    return _mm256_srli_epi32(a, kN);
  }
  template <int kN>
  static R ShrA(R a) {
    return _mm256_srai_epi32(a, kN);
  }
  template <int kN>
  static R Shl(R a) {
    return _mm256_slli_epi32(a, kN);
  }
  static R AddI(R a, R b) { return _mm256_add_epi32(a, b); }
  static R SubI(R a, R b) { return _mm256_sub_epi32(a, b); }
  static R Set1I(uint32_t x) { return _mm256_set1_epi32(static_cast<int>(x)); }
  static R MinI(R a, R b) { return _mm256_min_epi32(a, b); }
  static R MaxI(R a, R b) { return _mm256_max_epi32(a, b); }
  static R CmpGtI(R a, R b) { return _mm256_cmpgt_epi32(a, b); }
  static R CmpEqI(R a, R b) { return _mm256_cmpeq_epi32(a, b); }
  static R CmpLtF(F a, F b) { return _mm256_castps_si256(_mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
  static F CvtI(R a) { return _mm256_cvtepi32_ps(a); }
  static R TruncI(F a) { return _mm256_cvttps_epi32(a); }
  static uint32_t HMaxI(R a) {
    const __m128i h = _mm_max_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    const __m128i q = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    return static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_max_epi32(q, _mm_shuffle_epi32(q, 0xb1))));
  }
  template <bool kTail>
  static R LoadU8(const uint8_t* p, const Tail& t) {
    if constexpr (kTail) {
      alignas(16) uint8_t buf[16] = {};
      std::memcpy(buf, p, t.count);
      return _mm256_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(buf)));
    } else {
      return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    }
  }
  // Lanes hold values <= 0xff (the kernels mask them): both packs are exact.
  template <bool kTail>
  static void StoreU8(uint8_t* p, R x, const Tail& t) {
    const __m128i w = Narrow(x);
    const __m128i b = _mm_packus_epi16(w, w);
    if constexpr (kTail) {
      alignas(16) uint8_t buf[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(buf), b);
      std::memcpy(p, buf, t.count);
    } else {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(p), b);
    }
  }
  // The value of an fp16 in each lane (bits <= 0xffff).
  static F FromHalf(R x) { return _mm256_cvtph_ps(Narrow(x)); }
  // Four vectors of int8 codes (32 bytes) -> their values (int8_templates.h, Int8Half): each
  // half of the codes widened to 16 bits, made a half in place, and converted by F16C.
  template <bool kSigned>
  static void ValuesU8x4(const uint8_t* p, F* out) {
    for (int h = 0; h < 2; ++h) {
      __m256i w =
          _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
      if constexpr (kSigned) {
        w = _mm256_add_epi16(w, _mm256_and_si256(w, _mm256_set1_epi16(0x80)));
        w = _mm256_slli_epi16(w, 7);
      } else {
        w = _mm256_slli_epi16(w, 6);
      }
      out[2 * h] = _mm256_cvtph_ps(_mm256_castsi256_si128(w));
      out[2 * h + 1] = _mm256_cvtph_ps(_mm256_extracti128_si256(w, 1));
    }
  }
  // Four vectors of codes (>= 0, saturated to 0xff) -> 32 bytes in order: the packs
  // interleave the vectors' 4-byte groups by 128-bit lane (x0 lo, x1 lo, x2 lo, x3 lo | x0 hi,
  // ...), the permute puts them back. Signed: bit 7 from y's sign, by signed packs of y's bits
  // (a negative lane saturates to 0x80, a non-negative one to 0..0x7f) in the same order.
  static __m256i PackU8x4(const R* x) {
    return _mm256_packus_epi16(_mm256_packus_epi32(x[0], x[1]), _mm256_packus_epi32(x[2], x[3]));
  }
  static void StoreOrderedU8x4(uint8_t* p, __m256i b) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permutevar8x32_epi32(b, order));
  }
  static void StoreU8x4(uint8_t* p, const R* x) { StoreOrderedU8x4(p, PackU8x4(x)); }
  static void StoreSignedU8x4(uint8_t* p, const R* x, const R* y) {
    const __m256i signs =
        _mm256_packs_epi16(_mm256_packs_epi32(y[0], y[1]), _mm256_packs_epi32(y[2], y[3]));
    const __m256i sign_bits = _mm256_and_si256(signs, _mm256_set1_epi8(static_cast<char>(0x80)));
    StoreOrderedU8x4(p, _mm256_or_si256(PackU8x4(x), sign_bits));
  }
};

// 16 consecutive elements -> the 16 norm lanes held in four registers of 4 doubles
// (lanes 0-3, 4-7, 8-11, 12-15). Squares of floats are exact in double, so fma == add.
inline void NormStep(__m256 x0, __m256 x1, __m256d* acc, __m256i* bad) {
  const __m256d d[4] = {
      _mm256_cvtps_pd(_mm256_castps256_ps128(x0)), _mm256_cvtps_pd(_mm256_extractf128_ps(x0, 1)),
      _mm256_cvtps_pd(_mm256_castps256_ps128(x1)), _mm256_cvtps_pd(_mm256_extractf128_ps(x1, 1))};
  for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_pd(d[k], d[k], acc[k]);
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  for (__m256 x : {x0, x1}) {
    const __m256i e = _mm256_and_si256(_mm256_castps_si256(x), exp_mask);
    *bad = _mm256_sub_epi32(*bad, _mm256_cmpeq_epi32(e, exp_mask));  // -(-1) per lane
  }
}

template <FloatFormat G>
void NormBlockAvx2(const void* grad, size_t begin, size_t end, double* sum_squares,
                   uint64_t* non_finite) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  __m256i bad = _mm256_setzero_si256();
  size_t i = begin;
  const Avx2Vec::Tail full{};
  for (; i + 16 <= end; i += 16) {
    NormStep(LoadGrad<Avx2Vec, G, false>(grad, i, full),
             LoadGrad<Avx2Vec, G, false>(grad, i + 8, full), acc, &bad);
  }
  if (i < end) {  // zero-filled lanes add exactly 0.0 and are finite
    const size_t left = end - i;
    const __m256 x0 = LoadGrad<Avx2Vec, G, true>(grad, i, Avx2Vec::MakeTail(left < 8 ? left : 8));
    const __m256 x1 = left > 8
                          ? LoadGrad<Avx2Vec, G, true>(grad, i + 8, Avx2Vec::MakeTail(left - 8))
                          : _mm256_setzero_ps();
    NormStep(x0, x1, acc, &bad);
  }
  // l[i] + l[i+8]: lanes 0-3 and 4-7; then + l[i+4]; then + l[i+2]; then l[0] + l[1].
  const __m256d s = _mm256_add_pd(_mm256_add_pd(acc[0], acc[2]), _mm256_add_pd(acc[1], acc[3]));
  const __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  *sum_squares = _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
  alignas(32) uint32_t counts[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(counts), bad);
  uint64_t total = 0;
  for (uint32_t c : counts) total += c;
  *non_finite = total;
}

void NormBlockDispatch(const void* grad, FloatFormat format, size_t begin, size_t end,
                       double* sum_squares, uint64_t* non_finite) {
  switch (format) {
    case FloatFormat::kFp32:
      return NormBlockAvx2<FloatFormat::kFp32>(grad, begin, end, sum_squares, non_finite);
    case FloatFormat::kBf16:
      return NormBlockAvx2<FloatFormat::kBf16>(grad, begin, end, sum_squares, non_finite);
    case FloatFormat::kFp16:
      return NormBlockAvx2<FloatFormat::kFp16>(grad, begin, end, sum_squares, non_finite);
  }
}

}  // namespace

const IsaKernels& Avx2Kernels() {
  static const IsaKernels kernels{CpuIsa::kAvx2,
                                  &AdamDispatch<Avx2Vec>,
                                  &TrafficDispatch<Avx2Vec>,
                                  &NormBlockDispatch,
                                  &ScaleDispatch<Avx2Vec>,
                                  &ConvertDispatch<Avx2Vec>,
                                  &AdamInt8Dispatch<Avx2Vec>,
                                  &TrafficInt8Dispatch<Avx2Vec>};
  return kernels;
}

}  // namespace strata::cpu_optim
