// Internal interface between the public entry points (optim.cc: argument checks, ISA
// choice, OpenMP chunking) and the per-ISA kernels (adam_avx512.cc, adam_avx2.cc,
// adam_scalar.cc). A kernel processes one half-open element range [begin, end) on the
// calling thread; optim.cc splits the work. Every kernel of every ISA performs the same
// per-element operations in the same order (see include/strata/optim.h), which is what
// makes results bit-identical across ISAs.
//
// The bench-only entry points (TrafficStep) also live here: they are not part of the
// public API but `strata bench adam` needs them to measure the same-traffic bound.
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/optim.h"
#include "strata/status.h"

namespace strata::cpu_optim {

// Per-step scalars, computed once in double and rounded to float (MakeAdamScalars), so
// every ISA starts from the same float constants.
struct AdamScalars {
  float grad_scale;
  float weight_decay;     // Adam (L2) mode: g = fma(wd, p, g)
  float neg_lr_wd;        // AdamW mode: -lr*wd (see AdamVector)
  float one_minus_lr_wd;  // AdamWTorch mode: 1 - lr*wd
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^t)
  // The int8 kernel's folded constants (AdamApply's kFolded), each rounded once from double:
  float eps_x_bc2_sqrt;            // eps * sqrt(1 - beta2^t)
  float neg_step_size_x_bc2_sqrt;  // -lr / (1 - beta1^t) * sqrt(1 - beta2^t)
  // Its moments' constants (Int8Moments in int8_templates.h):
  float sqrt_beta2;                         // sqrt(beta2)
  float sqrt_one_minus_beta2;               // sqrt(1 - beta2)
  float one_minus_beta1_x_grad_scale;       // (1 - beta1) * grad_scale
  float sqrt_one_minus_beta2_x_grad_scale;  // sqrt(1 - beta2) * grad_scale
};

AdamScalars MakeAdamScalars(const AdamHyperParams& hyper, float grad_scale);

// How the moments are stored: the slice's StateFormat and StateRounding in one.
// kInt8 slices run through IsaKernels::adam_int8 (int8_templates.h), never `adam`.
enum class MomentStore : uint8_t { kF32, kBf16Nearest, kBf16Stochastic, kInt8 };
// How the master weights are stored (MasterFormat): fp32, bf16 stochastic, bf16 + Kahan term.
enum class MasterStore : uint8_t { kF32, kBf16Stochastic, kBf16Kahan };

struct AdamArgs {
  float* master;
  void* exp_avg;
  void* exp_avg_sq;
  const void* grad;
  void* param_out;
  FloatFormat grad_format;
  ParamOut param_out_format;
  AdamMode mode;
  AdamScalars s;
  MomentStore moments = MomentStore::kF32;
  uint32_t rounding_key = 0;  // Mix32 of the slice's rounding_key (see optim.h)
  uint64_t index_base = 0;
  // kInt8: one absmax per kInt8StateBlock elements of each moment, and the slice's length.
  float* exp_avg_scale = nullptr;
  float* exp_avg_sq_scale = nullptr;
  size_t n = 0;
  bool int8_nearest = false;  // kInt8 + StateRounding::kNearestEven
  MasterStore master_store = MasterStore::kF32;
  uint16_t* master16 = nullptr;  // bf16 masters (master is then null)
  uint16_t* comp = nullptr;      // kBf16Kahan: the bf16 compensation
  uint32_t master_key = 0;       // Mix32(rounding_key ^ 0x85ebca6b): the master's random bits
};

// One ISA's kernels. All ranges are element indices into the arrays of the call.
struct IsaKernels {
  CpuIsa isa;
  void (*adam)(const AdamArgs& args, size_t begin, size_t end);
  // Same loads and stores as `adam` (same arrays, widths and order), trivial arithmetic:
  // the memory-bandwidth bound `strata bench adam` compares against.
  void (*traffic)(const AdamArgs& args, size_t begin, size_t end);
  // Sum of squares of one block [begin, end), end - begin <= kGradNormBlock, begin a
  // multiple of kGradNormBlock; element i goes to lane i % 16 (see optim.h).
  void (*norm_block)(const void* grad, FloatFormat format, size_t begin, size_t end,
                     double* sum_squares, uint64_t* non_finite);
  void (*scale)(void* grad, FloatFormat format, float scale, size_t begin, size_t end);
  void (*convert)(const float* src, void* dst, FloatFormat dst_format, size_t begin, size_t end);
  // Int8 moments: whole quantization blocks [first_block, last_block) of the slice.
  void (*adam_int8)(const AdamArgs& args, size_t first_block, size_t last_block);
  void (*traffic_int8)(const AdamArgs& args, size_t first_block, size_t last_block);
};

const IsaKernels& ScalarKernels();
const IsaKernels& Avx2Kernels();
const IsaKernels& Avx512Kernels();

// One int8 quantization block (n <= kInt8StateBlock) from fp32 moments, rounding to nearest,
// and back (exp_avg_sq = the dequantized root squared). Scalar: for conversions.
void QuantizeInt8Block(const float* exp_avg, const float* exp_avg_sq, size_t n,
                       uint8_t* exp_avg_code, uint8_t* exp_avg_sq_code, float* exp_avg_scale,
                       float* exp_avg_sq_scale);
void DequantizeInt8Block(const uint8_t* exp_avg_code, const uint8_t* exp_avg_sq_code,
                         float exp_avg_scale, float exp_avg_sq_scale, size_t n, float* exp_avg,
                         float* exp_avg_sq);

// The kernels for options.isa (resolved), or NotSupported.
Result<const IsaKernels*> KernelsFor(const CpuKernelOptions& options);

// The bound kernel over a whole slice, with AdamStep's argument checks and threading.
// Leaves the slice's values as they were (param_out gets truncated bits). For benchmarks.
[[nodiscard]] Status TrafficStep(const AdamSlice& slice, const CpuKernelOptions& options = {});

// Bytes of DRAM traffic one AdamStep moves per parameter with these formats (each array
// read once, the fp32 ones written once, the copy written once).
size_t AdamBytesPerParam(FloatFormat grad_format, ParamOut param_out,
                         StateFormat state_format = StateFormat::kFp32,
                         MasterFormat master_format = MasterFormat::kFp32);

}  // namespace strata::cpu_optim
