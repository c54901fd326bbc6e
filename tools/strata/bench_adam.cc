// `strata bench adam`: throughput of the CPU AdamW kernel against its memory-bandwidth
// bound, and (--mode step) one whole fused optimizer step against the four-pass sequence.
//
// Bound: AdamTrafficStep (strata/optim.h), a kernel with exactly AdamStep's loads and stores (same
// arrays, widths, order and threading) whose arithmetic is one fma per stream that adds 0,
// timed alternately with AdamStep on the same buffers in the same run, so a shared,
// noisy machine slows both alike. ratio = median of paired (bound time / kernel time) (1.0 = at the
// bound). Because the bound leaves the data unchanged, the run can be validated at the end: a
// sample of elements is replayed with the scalar kernel and compared bit for bit (#wrong).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/bench_stats.h"
#include "model/run_size.h"
#include "strata/bytes.h"
#include "strata/env.h"
#include "strata/optim.h"
#include "tools/strata/bench_adam_state.h"
#include "tools/strata/cli_common.h"
#include "tools/strata/commands.h"
#include "tools/strata/config_file.h"

namespace strata::cli {
namespace {

using model::Median;

struct BenchAdamFlags {
  std::string params = "64M";
  std::vector<std::string> grad_dtypes;
  std::vector<std::string> param_outs;
  std::vector<int> threads;
  std::vector<std::string> isas;
  std::vector<std::string> state_dtypes;
  std::vector<std::string> master_dtypes;
  std::string mode = "adam";
  int iters = 10;
  int warmup = 2;
  std::string json;  // FILE, or "-" for standard output
};

// A buffer without value-initialisation (64M floats would otherwise be zeroed twice).
template <class T>
struct Buffer {
  std::unique_ptr<T[]> p;
  size_t n = 0;
  static Result<Buffer> Make(size_t n, const char* what) {
    Buffer b;
    b.p.reset(new (std::nothrow) T[n]);
    if (!b.p) {
      return Status::OutOfMemory(std::string("cannot allocate ") + std::to_string(n * sizeof(T)) +
                                 " bytes for " + what + ": lower --params");
    }
    b.n = n;
    return b;
  }
  T* data() const { return p.get(); }
  T& operator[](size_t i) const { return p[i]; }
};

// Deterministic pseudo-random floats in [lo, hi) (a hash of the index: fast for 64M).
inline float HashUniform(uint64_t i, uint64_t salt, float lo, float hi) {
  uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ salt;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return lo + (hi - lo) * static_cast<float>(x >> 40) * (1.0f / 16777216.0f);
}

struct State {
  Buffer<float> p, m, v, g32, scratch;
  Buffer<uint16_t> g16, out;
};

Status Fill(State* s, size_t n) {
  STRATA_ASSIGN_OR_RETURN(s->p, Buffer<float>::Make(n, "master"));
  STRATA_ASSIGN_OR_RETURN(s->m, Buffer<float>::Make(n, "exp_avg"));
  STRATA_ASSIGN_OR_RETURN(s->v, Buffer<float>::Make(n, "exp_avg_sq"));
  STRATA_ASSIGN_OR_RETURN(s->out, Buffer<uint16_t>::Make(n, "param_out"));
  for (size_t i = 0; i < n; ++i) {
    s->p[i] = HashUniform(i, 1, -1.0f, 1.0f);
    s->m[i] = HashUniform(i, 2, -1e-2f, 1e-2f);
    s->v[i] = HashUniform(i, 3, 0.0f, 1e-4f);
    s->out[i] = 0;
  }
  return Status::OK();
}

Status FillGrad(State* s, size_t n, FloatFormat f) {
  if (f == FloatFormat::kFp32) {
    if (!s->g32.p) {
      STRATA_ASSIGN_OR_RETURN(s->g32, Buffer<float>::Make(n, "grad"));
    }
    for (size_t i = 0; i < n; ++i) s->g32.p[i] = HashUniform(i, 4, -1e-2f, 1e-2f);
  } else {
    if (!s->g16.p) {
      STRATA_ASSIGN_OR_RETURN(s->g16, Buffer<uint16_t>::Make(n, "grad"));
    }
    for (size_t i = 0; i < n; ++i) {
      const float x = HashUniform(i, 4, -1e-2f, 1e-2f);
      s->g16.p[i] = f == FloatFormat::kBf16 ? FloatToBf16(x) : FloatToFp16(x);
    }
  }
  return Status::OK();
}

// The sampled elements' state before the timed run, replayed afterwards with the scalar
// kernel; every later operation on the big arrays is logged and replayed in order.
struct Sample {
  std::vector<size_t> idx;
  std::vector<float> p, m, v, g32;
  std::vector<uint16_t> g16, out;
  FloatFormat grad_format;

  void Take(const State& s, size_t n, FloatFormat gf) {
    grad_format = gf;
    const size_t k = std::min<size_t>(n, 1 << 16);
    idx.clear();
    for (size_t j = 0; j < k; ++j) idx.push_back(j * n / k);
    for (size_t t = 0; t < 17 && t < n; ++t) idx.push_back(n - 1 - t);  // the tail
    std::sort(idx.begin(), idx.end());
    idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
    p.clear(), m.clear(), v.clear(), g32.clear(), g16.clear(), out.clear();
    for (size_t i : idx) {
      p.push_back(s.p[i]);
      m.push_back(s.m[i]);
      v.push_back(s.v[i]);
      out.push_back(s.out[i]);
      if (gf == FloatFormat::kFp32) {
        g32.push_back(s.g32.p[i]);
      } else {
        g16.push_back(s.g16.p[i]);
      }
    }
  }
  void* grad() {
    return grad_format == FloatFormat::kFp32 ? static_cast<void*>(g32.data()) : g16.data();
  }
  AdamSlice Slice(ParamOut o) {
    return AdamSlice{p.data(), m.data(),    v.data(),
                     grad(),   grad_format, o == ParamOut::kNone ? nullptr : out.data(),
                     o,        idx.size()};
  }
  // Elements whose state differs from the big arrays (bitwise).
  uint64_t Wrong(const State& s, bool check_out) const {
    uint64_t wrong = 0;
    for (size_t j = 0; j < idx.size(); ++j) {
      const size_t i = idx[j];
      bool bad = std::memcmp(&p[j], &s.p[i], 4) || std::memcmp(&m[j], &s.m[i], 4) ||
                 std::memcmp(&v[j], &s.v[i], 4) || (check_out && out[j] != s.out[i]);
      if (grad_format == FloatFormat::kFp32) {
        bad = bad || std::memcmp(&g32[j], &s.g32.p[i], 4);
      } else {
        bad = bad || g16[j] != s.g16.p[i];
      }
      wrong += bad;
    }
    return wrong;
  }
};

template <class Fn>
Result<double> TimeIt(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  STRATA_RETURN_IF_ERROR(fn());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string CpuModel() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  }
  return "unknown";
}

struct AdamRow {
  StateFormat state;
  MasterFormat master;
  CpuIsa isa;
  FloatFormat grad;
  ParamOut out;
  int threads;
  size_t params;
  double seconds, bound_seconds;
  double ratio;  // median over iterations of (bound time / kernel time), measured in pairs
  size_t bytes_per_param;
  uint64_t wrong;
};

struct StepRow {
  CpuIsa isa;
  FloatFormat grad;
  int threads;
  size_t params;
  double fused_seconds, four_pass_seconds;
  double speedup;  // median over iterations of (four-pass time / fused time), in pairs
  size_t fused_bytes, four_pass_bytes;
  uint64_t wrong;
};

std::string ThreadsName(int t) { return t == 0 ? "default" : std::to_string(t); }

Status RunAdamCase(State& s, size_t n, CpuIsa isa, FloatFormat gf, ParamOut o, int threads,
                   const BenchAdamFlags& fl, AdamRow* row) {
  CpuKernelOptions opt{threads, isa};
  AdamSlice slice{
      s.p.data(), s.m.data(),
      s.v.data(), gf == FloatFormat::kFp32 ? static_cast<const void*>(s.g32.data()) : s.g16.data(),
      gf,         o == ParamOut::kNone ? nullptr : s.out.data(),
      o,          n};
  Sample sample;
  sample.Take(s, n, gf);
  const float scale = 0.5f;
  STRATA_ASSIGN_OR_RETURN(PairedTimes times,
                          TimeAgainstBound(
                              fl.warmup, fl.iters,
                              [&](int64_t t) { return AdamStep(slice, BenchHyper(t), scale, opt); },
                              [&](int64_t) { return AdamTrafficStep(slice, opt); }));
  int64_t t = times.steps;
  // One more (untimed) step so param_out holds AdamStep's copy, not the bound's bits.
  ++t;
  STRATA_RETURN_IF_ERROR(AdamStep(slice, BenchHyper(t), scale, opt));
  // Replay the t steps on the sample with the scalar kernel (the bound left data as is).
  CpuKernelOptions ref{1, CpuIsa::kScalar};
  for (int64_t k = 1; k <= t; ++k) {
    STRATA_RETURN_IF_ERROR(AdamStep(sample.Slice(o), BenchHyper(k), scale, ref));
  }
  *row = AdamRow{StateFormat::kFp32,
                 MasterFormat::kFp32,
                 isa,
                 gf,
                 o,
                 threads,
                 n,
                 times.kernel_seconds,
                 times.bound_seconds,
                 times.ratio,
                 AdamBytesPerParam(gf, o),
                 sample.Wrong(s, o != ParamOut::kNone)};
  return Status::OK();
}

// bf16 or int8 moments (bench_adam_state.cc): its own arrays, the grads and copy of `s`.
Status RunCompactCase(State& s, size_t n, CpuIsa isa, FloatFormat gf, ParamOut o, int threads,
                      StateFormat sf, MasterFormat mf, const BenchAdamFlags& fl, AdamRow* row) {
  CompactStateCase c;
  c.n = n, c.isa = isa, c.threads = threads, c.state = sf, c.grad_format = gf, c.master = mf;
  c.grad = gf == FloatFormat::kFp32 ? static_cast<const void*>(s.g32.data()) : s.g16.data();
  c.out = o, c.out_buffer = s.out.data(), c.warmup = fl.warmup, c.iters = fl.iters;
  STRATA_ASSIGN_OR_RETURN(const CompactStateResult r, RunCompactStateCase(c));
  *row = AdamRow{sf,
                 mf,
                 isa,
                 gf,
                 o,
                 threads,
                 n,
                 r.seconds,
                 r.bound_seconds,
                 r.ratio,
                 AdamBytesPerParam(gf, o, sf, mf),
                 r.wrong};
  return Status::OK();
}

// One optimizer step, fused: norm pass, then AdamStep with the unscale x clip scale and the
// bf16 copy. Four-pass: norm, ScaleGradients (writes the grads), AdamStep, ConvertFromFloat.
// Scales alternate 2 and 0.5 so the grads come back to their values (exact powers of two).
Status RunStepCase(State& s, size_t n, CpuIsa isa, FloatFormat gf, int threads,
                   const BenchAdamFlags& fl, StepRow* row) {
  CpuKernelOptions opt{threads, isa};
  void* grad = gf == FloatFormat::kFp32 ? static_cast<void*>(s.g32.data()) : s.g16.data();
  Sample sample;
  sample.Take(s, n, gf);
  struct Op {
    bool fused;
    int64_t t;
    float scale;
  };
  std::vector<Op> log;
  uint64_t non_finite = 0;
  auto fused = [&](int64_t t, float scale) -> Status {
    STRATA_ASSIGN_OR_RETURN(GradNormResult norm, GradNormSquared(grad, gf, n, opt));
    non_finite += norm.non_finite;
    AdamSlice slice{s.p.data(), s.m.data(), s.v.data(), grad, gf, s.out.data(), ParamOut::kBf16, n};
    return AdamStep(slice, BenchHyper(t), scale, opt);
  };
  auto four_pass = [&](int64_t t, float scale) -> Status {
    STRATA_ASSIGN_OR_RETURN(GradNormResult norm, GradNormSquared(grad, gf, n, opt));
    non_finite += norm.non_finite;
    STRATA_RETURN_IF_ERROR(ScaleGradients(grad, gf, n, scale, opt));
    AdamSlice slice{s.p.data(), s.m.data(), s.v.data(), grad, gf, nullptr, ParamOut::kNone, n};
    STRATA_RETURN_IF_ERROR(AdamStep(slice, BenchHyper(t), 1.0f, opt));
    return ConvertFromFloat(s.p.data(), s.out.data(), FloatFormat::kBf16, n, opt);
  };
  std::vector<double> ft, pt, ratios;
  int64_t t = 0;
  for (int k = 0; k < fl.warmup + fl.iters; ++k) {
    const float scale = (k % 2 == 0) ? 2.0f : 0.5f;
    double a = 0, b = 0;
    for (int half = 0; half < 2; ++half) {  // alternate which variant runs first
      ++t;
      if ((half == 0) == (k % 2 == 0)) {
        STRATA_ASSIGN_OR_RETURN(a, TimeIt([&] { return fused(t, scale); }));
        log.push_back({true, t, scale});
      } else {
        STRATA_ASSIGN_OR_RETURN(b, TimeIt([&] { return four_pass(t, scale); }));
        log.push_back({false, t, scale});
      }
    }
    if (k >= fl.warmup) ft.push_back(a), pt.push_back(b), ratios.push_back(b / a);
  }
  CpuKernelOptions ref{1, CpuIsa::kScalar};
  const size_t k = sample.idx.size();
  for (const Op& op : log) {
    if (op.fused) {
      STRATA_RETURN_IF_ERROR(
          AdamStep(sample.Slice(ParamOut::kBf16), BenchHyper(op.t), op.scale, ref));
    } else {
      STRATA_RETURN_IF_ERROR(ScaleGradients(sample.grad(), gf, k, op.scale, ref));
      STRATA_RETURN_IF_ERROR(AdamStep(sample.Slice(ParamOut::kNone), BenchHyper(op.t), 1.0f, ref));
      STRATA_RETURN_IF_ERROR(
          ConvertFromFloat(sample.p.data(), sample.out.data(), FloatFormat::kBf16, k, ref));
    }
  }
  const size_t g = FloatFormatBytes(gf);
  *row = StepRow{isa,
                 gf,
                 threads,
                 n,
                 Median(ft),
                 Median(pt),
                 Median(ratios),
                 g + AdamBytesPerParam(gf, ParamOut::kBf16),
                 g + 2 * g + AdamBytesPerParam(gf, ParamOut::kNone) + 4 + 2,
                 sample.Wrong(s, true) + non_finite};
  return Status::OK();
}

// The cases the flags ask for, each list checked and resolved (--isa all: every ISA this CPU
// has).
struct Cases {
  size_t params = 0;
  std::vector<CpuIsa> isas;
  std::vector<FloatFormat> grads;
  std::vector<ParamOut> outs;
  std::vector<StateFormat> states;    // of the moments (--mode adam)
  std::vector<MasterFormat> masters;  // of the master weights (--mode adam)
  bool step_mode = false;
};

// --params: a count as ParseBytes reads sizes (K, M, G = 2^10, 2^20, 2^30; overflow is an
// error), at least 1, and small enough that the State's buffers fit in this host's memory, so
// that a typo is refused by name before anything is allocated.
Result<size_t> ParseParams(const std::string& text) {
  STRATA_ASSIGN_OR_RETURN(const uint64_t n, ParseBytes("--params", text));
  if (n == 0) return Status::InvalidArgument("--params " + text + ": give at least 1 parameter");
  // Every buffer of State at once: master, moments, fp32 and 16-bit gradients, the 16-bit
  // copy-out and the four-pass scratch.
  constexpr uint64_t kBytesPerParam = 4 * 3 + 4 + 2 + 2 + 4;
  const uint64_t mem = model::HostMemoryBytes();
  if (mem != 0 && n > mem / kBytesPerParam) {
    return Status::InvalidArgument("--params " + text + " (" + std::to_string(n) +
                                   " parameters) needs up to " + std::to_string(kBytesPerParam) +
                                   " bytes each, more than this host's " + FormatBytes(mem) +
                                   " of memory; lower --params");
  }
  return static_cast<size_t>(n);
}

Result<Cases> ParseCases(const BenchAdamFlags& fl) {
  Cases c;
  STRATA_ASSIGN_OR_RETURN(c.params, ParseParams(fl.params));
  STRATA_RETURN_IF_ERROR(CheckOutput("--json", fl.json));  // before the run, not after it
  if (fl.iters < 1 || fl.warmup < 0) {
    return Status::InvalidArgument("--iters must be >= 1 and --warmup >= 0");
  }
  for (const std::string& name : fl.isas) {
    if (name == "all") {
      for (CpuIsa i : {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kScalar}) {
        if (CpuSupports(i)) c.isas.push_back(i);
      }
      continue;
    }
    Result<CpuIsa> isa = ParseCpuIsa(name);
    if (!isa.ok()) return Status::InvalidArgument("--isa: " + isa.status().message() + ", or all");
    STRATA_ASSIGN_OR_RETURN(CpuIsa resolved, ResolveCpuIsa(*isa));
    c.isas.push_back(resolved);
  }
  for (const std::string& name : fl.grad_dtypes) {
    Result<FloatFormat> f = ParseFloatFormat(name);
    if (!f.ok()) return Status::InvalidArgument("--grad-dtype: " + f.status().message());
    c.grads.push_back(*f);
  }
  for (const std::string& name : fl.param_outs) {
    Result<ParamOut> o = ParseParamOut(name);
    if (!o.ok()) return Status::InvalidArgument("--param-out: " + o.status().message());
    c.outs.push_back(*o);
  }
  for (int t : fl.threads) {
    if (t < 0) {
      return Status::InvalidArgument("--threads " + std::to_string(t) +
                                     ": use 0 (default) or more");
    }
  }
  for (const std::string& name : fl.state_dtypes) {
    Result<StateFormat> f = ParseStateFormat(name);
    if (!f.ok()) return Status::InvalidArgument("--state-dtype: " + f.status().message());
    c.states.push_back(*f);
  }
  for (const std::string& name : fl.master_dtypes) {
    Result<MasterFormat> f = ParseMasterFormat(name);
    if (!f.ok()) return Status::InvalidArgument("--master-dtype: " + f.status().message());
    c.masters.push_back(*f);
  }
  c.step_mode = fl.mode == "step";
  return c;
}

// The "# " lines echoing the configuration, and the table's column names.
void PrintHeader(FILE* out, const BenchAdamFlags& fl, const Cases& c) {
  Result<CpuIsa> found = ResolveCpuIsa(CpuIsa::kAuto);
  std::string supported;
  for (CpuIsa i : {CpuIsa::kAvx512, CpuIsa::kAvx2, CpuIsa::kScalar}) {
    if (CpuSupports(i)) supported += std::string(supported.empty() ? "" : " ") + CpuIsaName(i);
  }
  std::fprintf(out, "# strata bench adam --mode %s\n", fl.mode.c_str());
  std::fprintf(out, "# params: %zu (%s)  iters: %d  warmup: %d  (times are medians over iters)\n",
               c.params, fl.params.c_str(), fl.iters, fl.warmup);
  std::fprintf(out, "# cpu: %s; ISA found: %s; supported: %s; STRATA_CPU_ISA=%s\n",
               CpuModel().c_str(),
               found.ok() ? CpuIsaName(*found) : found.status().ToString().c_str(),
               supported.c_str(), EnvGet("STRATA_CPU_ISA").c_str());
  std::fprintf(out, "# hyper: AdamW lr=1e-3 wd=0.01 betas=(0.9,0.999) eps=1e-8\n");
  if (!c.step_mode) {
    std::fprintf(
        out,
        "# bound: same loads/stores as the kernel (AdamTrafficStep), one fma per "
        "stream; timed alternately with it; ratio = median of paired (bound time / kernel time)\n");
    std::fprintf(out,
                 "# #wrong: sampled elements differing (bitwise) from a scalar-kernel replay\n");
    std::fprintf(out,
                 "# state: moments' dtype (bf16: stochastic rounding; int8: nearest, + 8 B of "
                 "scales per 2048 params, not in B/param); the bound moves the same bytes\n");
    std::fprintf(out,
                 "# master: fp32, bf16-sr (2 B, stochastic rounding) or bf16-kahan (2 + 2 B); "
                 "a bf16 master skips fp16 grads and copies\n");
    std::fprintf(out, "%-5s %-10s %-7s %-5s %-5s %-8s %-11s %10s %9s %8s %8s %12s %7s %7s\n",
                 "state", "master", "isa", "grad", "out", "threads", "params", "time_ms",
                 "Gparam/s", "B/param", "GB/s", "bound_GB/s", "ratio", "#wrong");
  } else {
    std::fprintf(out,
                 "# fused: GradNormSquared pass + AdamStep(unscale x clip, bf16 copy-out)\n"
                 "# four-pass: GradNormSquared + ScaleGradients (writes grads) + AdamStep + "
                 "ConvertFromFloat(bf16)\n");
    std::fprintf(out, "%-10s %-7s %-5s %-8s %-11s %10s %9s %8s %8s %8s %7s\n", "variant", "isa",
                 "grad", "threads", "params", "time_ms", "Gparam/s", "B/param", "GB/s", "speedup",
                 "#wrong");
  }
  std::fflush(out);
}

// One row of --mode adam: printed, and returned as its JSON object.
nlohmann::json PrintAdamRow(FILE* out, const AdamRow& r) {
  const double gps = r.params / r.seconds / 1e9;
  const double gbps = gps * r.bytes_per_param;
  const double bound_gbps = r.params / r.bound_seconds / 1e9 * r.bytes_per_param;
  std::fprintf(out,
               "%-5s %-10s %-7s %-5s %-5s %-8s %-11zu %10.3f %9.3f %8zu %8.2f %12.2f %7.3f %7llu\n",
               StateFormatName(r.state), MasterFormatName(r.master), CpuIsaName(r.isa),
               FloatFormatName(r.grad), ParamOutName(r.out), ThreadsName(r.threads).c_str(),
               r.params, r.seconds * 1e3, gps, r.bytes_per_param, gbps, bound_gbps, r.ratio,
               static_cast<unsigned long long>(r.wrong));
  std::fflush(out);
  return {{"state_dtype", StateFormatName(r.state)},
          {"master_dtype", MasterFormatName(r.master)},
          {"isa", CpuIsaName(r.isa)},
          {"grad_dtype", FloatFormatName(r.grad)},
          {"param_out", ParamOutName(r.out)},
          {"threads", r.threads},
          {"params", r.params},
          {"seconds", r.seconds},
          {"gparams_per_s", gps},
          {"bytes_per_param", r.bytes_per_param},
          {"gbps", gbps},
          {"bound_gbps", bound_gbps},
          {"ratio_to_bound", r.ratio},
          {"wrong", r.wrong}};
}

// The two rows (fused, four-pass) of one --mode step case: printed, and returned as its JSON
// object.
nlohmann::json PrintStepRows(FILE* out, const StepRow& r) {
  for (bool fused : {true, false}) {
    const double sec = fused ? r.fused_seconds : r.four_pass_seconds;
    const size_t bytes = fused ? r.fused_bytes : r.four_pass_bytes;
    std::fprintf(out, "%-10s %-7s %-5s %-8s %-11zu %10.3f %9.3f %8zu %8.2f %8s %7llu\n",
                 fused ? "fused" : "four-pass", CpuIsaName(r.isa), FloatFormatName(r.grad),
                 ThreadsName(r.threads).c_str(), r.params, sec * 1e3, r.params / sec / 1e9, bytes,
                 r.params / sec / 1e9 * bytes,
                 fused ? (std::to_string(r.speedup).substr(0, 5) + "x").c_str() : "1x",
                 static_cast<unsigned long long>(r.wrong));
  }
  std::fflush(out);
  return {{"isa", CpuIsaName(r.isa)},
          {"grad_dtype", FloatFormatName(r.grad)},
          {"threads", r.threads},
          {"params", r.params},
          {"fused_seconds", r.fused_seconds},
          {"four_pass_seconds", r.four_pass_seconds},
          {"fused_bytes_per_param", r.fused_bytes},
          {"four_pass_bytes_per_param", r.four_pass_bytes},
          {"speedup", r.speedup},
          {"wrong", r.wrong}};
}

// DeepSpeed's layout keeps fp32 grads on the host and runs the four passes (46 B/param); when
// both were measured, our fused bf16 step against it too.
void PrintAgainstDeepSpeedLayout(FILE* out, const std::vector<StepRow>& rows) {
  for (const StepRow& a : rows) {
    for (const StepRow& b : rows) {
      if (a.grad == FloatFormat::kBf16 && b.grad == FloatFormat::kFp32 && a.isa == b.isa &&
          a.threads == b.threads) {
        std::fprintf(out,
                     "# fused bf16-grad step (%zu B/param) vs four-pass fp32-grad step (%zu "
                     "B/param, DeepSpeed's layout), %s threads %s: %.3fx\n",
                     a.fused_bytes, b.four_pass_bytes, CpuIsaName(a.isa),
                     ThreadsName(a.threads).c_str(), b.four_pass_seconds / a.fused_seconds);
      }
    }
  }
}

int RunBenchAdam(const BenchAdamFlags& fl) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "strata bench adam: %s\n", st.ToString().c_str());
    return 1;
  };
  Result<Cases> cases = ParseCases(fl);
  if (!cases.ok()) return fail(cases.status());
  const Cases& c = *cases;
  const size_t n = c.params;
  FILE* out = fl.json == "-" ? stderr : stdout;  // with --json -, the table goes to stderr
  PrintHeader(out, fl, c);

  State s;
  if (Status st = Fill(&s, n); !st.ok()) return fail(st);
  nlohmann::json runs = nlohmann::json::array();
  nlohmann::json steps = nlohmann::json::array();
  uint64_t total_wrong = 0;
  size_t skipped = 0;  // fp16 gradients or copies with a bf16 master: no kernel takes them
  std::vector<StepRow> step_rows;
  for (FloatFormat gf : c.grads) {
    if (Status st = FillGrad(&s, n, gf); !st.ok()) return fail(st);
    for (CpuIsa isa : c.isas) {
      for (int threads : fl.threads) {
        if (c.step_mode) {
          StepRow r;
          if (Status st = RunStepCase(s, n, isa, gf, threads, fl, &r); !st.ok()) return fail(st);
          steps.push_back(PrintStepRows(out, r));
          total_wrong += r.wrong;
          step_rows.push_back(r);
          continue;
        }
        for (StateFormat sf : c.states) {
          for (MasterFormat mf : c.masters) {
            for (ParamOut o : c.outs) {
              const bool bf16_master = mf != MasterFormat::kFp32;
              if (bf16_master && (gf == FloatFormat::kFp16 || o == ParamOut::kFp16)) {
                ++skipped;
                continue;
              }
              AdamRow r;
              const Status st = sf == StateFormat::kFp32 && !bf16_master
                                    ? RunAdamCase(s, n, isa, gf, o, threads, fl, &r)
                                    : RunCompactCase(s, n, isa, gf, o, threads, sf, mf, fl, &r);
              if (!st.ok()) return fail(st);
              runs.push_back(PrintAdamRow(out, r));
              total_wrong += r.wrong;
            }
          }
        }
      }
    }
  }
  PrintAgainstDeepSpeedLayout(out, step_rows);
  if (skipped != 0) {
    std::fprintf(out,
                 "skipped %zu case(s): a bf16 master takes fp32 or bf16 gradients and writes no "
                 "fp16 parameter copy (--grad-dtype / --param-out fp16)\n",
                 skipped);
    if (runs.empty() && steps.empty()) {
      return fail(Status::InvalidArgument(
          "no case left to run: add --grad-dtype fp32 or bf16 and --param-out none or bf16"));
    }
  }
  if (!fl.json.empty()) {
    nlohmann::json doc = {{"runs", runs}};
    if (c.step_mode) doc["steps"] = steps;
    if (Status st = WriteOutput("--json", fl.json, doc.dump(2) + "\n"); !st.ok()) return fail(st);
  }
  if (total_wrong > 0) {
    std::fprintf(stderr,
                 "strata bench adam: %llu sampled elements differ from the scalar reference\n",
                 static_cast<unsigned long long>(total_wrong));
    return 1;
  }
  return 0;
}

}  // namespace

void AddBenchAdam(CLI::App& bench, int* exit_code) {
  auto fl = std::make_shared<BenchAdamFlags>();
  fl->grad_dtypes = {"fp32"};
  fl->param_outs = {"none"};
  fl->threads = {0};
  fl->isas = {"auto"};
  fl->state_dtypes = {"fp32"};
  fl->master_dtypes = {"fp32"};
  CLI::App* cmd = bench.add_subcommand(
      "adam",
      "CPU AdamW throughput against its same-traffic memory bound; --mode step: one fused "
      "optimizer step against the four-pass norm/unscale/Adam/copy sequence");
  cmd->add_option("--params", fl->params, "parameters per case; K, M, G = 2^10, 2^20, 2^30")
      ->capture_default_str();
  cmd->add_option("--grad-dtype", fl->grad_dtypes,
                  "gradient format(s): fp32, bf16, fp16 (comma list)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--param-out", fl->param_outs,
                  "parameter copy written in the same pass: none, bf16, fp16 (comma list; "
                  "--mode step always writes bf16)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--threads", fl->threads,
                  "OpenMP threads (comma list); 0 = STRATA_NUM_THREADS or one per core")
      ->check(CLI::Range(0, kMaxThreads))
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--isa", fl->isas,
                  "kernel ISA(s): auto, avx512, avx2, scalar, or all (every one this CPU has)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--state-dtype", fl->state_dtypes,
                  "Adam moments' dtype(s), --mode adam: fp32, bf16, int8 (comma list)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--master-dtype", fl->master_dtypes,
                  "master weights' dtype(s), --mode adam: fp32, bf16-sr, bf16-kahan (comma list)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--mode", fl->mode, "adam: kernel vs bound; step: fused step vs four passes")
      ->check(CLI::IsMember({"adam", "step"}))
      ->capture_default_str();
  cmd->add_option("--iters", fl->iters, "timed iterations per case (median reported)")
      ->capture_default_str();
  cmd->add_option("--warmup", fl->warmup, "untimed iterations first")->capture_default_str();
  cmd->add_option("--json", fl->json,
                  "write the results as JSON to FILE (-: standard output; the table then goes "
                  "to standard error)");
  SetCallbackWithConfig(
      cmd, [fl] { return RunBenchAdam(*fl); }, exit_code);
}

}  // namespace strata::cli
