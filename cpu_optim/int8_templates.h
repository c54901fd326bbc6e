// The int8 moments (StateFormat::kInt8): block-wise quantization of exp_avg and of
// sqrt(exp_avg_sq) after Dettmers et al., "8-bit Optimizers via Block-wise Quantization"
// (2022), written once over the vector traits of kernel_templates.h and instantiated by
// each ISA's translation unit, so every ISA performs the same operations: same bits.
//
// The maps (include/strata/optim.h, "int8 moments"; docs/design.md says why these):
//   exp_avg:        code = s EEEE MMM; value = (-1)^s 2^(E-15) (1 + M/8) * absmax
//   sqrt(exp_avg_sq): code = EEEE MMMM; value = 2^(E-15) (1 + M/16) * absmax
// (E = 0: 2^-14 * M/8 or M/16, fp16's subnormals; the quantizer writes only M = 0 there)
// i.e. dynamic-exponent maps (a 4-bit exponent covers 2^-14..1 of the block's absmax) with
// 3 and 4 bits of linear fraction. Quantizing is integer work on the float bits of
// y = x * (1 / absmax): add random bits below the kept fraction (stochastic rounding, the
// bits of include/strata/optim.h) and truncate. Below 2^-14 (the smallest code):
// exp_avg rounds stochastically between 0 and 2^-14 (unbiased); sqrt(exp_avg_sq) rounds
// any non-zero value up to 2^-14, so a quantized denominator is never 0 where the true one
// is not (an update m / (0 + eps) would be enormous).
//
// The fused pass (AdamInt8Block): per block of kInt8StateBlock elements, a first loop
// streams grad and codes, reads the codes' values and computes the new m and v with the
// block's scales folded into the constants (Int8Moments), keeping m and sqrt(v) in an L1
// scratch together with their running absmax; a second loop streams the master, applies
// the update from the scratch (AdamApply, the second half of AdamVector's formula, with the
// bias correction folded into its constants: one division), writes master and copy, and
// requantizes.
// DRAM sees each array once. The absmax is an integer max over |bits|, exact and
// order-independent (a NaN, whose bits are the largest, propagates into the scale).
//
// V adds to kernel_templates.h's traits (I = R, a vector of uint32):
//   Bits(F), FromBits(I), And, Or, AndNot(a, b) = ~a & b, ShrL<n>, ShrA<n> (arithmetic),
//   Shl<n>, AddI, SubI, Set1I, MinI, MaxI (signed), CmpGtI(a, b) (signed, all-ones lanes),
//   CmpEqI, CmpLtF, CvtI (int32 -> float), TruncI (float -> int32, truncating), FromHalf
//   (the value of the fp16 bits in each lane), HMaxI (max over lanes), LoadU8<kTail>(ptr,
//   tail) (zero-extended), StoreU8<kTail>(ptr, x, tail) (low byte); optionally StoreU8x4(ptr,
//   x[4]) (four vectors of values >= 0, each saturated to 255) with StoreSignedU8x4(ptr, x[4],
//   y[4]) (the same, bit 7 set where y's bit 31 is: Int8Code in one pass; kStoresU8x4) and
//   ValuesU8x4<signed>(ptr, out[4]) (four vectors of codes' values, Int8Value; kDecodesU8x4).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "cpu_optim/convert.h"
#include "cpu_optim/kernel_templates.h"
#include "cpu_optim/kernels.h"

namespace strata::cpu_optim {
namespace {

// The two maps: kMant fraction bits, signed (exp_avg) or not (sqrt(exp_avg_sq)).
template <int kFractionBits, bool kHasSign>
struct Int8Map {
  static constexpr int kMant = kFractionBits;
  static constexpr bool kSigned = kHasSign;
  static constexpr int kDrop = 23 - kMant;  // fp32 fraction bits dropped
};
using ExpAvgMap = Int8Map<3, true>;
using ExpAvgSqMap = Int8Map<4, false>;
// Rounding bits that make Int8Quantize round to nearest (ties up): half of the dropped
// fraction after RoundingAddend, and an underflow threshold just above 1/2. For
// conversions, not for steps.
constexpr uint32_t kNearestBitsExpAvg = 0x80080000u;
constexpr uint32_t kNearestBitsExpAvgSq = 0x80000000u;

template <class V>
inline typename V::R Mask(typename V::R m, uint32_t bits) {
  return V::And(m, V::Set1I(bits));
}

template <class V>
inline typename V::R Select(typename V::R mask, typename V::R a, typename V::R b) {
  return V::Or(V::And(mask, a), V::AndNot(mask, b));
}

// The random bits a map adds below its kept fraction: exp_avg the low 20 of r,
// sqrt(exp_avg_sq) the high 19 (r >> 13).
template <class V, class Map>
inline typename V::R RoundingAddend(typename V::R r) {
  if constexpr (Map::kSigned) {
    return Mask<V>(r, (1u << Map::kDrop) - 1u);
  } else {
    return V::template ShrL<32 - Map::kDrop>(r);
  }
}
template <class Map>
constexpr uint32_t RoundingAddendOf(uint32_t r) {
  return Map::kSigned ? r & ((1u << Map::kDrop) - 1u) : r >> (32 - Map::kDrop);
}

// The magnitude of the code of y (b: y's bits, y = x * (1 / absmax)) given per-lane random
// bits r (see the header), before saturation: >= 0, and above the largest code only for
// NaN or infinity (Int8Code and the stores saturate it to 255). The rounded magnitude's
// bits >> kDrop are (exponent << kMant) | fraction, so the code of a normal value is that
// less the rebias (127 - 15) << kMant; the rebias is subtracted before an arithmetic shift,
// so nearest rounding adds one folded constant. kNearest: r is the constant of nearest
// rounding, folded at compile time (the same values as passing it in r).
// Below 2^-14 the normal formula yields at most the smallest code (rounding can carry into
// it) and at most 0 where the tiny rule gives 0, except for exp_avg's random threshold; so
// max(normal, tiny) is the select whenever the tiny rule is not random (one op instead of
// four). exp_avg's threshold test y * 2^14 > t is y > t * 2^-14 (exact power-of-two scaling):
// an integer compare of the bits when t is a constant. sqrt(exp_avg_sq) is >= +0 or NaN, so
// its bits are not masked: a NaN with the sign bit compares below 0 and yields code 0 (its
// block's scale is NaN all the same).
template <class V, class Map, bool kNearest = false>
inline typename V::R Int8Magnitude(typename V::R b, typename V::R r) {
  using I = typename V::R;
  constexpr uint32_t kNearestBits = Map::kSigned ? kNearestBitsExpAvg : kNearestBitsExpAvgSq;
  constexpr uint32_t kRebias = 112u << 23;
  constexpr uint32_t kSmallest = 1u << Map::kMant;  // the code of 2^-14
  const I a = Map::kSigned ? Mask<V>(b, 0x7fffffffu) : b;
  const I biased = kNearest ? V::AddI(a, V::Set1I(RoundingAddendOf<Map>(kNearestBits) - kRebias))
                            : V::AddI(V::SubI(a, V::Set1I(kRebias)), RoundingAddend<V, Map>(r));
  const I normal = V::template ShrA<Map::kDrop>(biased);
  if constexpr (!Map::kSigned) {  // any non-zero value up to 2^-14
    return V::MaxI(normal, Mask<V>(V::CmpGtI(a, V::Set1I(0)), kSmallest));
  } else if constexpr (kNearest) {  // up where y * 2^14 > the constant threshold
    constexpr uint32_t kThreshold =
        std::bit_cast<uint32_t>(static_cast<float>(kNearestBits >> 8) * 0x1p-38f);
    return V::MaxI(normal, Mask<V>(V::CmpGtI(a, V::Set1I(kThreshold)), kSmallest));
  } else {  // stochastic between 0 and 2^-14: up with p = y * 2^14
    const typename V::F thr = V::Mul(V::CvtI(V::template ShrL<8>(r)), V::Set1(0x1p-38f));
    const I tiny = Mask<V>(V::CmpLtF(thr, V::FromBits(a)), kSmallest);
    return Select<V>(V::CmpGtI(a, V::Set1I(0x387fffffu)), normal, tiny);
  }
}

// The code from its magnitude: saturated to 255 (NaN and infinity; every finite y <= 1 has
// a code <= 0x79), exp_avg's sign (y's bit 31) in bit 7.
template <class V, class Map>
inline typename V::R Int8Code(typename V::R magnitude, typename V::R b) {
  const typename V::R code = V::MinI(magnitude, V::Set1I(0xffu));
  if constexpr (!Map::kSigned) return code;
  return V::Or(code, Mask<V>(V::template ShrL<24>(b), 0x80u));
}

// The code of x given inv = 1 / absmax and random bits r.
template <class V, class Map, bool kNearest = false>
inline typename V::R Int8Quantize(typename V::F x, typename V::F inv, typename V::R r) {
  const typename V::R b = V::Bits(V::Mul(x, inv));
  return Int8Code<V, Map>(Int8Magnitude<V, Map, kNearest>(b, r), b);
}

// The fp16 bits whose value is a code's (absmax 1): exp_avg's s EEEE MMM is the half
// s 0EEEE MMM0000000 (the add moves the sign from bit 14 to 15), sqrt(exp_avg_sq)'s EEEE MMMM
// the half 00EEEE MMMM000000. So E = 0 is fp16's subnormal range: 2^-14 * M / 2^kMant
// (codes the quantizer never writes but M = 0).
template <class V, class Map>
inline typename V::R Int8Half(typename V::R code) {
  if constexpr (Map::kSigned) {
    return V::template Shl<7>(V::AddI(code, Mask<V>(code, 0x80u)));
  } else {
    return V::template Shl<6>(code);
  }
}

// value of a code (absmax 1).
template <class V, class Map>
inline typename V::F Int8Value(typename V::R code) {
  return V::FromHalf(Int8Half<V, Map>(code));
}

// value of a code times absmax.
template <class V, class Map>
inline typename V::F Int8Dequantize(typename V::R code, typename V::F absmax) {
  return V::Mul(Int8Value<V, Map>(code), absmax);
}

// The same values for four vectors of codes at once (V::ValuesU8x4, kDecodesU8x4): AVX2
// widens 32 codes to 16-bit halves in two registers and converts them with F16C.
template <class V>
inline constexpr bool kDecodesU8x4 = requires(const uint8_t* p, typename V::F* out) {
  V::template ValuesU8x4<true>(p, out);
};

// Int8Value of the 4 * kWidth codes at `codes` into out[0..3] (kDecodesU8x4 ISAs).
template <class V, class Map>
inline void Int8Values4(const uint8_t* codes, typename V::F* out) {
  V::template ValuesU8x4<Map::kSigned>(codes, out);
}

// 1 / absmax as every ISA computes it (scalar float division); 0 for an all-zero block.
inline float InverseScale(float absmax) { return absmax > 0.0f ? 1.0f / absmax : 0.0f; }

// The 64-byte line at p into L1 (a hint: never faults, also past an array's end). Inline asm
// because GCC 12 dropped every __builtin_prefetch of these kernels from the object code.
inline void PrefetchLine(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p);
#endif
}

// Prefetches the lines of element `target` of an array of `bytes`-wide elements whose first
// byte starts a line among the `step` elements ending at target (each line once per sweep).
inline void PrefetchStep(const void* base, size_t bytes, size_t target, size_t step) {
  if ((target * bytes) % 64 < step * bytes) {
    PrefetchLine(static_cast<const char*>(base) + target * bytes);
  }
}

// Software prefetch of the next block, in two forms (docs/design.md, "int8 moments"):
// - AVX-512 (kInt8Prefetch, the layout of the first kernel, whose requantizing loop touched
//   only L1): on the AVX-512 Xeon the hardware prefetchers alone left DRAM idle half of the
//   time, so both loops prefetch the next block, half a vector's elements per iteration: the
//   first loop its first half, the second loop its second half.
// - AVX2 (PrefetchAhead below, in the four-vector loops): each iteration asks for the lines at
//   the same offset one block ahead, the streams its loop reads, at constant displacements.
//   The AVX-512 form's address arithmetic cost about a quarter of the kernel's speed on the
//   AVX2 EPYC (Zen 3); this one costs nothing measurable in cache and gains from DRAM.
// The scalar kernel never prefetches.
template <class V>
inline constexpr bool kInt8Prefetch = V::kWidth == 16;
template <class V, FloatFormat G, ParamOut O, MasterStore P>
inline void PrefetchNext(const AdamArgs& a, size_t target) {
  constexpr size_t kStep = V::kWidth / 2;
  if constexpr (P == MasterStore::kF32) {
    PrefetchStep(a.master, 4, target, kStep);
  } else {
    PrefetchStep(a.master16, 2, target, kStep);
    if constexpr (P == MasterStore::kBf16Kahan) PrefetchStep(a.comp, 2, target, kStep);
  }
  PrefetchStep(a.grad, G == FloatFormat::kFp32 ? 4 : 2, target, kStep);
  if constexpr (O != ParamOut::kNone) PrefetchStep(a.param_out, 2, target, kStep);
  PrefetchStep(a.exp_avg, 1, target, kStep);
  PrefetchStep(a.exp_avg_sq, 1, target, kStep);
}

// The lines one block ahead of the four vectors at i: grad and both codes (the first loop's
// streams; a code line is asked for twice), then the master (the second loop's).
template <class V, FloatFormat G>
inline void PrefetchAhead(const AdamArgs& a, size_t i) {
  constexpr size_t kG = G == FloatFormat::kFp32 ? 4 : 2;
  const size_t next = i + kInt8StateBlock;
  const auto* grad = static_cast<const char*>(a.grad) + next * kG;
  for (size_t off = 0; off < 4 * V::kWidth * kG; off += 64) PrefetchLine(grad + off);
  PrefetchLine(static_cast<const uint8_t*>(a.exp_avg) + next);
  PrefetchLine(static_cast<const uint8_t*>(a.exp_avg_sq) + next);
}
template <class V, MasterStore P>
inline void PrefetchMasterAhead(const AdamArgs& a, size_t j) {
  const size_t next = j + kInt8StateBlock;
  if constexpr (P == MasterStore::kF32) {
    for (size_t off = 0; off < 4 * V::kWidth * 4; off += 64)
      PrefetchLine(a.master + next + off / 4);
  } else {
    for (size_t off = 0; off < 4 * V::kWidth * 2; off += 64)
      PrefetchLine(a.master16 + next + off / 2);
  }
}

// Whether V stores the codes of four vectors at once (StoreU8x4(ptr, const R[4]), 4 * kWidth
// bytes): AVX2 packs them with three saturating packs and a permute instead of three
// shuffles each, and the saturation is Int8Code's (exp_avg's signs: three more packs).
template <class V>
inline constexpr bool kStoresU8x4 = requires(uint8_t* p, const typename V::R* x) {
  V::StoreU8x4(p, x);
  V::StoreSignedU8x4(p, x, x);
};

// The new m and sqrt(v) of the int8 kernel (include/strata/optim.h, "int8 moments"), from the
// old codes' values with absmax 1, c_m, and t = c_u * (sqrt(b2) * s_u): the block's scales
// and the gradient scale are folded into the constants, which saves three multiplies of
// dequantizing and scaling first (the first loop is bound by its multiplies):
//   m = fma(c_m, b1 * s_m, ((1 - b1) * gs) * grad)
//   v = fma(h, h, t * t),  h = (sqrt(1 - b2) * gs) * grad
// Adam's L2 decay needs the scaled gradient itself: g = fma(wd, p, grad * gs), then
// (1 - b1) * g and sqrt(1 - b2) * g in place of the two folded products.
template <class V, AdamMode M>
inline void Int8Moments(const AdamConsts<V>& c, typename V::F grad, typename V::F c_m,
                        typename V::F m_coef, typename V::F t, typename V::F p, typename V::F* m,
                        typename V::F* sqrt_v) {
  using F = typename V::F;
  F gm, h;
  if constexpr (M == AdamMode::kAdam) {
    const F g = V::Fma(c.weight_decay, p, V::Mul(grad, c.grad_scale));
    gm = V::Mul(c.one_minus_beta1, g);
    h = V::Mul(c.sqrt_one_minus_beta2, g);
  } else {
    gm = V::Mul(c.one_minus_beta1_x_grad_scale, grad);
    h = V::Mul(c.sqrt_one_minus_beta2_x_grad_scale, grad);
  }
  *m = V::Fma(c_m, m_coef, gm);
  *sqrt_v = V::Sqrt(V::Fma(h, h, V::Mul(t, t)));
}

// The new m and sqrt(v) of a block, between its two loops (16 KiB: L1).
struct Int8Scratch {
  alignas(64) float m[kInt8StateBlock];
  alignas(64) float u[kInt8StateBlock];
};

// The first loop of AdamInt8Block: the codes' values, the new m and v (Int8Moments), the new
// m and sqrt(v) into the scratch, and the block's new scales (their absmax).
template <class V, FloatFormat G, ParamOut O, AdamMode M, MasterStore P>
void Int8MomentsLoop(const AdamArgs& a, const AdamConsts<V>& c, size_t block, size_t begin,
                     size_t end, Int8Scratch* scratch) {
  using F = typename V::F;
  using I = typename V::R;
  using Tail = typename V::Tail;
  const auto* m_code = static_cast<const uint8_t*>(a.exp_avg);
  const auto* u_code = static_cast<const uint8_t*>(a.exp_avg_sq);
  // The folded scales (Int8Moments), rounded once in float as on every ISA.
  const F m_coef = V::Set1(a.s.beta1 * a.exp_avg_scale[block]);
  const F u_coef = V::Set1(a.s.sqrt_beta2 * a.exp_avg_sq_scale[block]);
  I m_max = V::Set1I(0), u_max = V::Set1I(0);
  auto moments = [&](size_t i, const Tail& t, auto tail, F c_m, F u_old) {
    constexpr bool kTail = decltype(tail)::value;
    if constexpr (kInt8Prefetch<V>)
      PrefetchNext<V, G, O, P>(a, begin + kInt8StateBlock + (i - begin) / 2);
    const F grad = LoadGrad<V, G, kTail>(a.grad, i, t);
    F p{};
    if constexpr (M == AdamMode::kAdam) p = LoadMaster<V, P, kTail>(a, i, t);
    F m, sqrt_v;
    Int8Moments<V, M>(c, grad, c_m, m_coef, V::Mul(u_old, u_coef), p, &m, &sqrt_v);
    // Whole vectors into the scratch: lanes past a tail hold m = sqrt_v = 0 (zero loads).
    V::template StoreF32<false>(scratch->m + (i - begin), m, Tail{});
    V::template StoreF32<false>(scratch->u + (i - begin), sqrt_v, Tail{});
    m_max = V::MaxI(m_max, Mask<V>(V::Bits(m), 0x7fffffffu));
    u_max = V::MaxI(u_max, Mask<V>(V::Bits(sqrt_v), 0x7fffffffu));
  };
  auto one_vector = [&](size_t i, const Tail& t, auto tail) {
    constexpr bool kTail = decltype(tail)::value;
    moments(i, t, tail, Int8Value<V, ExpAvgMap>(V::template LoadU8<kTail>(m_code + i, t)),
            Int8Value<V, ExpAvgSqMap>(V::template LoadU8<kTail>(u_code + i, t)));
  };
  using False = std::false_type;
  using True = std::true_type;
  const Tail full{};
  size_t i = begin;
  if constexpr (kDecodesU8x4<V>) {
    for (; i + 4 * V::kWidth <= end; i += 4 * V::kWidth) {
      PrefetchAhead<V, G>(a, i);
      F m_old[4], u_old[4];
      Int8Values4<V, ExpAvgMap>(m_code + i, m_old);
      Int8Values4<V, ExpAvgSqMap>(u_code + i, u_old);
      for (size_t k = 0; k < 4; ++k) moments(i + k * V::kWidth, full, False{}, m_old[k], u_old[k]);
    }
  }
  for (; i + V::kWidth <= end; i += V::kWidth) one_vector(i, full, False{});
  if (i < end) one_vector(i, V::MakeTail(end - i), True{});

  a.exp_avg_scale[block] = BitsFloat(V::HMaxI(m_max));
  a.exp_avg_sq_scale[block] = BitsFloat(V::HMaxI(u_max));
}

// The second loop of AdamInt8Block: the weight update from the scratch (AdamApply, folded:
// the division), the master and the copy written, m and sqrt(v) requantized with the block's
// new scales.
template <class V, FloatFormat G, ParamOut O, AdamMode M, bool kNearest, MasterStore P>
void Int8ApplyLoop(const AdamArgs& a, const AdamConsts<V>& c, size_t block, size_t begin,
                   size_t end, const Int8Scratch& scratch) {
  using F = typename V::F;
  using I = typename V::R;
  using Tail = typename V::Tail;
  using False = std::false_type;
  using True = std::true_type;
  constexpr size_t kHalf = kInt8StateBlock / 2;
  constexpr bool kDelta = P == MasterStore::kBf16Kahan;
  const Tail full{};
  const F m_inv = V::Set1(InverseScale(a.exp_avg_scale[block]));
  const F u_inv = V::Set1(InverseScale(a.exp_avg_sq_scale[block]));
  auto* m_out = static_cast<uint8_t*>(a.exp_avg);
  auto* u_out = static_cast<uint8_t*>(a.exp_avg_sq);
  // The random bits of the vector at j, Mix32(index_base + j + lane + key), from a running
  // lane index (one add per vector instead of a broadcast).
  I lane_index = V::LaneIndex(static_cast<uint32_t>(a.index_base + begin) + a.rounding_key);
  auto random_bits = [&]() {
    if constexpr (kNearest) {
      return I{};
    } else {
      const I r = V::Mix(lane_index);
      lane_index = V::AddI(lane_index, V::Set1I(V::kWidth));
      return r;
    }
  };
  // The update of the vector at j, returning exp_avg's y; sqrt(exp_avg_sq)'s code apart
  // (sq_code), so that the four-vector loop holds one map's constants at a time.
  auto apply = [&](size_t j, const Tail& t, auto tail) {
    constexpr bool kTail = decltype(tail)::value;
    if constexpr (kInt8Prefetch<V>) {
      PrefetchNext<V, G, O, P>(a, begin + kInt8StateBlock + kHalf + (j - begin) / 2);
    }
    const F m = V::template LoadF32<false>(scratch.m + (j - begin), Tail{});
    const F u = V::template LoadF32<false>(scratch.u + (j - begin), Tail{});
    F p = LoadMaster<V, P, kTail>(a, j, t);
    const F p_old = p;
    AdamApply<V, M, kDelta, /*kFolded=*/true>(c, m, u, &p);
    p = StoreMaster<V, P, kTail>(a, j, p, p_old, t);
    if constexpr (O == ParamOut::kBf16) {
      V::template StoreBf16<kTail>(static_cast<uint16_t*>(a.param_out) + j, p, t);
    } else if constexpr (O == ParamOut::kFp16) {
      V::template StoreFp16<kTail>(static_cast<uint16_t*>(a.param_out) + j, p, t);
    }
    return V::Bits(V::Mul(m, m_inv));  // y of exp_avg
  };
  auto sq_code = [&](size_t j, I r) {
    const F u = V::template LoadF32<false>(scratch.u + (j - begin), Tail{});
    return Int8Magnitude<V, ExpAvgSqMap, kNearest>(V::Bits(V::Mul(u, u_inv)), r);
  };
  // Four vectors at a time where the ISA packs four vectors of codes in one store (which
  // saturates the magnitudes and takes exp_avg's signs from y's bits, as Int8Code).
  size_t j = begin;
  if constexpr (kStoresU8x4<V>) {
    for (; j + 4 * V::kWidth <= end; j += 4 * V::kWidth) {
      PrefetchMasterAhead<V, P>(a, j);
      I q[4], y[4], r[4];
      for (size_t k = 0; k < 4; ++k) {
        r[k] = random_bits();
        y[k] = apply(j + k * V::kWidth, full, False{});
        q[k] = Int8Magnitude<V, ExpAvgMap, kNearest>(y[k], r[k]);
      }
      V::StoreSignedU8x4(m_out + j, q, y);
      for (size_t k = 0; k < 4; ++k) q[k] = sq_code(j + k * V::kWidth, r[k]);
      V::StoreU8x4(u_out + j, q);
    }
  }
  auto m_code_of = [&](I y, I r) {
    return Int8Code<V, ExpAvgMap>(Int8Magnitude<V, ExpAvgMap, kNearest>(y, r), y);
  };
  auto u_code_of = [&](size_t j, I r) { return Int8Code<V, ExpAvgSqMap>(sq_code(j, r), I{}); };
  for (; j + V::kWidth <= end; j += V::kWidth) {
    const I r = random_bits();
    V::template StoreU8<false>(m_out + j, m_code_of(apply(j, full, False{}), r), full);
    V::template StoreU8<false>(u_out + j, u_code_of(j, r), full);
  }
  if (j < end) {
    const Tail t = V::MakeTail(end - j);
    const I r = random_bits();
    V::template StoreU8<true>(m_out + j, m_code_of(apply(j, t, True{}), r), t);
    V::template StoreU8<true>(u_out + j, u_code_of(j, r), t);
  }
}

// One block [begin, end) of the slice (begin a multiple of kInt8StateBlock), in two loops
// split where the new absmax becomes known:
//   1. moments: the codes' values, the new m and v (Int8Moments), the new m and sqrt(v) into
//      the scratch, their running absmax;
//   2. apply: the weight update from the scratch (AdamApply, folded: the division), the master
//      and the copy written, m and sqrt(v) requantized with the block's new scales.
// Each loop then holds one of the formula's long chains (the square root; the division),
// and the second interleaves its division with the integer work of the requantization, so
// the out-of-order window covers more of both (docs/design.md, "int8 moments": the update
// loop with the whole formula took three quarters of the time on Zen 3). Same bits: the
// same operations on the same values.
template <class V, FloatFormat G, ParamOut O, AdamMode M, bool kNearest, MasterStore P>
void AdamInt8Block(const AdamArgs& a, const AdamConsts<V>& c, size_t block, size_t begin,
                   size_t end) {
  Int8Scratch scratch;
  Int8MomentsLoop<V, G, O, M, P>(a, c, block, begin, end, &scratch);
  Int8ApplyLoop<V, G, O, M, kNearest, P>(a, c, block, begin, end, scratch);
}

template <class V, FloatFormat G, ParamOut O, AdamMode M, bool kNearest,
          MasterStore P = MasterStore::kF32>
void AdamInt8Range(const AdamArgs& a, size_t first_block, size_t last_block) {
  const AdamConsts<V> c(a.s);
  for (size_t b = first_block; b < last_block; ++b) {
    const size_t begin = b * kInt8StateBlock;
    const size_t end = begin + kInt8StateBlock < a.n ? begin + kInt8StateBlock : a.n;
    AdamInt8Block<V, G, O, M, kNearest, P>(a, c, b, begin, end);
  }
}

// A bf16 master: fp32 or bf16 gradients, no copy or a bf16 one (optim.cc checks).
template <class V, FloatFormat G, ParamOut O, AdamMode M, bool kNearest>
void AdamInt8Master(const AdamArgs& a, size_t first_block, size_t last_block) {
  if constexpr (G != FloatFormat::kFp16 && O != ParamOut::kFp16) {
    if (a.master_store == MasterStore::kBf16Stochastic) {
      return AdamInt8Range<V, G, O, M, kNearest, MasterStore::kBf16Stochastic>(a, first_block,
                                                                               last_block);
    }
    if (a.master_store == MasterStore::kBf16Kahan) {
      return AdamInt8Range<V, G, O, M, kNearest, MasterStore::kBf16Kahan>(a, first_block,
                                                                          last_block);
    }
  }
}

template <class V, FloatFormat G, ParamOut O, AdamMode M>
void AdamInt8Rounding(const AdamArgs& a, size_t first_block, size_t last_block) {
  const bool bf16_master = a.master_store != MasterStore::kF32;
  if (a.int8_nearest) {
    if (bf16_master) return AdamInt8Master<V, G, O, M, true>(a, first_block, last_block);
    AdamInt8Range<V, G, O, M, true>(a, first_block, last_block);
  } else {
    if (bf16_master) return AdamInt8Master<V, G, O, M, false>(a, first_block, last_block);
    AdamInt8Range<V, G, O, M, false>(a, first_block, last_block);
  }
}

template <class V, FloatFormat G, ParamOut O>
void AdamInt8Mode(const AdamArgs& a, size_t first_block, size_t last_block) {
  if (a.mode == AdamMode::kAdamW) {
    AdamInt8Rounding<V, G, O, AdamMode::kAdamW>(a, first_block, last_block);
  } else {
    AdamInt8Rounding<V, G, O, AdamMode::kAdam>(a, first_block, last_block);
  }
}

template <class V, FloatFormat G>
void AdamInt8Out(const AdamArgs& a, size_t first_block, size_t last_block) {
  switch (a.param_out_format) {
    case ParamOut::kNone:
      return AdamInt8Mode<V, G, ParamOut::kNone>(a, first_block, last_block);
    case ParamOut::kBf16:
      return AdamInt8Mode<V, G, ParamOut::kBf16>(a, first_block, last_block);
    case ParamOut::kFp16:
      return AdamInt8Mode<V, G, ParamOut::kFp16>(a, first_block, last_block);
  }
}

// Blocks [first_block, last_block) of an int8-state slice.
template <class V>
void AdamInt8Dispatch(const AdamArgs& a, size_t first_block, size_t last_block) {
  switch (a.grad_format) {
    case FloatFormat::kFp32:
      return AdamInt8Out<V, FloatFormat::kFp32>(a, first_block, last_block);
    case FloatFormat::kBf16:
      return AdamInt8Out<V, FloatFormat::kBf16>(a, first_block, last_block);
    case FloatFormat::kFp16:
      return AdamInt8Out<V, FloatFormat::kFp16>(a, first_block, last_block);
  }
}

// The bound for int8 moments: the same DRAM streams as AdamInt8Block (grad, master r/w,
// both code arrays r/w, the copy written), one fma per stream; values unchanged.
template <class V, bool kTail>
inline void TrafficInt8Vector(const AdamArgs& a, typename V::F zero, size_t i,
                              const typename V::Tail& t) {
  using F = typename V::F;
  F g;
  if (a.grad_format == FloatFormat::kFp32) {
    g = V::template LoadF32<kTail>(static_cast<const float*>(a.grad) + i, t);
  } else {
    g = V::template LoadBf16<kTail>(static_cast<const uint16_t*>(a.grad) + i, t);
  }
  const F p = V::Fma(g, zero, TrafficLoadMaster<V, kTail>(a, i, t));
  auto* m = static_cast<uint8_t*>(a.exp_avg);
  auto* u = static_cast<uint8_t*>(a.exp_avg_sq);
  const F mf = V::Fma(g, zero, V::CvtI(V::template LoadU8<kTail>(m + i, t)));
  const F uf = V::Fma(g, zero, V::CvtI(V::template LoadU8<kTail>(u + i, t)));
  V::template StoreU8<kTail>(m + i, V::TruncI(mf), t);
  V::template StoreU8<kTail>(u + i, V::TruncI(uf), t);
  TrafficStoreMaster<V, kTail>(a, i, p, g, zero, t);
  if (a.param_out_format != ParamOut::kNone) {
    V::template StoreTrunc16<kTail>(static_cast<uint16_t*>(a.param_out) + i, p, t);
  }
}

template <class V>
void TrafficInt8Dispatch(const AdamArgs& a, size_t first_block, size_t last_block) {
  const typename V::F zero = V::Set1(a.s.grad_scale);
  const size_t begin = first_block * kInt8StateBlock;
  const size_t end = last_block * kInt8StateBlock < a.n ? last_block * kInt8StateBlock : a.n;
  size_t i = begin;
  const typename V::Tail full{};
  for (; i + V::kWidth <= end; i += V::kWidth) TrafficInt8Vector<V, false>(a, zero, i, full);
  if (i < end) TrafficInt8Vector<V, true>(a, zero, i, V::MakeTail(end - i));
}

}  // namespace
}  // namespace strata::cpu_optim
