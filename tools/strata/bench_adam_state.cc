// See bench_adam_state.h.
#include "tools/strata/bench_adam_state.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "model/bench_stats.h"

namespace strata::cli {
namespace {

template <class T>
Result<std::unique_ptr<T[]>> Alloc(size_t n, const char* what) {
  std::unique_ptr<T[]> p(new (std::nothrow) T[n]);
  if (!p && n > 0) {
    return Status::OutOfMemory(std::string("cannot allocate ") + std::to_string(n * sizeof(T)) +
                               " bytes for " + what + ": lower --params");
  }
  return p;
}

// The arrays of one compact-state run; Slice(lo, hi) views elements [lo, hi) (block-aligned).
struct Arrays {
  StateFormat state;
  MasterFormat master;
  size_t n;
  std::unique_ptr<float[]> m_scale, v_scale;
  std::unique_ptr<uint8_t[]> p, m, v;  // MasterBytes() and MomentBytes() per element

  size_t MomentBytes() const {
    return state == StateFormat::kInt8 ? 1 : state == StateFormat::kBf16 ? 2 : 4;
  }
  size_t MasterBytes() const { return MasterFormatBytes(master); }
  AdamSlice Slice(size_t lo, size_t hi, const CompactStateCase& c, uint64_t key) {
    AdamSlice s;
    SetMaster(&s, p.get(), lo, n);
    s.exp_avg = m.get() + lo * MomentBytes();
    s.exp_avg_sq = v.get() + lo * MomentBytes();
    s.grad = static_cast<const char*>(c.grad) + lo * FloatFormatBytes(c.grad_format);
    s.grad_format = c.grad_format;
    if (c.out != ParamOut::kNone) s.param_out = c.out_buffer + lo, s.param_out_format = c.out;
    s.n = hi - lo;
    s.state_format = state;
    // int8: nearest, the rounding strata.optim.AdamW uses (docs/design.md); bf16: stochastic.
    s.state_rounding =
        state == StateFormat::kInt8 ? StateRounding::kNearestEven : StateRounding::kStochastic;
    s.rounding_key = key;
    s.index_base = lo;  // the rounding bits are indexed from the array's start
    if (state == StateFormat::kInt8) {
      s.exp_avg_scale = m_scale.get() + lo / kInt8StateBlock;
      s.exp_avg_sq_scale = v_scale.get() + lo / kInt8StateBlock;
    }
    return s;
  }
  // Element lo on of a master array of len elements at `bytes`: fp32, or bf16 (+ the Kahan
  // terms after the len weights).
  void SetMaster(AdamSlice* s, uint8_t* bytes, size_t lo, size_t len) const {
    s->master_format = master;
    if (master == MasterFormat::kFp32) {
      s->master = reinterpret_cast<float*>(bytes) + lo;
      return;
    }
    s->master_bf16 = reinterpret_cast<uint16_t*>(bytes) + lo;
    if (master == MasterFormat::kBf16Kahan) s->master_comp = s->master_bf16 + len;
  }
};

Status Fill(Arrays* a) {
  const size_t n = a->n, blocks = Int8StateBlocks(n);
  STRATA_ASSIGN_OR_RETURN(a->p, Alloc<uint8_t>(n * a->MasterBytes(), "master"));
  STRATA_ASSIGN_OR_RETURN(a->m, Alloc<uint8_t>(n * a->MomentBytes(), "exp_avg"));
  STRATA_ASSIGN_OR_RETURN(a->v, Alloc<uint8_t>(n * a->MomentBytes(), "exp_avg_sq"));
  STRATA_ASSIGN_OR_RETURN(a->m_scale, Alloc<float>(blocks, "exp_avg scales"));
  STRATA_ASSIGN_OR_RETURN(a->v_scale, Alloc<float>(blocks, "exp_avg_sq scales"));
  std::vector<float> m(kInt8StateBlock), v(kInt8StateBlock);
  for (size_t lo = 0; lo < n; lo += kInt8StateBlock) {
    const size_t len = std::min(kInt8StateBlock, n - lo);
    for (size_t i = 0; i < len; ++i) {  // a cheap hash: values over a few decades
      const uint32_t h = uint32_t((lo + i) * 2654435761u);
      const float w = float(int32_t(h)) * 0x1p-31f;
      if (a->master == MasterFormat::kFp32) {
        std::memcpy(a->p.get() + (lo + i) * 4, &w, 4);
      } else {  // the Kahan terms start at 0
        reinterpret_cast<uint16_t*>(a->p.get())[lo + i] = FloatToBf16(w);
        if (a->master == MasterFormat::kBf16Kahan) {
          reinterpret_cast<uint16_t*>(a->p.get())[n + lo + i] = 0;
        }
      }
      m[i] = float(int32_t(h * 40503u)) * 0x1p-38f;
      v[i] = float(h >> 8) * 0x1p-38f;
    }
    if (a->state == StateFormat::kInt8) {
      STRATA_RETURN_IF_ERROR(QuantizeInt8Moments(
          m.data(), v.data(), len, a->m.get() + lo, a->v.get() + lo,
          a->m_scale.get() + lo / kInt8StateBlock, a->v_scale.get() + lo / kInt8StateBlock));
    } else if (a->state == StateFormat::kFp32) {
      std::memcpy(a->m.get() + lo * 4, m.data(), len * 4);
      std::memcpy(a->v.get() + lo * 4, v.data(), len * 4);
    } else {
      auto* m16 = reinterpret_cast<uint16_t*>(a->m.get()) + lo;
      auto* v16 = reinterpret_cast<uint16_t*>(a->v.get()) + lo;
      for (size_t i = 0; i < len; ++i) m16[i] = FloatToBf16(m[i]), v16[i] = FloatToBf16(v[i]);
    }
  }
  return Status::OK();
}

// The bytes of `len` elements of every array and of their `blocks` scales, concatenated: the
// master first (MasterBytes() per element: fp32, or the bf16 weights then their Kahan terms).
std::vector<uint8_t> RangeBytes(const uint8_t* p, const uint8_t* p_comp, const uint8_t* m,
                                const uint8_t* v, const float* ms, const float* vs, size_t len,
                                const Arrays& a, size_t blocks) {
  std::vector<uint8_t> out;
  auto put = [&](const void* x, size_t bytes) {
    const auto* b = static_cast<const uint8_t*>(x);
    out.insert(out.end(), b, b + bytes);
  };
  const bool bf16 = a.master != MasterFormat::kFp32;
  put(p, len * (bf16 ? 2 : 4));
  if (a.master == MasterFormat::kBf16Kahan) put(p_comp, len * 2);
  put(m, len * a.MomentBytes());
  put(v, len * a.MomentBytes());
  put(ms, blocks * 4);
  put(vs, blocks * 4);
  return out;
}

// Elements [lo, hi) of `a` (lo block-aligned), as RangeBytes lays them out.
std::vector<uint8_t> RangeOf(const Arrays& a, size_t lo, size_t hi) {
  const size_t mb = a.MomentBytes(), b0 = lo / kInt8StateBlock;
  const size_t w = a.master == MasterFormat::kFp32 ? 4 : 2;
  // Only a Kahan master has compensation terms (after the n weights); no pointer past them.
  const uint8_t* comp = a.master == MasterFormat::kBf16Kahan ? a.p.get() + (a.n + lo) * w : nullptr;
  return RangeBytes(a.p.get() + lo * w, comp, a.m.get() + lo * mb, a.v.get() + lo * mb,
                    a.m_scale.get() + b0, a.v_scale.get() + b0, hi - lo, a,
                    Int8StateBlocks(hi) - b0);
}

}  // namespace

AdamHyperParams BenchHyper(int64_t t) {
  AdamHyperParams h;
  h.lr = 1e-3;
  h.weight_decay = 0.01;
  h.step = t;
  return h;
}

Result<PairedTimes> TimeAgainstBound(int warmup, int iters,
                                     const std::function<Status(int64_t)>& kernel,
                                     const std::function<Status(int64_t)>& bound) {
  auto time = [](auto&& fn) -> Result<double> {
    const auto t0 = std::chrono::steady_clock::now();
    STRATA_RETURN_IF_ERROR(fn());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> kt, bt, ratios;
  int64_t t = 0;
  for (int k = 0; k < warmup + iters; ++k) {
    ++t;
    double x = 0, y = 0;
    if (k % 2 == 0) {
      STRATA_ASSIGN_OR_RETURN(x, time([&] { return kernel(t); }));
      STRATA_ASSIGN_OR_RETURN(y, time([&] { return bound(t); }));
    } else {
      STRATA_ASSIGN_OR_RETURN(y, time([&] { return bound(t); }));
      STRATA_ASSIGN_OR_RETURN(x, time([&] { return kernel(t); }));
    }
    if (k >= warmup) kt.push_back(x), bt.push_back(y), ratios.push_back(y / x);
  }
  return PairedTimes{model::Median(kt), model::Median(bt), model::Median(ratios), t};
}

Result<CompactStateResult> RunCompactStateCase(const CompactStateCase& c) {
  Arrays a{c.state, c.master, c.n, {}, {}, {}, {}, {}};
  STRATA_RETURN_IF_ERROR(Fill(&a));
  // The first block and the last (maybe partial) one, replayed at the end.
  const size_t last_lo = (Int8StateBlocks(c.n) - 1) * kInt8StateBlock;
  struct Range {
    size_t lo, hi;
    std::vector<uint8_t> before;
  };
  std::vector<Range> ranges = {{0, std::min(c.n, kInt8StateBlock), {}}, {last_lo, c.n, {}}};
  for (Range& g : ranges) g.before = RangeOf(a, g.lo, g.hi);
  const CpuKernelOptions opt{c.threads, c.isa};
  const float scale = 0.5f;
  auto key = [](int64_t t) { return 0x5eed0000ull + uint64_t(t); };
  STRATA_ASSIGN_OR_RETURN(
      PairedTimes times,
      TimeAgainstBound(
          c.warmup, c.iters,
          [&](int64_t t) {
            return AdamStep(a.Slice(0, c.n, c, key(t)), BenchHyper(t), scale, opt);
          },
          [&](int64_t t) { return AdamTrafficStep(a.Slice(0, c.n, c, key(t)), opt); }));
  int64_t t = times.steps;
  // One more (untimed) step so the copy holds AdamStep's bits, not the bound's.
  ++t;
  STRATA_RETURN_IF_ERROR(AdamStep(a.Slice(0, c.n, c, key(t)), BenchHyper(t), scale, opt));
  CompactStateResult r{times.kernel_seconds, times.bound_seconds, times.ratio, 0};
  // Replay each range from its bytes before the run with the scalar kernel, t steps.
  for (const Range& g : ranges) {
    const size_t len = g.hi - g.lo, mb = a.MomentBytes(), pb = a.MasterBytes();
    const size_t nb = Int8StateBlocks(g.hi) - g.lo / kInt8StateBlock;
    std::vector<uint8_t> p(len * pb), m(len * mb), v(len * mb);
    std::vector<float> ms(nb), vs(nb);
    const uint8_t* src = g.before.data();
    for (auto [dst, bytes] : {std::pair<void*, size_t>{p.data(), len * pb},
                              {m.data(), len * mb},
                              {v.data(), len * mb},
                              {ms.data(), nb * 4},
                              {vs.data(), nb * 4}}) {
      std::memcpy(dst, src, bytes);
      src += bytes;
    }
    std::vector<uint16_t> out(len);
    for (int64_t k = 1; k <= t; ++k) {
      AdamSlice sl = a.Slice(g.lo, g.hi, c, key(k));
      a.SetMaster(&sl, p.data(), 0, len);
      sl.exp_avg = m.data(), sl.exp_avg_sq = v.data();
      if (c.state == StateFormat::kInt8)
        sl.exp_avg_scale = ms.data(), sl.exp_avg_sq_scale = vs.data();
      if (c.out != ParamOut::kNone) sl.param_out = out.data();
      STRATA_RETURN_IF_ERROR(
          AdamStep(sl, BenchHyper(k), scale, CpuKernelOptions{1, CpuIsa::kScalar}));
    }
    const size_t w = pb == 2 || a.master == MasterFormat::kBf16Kahan ? 2 : 4;
    const std::vector<uint8_t> want = RangeBytes(p.data(), p.data() + len * w, m.data(), v.data(),
                                                 ms.data(), vs.data(), len, a, nb);
    const std::vector<uint8_t> got = RangeOf(a, g.lo, g.hi);
    for (size_t i = 0; i < len * pb; i += w) {  // masters element by element, the rest as a whole
      r.wrong += std::memcmp(&got[i], &want[i], w) != 0;
    }
    if (std::memcmp(got.data() + len * pb, want.data() + len * pb, got.size() - len * pb) != 0) {
      ++r.wrong;
    }
    if (c.out != ParamOut::kNone &&
        std::memcmp(out.data(), c.out_buffer + g.lo, len * sizeof(uint16_t)) != 0) {
      ++r.wrong;
    }
  }
  return r;
}

}  // namespace strata::cli
