// Busy kernel: waits until %globaltimer (the GPU's nanosecond wall clock, shared by all
// SMs) has advanced by `duration_ns` since the kernel started. Timing by the global timer
// rather than clock64() keeps the duration independent of the SM clock frequency, which
// changes under boost and power capping. __nanosleep between reads keeps the one warp from
// hammering the issue slot, leaving the SM to real kernels on other streams.
#include "gpu/busy_kernel.h"

namespace strata::gpu_internal {
namespace {

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void BusyKernel(uint64_t duration_ns) {
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < duration_ns) {
    __nanosleep(1000);
  }
}

}  // namespace

cudaError_t LaunchBusyKernel(uint64_t duration_ns, cudaStream_t stream) {
  BusyKernel<<<1, 1, 0, stream>>>(duration_ns);
  return cudaGetLastError();
}

}  // namespace strata::gpu_internal
