// The kernels' algorithms, written once over a vector-traits class V and instantiated by
// each per-ISA translation unit (adam_avx512.cc, adam_avx2.cc, adam_scalar.cc) with its
// own traits. Because the per-element operation sequence exists only here, every ISA
// performs the same IEEE operations in the same order: results are bit-identical.
//
// V provides (kTail = a partial vector of `Tail` elements; lanes beyond it load as 0 and
// are not stored):
//   kWidth, F (vector of floats), Tail, MakeTail(count),
//   Set1, Add, Mul, Div, Sqrt, Fma(a, b, c) = a*b + c rounded once,
//   LoadF32/LoadBf16/LoadFp16<kTail>(ptr, tail), StoreF32/StoreBf16/StoreFp16<kTail>
//   (bf16/fp16 stores round to nearest even, NaN kept), StoreTrunc16<kTail> (drops the low
//   16 bits: the bound kernel's trivial conversion),
//   R (vector of uint32), RandomBits(first, key) = Mix32(first + lane + key) per lane, i.e.
//   Mix(LaneIndex(first + key)) with LaneIndex(x) = x + lane and Mix = Mix32 per lane,
//   StoreBf16Stochastic<kHigh, kTail>(ptr, x, r, tail) (adds r's low, or with kHigh high,
//   16 bits to x's bits and keeps the top 16; NaN kept as StoreBf16 keeps it).
//
// Internal linkage for the same reason as convert.h: one copy per ISA translation unit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu_optim/kernels.h"

namespace strata::cpu_optim {
namespace {

template <class V, FloatFormat G, bool kTail>
inline typename V::F LoadGrad(const void* grad, size_t i, const typename V::Tail& t) {
  if constexpr (G == FloatFormat::kFp32) {
    return V::template LoadF32<kTail>(static_cast<const float*>(grad) + i, t);
  } else if constexpr (G == FloatFormat::kBf16) {
    return V::template LoadBf16<kTail>(static_cast<const uint16_t*>(grad) + i, t);
  } else {
    return V::template LoadFp16<kTail>(static_cast<const uint16_t*>(grad) + i, t);
  }
}

template <class V, FloatFormat G, bool kTail>
inline void StoreGrad(void* grad, size_t i, typename V::F x, const typename V::Tail& t) {
  if constexpr (G == FloatFormat::kFp32) {
    V::template StoreF32<kTail>(static_cast<float*>(grad) + i, x, t);
  } else if constexpr (G == FloatFormat::kBf16) {
    V::template StoreBf16<kTail>(static_cast<uint16_t*>(grad) + i, x, t);
  } else {
    V::template StoreFp16<kTail>(static_cast<uint16_t*>(grad) + i, x, t);
  }
}

template <class V, MomentStore S, bool kTail>
inline typename V::F LoadMoment(const void* p, size_t i, const typename V::Tail& t) {
  if constexpr (S == MomentStore::kF32) {
    return V::template LoadF32<kTail>(static_cast<const float*>(p) + i, t);
  } else {
    return V::template LoadBf16<kTail>(static_cast<const uint16_t*>(p) + i, t);
  }
}

// kHigh: which half of the random bits a stochastic store uses (exp_avg low, exp_avg_sq high).
template <class V, MomentStore S, bool kHigh, bool kTail>
inline void StoreMoment(void* p, size_t i, typename V::F x, const typename V::R& r,
                        const typename V::Tail& t) {
  if constexpr (S == MomentStore::kF32) {
    V::template StoreF32<kTail>(static_cast<float*>(p) + i, x, t);
  } else if constexpr (S == MomentStore::kBf16Nearest) {
    V::template StoreBf16<kTail>(static_cast<uint16_t*>(p) + i, x, t);
  } else {
    V::template StoreBf16Stochastic<kHigh, kTail>(static_cast<uint16_t*>(p) + i, x, r, t);
  }
}

template <class V>
struct AdamConsts {
  typename V::F grad_scale, weight_decay, neg_lr_wd, one_minus_lr_wd, beta1, one_minus_beta1, beta2,
      one_minus_beta2, bias_correction2_sqrt, eps, neg_step_size, eps_x_bc2_sqrt,
      neg_step_size_x_bc2_sqrt, sqrt_one_minus_beta2, one_minus_beta1_x_grad_scale,
      sqrt_one_minus_beta2_x_grad_scale;
  explicit AdamConsts(const AdamScalars& s)
      : grad_scale(V::Set1(s.grad_scale)),
        weight_decay(V::Set1(s.weight_decay)),
        neg_lr_wd(V::Set1(s.neg_lr_wd)),
        one_minus_lr_wd(V::Set1(s.one_minus_lr_wd)),
        beta1(V::Set1(s.beta1)),
        one_minus_beta1(V::Set1(s.one_minus_beta1)),
        beta2(V::Set1(s.beta2)),
        one_minus_beta2(V::Set1(s.one_minus_beta2)),
        bias_correction2_sqrt(V::Set1(s.bias_correction2_sqrt)),
        eps(V::Set1(s.eps)),
        neg_step_size(V::Set1(s.neg_step_size)),
        eps_x_bc2_sqrt(V::Set1(s.eps_x_bc2_sqrt)),
        neg_step_size_x_bc2_sqrt(V::Set1(s.neg_step_size_x_bc2_sqrt)),
        sqrt_one_minus_beta2(V::Set1(s.sqrt_one_minus_beta2)),
        one_minus_beta1_x_grad_scale(V::Set1(s.one_minus_beta1_x_grad_scale)),
        sqrt_one_minus_beta2_x_grad_scale(V::Set1(s.sqrt_one_minus_beta2_x_grad_scale)) {}
};

// The kAdamW / kAdam update of one vector (formula: include/strata/optim.h) in two halves:
// AdamVector (through AdamMath) runs both, the int8 kernel (int8_templates.h) only the
// second, its own Int8Moments in place of the first. AdamMoments: m and v from their old
// values (p: the weight, read by kAdam's L2 decay only); *v_new the new second moment and
// *sqrt_v its square root.
template <class V, AdamMode M>
inline void AdamMoments(const AdamConsts<V>& c, typename V::F g, typename V::F v_old,
                        typename V::F m_old, typename V::F p, typename V::F* m,
                        typename V::F* v_new, typename V::F* sqrt_v) {
  if constexpr (M == AdamMode::kAdam) g = V::Fma(c.weight_decay, p, g);
  *m = V::Fma(c.beta1, m_old, V::Mul(c.one_minus_beta1, g));
  const typename V::F v = V::Fma(c.beta2, v_old, V::Mul(c.one_minus_beta2, V::Mul(g, g)));
  *v_new = v;
  *sqrt_v = V::Sqrt(v);
}

// AdamApply: the weight update from the new m and sqrt(v), p in place, as the formula in
// optim.h rounds it: m / (sqrt(v) / sqrt(1 - beta2^t) + eps), a square root and two divisions.
//
// kFolded (the int8 kernel only) folds the bias correction into the constants instead:
// (step * sqrt(1 - beta2^t)) * m / (sqrt(v) + eps * sqrt(1 - beta2^t)), one division fewer,
// the same value up to an ulp of the update. The divider is the int8 kernel's busiest unit
// (bench/divider_floor), and its moments carry 3 to 4 significant bits, so the ulp is
// nothing; the fp32 and bf16 kernels keep torch's rounding.
template <class V, AdamMode M, bool kDelta = false, bool kFolded = false>
inline void AdamApply(const AdamConsts<V>& c, typename V::F m, typename V::F sqrt_v,
                      typename V::F* p) {
  using F = typename V::F;
  F ratio, neg_step;
  if constexpr (kFolded) {
    ratio = V::Div(m, V::Add(sqrt_v, c.eps_x_bc2_sqrt));
    neg_step = c.neg_step_size_x_bc2_sqrt;
  } else {
    ratio = V::Div(m, V::Add(V::Div(sqrt_v, c.bias_correction2_sqrt), c.eps));
    neg_step = c.neg_step_size;
  }
  // AdamW: p * (1 - lr*wd) - step * m/denom evaluated as p + ((-lr*wd)*p + -step * m/denom):
  // the only rounding at the magnitude of p is the final add (half an ulp of p per step);
  // the others fall on the small update. The product form would round p twice per step
  // and carry float(1 - lr*wd)'s error (up to 3e-8) into every step as a bias.
  // kDelta (the Kahan master): *p receives the update d instead of p + d (optim.h).
  if constexpr (kDelta && M == AdamMode::kAdamW) {
    *p = V::Fma(neg_step, ratio, V::Mul(c.neg_lr_wd, *p));
  } else if constexpr (kDelta) {
    *p = V::Mul(neg_step, ratio);
  } else if constexpr (M == AdamMode::kAdamW) {
    *p = V::Add(*p, V::Fma(neg_step, ratio, V::Mul(c.neg_lr_wd, *p)));
  } else {
    *p = V::Fma(neg_step, ratio, *p);
  }
}

template <class V, AdamMode M, bool kDelta = false>
inline void AdamMath(const AdamConsts<V>& c, typename V::F g, typename V::F v_old,
                     typename V::F m_old, typename V::F* p, typename V::F* m, typename V::F* v_new,
                     typename V::F* sqrt_v) {
  AdamMoments<V, M>(c, g, v_old, m_old, *p, m, v_new, sqrt_v);
  AdamApply<V, M, kDelta>(c, *m, *sqrt_v, p);
}

template <class V, MasterStore P, bool kTail>
inline typename V::F LoadMaster(const AdamArgs& a, size_t i, const typename V::Tail& t) {
  if constexpr (P == MasterStore::kF32) return V::template LoadF32<kTail>(a.master + i, t);
  return V::template LoadBf16<kTail>(a.master16 + i, t);
}

// Stores the new weight (x = p + d; kBf16Kahan: x = d, the update, and p_old the weight it
// applies to) and returns the weight as stored, for the parameter copy.
template <class V, MasterStore P, bool kTail>
inline typename V::F StoreMaster(const AdamArgs& a, size_t i, typename V::F x, typename V::F p_old,
                                 const typename V::Tail& t) {
  using F = typename V::F;
  if constexpr (P == MasterStore::kF32) {
    V::template StoreF32<kTail>(a.master + i, x, t);
    return x;
  } else if constexpr (P == MasterStore::kBf16Stochastic) {
    const typename V::R r = V::RandomBits(static_cast<uint32_t>(a.index_base + i), a.master_key);
    V::template StoreBf16Stochastic<false, kTail>(a.master16 + i, x, r, t);
    return V::template LoadBf16<kTail>(a.master16 + i, t);
  } else {  // Kahan: u = d + c; p' = bf16(p + u); c' = bf16(u - (p' - p)), both exact negations
    const F minus_one = V::Set1(-1.0f);
    const F u = V::Add(x, V::template LoadBf16<kTail>(a.comp + i, t));
    V::template StoreBf16<kTail>(a.master16 + i, V::Add(p_old, u), t);
    const F p_new = V::template LoadBf16<kTail>(a.master16 + i, t);
    const F applied = V::Add(p_new, V::Mul(p_old, minus_one));
    V::template StoreBf16<kTail>(a.comp + i, V::Add(u, V::Mul(applied, minus_one)), t);
    return p_new;
  }
}

// One vector of the AdamW/Adam update; the formula is the one in include/strata/optim.h
// (torch.optim.AdamW / torch.optim.Adam).
template <class V, FloatFormat G, ParamOut O, AdamMode M, MomentStore S, bool kTail,
          MasterStore P = MasterStore::kF32>
inline void AdamVector(const AdamArgs& a, const AdamConsts<V>& c, size_t i,
                       const typename V::Tail& t) {
  using F = typename V::F;
  F g = V::Mul(LoadGrad<V, G, kTail>(a.grad, i, t), c.grad_scale);
  F p = LoadMaster<V, P, kTail>(a, i, t);
  if constexpr (M == AdamMode::kAdamWTorch || M == AdamMode::kAdamWTorchLerp) {
    // torch.optim.AdamW's own rounding, operation by operation (optim.h).
    static_assert(G == FloatFormat::kFp32 && O == ParamOut::kNone && S == MomentStore::kF32);
    p = V::Mul(p, c.one_minus_lr_wd);
    const F m_old = V::template LoadF32<kTail>(static_cast<float*>(a.exp_avg) + i, t);
    F m;
    if constexpr (M == AdamMode::kAdamWTorchLerp) {  // exp_avg.lerp_(grad, 1 - beta1)
      m = V::Fma(c.one_minus_beta1, V::Add(g, V::Mul(m_old, V::Set1(-1.0f))), m_old);
    } else {
      m = V::Fma(g, c.one_minus_beta1, V::Mul(m_old, c.beta1));
    }
    const F v = V::Fma(
        V::Mul(g, c.one_minus_beta2), g,
        V::Mul(V::template LoadF32<kTail>(static_cast<float*>(a.exp_avg_sq) + i, t), c.beta2));
    const F denom = V::Add(V::Div(V::Sqrt(v), c.bias_correction2_sqrt), c.eps);
    p = V::Add(p, V::Div(V::Mul(c.neg_step_size, m), denom));
    V::template StoreF32<kTail>(static_cast<float*>(a.exp_avg) + i, m, t);
    V::template StoreF32<kTail>(static_cast<float*>(a.exp_avg_sq) + i, v, t);
    V::template StoreF32<kTail>(a.master + i, p, t);
    return;
  }
  F m, v, sqrt_v;
  const F p_old = p;
  AdamMath<V, M, P == MasterStore::kBf16Kahan>(c, g, LoadMoment<V, S, kTail>(a.exp_avg_sq, i, t),
                                               LoadMoment<V, S, kTail>(a.exp_avg, i, t), &p, &m, &v,
                                               &sqrt_v);
  typename V::R r{};
  if constexpr (S == MomentStore::kBf16Stochastic) {
    r = V::RandomBits(static_cast<uint32_t>(a.index_base + i), a.rounding_key);
  }
  StoreMoment<V, S, false, kTail>(a.exp_avg, i, m, r, t);
  StoreMoment<V, S, true, kTail>(a.exp_avg_sq, i, v, r, t);
  p = StoreMaster<V, P, kTail>(a, i, p, p_old, t);
  if constexpr (O == ParamOut::kBf16) {
    V::template StoreBf16<kTail>(static_cast<uint16_t*>(a.param_out) + i, p, t);
  } else if constexpr (O == ParamOut::kFp16) {
    V::template StoreFp16<kTail>(static_cast<uint16_t*>(a.param_out) + i, p, t);
  }
}

template <class V, FloatFormat G, ParamOut O, AdamMode M, MomentStore S,
          MasterStore P = MasterStore::kF32>
void AdamRange(const AdamArgs& a, size_t begin, size_t end) {
  const AdamConsts<V> c(a.s);
  size_t i = begin;
  const typename V::Tail full{};
  for (; i + V::kWidth <= end; i += V::kWidth) {
    AdamVector<V, G, O, M, S, false, P>(a, c, i, full);
  }
  if (i < end) AdamVector<V, G, O, M, S, true, P>(a, c, i, V::MakeTail(end - i));
}

// A bf16 master (fp32 or bf16 gradients, no copy or a bf16 one: optim.cc checks).
template <class V, FloatFormat G, ParamOut O, AdamMode M, MomentStore S>
void AdamRangeMaster(const AdamArgs& a, size_t begin, size_t end) {
  if constexpr (G != FloatFormat::kFp16 && O != ParamOut::kFp16) {
    if (a.master_store == MasterStore::kBf16Stochastic) {
      return AdamRange<V, G, O, M, S, MasterStore::kBf16Stochastic>(a, begin, end);
    }
    if (a.master_store == MasterStore::kBf16Kahan) {
      return AdamRange<V, G, O, M, S, MasterStore::kBf16Kahan>(a, begin, end);
    }
  }
}

// The bound's master streams: fp32, or bf16 (+ the bf16 compensation), values unchanged
// (a bf16 value widened and truncated back is itself). Run-time branches: the bound kernel's
// loop is memory-bound, one predictable branch per vector costs nothing measurable.
template <class V, bool kTail>
inline typename V::F TrafficLoadMaster(const AdamArgs& a, size_t i, const typename V::Tail& t) {
  if (a.master_store == MasterStore::kF32) return V::template LoadF32<kTail>(a.master + i, t);
  return V::template LoadBf16<kTail>(a.master16 + i, t);
}

template <class V, bool kTail>
inline void TrafficStoreMaster(const AdamArgs& a, size_t i, typename V::F p, typename V::F g,
                               typename V::F zero, const typename V::Tail& t) {
  if (a.master_store == MasterStore::kF32) return V::template StoreF32<kTail>(a.master + i, p, t);
  V::template StoreTrunc16<kTail>(a.master16 + i, p, t);
  if (a.master_store == MasterStore::kBf16Kahan) {
    const typename V::F c = V::Fma(g, zero, V::template LoadBf16<kTail>(a.comp + i, t));
    V::template StoreTrunc16<kTail>(a.comp + i, c, t);
  }
}

// The bound: the same streams as AdamVector (grad read at its width, master/m/v read and
// written, the copy written at 16 bits) with one fma per stream instead of the update.
// The fma adds g * 0 (a.s.grad_scale is 0, a run-time value the compiler cannot fold), so
// the data keep their values and a benchmark can interleave this kernel with AdamStep.
template <class V, FloatFormat G, ParamOut O, MomentStore S, bool kTail>
inline void TrafficVector(const AdamArgs& a, const typename V::F zero, size_t i,
                          const typename V::Tail& t) {
  using F = typename V::F;
  F g;
  if constexpr (G == FloatFormat::kFp32) {
    g = V::template LoadF32<kTail>(static_cast<const float*>(a.grad) + i, t);
  } else {  // fp16 bits widened like bf16: same bytes loaded, no conversion work
    g = V::template LoadBf16<kTail>(static_cast<const uint16_t*>(a.grad) + i, t);
  }
  const F p = V::Fma(g, zero, TrafficLoadMaster<V, kTail>(a, i, t));
  const F m = V::Fma(g, zero, LoadMoment<V, S, kTail>(a.exp_avg, i, t));
  const F v = V::Fma(g, zero, LoadMoment<V, S, kTail>(a.exp_avg_sq, i, t));
  if constexpr (S == MomentStore::kF32) {
    V::template StoreF32<kTail>(static_cast<float*>(a.exp_avg) + i, m, t);
    V::template StoreF32<kTail>(static_cast<float*>(a.exp_avg_sq) + i, v, t);
  } else {  // exact: the values are bf16 already
    V::template StoreTrunc16<kTail>(static_cast<uint16_t*>(a.exp_avg) + i, m, t);
    V::template StoreTrunc16<kTail>(static_cast<uint16_t*>(a.exp_avg_sq) + i, v, t);
  }
  TrafficStoreMaster<V, kTail>(a, i, p, g, zero, t);
  if constexpr (O != ParamOut::kNone) {
    V::template StoreTrunc16<kTail>(static_cast<uint16_t*>(a.param_out) + i, p, t);
  }
}

template <class V, FloatFormat G, ParamOut O, MomentStore S>
void TrafficRange(const AdamArgs& a, size_t begin, size_t end) {
  size_t i = begin;
  const typename V::Tail full{};
  const typename V::F zero = V::Set1(a.s.grad_scale);
  for (; i + V::kWidth <= end; i += V::kWidth) TrafficVector<V, G, O, S, false>(a, zero, i, full);
  if (i < end) TrafficVector<V, G, O, S, true>(a, zero, i, V::MakeTail(end - i));
}

template <class V, FloatFormat G, ParamOut O>
void TrafficRangeState(const AdamArgs& a, size_t begin, size_t end) {
  if (a.moments == MomentStore::kF32) {
    TrafficRange<V, G, O, MomentStore::kF32>(a, begin, end);
  } else {
    TrafficRange<V, G, O, MomentStore::kBf16Nearest>(a, begin, end);
  }
}

template <class V, FloatFormat G>
void ScaleRange(void* grad, float scale, size_t begin, size_t end) {
  const typename V::F s = V::Set1(scale);
  size_t i = begin;
  const typename V::Tail full{};
  for (; i + V::kWidth <= end; i += V::kWidth) {
    StoreGrad<V, G, false>(grad, i, V::Mul(LoadGrad<V, G, false>(grad, i, full), s), full);
  }
  if (i < end) {
    const typename V::Tail t = V::MakeTail(end - i);
    StoreGrad<V, G, true>(grad, i, V::Mul(LoadGrad<V, G, true>(grad, i, t), s), t);
  }
}

template <class V, FloatFormat D>
void ConvertRange(const float* src, void* dst, size_t begin, size_t end) {
  size_t i = begin;
  const typename V::Tail full{};
  for (; i + V::kWidth <= end; i += V::kWidth) {
    StoreGrad<V, D, false>(dst, i, V::template LoadF32<false>(src + i, full), full);
  }
  if (i < end) {
    const typename V::Tail t = V::MakeTail(end - i);
    StoreGrad<V, D, true>(dst, i, V::template LoadF32<true>(src + i, t), t);
  }
}

// Run-time format/mode -> template instantiation, once per range.
template <class V, FloatFormat G, ParamOut O, AdamMode M>
void AdamRangeState(const AdamArgs& a, size_t begin, size_t end) {
  if (a.master_store != MasterStore::kF32) {
    switch (a.moments) {
      case MomentStore::kF32:
        return AdamRangeMaster<V, G, O, M, MomentStore::kF32>(a, begin, end);
      case MomentStore::kBf16Nearest:
        return AdamRangeMaster<V, G, O, M, MomentStore::kBf16Nearest>(a, begin, end);
      case MomentStore::kBf16Stochastic:
        return AdamRangeMaster<V, G, O, M, MomentStore::kBf16Stochastic>(a, begin, end);
      case MomentStore::kInt8:
        return;
    }
  }
  switch (a.moments) {
    case MomentStore::kF32:
      return AdamRange<V, G, O, M, MomentStore::kF32>(a, begin, end);
    case MomentStore::kBf16Nearest:
      return AdamRange<V, G, O, M, MomentStore::kBf16Nearest>(a, begin, end);
    case MomentStore::kBf16Stochastic:
      return AdamRange<V, G, O, M, MomentStore::kBf16Stochastic>(a, begin, end);
    case MomentStore::kInt8:  // optim.cc sends these to IsaKernels::adam_int8
      return;
  }
}

template <class V, FloatFormat G, ParamOut O>
void AdamRangeMode(const AdamArgs& a, size_t begin, size_t end) {
  if (a.mode == AdamMode::kAdamW) {
    AdamRangeState<V, G, O, AdamMode::kAdamW>(a, begin, end);
  } else {
    AdamRangeState<V, G, O, AdamMode::kAdam>(a, begin, end);
  }
}

template <class V, FloatFormat G>
void AdamRangeOut(const AdamArgs& a, size_t begin, size_t end) {
  switch (a.param_out_format) {
    case ParamOut::kNone:
      return AdamRangeMode<V, G, ParamOut::kNone>(a, begin, end);
    case ParamOut::kBf16:
      return AdamRangeMode<V, G, ParamOut::kBf16>(a, begin, end);
    case ParamOut::kFp16:
      return AdamRangeMode<V, G, ParamOut::kFp16>(a, begin, end);
  }
}

template <class V>
void AdamDispatch(const AdamArgs& a, size_t begin, size_t end) {
  if (a.mode == AdamMode::kAdamWTorch) {  // one instantiation: AdamStep admits no other formats
    return AdamRange<V, FloatFormat::kFp32, ParamOut::kNone, AdamMode::kAdamWTorch,
                     MomentStore::kF32>(a, begin, end);
  }
  if (a.mode == AdamMode::kAdamWTorchLerp) {
    return AdamRange<V, FloatFormat::kFp32, ParamOut::kNone, AdamMode::kAdamWTorchLerp,
                     MomentStore::kF32>(a, begin, end);
  }
  switch (a.grad_format) {
    case FloatFormat::kFp32:
      return AdamRangeOut<V, FloatFormat::kFp32>(a, begin, end);
    case FloatFormat::kBf16:
      return AdamRangeOut<V, FloatFormat::kBf16>(a, begin, end);
    case FloatFormat::kFp16:
      return AdamRangeOut<V, FloatFormat::kFp16>(a, begin, end);
  }
}

template <class V, FloatFormat G>
void TrafficRangeOut(const AdamArgs& a, size_t begin, size_t end) {
  if (a.param_out_format == ParamOut::kNone) {
    TrafficRangeState<V, G, ParamOut::kNone>(a, begin, end);
  } else {
    TrafficRangeState<V, G, ParamOut::kBf16>(a, begin, end);
  }
}

template <class V>
void TrafficDispatch(const AdamArgs& a, size_t begin, size_t end) {
  if (a.grad_format == FloatFormat::kFp32) {
    TrafficRangeOut<V, FloatFormat::kFp32>(a, begin, end);
  } else {
    TrafficRangeOut<V, FloatFormat::kBf16>(a, begin, end);
  }
}

template <class V>
void ScaleDispatch(void* grad, FloatFormat format, float scale, size_t begin, size_t end) {
  switch (format) {
    case FloatFormat::kFp32:
      return ScaleRange<V, FloatFormat::kFp32>(grad, scale, begin, end);
    case FloatFormat::kBf16:
      return ScaleRange<V, FloatFormat::kBf16>(grad, scale, begin, end);
    case FloatFormat::kFp16:
      return ScaleRange<V, FloatFormat::kFp16>(grad, scale, begin, end);
  }
}

template <class V>
void ConvertDispatch(const float* src, void* dst, FloatFormat format, size_t begin, size_t end) {
  switch (format) {
    case FloatFormat::kFp32:
      return ConvertRange<V, FloatFormat::kFp32>(src, dst, begin, end);
    case FloatFormat::kBf16:
      return ConvertRange<V, FloatFormat::kBf16>(src, dst, begin, end);
    case FloatFormat::kFp16:
      return ConvertRange<V, FloatFormat::kFp16>(src, dst, begin, end);
  }
}

// The fixed reduction of the 16 norm lanes (see optim.h): s[i] = l[i] + l[i+8],
// then s[i] + s[i+4], then + s[i+2], then s[0] + s[1]. Vector kernels realise the same
// tree with register halves.
inline double ReduceNormLanes(const double* l) {
  double s[8];
  for (int i = 0; i < 8; ++i) s[i] = l[i] + l[i + 8];
  for (int i = 0; i < 4; ++i) s[i] = s[i] + s[i + 4];
  for (int i = 0; i < 2; ++i) s[i] = s[i] + s[i + 2];
  return s[0] + s[1];
}

}  // namespace
}  // namespace strata::cpu_optim
