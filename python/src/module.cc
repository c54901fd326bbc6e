// strata._strata: the C++ core for Python, over libstrata's public API (include/strata/) only.
//
// No libtorch: tensors cross as raw addresses (tensor.data_ptr()) and byte or element counts,
// and memory the engine owns crosses back as a writable memoryview the Python layer wraps with
// torch.frombuffer. So one build serves every torch version; python/strata/ holds the torch code.
//
// Every failure is raised as strata.Error (a RuntimeError) carrying Status::ToString()
// unchanged. Calls that can block (I/O, the optimizer kernels, the engine's step API) release
// the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "python/src/binding.h"
#include "strata/optim.h"
#include "strata/version.h"

namespace py = pybind11;

namespace strata::python {

void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StrataError(status.ToString());
}

void CheckPathArgument(const std::string& path, const char* what) {
  const size_t nul = path.find('\0');
  if (nul == std::string::npos) return;
  ThrowIfError(Status::InvalidArgument(std::string(what) + " '" + path.substr(0, nul) +
                                       "\\0...' holds a NUL byte at offset " + std::to_string(nul) +
                                       "; a file name cannot contain one"));
}

namespace {

// The hyper-parameters of one step, as the torch layer passes them (mode left at AdamW).
AdamHyperParams Hyper(double lr, double beta1, double beta2, double eps, double weight_decay,
                      int64_t step) {
  AdamHyperParams h;
  h.lr = lr;
  h.beta1 = beta1;
  h.beta2 = beta2;
  h.eps = eps;
  h.weight_decay = weight_decay;
  h.step = step;
  return h;
}

// AdamStep with the GIL released; a failure is raised as strata.Error.
void RunAdamStep(const AdamSlice& slice, const AdamHyperParams& h, float grad_scale, int threads) {
  CpuKernelOptions options;
  options.threads = threads;
  Status s;
  {
    py::gil_scoped_release release;
    s = AdamStep(slice, h, grad_scale, options);
  }
  ThrowIfError(s);
}

// The SIMD AdamW/Adam step over one fp32 tensor (parameters, moments and gradient all fp32).
// rounding: "fused" (AdamMode::kAdamW), or AdamW rounded as torch.optim.AdamW rounds it:
// "torch1" (torch 1.x, AdamMode::kAdamWTorch) or "torch2" (lerp_ moments, kAdamWTorchLerp).
void AdamStepF32(uintptr_t param, uintptr_t exp_avg, uintptr_t exp_avg_sq, uintptr_t grad, size_t n,
                 double lr, double beta1, double beta2, double eps, double weight_decay,
                 int64_t step, float grad_scale, bool adamw, int threads,
                 const std::string& rounding) {
  AdamSlice slice;
  slice.master = reinterpret_cast<float*>(param);
  slice.exp_avg = reinterpret_cast<float*>(exp_avg);
  slice.exp_avg_sq = reinterpret_cast<float*>(exp_avg_sq);
  slice.grad = reinterpret_cast<const void*>(grad);
  slice.grad_format = FloatFormat::kFp32;
  slice.n = n;
  AdamHyperParams h = Hyper(lr, beta1, beta2, eps, weight_decay, step);
  if (rounding != "fused" && rounding != "torch1" && rounding != "torch2") {
    ThrowIfError(Status::InvalidArgument("rounding '" + rounding +
                                         "': expected \"fused\", \"torch1\" or \"torch2\""));
  }
  h.mode = !adamw                 ? AdamMode::kAdam
           : rounding == "torch1" ? AdamMode::kAdamWTorch
           : rounding == "torch2" ? AdamMode::kAdamWTorchLerp
                                  : AdamMode::kAdamW;
  RunAdamStep(slice, h, grad_scale, threads);
}

// The AdamW step over one fp32 tensor with int8 moments (StateFormat::kInt8): codes n bytes
// each, scales Int8StateBlocks(n) floats each, all updated in place; `key` keys the
// stochastic rounding (give each step and tensor its own).
void AdamStepInt8(uintptr_t param, uintptr_t exp_avg, uintptr_t exp_avg_sq, uintptr_t exp_avg_scale,
                  uintptr_t exp_avg_sq_scale, uintptr_t grad, size_t n, double lr, double beta1,
                  double beta2, double eps, double weight_decay, int64_t step, float grad_scale,
                  uint64_t key, bool stochastic, int threads) {
  AdamSlice slice;
  slice.master = reinterpret_cast<float*>(param);
  slice.exp_avg = reinterpret_cast<void*>(exp_avg);
  slice.exp_avg_sq = reinterpret_cast<void*>(exp_avg_sq);
  slice.exp_avg_scale = reinterpret_cast<float*>(exp_avg_scale);
  slice.exp_avg_sq_scale = reinterpret_cast<float*>(exp_avg_sq_scale);
  slice.grad = reinterpret_cast<const void*>(grad);
  slice.n = n;
  slice.state_format = StateFormat::kInt8;
  slice.rounding_key = key;
  slice.state_rounding = stochastic ? StateRounding::kStochastic : StateRounding::kNearestEven;
  AdamHyperParams h = Hyper(lr, beta1, beta2, eps, weight_decay, step);
  RunAdamStep(slice, h, grad_scale, threads);
}

// The AdamW step over one fp32 gradient with a bf16 master (MasterFormat: "bf16-sr" or
// "bf16-kahan"; comp n bf16 for kahan, else 0) and fp32 moments, or int8 moments when the
// scales are non-zero (codes n bytes, scales Int8StateBlocks(n) floats each, rounded to
// nearest). `copy`: n bf16, the stored master's bits. `key` keys the stochastic rounding.
void AdamStepBf16Master(uintptr_t master, uintptr_t comp, uintptr_t copy, uintptr_t exp_avg,
                        uintptr_t exp_avg_sq, uintptr_t exp_avg_scale, uintptr_t exp_avg_sq_scale,
                        uintptr_t grad, size_t n, double lr, double beta1, double beta2, double eps,
                        double weight_decay, int64_t step, float grad_scale, uint64_t key,
                        const std::string& master_format, int threads) {
  Result<MasterFormat> format = ParseMasterFormat(master_format);
  ThrowIfError(format.status());
  AdamSlice slice;
  slice.master_format = *format;
  slice.master_bf16 = reinterpret_cast<uint16_t*>(master);
  slice.master_comp = reinterpret_cast<uint16_t*>(comp);
  slice.param_out = reinterpret_cast<void*>(copy);
  slice.param_out_format = copy != 0 ? ParamOut::kBf16 : ParamOut::kNone;
  slice.exp_avg = reinterpret_cast<void*>(exp_avg);
  slice.exp_avg_sq = reinterpret_cast<void*>(exp_avg_sq);
  if (exp_avg_scale != 0) {
    slice.state_format = StateFormat::kInt8;
    slice.state_rounding = StateRounding::kNearestEven;
    slice.exp_avg_scale = reinterpret_cast<float*>(exp_avg_scale);
    slice.exp_avg_sq_scale = reinterpret_cast<float*>(exp_avg_sq_scale);
  }
  slice.grad = reinterpret_cast<const void*>(grad);
  slice.n = n;
  slice.rounding_key = key;
  RunAdamStep(slice, Hyper(lr, beta1, beta2, eps, weight_decay, step), grad_scale, threads);
}

// (sum of squares, non-finite count) of n fp32 gradient values.
py::tuple GradNormSquaredF32(uintptr_t grad, size_t n, int threads) {
  CpuKernelOptions options;
  options.threads = threads;
  Result<GradNormResult> r = Status::OK();
  {
    py::gil_scoped_release release;
    r = GradNormSquared(reinterpret_cast<const void*>(grad), FloatFormat::kFp32, n, options);
  }
  ThrowIfError(r.status());
  return py::make_tuple(r->sum_squares, r->non_finite);
}

std::string ResolvedIsa() {
  Result<CpuIsa> isa = ResolveCpuIsa(CpuIsa::kAuto);
  ThrowIfError(isa.status());
  return CpuIsaName(*isa);
}

}  // namespace
}  // namespace strata::python

PYBIND11_MODULE(_strata, m) {
  using namespace strata::python;
  m.doc() = "Strata's C++ core (libstrata); use the `strata` package, not this module.";
  static py::exception<StrataError> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StrataError& e) {
      error(e.what());
    }
  });
  m.def("version", [] { return std::string(strata::Version()); });
  m.def("cpu_isa", &ResolvedIsa, "The instruction set the optimizer kernels run with.");
  m.def("adam_step_f32", &AdamStepF32, py::arg("param"), py::arg("exp_avg"), py::arg("exp_avg_sq"),
        py::arg("grad"), py::arg("n"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"),
        py::arg("eps"), py::arg("weight_decay"), py::arg("step"), py::arg("grad_scale"),
        py::arg("adamw") = true, py::arg("threads") = 0, py::arg("rounding") = "fused");
  m.def("adam_step_int8", &AdamStepInt8, py::arg("param"), py::arg("exp_avg"),
        py::arg("exp_avg_sq"), py::arg("exp_avg_scale"), py::arg("exp_avg_sq_scale"),
        py::arg("grad"), py::arg("n"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"),
        py::arg("eps"), py::arg("weight_decay"), py::arg("step"), py::arg("grad_scale"),
        py::arg("key"), py::arg("stochastic") = true, py::arg("threads") = 0);
  m.def("adam_step_bf16_master", &AdamStepBf16Master, py::arg("master"), py::arg("comp"),
        py::arg("copy"), py::arg("exp_avg"), py::arg("exp_avg_sq"), py::arg("exp_avg_scale"),
        py::arg("exp_avg_sq_scale"), py::arg("grad"), py::arg("n"), py::arg("lr"), py::arg("beta1"),
        py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("step"),
        py::arg("grad_scale"), py::arg("key"), py::arg("master_format"), py::arg("threads") = 0);
  m.def(
      "int8_state_blocks", [](size_t n) { return strata::Int8StateBlocks(n); }, py::arg("n"));
  m.def(
      "int8_moments_to_float",
      [](uintptr_t m_code, uintptr_t v_code, uintptr_t m_scale, uintptr_t v_scale, size_t n,
         uintptr_t m, uintptr_t v) {
        ThrowIfError(strata::DequantizeInt8Moments(
            reinterpret_cast<const uint8_t*>(m_code), reinterpret_cast<const uint8_t*>(v_code),
            reinterpret_cast<const float*>(m_scale), reinterpret_cast<const float*>(v_scale), n,
            reinterpret_cast<float*>(m), reinterpret_cast<float*>(v)));
      },
      "int8 moments -> fp32 exp_avg, exp_avg_sq (strata/optim.h DequantizeInt8Moments).");
  m.def(
      "int8_moments_from_float",
      [](uintptr_t m, uintptr_t v, size_t n, uintptr_t m_code, uintptr_t v_code, uintptr_t m_scale,
         uintptr_t v_scale) {
        ThrowIfError(strata::QuantizeInt8Moments(
            reinterpret_cast<const float*>(m), reinterpret_cast<const float*>(v), n,
            reinterpret_cast<uint8_t*>(m_code), reinterpret_cast<uint8_t*>(v_code),
            reinterpret_cast<float*>(m_scale), reinterpret_cast<float*>(v_scale)));
      },
      "fp32 exp_avg, exp_avg_sq -> int8 codes and scales (round to nearest).");
  m.def("grad_norm_squared_f32", &GradNormSquaredF32, py::arg("grad"), py::arg("n"),
        py::arg("threads") = 0);
  m.def(
      "copy_bytes",
      [](uintptr_t dst, uintptr_t src, size_t bytes) {
        py::gil_scoped_release release;
        std::memcpy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
      },
      py::arg("dst"), py::arg("src"), py::arg("bytes"),
      "memcpy between host memory the caller owns (GIL released): glibc's large-copy path "
      "(non-temporal stores) moves the offload layer's hundreds of MB per step faster than "
      "Tensor.copy_.");
  m.def(
      "memory",
      [](uintptr_t address, size_t bytes) {
        return py::memoryview::from_memory(reinterpret_cast<void*>(address),
                                           static_cast<py::ssize_t>(bytes), /*readonly=*/false);
      },
      "A writable memoryview over memory the engine owns (valid while the engine says so).");
  BindIo(m);
  BindEngine(m);
}
