// The busy kernel behind CudaDevice::EnqueueBusy: one thread of one block that keeps a
// stream occupied for a given time while using (almost) no SM resources and no host CPU.
// It emulates a kernel of known duration for benchmarks (`strata bench step --compute-ms`).
// CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::gpu_internal {

// Launches the kernel on `stream`; returns the launch error (cudaSuccess when queued).
cudaError_t LaunchBusyKernel(uint64_t duration_ns, cudaStream_t stream);

}  // namespace strata::gpu_internal
