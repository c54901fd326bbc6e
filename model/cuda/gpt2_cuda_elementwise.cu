// The tuned elementwise kernels (the default unless KernelChoice::naive_elementwise): GELU
// forward/backward, residual forward/backward and the fp32 <-> bf16 conversions with 128-bit
// loads and stores (8 bf16 per access) and a scalar tail, and the fused residual + LayerNorm
// forward. Same formulas as the one-value-per-thread kernels of gpt2_cuda_kernels.cu, applied
// to the same values, so they give the same bits; the vector path is taken when every pointer
// is 16-byte aligned (else the caller uses the old kernel).
//
// ResidualLayerNormForward: r = bf16(a + b) stored, then LayerNorm over r exactly as
// LayerNormForwardKernel does it (one warp per row, lanes strided by 32, the same two passes
// and reduction order), so it equals ResidualForward followed by LayerNormForward bit for bit
// while reading the residual stream once less and launching once less.
//
// Test: ctest --test-dir build/release -R gpt2_cuda_ops (GpuOpsTest.GeluAndResidual,
// ResidualLayerNorm; needs a GPU)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "model/cuda/gpt2_cuda_kernels.h"
#include "model/cuda/gpt2_cuda_ops.h"
#include "model/cuda/gpt2_cuda_vec.cuh"

namespace strata::model::cuda_ops {
namespace {

constexpr int kThreads = 256;
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;
constexpr float kLayerNormEps = 1e-5f;

__device__ __forceinline__ float Gelu(float x) {
  const float u = kGeluK * (x + kGeluA * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float GeluGrad(float x) {
  const float th = tanhf(kGeluK * (x + kGeluA * x * x * x));
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluK * (1.0f + 3.0f * kGeluA * x * x);
}

// Grid-stride over n elements: op.Chunk(c) for each whole 8-wide chunk c (elements
// [8c, 8c+8), one 128-bit access per operand), then op.One(i) for each element of the tail.
template <typename Op>
__device__ __forceinline__ void ForEach(size_t n, const Op& op) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t first = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  const size_t chunks = n / 8;
  for (size_t c = first; c < chunks; c += stride) op.Chunk(c);
  for (size_t i = chunks * 8 + first; i < n; i += stride) op.One(i);
}

struct GeluFwd {
  Bf16* out;
  const Bf16* inp;
  __device__ void Chunk(size_t c) const {
    const Bf16Vec<8> x = reinterpret_cast<const Bf16Vec<8>*>(inp)[c];
    Bf16Vec<8> y;
#pragma unroll
    for (int k = 0; k < 8; ++k) y.v[k] = ToB(Gelu(ToF(x.v[k])));
    reinterpret_cast<Bf16Vec<8>*>(out)[c] = y;
  }
  __device__ void One(size_t i) const { out[i] = ToB(Gelu(ToF(inp[i]))); }
};

struct GeluBwd {
  Bf16* dinp;
  const Bf16 *inp, *dout;
  __device__ void Chunk(size_t c) const {
    const Bf16Vec<8> x = reinterpret_cast<const Bf16Vec<8>*>(inp)[c];
    const Bf16Vec<8> g = reinterpret_cast<const Bf16Vec<8>*>(dout)[c];
    Bf16Vec<8> d = reinterpret_cast<const Bf16Vec<8>*>(dinp)[c];
#pragma unroll
    for (int k = 0; k < 8; ++k) d.v[k] = ToB(ToF(d.v[k]) + GeluGrad(ToF(x.v[k])) * ToF(g.v[k]));
    reinterpret_cast<Bf16Vec<8>*>(dinp)[c] = d;
  }
  __device__ void One(size_t i) const {
    dinp[i] = ToB(ToF(dinp[i]) + GeluGrad(ToF(inp[i])) * ToF(dout[i]));
  }
};

struct ResidualFwd {
  Bf16* out;
  const Bf16 *a, *b;
  __device__ void Chunk(size_t c) const {
    const Bf16Vec<8> x = reinterpret_cast<const Bf16Vec<8>*>(a)[c];
    const Bf16Vec<8> y = reinterpret_cast<const Bf16Vec<8>*>(b)[c];
    Bf16Vec<8> o;
#pragma unroll
    for (int k = 0; k < 8; ++k) o.v[k] = ToB(ToF(x.v[k]) + ToF(y.v[k]));
    reinterpret_cast<Bf16Vec<8>*>(out)[c] = o;
  }
  __device__ void One(size_t i) const { out[i] = ToB(ToF(a[i]) + ToF(b[i])); }
};

// d += g for one of the two residual inputs (called once per non-null one).
struct ResidualBwd {
  Bf16* d;
  const Bf16* dout;
  __device__ void Chunk(size_t c) const {
    const Bf16Vec<8> g = reinterpret_cast<const Bf16Vec<8>*>(dout)[c];
    Bf16Vec<8> x = reinterpret_cast<const Bf16Vec<8>*>(d)[c];
#pragma unroll
    for (int k = 0; k < 8; ++k) x.v[k] = ToB(ToF(x.v[k]) + ToF(g.v[k]));
    reinterpret_cast<Bf16Vec<8>*>(d)[c] = x;
  }
  __device__ void One(size_t i) const { d[i] = ToB(ToF(d[i]) + ToF(dout[i])); }
};

struct F32ToBf16 {
  Bf16* dst;
  const float* src;
  __device__ void Chunk(size_t c) const {
    const F32Vec<4> lo = reinterpret_cast<const F32Vec<4>*>(src)[2 * c];
    const F32Vec<4> hi = reinterpret_cast<const F32Vec<4>*>(src)[2 * c + 1];
    Bf16Vec<8> o;
#pragma unroll
    for (int k = 0; k < 4; ++k) o.v[k] = ToB(lo.v[k]), o.v[4 + k] = ToB(hi.v[k]);
    reinterpret_cast<Bf16Vec<8>*>(dst)[c] = o;
  }
  __device__ void One(size_t i) const { dst[i] = ToB(src[i]); }
};

struct Bf16ToF32 {
  float* dst;
  const Bf16* src;
  __device__ void Chunk(size_t c) const {
    const Bf16Vec<8> x = reinterpret_cast<const Bf16Vec<8>*>(src)[c];
    F32Vec<4> lo, hi;
#pragma unroll
    for (int k = 0; k < 4; ++k) lo.v[k] = ToF(x.v[k]), hi.v[k] = ToF(x.v[4 + k]);
    reinterpret_cast<F32Vec<4>*>(dst)[2 * c] = lo;
    reinterpret_cast<F32Vec<4>*>(dst)[2 * c + 1] = hi;
  }
  __device__ void One(size_t i) const { dst[i] = ToF(src[i]); }
};

template <typename Op>
__global__ void __launch_bounds__(kThreads) ElementwiseKernel(Op op, size_t n) {
  ForEach(n, op);
}

template <typename Op>
Status Launch(const CudaOpContext& ctx, const Op& op, size_t n, const char* what) {
  if (n == 0) return Status::OK();
  // Enough threads for one chunk each (plus the tail), capped; grid-stride loops do the rest.
  const size_t work = n / 8 + 8;
  const unsigned blocks =
      static_cast<unsigned>(std::min<size_t>((work + kThreads - 1) / kThreads, 65535u * 4));
  ElementwiseKernel<Op><<<blocks, kThreads, 0, ctx.stream()>>>(op, n);
  return CudaStatus(cudaGetLastError(), what);
}

// One warp per row: r = bf16(a + b) written to res, then LayerNormForwardKernel's arithmetic
// over r (see the file comment).
__global__ void ResidualLayerNormKernel(Bf16* res, Bf16* out, float* mean, float* rstd,
                                        const Bf16* a, const Bf16* b, const Bf16* w,
                                        const Bf16* bias, int N, int C) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= N) return;
  const Bf16* x = a + row * C;
  const Bf16* y = b + row * C;
  Bf16* r = res + row * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const Bf16 v = ToB(ToF(x[c]) + ToF(y[c]));
    r[c] = v;
    s += ToF(v);
  }
  const float m = WarpSum(s) / C;
  float var = 0.0f;
  for (int c = lane; c < C; c += 32) {  // this lane's own writes: visible to it
    const float d = ToF(r[c]) - m;
    var += d * d;
  }
  const float rs = rsqrtf(WarpSum(var) / C + kLayerNormEps);
  Bf16* o = out + row * C;
  for (int c = lane; c < C; c += 32) o[c] = ToB((ToF(r[c]) - m) * rs * ToF(w[c]) + ToF(bias[c]));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

__global__ void AddF32Kernel(float* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

}  // namespace

Status LaunchAddF32(cudaStream_t stream, float* dst, const float* src, size_t n) {
  if (n == 0) return Status::OK();
  const unsigned blocks =
      static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, 65535u * 4));
  AddF32Kernel<<<blocks, kThreads, 0, stream>>>(dst, src, n);
  return CudaStatus(cudaGetLastError(), "AddF32Kernel");
}

bool VectorizedElementwise(const CudaOpContext& ctx, std::initializer_list<const void*> ptrs) {
  if (ctx.kernels().naive_elementwise) return false;
  for (const void* p : ptrs) {
    if (p != nullptr && !Aligned16(p)) return false;
  }
  return true;
}

Status GeluForwardVec(const CudaOpContext& ctx, Bf16* out, const Bf16* inp, size_t n) {
  return Launch(ctx, GeluFwd{out, inp}, n, "GeluForward (vectorized)");
}
Status GeluBackwardVec(const CudaOpContext& ctx, Bf16* dinp, const Bf16* inp, const Bf16* dout,
                       size_t n) {
  return Launch(ctx, GeluBwd{dinp, inp, dout}, n, "GeluBackward (vectorized)");
}
Status ResidualForwardVec(const CudaOpContext& ctx, Bf16* out, const Bf16* a, const Bf16* b,
                          size_t n) {
  return Launch(ctx, ResidualFwd{out, a, b}, n, "ResidualForward (vectorized)");
}
Status ResidualBackwardVec(const CudaOpContext& ctx, Bf16* da, Bf16* db, const Bf16* dout,
                           size_t n) {
  if (da != nullptr) {
    STRATA_RETURN_IF_ERROR(Launch(ctx, ResidualBwd{da, dout}, n, "ResidualBackward (vectorized)"));
  }
  if (db != nullptr) {
    STRATA_RETURN_IF_ERROR(Launch(ctx, ResidualBwd{db, dout}, n, "ResidualBackward (vectorized)"));
  }
  return Status::OK();
}
Status ConvertF32ToBf16Vec(const CudaOpContext& ctx, Bf16* dst, const float* src, size_t n) {
  return Launch(ctx, F32ToBf16{dst, src}, n, "ConvertF32ToBf16 (vectorized)");
}
Status ConvertBf16ToF32Vec(const CudaOpContext& ctx, float* dst, const Bf16* src, size_t n) {
  return Launch(ctx, Bf16ToF32{dst, src}, n, "ConvertBf16ToF32 (vectorized)");
}

Status ResidualLayerNormForward(const CudaOpContext& ctx, Bf16* res, Bf16* out, float* mean,
                                float* rstd, const Bf16* a, const Bf16* b, const Bf16* w,
                                const Bf16* bias, int N, int C) {
  if (N < 0 || C < 0)
    return Status::InvalidArgument("ResidualLayerNormForward: negative dimension");
  if (N == 0) return Status::OK();
  if (C == 0) return Status::InvalidArgument("ResidualLayerNormForward: C must be positive");
  const size_t bytes = sizeof(Bf16) * size_t(N) * C;
  if (Overlaps(out, bytes, res, bytes) || Overlaps(out, bytes, a, bytes) ||
      Overlaps(out, bytes, b, bytes)) {
    return Status::InvalidArgument(
        "ResidualLayerNormForward: out overlaps res, a or b (the kernel reads the residual "
        "row after writing out); give out its own buffer");
  }
  if (ctx.kernels().naive_elementwise) {
    STRATA_RETURN_IF_ERROR(ResidualForward(ctx, res, a, b, size_t(N) * C));
    return LayerNormForward(ctx, out, mean, rstd, res, w, bias, N, C);
  }
  constexpr int kRowsPerBlock = kThreads / 32;
  const unsigned blocks = static_cast<unsigned>((int64_t(N) + kRowsPerBlock - 1) / kRowsPerBlock);
  ResidualLayerNormKernel<<<blocks, kThreads, 0, ctx.stream()>>>(res, out, mean, rstd, a, b, w,
                                                                 bias, N, C);
  return CudaStatus(cudaGetLastError(), "ResidualLayerNormKernel");
}

}  // namespace strata::model::cuda_ops
