// data[i] /= divisor (IEEE division, not a multiply by the reciprocal: see divide_kernel.h).
// A grid-stride loop, so any count fits in a bounded grid.
#include "gpu/divide_kernel.h"

namespace strata::gpu_internal {
namespace {

__global__ void DivideKernel(float* data, size_t count, float divisor) {
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    data[i] = __fdiv_rn(data[i], divisor);
  }
}

}  // namespace

cudaError_t LaunchDivideKernel(float* data, size_t count, float divisor, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const size_t wanted = (count + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(wanted < 4096 ? wanted : 4096);
  DivideKernel<<<blocks, kThreads, 0, stream>>>(data, count, divisor);
  return cudaGetLastError();
}

}  // namespace strata::gpu_internal
