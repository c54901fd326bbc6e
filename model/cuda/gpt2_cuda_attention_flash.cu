// The flash attention forward (KernelChoice::flash_attention): causal multi-head self-attention
// in one kernel per 64 query rows of a head, with no T×T buffer. Same contract as
// AttentionForward in gpt2_cuda_ops.h: out [B,T,C] and the first half of stats (the log-sum-exps
// of the scaled scores, per (b, h, t)), so the cuBLAS backward (gpt2_cuda_attention_gemm.cu)
// runs from them unchanged.
//
// Per block: one head's 64 query rows, 4 warps of 16 rows each. For each tile of 64 keys up to
// the block's last row (causal), every warp computes its scores S = σ Q Kᵀ (16 × 64, WMMA
// bf16 → fp32 on tensor cores), two lanes per row keep the row's running maximum m and sum l
// (the online softmax: P = exp(S - m_new), the row's output rescaled by exp(m - m_new)), and
// the warp adds P V (P rounded to bf16, as the cuBLAS path rounds its P) into its fp32 output
// rows in shared memory. At the end out = O / l and L = m + log l.
//
// Memory: dynamic shared memory only (64 KiB for head size 64, 104 KiB for 128): the Q, K and
// V tiles, each warp's scores, probabilities and output rows. Reads qkv in place (no head-major
// copies); every key tile is read once per block of 64 queries.
//
// Determinism: fixed order everywhere (one warp per 16 rows, no atomics).
//
// Status: written without a GPU (issue 26); opt-in until GpuOpsTest.Attention (variant 3) and
// gpu_model_bench have run it on the lent H200.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "model/cuda/gpt2_cuda_kernels.h"
#include "model/cuda/gpt2_cuda_ops.h"
#include "model/cuda/gpt2_cuda_vec.cuh"

namespace strata::model::cuda_ops {
namespace {

constexpr int kRows = 64;  // query rows per block
constexpr int kCols = 64;  // keys per tile
constexpr int kWarps = 4;  // 16 rows each
constexpr int kThreads = 32 * kWarps;
constexpr unsigned kFullMask = 0xffffffffu;

// Byte offsets of the block's shared memory (each a multiple of 32, as WMMA needs).
template <int HS>
struct Layout {
  static constexpr size_t q = 0;                                    // bf16 [kRows][HS]
  static constexpr size_t k = q + size_t(kRows) * HS * 2;           // bf16 [kCols][HS]
  static constexpr size_t v = k + size_t(kCols) * HS * 2;           // bf16 [kCols][HS]
  static constexpr size_t s = v + size_t(kCols) * HS * 2;           // f32 [kWarps][16][kCols]
  static constexpr size_t p = s + size_t(kWarps) * 16 * kCols * 4;  // bf16 [kWarps][16][kCols]
  static constexpr size_t o = p + size_t(kWarps) * 16 * kCols * 2;  // f32 [kWarps][16][HS]
  static constexpr size_t bytes = o + size_t(kWarps) * 16 * HS * 4;
};

template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(Bf16* out, float* lse, const Bf16* qkv, int T, int C, int NH, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace nvcuda;
  using L = Layout<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  Bf16* Qs = reinterpret_cast<Bf16*>(smem + L::q);
  Bf16* Ks = reinterpret_cast<Bf16*>(smem + L::k);
  Bf16* Vs = reinterpret_cast<Bf16*>(smem + L::v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* Sw = reinterpret_cast<float*>(smem + L::s) + warp * 16 * kCols;
  Bf16* Pw = reinterpret_cast<Bf16*>(smem + L::p) + warp * 16 * kCols;
  float* Ow = reinterpret_cast<float*>(smem + L::o) + warp * 16 * HS;

  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int row0 = blockIdx.x * kRows;
  const int64_t stride = 3 * int64_t(C);
  const Bf16* base = qkv + int64_t(b) * T * stride + int64_t(h) * HS;
  const Bf16 zero = ToB(0.0f);
  for (int i = threadIdx.x; i < kRows * HS; i += kThreads) {
    const int t = row0 + i / HS;
    Qs[i] = t < T ? base[int64_t(t) * stride + i % HS] : zero;
  }
  for (int i = lane; i < 16 * HS; i += 32) Ow[i] = 0.0f;

  // Two lanes per row: lane 2r and 2r+1 hold row r's statistics (the same values).
  const int my_row = lane / 2, half = lane % 2;
  const int t = row0 + warp * 16 + my_row;  // this row's query
  float m = -INFINITY, l = 0.0f;
  const int last_row = min(T - 1, row0 + kRows - 1);
  const int tiles = last_row / kCols + 1;
  const int warp_last = row0 + warp * 16 + 15;
  for (int j = 0; j < tiles; ++j) {
    const int key0 = j * kCols;
    __syncthreads();  // the last tile's K and V are no longer read
    for (int i = threadIdx.x; i < kCols * HS; i += kThreads) {
      const int s = key0 + i / HS;
      const bool in = s < T;
      Ks[i] = in ? base[int64_t(s) * stride + C + i % HS] : zero;
      Vs[i] = in ? base[int64_t(s) * stride + 2 * C + i % HS] : zero;
    }
    __syncthreads();
    if (warp_last < key0) continue;  // every row of this warp is before the tile's first key

    // S = Q Kᵀ for the warp's 16 rows and the tile's 64 keys.
    for (int n = 0; n < kCols / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk < HS / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> bk;
        wmma::load_matrix_sync(a, Qs + warp * 16 * HS + kk * 16, HS);
        wmma::load_matrix_sync(bk, Ks + n * 16 * HS + kk * 16, HS);
        wmma::mma_sync(acc, a, bk, acc);
      }
      wmma::store_matrix_sync(Sw + n * 16, acc, kCols, wmma::mem_row_major);
    }
    __syncwarp();

    // The online softmax over this tile: each lane half a row.
    float* srow = Sw + my_row * kCols;
    Bf16* prow = Pw + my_row * kCols;
    float tile_max = -INFINITY;
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const int s = key0 + c;
      const float x = (s <= t && s < T) ? srow[c] * scale : -INFINITY;
      srow[c] = x;
      tile_max = fmaxf(tile_max, x);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);
    float sum = 0.0f;
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const float p = srow[c] == -INFINITY ? 0.0f : expf(srow[c] - m_new);
      prow[c] = ToB(p);
      sum += p;
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    float* orow = Ow + my_row * HS;
    for (int c = half * (HS / 2); c < (half + 1) * (HS / 2); ++c) orow[c] *= alpha;
    __syncwarp();

    // O += P V.
    for (int n = 0; n < HS / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, Ow + n * 16, HS, wmma::mem_row_major);
      for (int kk = 0; kk < kCols / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> bv;
        wmma::load_matrix_sync(a, Pw + kk * 16, kCols);
        wmma::load_matrix_sync(bv, Vs + kk * 16 * HS + n * 16, HS);
        wmma::mma_sync(acc, a, bv, acc);
      }
      wmma::store_matrix_sync(Ow + n * 16, acc, HS, wmma::mem_row_major);
    }
    __syncwarp();
  }
  __syncwarp();
  if (t < T) {
    const float inv = 1.0f / l;
    Bf16* o = out + (int64_t(b) * T + t) * C + int64_t(h) * HS;
    const float* orow = Ow + my_row * HS;
    for (int c = half * (HS / 2); c < (half + 1) * (HS / 2); ++c) o[c] = ToB(orow[c] * inv);
    if (half == 0) lse[int64_t(bh) * T + t] = m + logf(l);
  }
#endif
}

template <int HS>
Status Launch(const CudaOpContext& ctx, Bf16* out, float* stats, const Bf16* qkv, int B, int T,
              int C, int NH) {
  const size_t bytes = Layout<HS>::bytes;
  cudaError_t e = cudaFuncSetAttribute(FlashForwardKernel<HS>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e != cudaSuccess) {
    return Status::Cuda(std::string("flash attention: shared memory of ") + std::to_string(bytes) +
                        " bytes: " + cudaGetErrorString(e));
  }
  const dim3 grid((T + kRows - 1) / kRows, unsigned(B) * NH);
  FlashForwardKernel<HS><<<grid, kThreads, bytes, ctx.stream()>>>(out, stats, qkv, T, C, NH,
                                                                  1.0f / std::sqrt(float(HS)));
  e = cudaGetLastError();
  if (e != cudaSuccess) {
    return Status::Cuda(std::string("flash attention forward: ") + cudaGetErrorString(e));
  }
  return Status::OK();
}

}  // namespace

bool FlashAttentionSupports(int C, int NH) {
  if (C <= 0 || NH <= 0 || C % NH != 0) return false;
  const int hs = C / NH;
  return hs == 64 || hs == 128;
}

Status FlashAttentionForward(const CudaOpContext& ctx, Bf16* out, float* stats, const Bf16* qkv,
                             int B, int T, int C, int NH) {
  if (!FlashAttentionSupports(C, NH)) {
    return Status::InvalidArgument("flash attention: head size " +
                                   std::to_string(NH > 0 ? C / NH : 0) + " (64 or 128 only)");
  }
  if (B <= 0 || T <= 0) return Status::OK();
  if (int64_t(B) * NH > 65535) {
    return Status::InvalidArgument("flash attention: B·NH = " + std::to_string(int64_t(B) * NH) +
                                   " heads exceed the grid's 65535");
  }
  return C / NH == 64 ? Launch<64>(ctx, out, stats, qkv, B, T, C, NH)
                      : Launch<128>(ctx, out, stats, qkv, B, T, C, NH);
}

}  // namespace strata::model::cuda_ops
