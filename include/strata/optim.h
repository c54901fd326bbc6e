// The CPU optimizer: AdamW/Adam over one contiguous slice of a shard, the deterministic
// gradient norm that clipping needs, and the fp32 <-> bf16/fp16 conversions the engine and
// the model share.
//
// What runs: one fused pass per step. AdamStep reads the gradient (fp32, bf16 or fp16),
// multiplies it by one scale (loss-scale unscale x clip coefficient), updates the fp32
// master weights and both moments in place and, in the same pass, writes the updated
// parameters as bf16 or fp16 into a second buffer (the copy the device needs). With bf16
// gradients and a bf16 copy that pass plus the GradNormSquared pass move 30 bytes per
// parameter, against 46 for the usual norm / unscale / Adam / copy sequence.
//
// Kernels exist for AVX-512 (F+BW+VL), AVX2 (+FMA+F16C) and plain scalar code; the best
// one the CPU has is chosen at run time (cpuid), STRATA_CPU_ISA or CpuKernelOptions::isa
// force one. Every path performs the same IEEE operations in the same order per element
// (fused multiply-add where the formula says fma, exact sqrt and division, no reciprocal
// approximations), so results are bit-identical across ISAs and thread counts.
//
// Ownership: the caller owns every buffer; functions neither keep pointers nor allocate
// beyond a small per-call scratch (GradNormSquared: 16 bytes per 4096 elements).
// Thread-safety: every function may be called concurrently from many threads on disjoint
// buffers. Each call parallelises itself with OpenMP (CpuKernelOptions::threads).
// Buffers may have any alignment and any length; the arrays of one call must not overlap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "strata/status.h"

namespace strata {

// Element formats of gradients and of the parameter copy.
enum class FloatFormat : uint8_t { kFp32, kBf16, kFp16 };

// "fp32", "bf16", "fp16".
const char* FloatFormatName(FloatFormat format);
// Parses "fp32" | "bf16" | "fp16"; InvalidArgument naming the bad value otherwise.
Result<FloatFormat> ParseFloatFormat(std::string_view name);
// 4 for fp32, 2 for bf16 and fp16.
size_t FloatFormatBytes(FloatFormat format);

// The instruction set a CPU kernel runs with. kAuto: STRATA_CPU_ISA when set (and not
// "auto"), else the best one this CPU supports.
enum class CpuIsa : uint8_t { kAuto, kAvx512, kAvx2, kScalar };

// "auto", "avx512", "avx2", "scalar".
const char* CpuIsaName(CpuIsa isa);
// Parses the names above; InvalidArgument naming the bad value otherwise.
Result<CpuIsa> ParseCpuIsa(std::string_view name);
// Whether this CPU (and OS) can run `isa`: avx512 needs AVX512F+BW+VL, FMA and F16C;
// avx2 needs AVX2, FMA and F16C. kAuto and kScalar are always supported.
bool CpuSupports(CpuIsa isa);
// Resolves kAuto (through STRATA_CPU_ISA, then cpuid) to a concrete ISA. Returns
// NotSupported naming the ISA when it, or the one STRATA_CPU_ISA names, is not supported
// by this CPU; InvalidArgument when STRATA_CPU_ISA holds an unknown name.
Result<CpuIsa> ResolveCpuIsa(CpuIsa requested);

// How a CPU kernel runs. Neither option changes a result bit.
struct CpuKernelOptions {
  // OpenMP threads for this call. 0: STRATA_NUM_THREADS when > 0, else OpenMP's default
  // (one per core). Small inputs use fewer threads than asked.
  int threads = 0;
  CpuIsa isa = CpuIsa::kAuto;
};

// kAdamW: decoupled weight decay (torch.optim.AdamW). kAdam: L2 penalty added to the
// gradient before the moments (torch.optim.Adam with weight_decay). kAdamWTorch: AdamW
// rounded step by step as torch.optim.AdamW rounds it on the CPU (see AdamStep), for
// strata.optim.AdamW to reproduce torch's results; fp32 gradients, fp32 moments and no
// parameter copy only. kAdamWTorchLerp: the same for torch >= 2.0, which computes the first
// moment as exp_avg.lerp_(grad, 1 - beta1). The engine uses kAdamW or kAdam.
enum class AdamMode : uint8_t { kAdamW, kAdam, kAdamWTorch, kAdamWTorchLerp };

// Hyper-parameters of one parameter group at one step. Scalars derived from them
// (bias corrections, step size, decay factor) are computed in double and rounded to
// float once, identically for every ISA.
struct AdamHyperParams {
  double lr = 1e-3;           // >= 0
  double beta1 = 0.9;         // in [0, 1)
  double beta2 = 0.999;       // in [0, 1)
  double eps = 1e-8;          // >= 0
  double weight_decay = 0.0;  // >= 0
  int64_t step = 1;           // this step's number, counted from 1 (bias correction)
  AdamMode mode = AdamMode::kAdamW;
};

// The format of the optional parameter copy written by AdamStep.
enum class ParamOut : uint8_t { kNone, kBf16, kFp16 };

// "none", "bf16", "fp16"; parse: InvalidArgument naming the bad value.
const char* ParamOutName(ParamOut out);
Result<ParamOut> ParseParamOut(std::string_view name);

// The format of the Adam moments (exp_avg, exp_avg_sq) in memory. The update itself is
// computed in fp32 either way; kBf16 widens the stored moments exactly on load and rounds
// the new ones to bf16 on store (the master weights stay fp32): 8 bytes of state per
// parameter instead of 12. kInt8 quantizes both moments block-wise to 8-bit codes (see "int8
// moments" below): 6 bytes of state per parameter (+ 8 bytes of scales per 2048).
enum class StateFormat : uint8_t { kFp32, kBf16, kInt8 };
// How kBf16 moments are rounded on store.
//   kNearestEven: round to nearest, ties to even (as FloatToBf16). Deterministic, but an
//     increment below half a bf16 ulp (2^-9 relative) is lost: exp_avg_sq with beta2 =
//     0.999 moves by 0.1% of itself per step, so it can grow but never decay.
//   kStochastic: rounds up with probability equal to the dropped fraction, so each store is
//     unbiased and small increments survive on average. The random bits are a fixed hash
//     of (rounding_key, index_base + i): the same bits for every ISA, thread count and
//     tier, so results stay bit-identical across them and across reruns.
enum class StateRounding : uint8_t { kNearestEven, kStochastic };
// "fp32", "bf16", "int8"; "nearest-even", "stochastic".
const char* StateFormatName(StateFormat format);
const char* StateRoundingName(StateRounding rounding);
// Parses "fp32" | "bf16" | "int8"; InvalidArgument naming the bad value otherwise.
Result<StateFormat> ParseStateFormat(std::string_view name);

// The format of the master weights (AdamSlice::master_format). Opt-in 2-byte masters; the
// update is computed in fp32 either way:
//   kFp32: `master`, fp32, rounded to nearest once per step (see AdamStep).
//   kBf16Stochastic: `master_bf16`, bf16, stored with stochastic rounding (unbiased per step,
//     so updates below half a bf16 ulp, 2^-9 relative, survive on average). Element i's bits:
//     the low 16 of h_p = Mix32(uint32(index_base + i) + Mix32(k ^ 0x85ebca6b)), k the moments'
//     key Mix32(uint32(rounding_key ^ (rounding_key >> 32))); added to the fp32 bits of the
//     new weight before the low 16 are dropped (NaN kept as FloatToBf16 keeps it).
//   kBf16Kahan: `master_bf16` and a bf16 compensation `master_comp` (Kahan summation, as in
//     Zamirai et al., "Revisiting BFloat16 Training"): with d the step's update of the weight
//     (AdamW: fma(-lr/(1-b1^t), m/denom, (-lr*wd)*p); Adam: (-lr/(1-b1^t)) * (m/denom)),
//       u = d + c;  p' = bf16_nearest(p + u);  c' = bf16_nearest(u - (p' - p))
//     i.e. the rounding error of each step is carried into the next: 4 bytes like fp32, but
//     each half a 16-bit stream the engine can keep apart.
// With a bf16 master, param_out (kNone or kBf16) receives the stored master's bits; gradients
// are fp32 or bf16. The same bits on every ISA and thread count.
enum class MasterFormat : uint8_t { kFp32, kBf16Stochastic, kBf16Kahan };
// "fp32", "bf16-sr", "bf16-kahan"; parse: InvalidArgument naming the bad value.
const char* MasterFormatName(MasterFormat format);
Result<MasterFormat> ParseMasterFormat(std::string_view name);
// Bytes of master state per parameter: 4, 2, 4 (bf16 + bf16 compensation).
size_t MasterFormatBytes(MasterFormat format);

// Int8 moments (StateFormat::kInt8), after Dettmers et al., "8-bit Optimizers via Block-wise
// Quantization". A slice is cut into blocks of kInt8StateBlock elements counted from its
// first element (the last one may be shorter); each block of each moment has one fp32 scale,
// its absmax, and one 8-bit code per element:
//   exp_avg:     code s|EEEE|MMM  ->  (-1)^s * 2^(E-15) * (1 + M/8)  * scale
//   exp_avg_sq:  code EEEE|MMMM   -> (2^(E-15) * (1 + M/16) * scale)^2
// with E = 0 read as fp16's subnormals, 2^-14 * M/8 (M/16): each code is an fp16 cut short,
// s 0EEEE MMM0000000 and 00EEEE MMMM000000 (the quantizer writes E = 0 only with M = 0);
// exp_avg_sq is stored as its square root, whose dynamic range is half as wide, with
// its own scale = absmax of sqrt(exp_avg_sq). AdamStep updates a block in fp32 from its
// codes (the formula below: kInt8 folds the scales into its constants), takes the new absmax
// and requantizes y = x * (1/scale) by adding rounding bits h to y's fp32 bits and keeping
// the top 3 (exp_avg: h's low 20 bits) or 4 (sqrt(exp_avg_sq): h >> 13, its high 19 bits)
// fraction bits. Below 2^-14, exp_avg rounds up to 2^-14 when (h >> 8) * 2^-24 < y * 2^14,
// and sqrt(exp_avg_sq) rounds any non-zero value up to 2^-14 (a denominator never quantizes
// to 0). A finite y has a code magnitude of at most 0x79; NaN and infinity saturate to the
// largest code, 0xff (sqrt(exp_avg_sq): 0 for a NaN with the sign bit set), and their
// block's scale is NaN or infinite. state_rounding picks h:
//   kNearestEven: h = 0x80080000 for exp_avg and 0x80000000 for sqrt(exp_avg_sq) (round to
//     nearest, ties away from zero). Measured better (docs/design.md): an EMA with beta2 = 0.999
//     re-rounded stochastically each step random-walks by tens of percent at 4 fraction bits.
//   kStochastic: element i's hash bits of the kBf16 rounding below (unbiased per store).
// The same bits on every ISA and thread count.
inline constexpr size_t kInt8StateBlock = 2048;
// Blocks (scales per moment) of an n-element int8 slice: ceil(n / kInt8StateBlock).
inline constexpr size_t Int8StateBlocks(size_t n) {
  return (n + kInt8StateBlock - 1) / kInt8StateBlock;
}
// fp32 moments -> int8 codes and scales (round to nearest; n elements, Int8StateBlocks(n)
// scales each), and back (exp_avg_sq squared from its stored root). For conversions,
// checkpoints and state_dict(); InvalidArgument for a null array with n > 0.
[[nodiscard]] Status QuantizeInt8Moments(const float* exp_avg, const float* exp_avg_sq, size_t n,
                                         uint8_t* exp_avg_code, uint8_t* exp_avg_sq_code,
                                         float* exp_avg_scale, float* exp_avg_sq_scale);
[[nodiscard]] Status DequantizeInt8Moments(const uint8_t* exp_avg_code,
                                           const uint8_t* exp_avg_sq_code,
                                           const float* exp_avg_scale,
                                           const float* exp_avg_sq_scale, size_t n, float* exp_avg,
                                           float* exp_avg_sq);

// One contiguous slice of n parameters. The master and moment arrays are updated in place.
struct AdamSlice {
  float* master = nullptr;     // fp32 master weights, n elements (null with a bf16 master)
  void* exp_avg = nullptr;     // first moment, n elements of state_format
  void* exp_avg_sq = nullptr;  // second moment, n elements of state_format
  const void* grad = nullptr;  // n elements of grad_format; read only
  FloatFormat grad_format = FloatFormat::kFp32;
  void* param_out = nullptr;  // n elements of param_out_format, written; null iff kNone
  ParamOut param_out_format = ParamOut::kNone;
  size_t n = 0;
  StateFormat state_format = StateFormat::kFp32;
  StateRounding state_rounding = StateRounding::kStochastic;  // kBf16 only
  // kBf16 + kStochastic: element i's random bits are h = Mix32(uint32(index_base + i) +
  // Mix32(uint32(rounding_key ^ (rounding_key >> 32)))) (Mix32: the "lowbias32" integer
  // hash); exp_avg adds h's low 16 bits to its fp32 bits before dropping them, exp_avg_sq
  // the high 16. Give every step and every array a different key, and each slice of one
  // array its first element's index within the array, so the bits do not depend on how the
  // array is cut into slices.
  uint64_t rounding_key = 0;
  uint64_t index_base = 0;
  // kInt8 only: Int8StateBlocks(n) scales per moment, read and updated with the codes.
  float* exp_avg_scale = nullptr;
  float* exp_avg_sq_scale = nullptr;
  // A 2-byte master (MasterFormat above): n bf16 weights in master_bf16 instead of `master`,
  // and for kBf16Kahan n bf16 compensations in master_comp, both updated in place.
  MasterFormat master_format = MasterFormat::kFp32;
  uint16_t* master_bf16 = nullptr;
  uint16_t* master_comp = nullptr;
};

// One optimizer step over `slice`, per element (g the gradient converted to float):
//   g = g * grad_scale
//   Adam:  g = fma(wd, p, g)                              (L2 decay)
//   m = fma(b1, m, (1-b1) * g)
//   v = fma(b2, v, (1-b2) * (g*g))
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps
//   AdamW: p = p + fma(-lr / (1 - b1^t), m / denom, (-lr*wd) * p)
//   Adam:  p = fma(-lr / (1 - b1^t), m / denom, p)
//   param_out = round_to_nearest_even(p)                  (when asked)
// with m and v read from and stored to state_format (bf16: rounded per state_rounding).
// which is torch's formula (decay p *= 1 - lr*wd; p -= lr/bc1 * m/denom), grouped so that
// p is rounded once per step (half an ulp) and lr*wd's rounding touches only a small term.
// kInt8 folds the bias correction into two constants, each rounded once from double, and
// so divides once per element instead of twice (the divider bounds that kernel):
//   AdamW: p = p + fma(float(-lr / (1 - b1^t) * sqrt(1 - b2^t)),
//                      m / (sqrt(v) + float(eps * sqrt(1 - b2^t))), (-lr*wd) * p)
//   Adam:  p = fma(<the same two factors>, p)
// The same value up to an ulp of the update, far below the moments' 3 to 4 bits. It also
// folds the block's scales s_m, s_u (sqrt(exp_avg_sq)'s) and grad_scale into the moments'
// constants, reading the codes' values c_m, c_u at scale 1 (three multiplies fewer):
//   m = fma(c_m, float(b1) * s_m, float((1-b1) * grad_scale) * g)
//   v = fma(h, h, t * t)
//   h = float(sqrt(1-b2) * grad_scale) * g,  t = c_u * (float(sqrt(b2)) * s_u)
//   Adam: g = fma(wd, p, g * grad_scale), then (1-b1) * g and sqrt(1-b2) * g for the products
// (the fp32 formula's m and v up to a few ulps of their terms).
// kAdamWTorch instead rounds every operation as torch 1.13's single-tensor CPU AdamW does
// (its vectorised kernels fuse the two multiply-adds marked fma):
//   p = p * (1 - lr*wd)
//   m = fma(g, 1-b1, m * b1)          kAdamWTorchLerp (torch >= 2.0): m = fma(1-b1, g - m, m)
//   v = fma((1-b2) * g, g, v * b2)
//   denom = sqrt(v) / sqrt(1 - b2^t) + eps
//   p = p + ((-lr / (1 - b1^t)) * m) / denom
// Near a weight that crosses zero the two groupings differ by ulps of the weight's earlier
// magnitude, which is a large relative difference of the small result.
// grad_scale is the product of the loss-scale unscale and the clip coefficient; pass 1
// for neither. Non-finite gradients are not filtered: check GradNormSquared first.
// Returns InvalidArgument (nothing written) for a null array with n > 0, param_out set
// without a format or the reverse, overlapping arrays, a step < 1, hyper-parameters
// outside their ranges or a non-finite grad_scale; NotSupported when options.isa (or
// STRATA_CPU_ISA) names an ISA this CPU lacks.
[[nodiscard]] Status AdamStep(const AdamSlice& slice, const AdamHyperParams& hyper,
                              float grad_scale, const CpuKernelOptions& options = {});

// GradNormSquared sums per block of this many elements; block sums are added in block
// order. The result therefore depends on neither thread count nor ISA nor alignment.
inline constexpr size_t kGradNormBlock = 4096;

struct GradNormResult {
  // Sum of squares of the gradient (squares are exact in double). NaN or Inf when
  // non_finite > 0.
  double sum_squares = 0.0;
  // How many gradient elements were NaN or +-Inf (the step must then be skipped).
  uint64_t non_finite = 0;
};

// The squared L2 norm of n gradient elements, deterministic: inside a block element i
// goes to accumulator i mod 16, the 16 accumulators are added in a fixed tree, and the
// block sums in block order. InvalidArgument for a null grad with n > 0; OutOfMemory when
// the scratch cannot be allocated; NotSupported for an ISA this CPU lacks.
[[nodiscard]] Result<GradNormResult> GradNormSquared(const void* grad, FloatFormat format, size_t n,
                                                     const CpuKernelOptions& options = {});

// grad[i] = round(grad[i] * scale) in place (the unscale pass of a multi-pass step; the
// fused AdamStep does not need it). Same status rules as AdamStep.
[[nodiscard]] Status ScaleGradients(void* grad, FloatFormat format, size_t n, float scale,
                                    const CpuKernelOptions& options = {});

// dst[i] = round_to_nearest_even(src[i]) in `dst_format` (fp32: a copy). Arrays must not
// overlap. Same status rules as AdamStep.
[[nodiscard]] Status ConvertFromFloat(const float* src, void* dst, FloatFormat dst_format, size_t n,
                                      const CpuKernelOptions& options = {});

// Scalar conversions, bit-identical to the vector kernels. To bf16/fp16: round to
// nearest, ties to even; overflow becomes Inf; NaN stays NaN (sign and upper payload
// kept, quiet bit set); fp16 subnormals are produced exactly (no flush to zero), fp32
// subnormals are rounded like any value (no DAZ). From bf16/fp16: exact.
uint16_t FloatToBf16(float value);
float Bf16ToFloat(uint16_t bits);
uint16_t FloatToFp16(float value);
float Fp16ToFloat(uint16_t bits);

// For benchmarks (`strata bench adam`): the memory-traffic bound of AdamStep. AdamTrafficStep
// makes exactly AdamStep's loads and stores over `slice` (one fma per element, no Adam math),
// with its argument checks and threading, and leaves the values as they were (param_out gets
// truncated bits). AdamBytesPerParam: the DRAM bytes one AdamStep moves per parameter with these
// formats (each array read once, the fp32 ones written once, the copy written once).
[[nodiscard]] Status AdamTrafficStep(const AdamSlice& slice, const CpuKernelOptions& options = {});
size_t AdamBytesPerParam(FloatFormat grad_format, ParamOut param_out,
                         StateFormat state_format = StateFormat::kFp32,
                         MasterFormat master_format = MasterFormat::kFp32);

}  // namespace strata
