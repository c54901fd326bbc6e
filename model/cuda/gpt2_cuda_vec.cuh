// Device helpers shared by the GPT-2 CUDA kernel files (internal to model/cuda/, included only
// from .cu files): bf16 <-> fp32, kVec consecutive values as one aligned unit so that a load or
// store of 8 bf16 (or 4 fp32) is one 128-bit instruction, and the warp-wide sum and maximum.
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

constexpr unsigned kFullMask = 0xffffffffu;  // every lane of a warp

// The sum (maximum) of `v` over the 32 lanes of a warp, in every lane (butterfly reduction).
__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

}  // namespace strata::model::cuda_ops
