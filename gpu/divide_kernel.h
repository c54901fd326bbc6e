// Element-wise division of an fp32 buffer by a scalar, in place, on a stream. The NCCL
// communicator's kAverage uses it after a sum, because comm.h defines the average as a
// division (bit-identical to the Gloo backend), while ncclAvg multiplies by 1/N before
// summing. CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace strata::gpu_internal {

// data[i] = data[i] / divisor for i in [0, count). Returns the launch error.
cudaError_t LaunchDivideKernel(float* data, size_t count, float divisor, cudaStream_t stream);

}  // namespace strata::gpu_internal
