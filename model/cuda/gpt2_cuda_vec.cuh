// Device helpers shared by the GPT-2 CUDA kernel files (internal to model/cuda/, included only
// from .cu files): bf16 <-> fp32, and kVec consecutive values as one aligned unit so that a
// load or store of 8 bf16 (or 4 fp32) is one 128-bit instruction.
//
// A Bf16Vec<8> access needs a 16-byte-aligned address: callers check the base pointers
// (Aligned16) and that every offset they form is a multiple of 8 elements, and fall back to
// kVec = 1 (or a scalar tail) otherwise.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace strata::model::cuda_ops {

__device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ __nv_bfloat16 ToB(float x) { return __float2bfloat16_rn(x); }

template <int kVec>
struct alignas(kVec * sizeof(__nv_bfloat16)) Bf16Vec {
  __nv_bfloat16 v[kVec];
};
template <int kVec>
struct alignas(kVec * sizeof(float)) F32Vec {
  float v[kVec];
};

inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace strata::model::cuda_ops
