// The public entry points of include/strata/optim.h: argument checks, ISA resolution and
// the OpenMP split of a call into fixed chunks.
//
// Chunking: a call is cut into chunks of kChunk elements whose boundaries fall on 64-byte
// lines of `master` (or the first array), and OpenMP's static schedule hands each thread
// one contiguous run of chunks, so threads share at most one cache line per array at
// each of their (threads - 1) boundaries: no false sharing in the loop. Every element's
// result is independent of which chunk or thread computes it, so the split never changes
// a bit. GradNormSquared instead cuts at fixed kGradNormBlock element indices and adds the
// block sums in order, which makes the reduction independent of the split too.
#include "strata/optim.h"

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "cpu_optim/convert.h"
#include "cpu_optim/kernels.h"
#include "strata/env.h"

namespace strata {

const char* FloatFormatName(FloatFormat format) {
  switch (format) {
    case FloatFormat::kFp32:
      return "fp32";
    case FloatFormat::kBf16:
      return "bf16";
    case FloatFormat::kFp16:
      return "fp16";
  }
  return "?";
}

Result<FloatFormat> ParseFloatFormat(std::string_view name) {
  if (name == "fp32") return FloatFormat::kFp32;
  if (name == "bf16") return FloatFormat::kBf16;
  if (name == "fp16") return FloatFormat::kFp16;
  return Status::InvalidArgument("unknown float format '" + std::string(name) +
                                 "': use fp32, bf16 or fp16");
}

size_t FloatFormatBytes(FloatFormat format) { return format == FloatFormat::kFp32 ? 4 : 2; }

const char* ParamOutName(ParamOut out) {
  switch (out) {
    case ParamOut::kNone:
      return "none";
    case ParamOut::kBf16:
      return "bf16";
    case ParamOut::kFp16:
      return "fp16";
  }
  return "?";
}

const char* StateFormatName(StateFormat format) {
  switch (format) {
    case StateFormat::kFp32:
      return "fp32";
    case StateFormat::kBf16:
      return "bf16";
    case StateFormat::kInt8:
      return "int8";
  }
  return "?";
}

Result<StateFormat> ParseStateFormat(std::string_view name) {
  if (name == "fp32") return StateFormat::kFp32;
  if (name == "bf16") return StateFormat::kBf16;
  if (name == "int8") return StateFormat::kInt8;
  return Status::InvalidArgument("unknown optimizer state dtype '" + std::string(name) +
                                 "': use fp32, bf16 or int8");
}

const char* MasterFormatName(MasterFormat format) {
  switch (format) {
    case MasterFormat::kFp32:
      return "fp32";
    case MasterFormat::kBf16Stochastic:
      return "bf16-sr";
    case MasterFormat::kBf16Kahan:
      return "bf16-kahan";
  }
  return "?";
}

Result<MasterFormat> ParseMasterFormat(std::string_view name) {
  if (name == "fp32") return MasterFormat::kFp32;
  if (name == "bf16-sr") return MasterFormat::kBf16Stochastic;
  if (name == "bf16-kahan") return MasterFormat::kBf16Kahan;
  return Status::InvalidArgument("unknown master weight dtype '" + std::string(name) +
                                 "': use fp32, bf16-sr or bf16-kahan");
}

size_t MasterFormatBytes(MasterFormat format) {
  return format == MasterFormat::kBf16Stochastic ? 2 : 4;
}

const char* StateRoundingName(StateRounding rounding) {
  switch (rounding) {
    case StateRounding::kNearestEven:
      return "nearest-even";
    case StateRounding::kStochastic:
      return "stochastic";
  }
  return "?";
}

Result<ParamOut> ParseParamOut(std::string_view name) {
  if (name == "none") return ParamOut::kNone;
  if (name == "bf16") return ParamOut::kBf16;
  if (name == "fp16") return ParamOut::kFp16;
  return Status::InvalidArgument("unknown parameter copy format '" + std::string(name) +
                                 "': use none, bf16 or fp16");
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAuto:
      return "auto";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kScalar:
      return "scalar";
  }
  return "?";
}

Result<CpuIsa> ParseCpuIsa(std::string_view name) {
  if (name == "auto") return CpuIsa::kAuto;
  if (name == "avx512") return CpuIsa::kAvx512;
  if (name == "avx2") return CpuIsa::kAvx2;
  if (name == "scalar") return CpuIsa::kScalar;
  return Status::InvalidArgument("unknown CPU ISA '" + std::string(name) +
                                 "': use auto, avx512, avx2 or scalar");
}

bool CpuSupports(CpuIsa isa) {
#if defined(STRATA_CPU_OPTIM_X86)
  // __builtin_cpu_supports also checks that the OS saves the wider register state (XCR0).
  static const bool kAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                            __builtin_cpu_supports("f16c");
  static const bool kAvx512 = kAvx2 && __builtin_cpu_supports("avx512f") &&
                              __builtin_cpu_supports("avx512bw") &&
                              __builtin_cpu_supports("avx512vl");
#else
  constexpr bool kAvx2 = false;  // not an x86 build: only the scalar kernels exist
  constexpr bool kAvx512 = false;
#endif
  switch (isa) {
    case CpuIsa::kAuto:
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
      return kAvx2;
    case CpuIsa::kAvx512:
      return kAvx512;
  }
  return false;
}

Result<CpuIsa> ResolveCpuIsa(CpuIsa requested) {
  CpuIsa isa = requested;
  const char* source = "requested";
  if (isa == CpuIsa::kAuto) {
    const std::string env = EnvGet("STRATA_CPU_ISA");
    Result<CpuIsa> parsed = ParseCpuIsa(env);
    if (!parsed.ok()) {
      return Status::InvalidArgument("STRATA_CPU_ISA='" + env +
                                     "' is not an ISA: use auto, avx512, avx2 or scalar");
    }
    isa = *parsed;
    source = "STRATA_CPU_ISA";
  }
  if (isa == CpuIsa::kAuto) {
    return CpuSupports(CpuIsa::kAvx512) ? CpuIsa::kAvx512
           : CpuSupports(CpuIsa::kAvx2) ? CpuIsa::kAvx2
                                        : CpuIsa::kScalar;
  }
  if (!CpuSupports(isa)) {
    return Status::NotSupported(std::string("CPU ISA ") + CpuIsaName(isa) + " (" + source +
                                ") is not supported by this CPU: " +
                                (isa == CpuIsa::kAvx512 ? "it needs AVX512F, AVX512BW and AVX512VL"
                                                        : "it needs AVX2, FMA and F16C") +
                                "; use auto or scalar");
  }
  return isa;
}

uint16_t FloatToBf16(float value) { return cpu_optim::FloatToBf16Bits(value); }
float Bf16ToFloat(uint16_t bits) { return cpu_optim::Bf16BitsToFloat(bits); }
uint16_t FloatToFp16(float value) { return cpu_optim::FloatToFp16Bits(value); }
float Fp16ToFloat(uint16_t bits) { return cpu_optim::Fp16BitsToFloat(bits); }

namespace cpu_optim {
namespace {

// 16 Ki elements = 64 KiB per fp32 array: large enough that the OpenMP overhead is noise,
// a multiple of 16 elements so full chunks are whole vectors and whole 64-byte lines.
constexpr size_t kChunk = 16384;
// Below this many elements a call runs on the calling thread (a fork costs microseconds).
constexpr size_t kMinParallel = 2 * kChunk;

int ThreadCount(const CpuKernelOptions& options) {
#if defined(__SANITIZE_THREAD__)
  // libgomp is not instrumented: ThreadSanitizer cannot see its fork and barrier, so every
  // region would be reported. Under TSan the kernels run on the calling thread (the same bits:
  // the tests check every thread count gives them), and TSan checks the threads around them.
  (void)options;
  return 1;
#endif
  if (options.threads > 0) return options.threads;
  if (const int env = EnvNumThreads(); env > 0) return env;
  return omp_get_max_threads();
}

// Calls fn(begin, end) over [0, n) in chunks aligned to `anchor`'s 64-byte lines.
template <class Fn>
void ParallelChunks(size_t n, const void* anchor, size_t elem_bytes, int threads, Fn&& fn) {
  if (n == 0) return;
  if (threads <= 1 || n < kMinParallel) {
    fn(size_t{0}, n);
    return;
  }
  const size_t misalign = reinterpret_cast<uintptr_t>(anchor) % 64;
  size_t head = misalign == 0 ? 0 : (64 - misalign) / elem_bytes;  // elements to the line
  if (head == 0) head = kChunk;
  const size_t chunks = 1 + (n > head ? (n - head + kChunk - 1) / kChunk : 0);
  const int t = static_cast<int>(chunks < static_cast<size_t>(threads) ? chunks : threads);
#pragma omp parallel for schedule(static) num_threads(t)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t begin = c == 0 ? 0 : head + (c - 1) * kChunk;
    const size_t end_raw = head + c * kChunk;
    fn(begin, end_raw < n ? end_raw : n);
  }
}

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a == nullptr || b == nullptr || a_bytes == 0 || b_bytes == 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

size_t ParamOutBytes(ParamOut out) { return out == ParamOut::kNone ? 0 : 2; }

size_t StateBytesPerElement(StateFormat f) {
  return f == StateFormat::kFp32 ? 4 : f == StateFormat::kBf16 ? 2 : 1;
}

// Int8 slices: whole quantization blocks per call, kInt8Chunk blocks per OpenMP chunk (the
// same element count as kChunk).
constexpr size_t kInt8Chunk = kChunk / kInt8StateBlock;

template <class Fn>
void ParallelBlocks(size_t n, int threads, Fn&& fn) {
  const size_t blocks = Int8StateBlocks(n);
  if (blocks == 0) return;
  if (threads <= 1 || n < kMinParallel) {
    fn(size_t{0}, blocks);
    return;
  }
  const size_t chunks = (blocks + kInt8Chunk - 1) / kInt8Chunk;
  const int t = static_cast<int>(chunks < static_cast<size_t>(threads) ? chunks : threads);
#pragma omp parallel for schedule(static) num_threads(t)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t last = (c + 1) * kInt8Chunk;
    fn(c * kInt8Chunk, last < blocks ? last : blocks);
  }
}

// A bf16 master's arrays and the formats it takes; OK for an fp32 master.
Status CheckMaster(const AdamSlice& s) {
  const MasterFormat f = s.master_format;
  if (f != MasterFormat::kFp32 && f != MasterFormat::kBf16Stochastic &&
      f != MasterFormat::kBf16Kahan) {
    return Status::InvalidArgument("AdamStep: unknown MasterFormat value " +
                                   std::to_string(static_cast<int>(f)));
  }
  if (f == MasterFormat::kFp32) {
    if (s.master_bf16 != nullptr || s.master_comp != nullptr) {
      return Status::InvalidArgument(
          "AdamStep: master_bf16/master_comp are set but master_format is fp32: set "
          "master_format to bf16-sr or bf16-kahan, or pass `master` only");
    }
    return Status::OK();
  }
  const bool kahan = f == MasterFormat::kBf16Kahan;
  if (s.master != nullptr || s.master_bf16 == nullptr || kahan != (s.master_comp != nullptr)) {
    return Status::InvalidArgument(
        std::string("AdamStep: a ") + MasterFormatName(f) + " master takes master_bf16" +
        (kahan ? " and master_comp" : " (no master_comp)") + " and a null `master`");
  }
  if (s.grad_format == FloatFormat::kFp16 || s.param_out_format == ParamOut::kFp16) {
    return Status::NotSupported(
        "AdamStep: a bf16 master takes fp32 or bf16 gradients and no copy or a bf16 one; "
        "use an fp32 master with fp16");
  }
  return Status::OK();
}

Status CheckSlice(const AdamSlice& s) {
  if (s.n == 0) return Status::OK();
  STRATA_RETURN_IF_ERROR(CheckMaster(s));
  const bool master = s.master != nullptr || s.master_bf16 != nullptr;
  if (!master || s.exp_avg == nullptr || s.exp_avg_sq == nullptr || s.grad == nullptr) {
    return Status::InvalidArgument(
        "AdamStep: master, exp_avg, exp_avg_sq and grad must be "
        "non-null for a slice of " +
        std::to_string(s.n) + " elements");
  }
  if ((s.param_out == nullptr) != (s.param_out_format == ParamOut::kNone)) {
    return Status::InvalidArgument(std::string("AdamStep: param_out is ") +
                                   (s.param_out ? "set" : "null") + " but param_out_format is " +
                                   ParamOutName(s.param_out_format) + ": pass both or neither");
  }
  struct Range {
    const char* name;
    const void* p;
    size_t bytes;
  };
  if (s.state_format != StateFormat::kFp32 && s.state_format != StateFormat::kBf16 &&
      s.state_format != StateFormat::kInt8) {
    return Status::InvalidArgument("AdamStep: unknown StateFormat value " +
                                   std::to_string(static_cast<int>(s.state_format)));
  }
  if (s.state_rounding != StateRounding::kNearestEven &&
      s.state_rounding != StateRounding::kStochastic) {
    return Status::InvalidArgument("AdamStep: unknown StateRounding value " +
                                   std::to_string(static_cast<int>(s.state_rounding)));
  }
  const bool int8 = s.state_format == StateFormat::kInt8;
  if (int8 && (s.exp_avg_scale == nullptr || s.exp_avg_sq_scale == nullptr)) {
    return Status::InvalidArgument(
        "AdamStep: int8 moments need exp_avg_scale and exp_avg_sq_scale (" +
        std::to_string(Int8StateBlocks(s.n)) + " floats each for " + std::to_string(s.n) +
        " elements)");
  }
  const size_t state = StateBytesPerElement(s.state_format);
  const size_t scales = int8 ? Int8StateBlocks(s.n) * 4 : 0;
  const Range r[] = {{"master", s.master, s.n * 4},
                     {"exp_avg", s.exp_avg, s.n * state},
                     {"exp_avg_sq", s.exp_avg_sq, s.n * state},
                     {"grad", s.grad, s.n * FloatFormatBytes(s.grad_format)},
                     {"param_out", s.param_out, s.n * ParamOutBytes(s.param_out_format)},
                     {"exp_avg_scale", int8 ? s.exp_avg_scale : nullptr, scales},
                     {"exp_avg_sq_scale", int8 ? s.exp_avg_sq_scale : nullptr, scales},
                     {"master_bf16", s.master_bf16, s.n * 2},
                     {"master_comp", s.master_comp, s.n * 2}};
  for (size_t i = 0; i < std::size(r); ++i) {
    for (size_t j = i + 1; j < std::size(r); ++j) {
      if (Overlaps(r[i].p, r[i].bytes, r[j].p, r[j].bytes)) {
        return Status::InvalidArgument(std::string("AdamStep: ") + r[i].name + " and " + r[j].name +
                                       " overlap; each array needs its own memory");
      }
    }
  }
  return Status::OK();
}

Status CheckHyper(const AdamHyperParams& h, float grad_scale) {
  auto bad = [](const char* what, double v, const char* want) {
    return Status::InvalidArgument(std::string("AdamStep: ") + what + " = " + std::to_string(v) +
                                   " is invalid: " + want);
  };
  if (!(h.lr >= 0.0) || !std::isfinite(h.lr)) return bad("lr", h.lr, "need a finite lr >= 0");
  if (!(h.beta1 >= 0.0 && h.beta1 < 1.0)) return bad("beta1", h.beta1, "need 0 <= beta1 < 1");
  if (!(h.beta2 >= 0.0 && h.beta2 < 1.0)) return bad("beta2", h.beta2, "need 0 <= beta2 < 1");
  if (!(h.eps >= 0.0) || !std::isfinite(h.eps)) return bad("eps", h.eps, "need a finite eps >= 0");
  if (!(h.weight_decay >= 0.0) || !std::isfinite(h.weight_decay)) {
    return bad("weight_decay", h.weight_decay, "need a finite weight_decay >= 0");
  }
  if (h.step < 1) {
    return Status::InvalidArgument("AdamStep: step = " + std::to_string(h.step) +
                                   " is invalid: steps are counted from 1");
  }
  if (!std::isfinite(grad_scale)) {
    return Status::InvalidArgument(
        "AdamStep: grad_scale is not finite: skip the step when GradNormSquared reports "
        "non-finite gradients instead of passing a NaN/Inf clip coefficient");
  }
  return Status::OK();
}

Status CheckFormat(FloatFormat f, const char* fn) {
  if (f == FloatFormat::kFp32 || f == FloatFormat::kBf16 || f == FloatFormat::kFp16) {
    return Status::OK();
  }
  return Status::InvalidArgument(std::string(fn) + ": unknown FloatFormat value " +
                                 std::to_string(static_cast<int>(f)));
}

Status PrepareAdam(const AdamSlice& slice, const CpuKernelOptions& options,
                   const IsaKernels** kernels) {
  STRATA_RETURN_IF_ERROR(CheckFormat(slice.grad_format, "AdamStep"));
  if (slice.param_out_format != ParamOut::kNone && slice.param_out_format != ParamOut::kBf16 &&
      slice.param_out_format != ParamOut::kFp16) {
    return Status::InvalidArgument("AdamStep: unknown ParamOut value " +
                                   std::to_string(static_cast<int>(slice.param_out_format)));
  }
  STRATA_RETURN_IF_ERROR(CheckSlice(slice));
  STRATA_ASSIGN_OR_RETURN(*kernels, KernelsFor(options));
  return Status::OK();
}

// The master array, whose 64-byte lines the chunks are aligned to, and its element width.
const void* MasterAnchor(const AdamSlice& s) {
  return s.master != nullptr ? static_cast<const void*>(s.master) : s.master_bf16;
}
size_t MasterAnchorBytes(const AdamSlice& s) { return s.master != nullptr ? 4 : 2; }

// The slice's arrays and formats as the kernels take them (scalars left to the caller).
AdamArgs ArgsOf(const AdamSlice& slice, AdamMode mode, const AdamScalars& scalars) {
  AdamArgs a{slice.master,    slice.exp_avg,     slice.exp_avg_sq,       slice.grad,
             slice.param_out, slice.grad_format, slice.param_out_format, mode,
             scalars};
  if (slice.state_format == StateFormat::kBf16) {
    a.moments = slice.state_rounding == StateRounding::kStochastic ? MomentStore::kBf16Stochastic
                                                                   : MomentStore::kBf16Nearest;
  } else if (slice.state_format == StateFormat::kInt8) {
    a.moments = MomentStore::kInt8;
    a.exp_avg_scale = slice.exp_avg_scale;
    a.exp_avg_sq_scale = slice.exp_avg_sq_scale;
    a.int8_nearest = slice.state_rounding == StateRounding::kNearestEven;
  }
  a.n = slice.n;
  a.rounding_key = Mix32(static_cast<uint32_t>(slice.rounding_key ^ (slice.rounding_key >> 32)));
  a.master_key = Mix32(a.rounding_key ^ 0x85ebca6bu);
  a.master_store = slice.master_format == MasterFormat::kBf16Stochastic
                       ? MasterStore::kBf16Stochastic
                   : slice.master_format == MasterFormat::kBf16Kahan ? MasterStore::kBf16Kahan
                                                                     : MasterStore::kF32;
  a.master16 = slice.master_bf16;
  a.comp = slice.master_comp;
  a.index_base = slice.index_base;
  return a;
}

}  // namespace

AdamScalars MakeAdamScalars(const AdamHyperParams& h, float grad_scale) {
  const double t = static_cast<double>(h.step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
  AdamScalars s;
  s.grad_scale = grad_scale;
  s.weight_decay = static_cast<float>(h.weight_decay);
  s.neg_lr_wd = static_cast<float>(-h.lr * h.weight_decay);
  s.one_minus_lr_wd = static_cast<float>(1.0 - h.lr * h.weight_decay);
  s.beta1 = static_cast<float>(h.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  s.bias_correction2_sqrt = static_cast<float>(bias_correction2_sqrt);
  s.eps = static_cast<float>(h.eps);
  s.neg_step_size = static_cast<float>(-h.lr / bias_correction1);
  s.eps_x_bc2_sqrt = static_cast<float>(h.eps * bias_correction2_sqrt);
  s.neg_step_size_x_bc2_sqrt = static_cast<float>(-h.lr / bias_correction1 * bias_correction2_sqrt);
  const double sqrt_one_minus_beta2 = std::sqrt(1.0 - h.beta2);
  s.sqrt_beta2 = static_cast<float>(std::sqrt(h.beta2));
  s.sqrt_one_minus_beta2 = static_cast<float>(sqrt_one_minus_beta2);
  s.one_minus_beta1_x_grad_scale = static_cast<float>((1.0 - h.beta1) * grad_scale);
  s.sqrt_one_minus_beta2_x_grad_scale = static_cast<float>(sqrt_one_minus_beta2 * grad_scale);
  return s;
}

Result<const IsaKernels*> KernelsFor(const CpuKernelOptions& options) {
  if (options.threads < 0) {
    return Status::InvalidArgument("threads = " + std::to_string(options.threads) +
                                   " is invalid: use 0 (default) or a positive count");
  }
  STRATA_ASSIGN_OR_RETURN(const CpuIsa isa, ResolveCpuIsa(options.isa));
#if defined(STRATA_CPU_OPTIM_X86)
  if (isa == CpuIsa::kAvx512) return &Avx512Kernels();
  if (isa == CpuIsa::kAvx2) return &Avx2Kernels();
#endif
  return &ScalarKernels();
}

size_t AdamBytesPerParam(FloatFormat grad_format, ParamOut param_out, StateFormat state_format,
                         MasterFormat master_format) {
  const size_t moment = StateBytesPerElement(state_format);
  return FloatFormatBytes(grad_format) + (MasterFormatBytes(master_format) + 2 * moment) * 2 +
         ParamOutBytes(param_out);
}

Status TrafficStep(const AdamSlice& slice, const CpuKernelOptions& options) {
  const IsaKernels* kernels = nullptr;
  STRATA_RETURN_IF_ERROR(PrepareAdam(slice, options, &kernels));
  const AdamArgs args = ArgsOf(slice, AdamMode::kAdamW, AdamScalars{});
  if (slice.state_format == StateFormat::kInt8) {
    ParallelBlocks(slice.n, ThreadCount(options),
                   [&](size_t b, size_t e) { kernels->traffic_int8(args, b, e); });
    return Status::OK();
  }
  ParallelChunks(slice.n, MasterAnchor(slice), MasterAnchorBytes(slice), ThreadCount(options),
                 [&](size_t b, size_t e) { kernels->traffic(args, b, e); });
  return Status::OK();
}

}  // namespace cpu_optim

Status AdamStep(const AdamSlice& slice, const AdamHyperParams& hyper, float grad_scale,
                const CpuKernelOptions& options) {
  using namespace cpu_optim;  // NOLINT: internal names of this module
  const IsaKernels* kernels = nullptr;
  STRATA_RETURN_IF_ERROR(PrepareAdam(slice, options, &kernels));
  STRATA_RETURN_IF_ERROR(CheckHyper(hyper, grad_scale));
  const bool torch_rounding =
      hyper.mode == AdamMode::kAdamWTorch || hyper.mode == AdamMode::kAdamWTorchLerp;
  if (hyper.mode != AdamMode::kAdamW && hyper.mode != AdamMode::kAdam && !torch_rounding) {
    return Status::InvalidArgument("AdamStep: unknown AdamMode value " +
                                   std::to_string(static_cast<int>(hyper.mode)));
  }
  if (torch_rounding &&
      (slice.grad_format != FloatFormat::kFp32 || slice.param_out_format != ParamOut::kNone ||
       slice.state_format != StateFormat::kFp32 || slice.master_format != MasterFormat::kFp32)) {
    return Status::NotSupported(
        "AdamStep: AdamMode::kAdamWTorch[Lerp] (torch's rounding order) takes fp32 gradients, fp32 "
        "moments and master and no parameter copy; use AdamMode::kAdamW for the other formats");
  }
  const AdamArgs args = ArgsOf(slice, hyper.mode, MakeAdamScalars(hyper, grad_scale));
  if (slice.state_format == StateFormat::kInt8) {
    ParallelBlocks(slice.n, ThreadCount(options),
                   [&](size_t b, size_t e) { kernels->adam_int8(args, b, e); });
    return Status::OK();
  }
  ParallelChunks(slice.n, MasterAnchor(slice), MasterAnchorBytes(slice), ThreadCount(options),
                 [&](size_t b, size_t e) { kernels->adam(args, b, e); });
  return Status::OK();
}

Result<GradNormResult> GradNormSquared(const void* grad, FloatFormat format, size_t n,
                                       const CpuKernelOptions& options) {
  using namespace cpu_optim;  // NOLINT
  STRATA_RETURN_IF_ERROR(CheckFormat(format, "GradNormSquared"));
  if (n > 0 && grad == nullptr) {
    return Status::InvalidArgument("GradNormSquared: grad is null for " + std::to_string(n) +
                                   " elements");
  }
  STRATA_ASSIGN_OR_RETURN(const IsaKernels* kernels, KernelsFor(options));
  GradNormResult result;
  if (n == 0) return result;
  const size_t blocks = (n + kGradNormBlock - 1) / kGradNormBlock;
  struct BlockSum {
    double sum;
    uint64_t bad;
  };
  std::vector<BlockSum> sums;
  try {
    sums.resize(blocks);
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory("GradNormSquared: cannot allocate " +
                               std::to_string(blocks * sizeof(BlockSum)) +
                               " bytes of block sums for " + std::to_string(n) + " elements");
  }
  auto run = [&](size_t b) {
    const size_t begin = b * kGradNormBlock;
    const size_t end = begin + kGradNormBlock < n ? begin + kGradNormBlock : n;
    kernels->norm_block(grad, format, begin, end, &sums[b].sum, &sums[b].bad);
  };
  const int threads = ThreadCount(options);
  if (threads <= 1 || n < kMinParallel) {
    for (size_t b = 0; b < blocks; ++b) run(b);
  } else {
    const int t = static_cast<int>(blocks < static_cast<size_t>(threads) ? blocks : threads);
#pragma omp parallel for schedule(static) num_threads(t)
    for (size_t b = 0; b < blocks; ++b) run(b);
  }
  for (const BlockSum& s : sums) {  // block order: the fixed combination
    result.sum_squares += s.sum;
    result.non_finite += s.bad;
  }
  return result;
}

Status ScaleGradients(void* grad, FloatFormat format, size_t n, float scale,
                      const CpuKernelOptions& options) {
  using namespace cpu_optim;  // NOLINT
  STRATA_RETURN_IF_ERROR(CheckFormat(format, "ScaleGradients"));
  if (n > 0 && grad == nullptr) {
    return Status::InvalidArgument("ScaleGradients: grad is null for " + std::to_string(n) +
                                   " elements");
  }
  if (!std::isfinite(scale)) {
    return Status::InvalidArgument("ScaleGradients: scale is not finite");
  }
  STRATA_ASSIGN_OR_RETURN(const IsaKernels* kernels, KernelsFor(options));
  ParallelChunks(n, grad, FloatFormatBytes(format), ThreadCount(options),
                 [&](size_t b, size_t e) { kernels->scale(grad, format, scale, b, e); });
  return Status::OK();
}

Status ConvertFromFloat(const float* src, void* dst, FloatFormat dst_format, size_t n,
                        const CpuKernelOptions& options) {
  using namespace cpu_optim;  // NOLINT
  STRATA_RETURN_IF_ERROR(CheckFormat(dst_format, "ConvertFromFloat"));
  if (n > 0 && (src == nullptr || dst == nullptr)) {
    return Status::InvalidArgument("ConvertFromFloat: src and dst must be non-null for " +
                                   std::to_string(n) + " elements");
  }
  if (Overlaps(src, n * 4, dst, n * FloatFormatBytes(dst_format))) {
    return Status::InvalidArgument("ConvertFromFloat: src and dst overlap");
  }
  STRATA_ASSIGN_OR_RETURN(const IsaKernels* kernels, KernelsFor(options));
  ParallelChunks(n, dst, FloatFormatBytes(dst_format), ThreadCount(options),
                 [&](size_t b, size_t e) { kernels->convert(src, dst, dst_format, b, e); });
  return Status::OK();
}

Status QuantizeInt8Moments(const float* exp_avg, const float* exp_avg_sq, size_t n,
                           uint8_t* exp_avg_code, uint8_t* exp_avg_sq_code, float* exp_avg_scale,
                           float* exp_avg_sq_scale) {
  if (n > 0 && (!exp_avg || !exp_avg_sq || !exp_avg_code || !exp_avg_sq_code || !exp_avg_scale ||
                !exp_avg_sq_scale)) {
    return Status::InvalidArgument("QuantizeInt8Moments: an array is null for " +
                                   std::to_string(n) + " elements");
  }
  for (size_t b = 0; b < Int8StateBlocks(n); ++b) {
    const size_t lo = b * kInt8StateBlock;
    const size_t len = n - lo < kInt8StateBlock ? n - lo : kInt8StateBlock;
    cpu_optim::QuantizeInt8Block(exp_avg + lo, exp_avg_sq + lo, len, exp_avg_code + lo,
                                 exp_avg_sq_code + lo, exp_avg_scale + b, exp_avg_sq_scale + b);
  }
  return Status::OK();
}

Status DequantizeInt8Moments(const uint8_t* exp_avg_code, const uint8_t* exp_avg_sq_code,
                             const float* exp_avg_scale, const float* exp_avg_sq_scale, size_t n,
                             float* exp_avg, float* exp_avg_sq) {
  if (n > 0 && (!exp_avg || !exp_avg_sq || !exp_avg_code || !exp_avg_sq_code || !exp_avg_scale ||
                !exp_avg_sq_scale)) {
    return Status::InvalidArgument("DequantizeInt8Moments: an array is null for " +
                                   std::to_string(n) + " elements");
  }
  for (size_t b = 0; b < Int8StateBlocks(n); ++b) {
    const size_t lo = b * kInt8StateBlock;
    const size_t len = n - lo < kInt8StateBlock ? n - lo : kInt8StateBlock;
    cpu_optim::DequantizeInt8Block(exp_avg_code + lo, exp_avg_sq_code + lo, exp_avg_scale[b],
                                   exp_avg_sq_scale[b], len, exp_avg + lo, exp_avg_sq + lo);
  }
  return Status::OK();
}

Status AdamTrafficStep(const AdamSlice& slice, const CpuKernelOptions& options) {
  return cpu_optim::TrafficStep(slice, options);
}
size_t AdamBytesPerParam(FloatFormat grad_format, ParamOut param_out, StateFormat state_format,
                         MasterFormat master_format) {
  return cpu_optim::AdamBytesPerParam(grad_format, param_out, state_format, master_format);
}

}  // namespace strata
