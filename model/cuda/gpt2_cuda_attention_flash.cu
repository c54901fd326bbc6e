// Flash attention (KernelChoice::flash_attention): causal multi-head self-attention with no
// T×T buffer. Same contract as AttentionForward / AttentionBackward in gpt2_cuda_ops.h: out
// [B,T,C] and stats (the log-sum-exps L of the scaled scores per (b, h, t), then the backward's
// row sums D), so either direction can pair with the cuBLAS path's other one.
//
// Forward, per block: one head's 64 query rows, 4 warps of 16 rows each. For each tile of 64
// keys up to the block's last row (causal), every warp computes its scores S = σ Q Kᵀ (16 × 64,
// WMMA bf16 → fp32 on tensor cores), two lanes per row keep the row's running maximum m and sum
// l (the online softmax: P = exp(S - m_new), the row's output rescaled by exp(m - m_new)), and
// the warp adds P V (P rounded to bf16, as the cuBLAS path rounds its P) into its fp32 output
// rows in shared memory. At the end out = O / l and L = m + log l.
//
// Backward, two kernels with P = exp(σ q·k - L) recomputed (bf16) and dP = dO Vᵀ:
//   per 64 queries: D_t = Σ_s P_ts dP_ts (first pass over the key tiles), then
//                   dQ = σ Σ_s dS_ts K_s with dS = P ∘ (dP - D) (second pass);
//   per 64 keys, over the query tiles from its own on: dV = Σ_t P_ts dO_t, dK = σ Σ_t dS_ts Q_t.
// No atomics: each of dQ, dK, dV is summed by the one warp that owns its rows and added into
// dqkv once (rounded to bf16 once).
//
// Memory: dynamic shared memory only (forward 64 KiB at head size 64, 104 KiB at 128; backward
// about 88 KiB at 64). Reads qkv and dout in place (no head-major copies).
//
// Shared-memory banks: lanes 2r and 2r+1 own row r of a warp's 16-row tiles, the two taking
// alternate columns (lane 2r + h the columns c ≡ h mod 2). Row strides are padded (fp32 rows
// kCols + 4 and HS + 4 floats, bf16 rows kCols + 8 values) so that the 32 lanes of a warp fall
// on 16 banks (2-way) instead of one (32-way with rows 64 or 128 floats apart); the padded
// strides keep WMMA's rules (a multiple of 16 bytes; every fragment pointer 32-byte aligned).
//
// Devices: the kernels need sm_80 (bf16 WMMA). FlashAttentionSupports refuses a device below
// it (the dispatch then takes the cuBLAS path), and a kernel compiled for one traps.
//
// Determinism: fixed order everywhere.
//
// Status: written without a GPU (issue 26); opt-in until GpuOpsTest.Attention (variant 3) and
// gpu_model_bench have run it on a GPU (docs/gpu_record.md).
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
// Padded row strides of the per-warp tiles (see the header): fp32 score rows, bf16 score rows,
// fp32 rows of HS.
constexpr int kSStride = kCols + 4;
constexpr int kPStride = kCols + 8;
template <int HS>
constexpr int kOStride = HS + 4;
// Bytes of one warp's 16-row tile of each kind (each a multiple of 32).
constexpr size_t kSTile = size_t(16) * kSStride * 4;
constexpr size_t kPTile = size_t(16) * kPStride * 2;
template <int HS>
constexpr size_t kOTile = size_t(16) * kOStride<HS> * 4;
static_assert(kSStride % 4 == 0 && kPStride % 8 == 0, "WMMA: ldm a multiple of 16 bytes");
static_assert(kSTile % 32 == 0 && kPTile % 32 == 0 && kOTile<64> % 32 == 0 && kOTile<128> % 32 == 0,
              "WMMA: every warp's tile 32-byte aligned");

// Byte offsets of the block's shared memory (each a multiple of 32, as WMMA needs).
template <int HS>
struct Layout {
  static constexpr size_t q = 0;                           // bf16 [kRows][HS]
  static constexpr size_t k = q + size_t(kRows) * HS * 2;  // bf16 [kCols][HS]
  static constexpr size_t v = k + size_t(kCols) * HS * 2;  // bf16 [kCols][HS]
  static constexpr size_t s = v + size_t(kCols) * HS * 2;  // f32 [kWarps][16][kSStride]
  static constexpr size_t p = s + kWarps * kSTile;         // bf16 [kWarps][16][kPStride]
  static constexpr size_t o = p + kWarps * kPTile;         // f32 [kWarps][16][kOStride]
  static constexpr size_t bytes = o + kWarps * kOTile<HS>;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// out (16 × kCols, fp32, row stride kSStride) = a (16 × HS) · bᵀ, b's kCols rows of HS: one
// warp.
template <int HS>
__device__ void ScoreTile(float* out, const Bf16* a, const Bf16* b) {
  using namespace nvcuda;
  for (int n = 0; n < kCols / 16; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < HS / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, a + kk * 16, HS);
      wmma::load_matrix_sync(fb, b + n * 16 * HS + kk * 16, HS);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, kSStride, wmma::mem_row_major);
  }
}

// acc (16 × HS, fp32, row stride kOStride) += p (16 × kCols, bf16, row stride kPStride) ·
// b (kCols × HS): one warp.
template <int HS>
__device__ void AccumulateTile(float* acc_rows, const Bf16* p, const Bf16* b) {
  using namespace nvcuda;
  for (int n = 0; n < HS / 16; ++n) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(acc, acc_rows + n * 16, kOStride<HS>, wmma::mem_row_major);
    for (int kk = 0; kk < kCols / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, p + kk * 16, kPStride);
      wmma::load_matrix_sync(fb, b + kk * 16 * HS + n * 16, HS);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(acc_rows + n * 16, acc, kOStride<HS>, wmma::mem_row_major);
  }
}
#endif

// rows [row0, row0 + rows) of one head's [T, stride] matrix (channels at `base`), zero past T.
template <int HS>
__device__ void LoadRows(Bf16* dst, const Bf16* base, int64_t stride, int row0, int rows, int T) {
  const Bf16 zero = ToB(0.0f);
  for (int i = threadIdx.x; i < rows * HS; i += kThreads) {
    const int t = row0 + i / HS;
    dst[i] = t < T ? base[int64_t(t) * stride + i % HS] : zero;
  }
}

// dst[c] += k · src[c] (each sum rounded to bf16 once) over the columns c ≡ half (mod 2) of a
// row of HS.
template <int HS>
__device__ void AddHalfRow(Bf16* dst, const float* src, float k, int half) {
  for (int c = half; c < HS; c += 2) dst[c] = ToB(ToF(dst[c]) + k * src[c]);
}

// A kernel compiled for a device below sm_80 (no bf16 WMMA): FlashAttentionSupports refuses
// such a device, so reaching one is a defect; trap rather than leave the outputs untouched.
#define STRATA_FLASH_BELOW_SM80_TRAP() __trap()

template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(Bf16* out, float* lse, const Bf16* qkv, int T, int C, int NH, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = Layout<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  Bf16* Qs = reinterpret_cast<Bf16*>(smem + L::q);
  Bf16* Ks = reinterpret_cast<Bf16*>(smem + L::k);
  Bf16* Vs = reinterpret_cast<Bf16*>(smem + L::v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* Sw = reinterpret_cast<float*>(smem + L::s + warp * kSTile);
  Bf16* Pw = reinterpret_cast<Bf16*>(smem + L::p + warp * kPTile);
  float* Ow = reinterpret_cast<float*>(smem + L::o + warp * kOTile<HS>);

  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int row0 = blockIdx.x * kRows;
  const int64_t stride = 3 * int64_t(C);
  const Bf16* base = qkv + int64_t(b) * T * stride + int64_t(h) * HS;
  LoadRows<HS>(Qs, base, stride, row0, kRows, T);
  for (int i = lane; i < 16 * kOStride<HS>; i += 32) Ow[i] = 0.0f;

  // Two lanes per row: lane 2r and 2r+1 hold row r's statistics (the same values), each
  // taking alternate columns.
  const int my_row = lane / 2, half = lane % 2;
  const int t = row0 + warp * 16 + my_row;  // this row's query
  float m = -INFINITY, l = 0.0f;
  const int last_row = min(T - 1, row0 + kRows - 1);
  const int tiles = last_row / kCols + 1;
  const int warp_last = row0 + warp * 16 + 15;
  for (int j = 0; j < tiles; ++j) {
    const int key0 = j * kCols;
    __syncthreads();  // the last tile's K and V are no longer read
    LoadRows<HS>(Ks, base + C, stride, key0, kCols, T);
    LoadRows<HS>(Vs, base + 2 * C, stride, key0, kCols, T);
    __syncthreads();
    if (warp_last < key0) continue;  // every row of this warp is before the tile's first key

    ScoreTile<HS>(Sw, Qs + warp * 16 * HS, Ks);  // S = Q Kᵀ: the warp's 16 rows, 64 keys
    __syncwarp();

    // The online softmax over this tile: each lane half a row.
    float* srow = Sw + my_row * kSStride;
    Bf16* prow = Pw + my_row * kPStride;
    float tile_max = -INFINITY;
    for (int c = half; c < kCols; c += 2) {
      const int s = key0 + c;
      const float x = (s <= t && s < T) ? srow[c] * scale : -INFINITY;
      srow[c] = x;
      tile_max = fmaxf(tile_max, x);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, 1));
    const float m_new = fmaxf(m, tile_max);
    const float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);
    float sum = 0.0f;
    for (int c = half; c < kCols; c += 2) {
      const float p = srow[c] == -INFINITY ? 0.0f : expf(srow[c] - m_new);
      prow[c] = ToB(p);
      sum += p;
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    float* orow = Ow + my_row * kOStride<HS>;
    for (int c = half; c < HS; c += 2) orow[c] *= alpha;
    __syncwarp();

    AccumulateTile<HS>(Ow, Pw, Vs);  // O += P V
    __syncwarp();
  }
  __syncwarp();
  if (t < T) {
    const float inv = 1.0f / l;
    Bf16* o = out + (int64_t(b) * T + t) * C + int64_t(h) * HS;
    const float* orow = Ow + my_row * kOStride<HS>;
    for (int c = half; c < HS; c += 2) o[c] = ToB(orow[c] * inv);
    if (half == 0) lse[int64_t(bh) * T + t] = m + logf(l);
  }
#elif defined(__CUDA_ARCH__)
  STRATA_FLASH_BELOW_SM80_TRAP();
#endif
}

// The query kernel's shared memory: the block's Q and dO rows, the current K and V tiles, each
// warp's scores, dP (fp32) and dS (bf16), and its dQ rows (fp32).
template <int HS>
struct QueryLayout {
  static constexpr size_t tile = size_t(kCols) * HS * 2;
  static constexpr size_t q = 0, dout = tile, k = 2 * tile, v = 3 * tile;
  static constexpr size_t s = 4 * tile;               // f32 [kWarps][16][kSStride]
  static constexpr size_t dp = s + kWarps * kSTile;   // f32 [kWarps][16][kSStride]
  static constexpr size_t ds = dp + kWarps * kSTile;  // bf16 [kWarps][16][kPStride]
  static constexpr size_t dq = ds + kWarps * kPTile;  // f32 [kWarps][16][kOStride]
  static constexpr size_t bytes = dq + kWarps * kOTile<HS>;
};

// Per block of 64 queries of a head, with P = exp(σ q·k - L) from the forward's log-sum-exps
// (rounded to bf16, as the cuBLAS path rounds its P) and dP = dO Vᵀ: a first pass over the key
// tiles sums D_t = Σ_s P_ts dP_ts (stored in stats' second half, for the key kernel), a second
// adds dQ = σ Σ_s dS_ts K_s, dS = P ∘ (dP - D) (bf16), into dqkv's q part (rounded once).
template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardQueryKernel(Bf16* dqkv, float* stats, const Bf16* dout, const Bf16* qkv, int T,
                             int C, int NH, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = QueryLayout<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  Bf16* Qs = reinterpret_cast<Bf16*>(smem + L::q);
  Bf16* dOs = reinterpret_cast<Bf16*>(smem + L::dout);
  Bf16* Ks = reinterpret_cast<Bf16*>(smem + L::k);
  Bf16* Vs = reinterpret_cast<Bf16*>(smem + L::v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* Sw = reinterpret_cast<float*>(smem + L::s + warp * kSTile);
  float* dPw = reinterpret_cast<float*>(smem + L::dp + warp * kSTile);
  Bf16* dSw = reinterpret_cast<Bf16*>(smem + L::ds + warp * kPTile);
  float* dQw = reinterpret_cast<float*>(smem + L::dq + warp * kOTile<HS>);

  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int row0 = blockIdx.x * kRows;
  const int64_t stride = 3 * int64_t(C);
  const Bf16* base = qkv + int64_t(b) * T * stride + int64_t(h) * HS;
  LoadRows<HS>(Qs, base, stride, row0, kRows, T);
  LoadRows<HS>(dOs, dout + int64_t(b) * T * C + int64_t(h) * HS, C, row0, kRows, T);
  for (int i = lane; i < 16 * kOStride<HS>; i += 32) dQw[i] = 0.0f;
  const int my_row = lane / 2, half = lane % 2;
  const int t = row0 + warp * 16 + my_row;  // this row's query
  const float lse = t < T ? stats[int64_t(bh) * T + t] : 0.0f;
  const int tiles = min(T - 1, row0 + kRows - 1) / kCols + 1;
  const int warp_last = row0 + warp * 16 + 15;
  float D = 0.0f;
  for (int pass = 0; pass < 2; ++pass) {
    for (int j = 0; j < tiles; ++j) {
      const int key0 = j * kCols;
      __syncthreads();
      LoadRows<HS>(Ks, base + C, stride, key0, kCols, T);
      LoadRows<HS>(Vs, base + 2 * C, stride, key0, kCols, T);
      __syncthreads();
      if (warp_last < key0) continue;
      ScoreTile<HS>(Sw, Qs + warp * 16 * HS, Ks);    // S = Q Kᵀ
      ScoreTile<HS>(dPw, dOs + warp * 16 * HS, Vs);  // dP = dO Vᵀ
      __syncwarp();
      float part = 0.0f;
      for (int c = half; c < kCols; c += 2) {
        const int s = key0 + c;
        const int i = my_row * kSStride + c;
        const float p = (s <= t && t < T) ? ToF(ToB(expf(Sw[i] * scale - lse))) : 0.0f;
        if (pass == 0) {
          part += p * dPw[i];
        } else {
          dSw[my_row * kPStride + c] = ToB(p * (dPw[i] - D));
        }
      }
      if (pass == 0) {
        D += part + __shfl_xor_sync(kFullMask, part, 1);
        continue;
      }
      __syncwarp();
      AccumulateTile<HS>(dQw, dSw, Ks);  // dQ += dS K (σ at the end)
      __syncwarp();
    }
    if (pass == 0 && t < T && half == 0) stats[(int64_t(gridDim.y) + bh) * T + t] = D;
  }
  __syncwarp();
  if (t < T) {
    AddHalfRow<HS>(dqkv + (int64_t(b) * T + t) * stride + int64_t(h) * HS,
                   dQw + my_row * kOStride<HS>, scale, half);
  }
#elif defined(__CUDA_ARCH__)
  STRATA_FLASH_BELOW_SM80_TRAP();
#endif
}

// The key kernel's shared memory: the block's K and V rows, the current Q and dO tiles, each
// warp's Sᵀ then dPᵀ (fp32) and Pᵀ then dSᵀ (bf16), its dK and dV rows (fp32), the tile's L, D.
template <int HS>
struct KeyLayout {
  static constexpr size_t tile = size_t(kCols) * HS * 2;
  static constexpr size_t k = 0, v = tile, q = 2 * tile, dout = 3 * tile;
  static constexpr size_t s = 4 * tile;                    // f32 [kWarps][16][kSStride]
  static constexpr size_t p = s + kWarps * kSTile;         // bf16 [kWarps][16][kPStride]
  static constexpr size_t dk = p + kWarps * kPTile;        // f32 [kWarps][16][kOStride]
  static constexpr size_t dv = dk + kWarps * kOTile<HS>;   // f32 [kWarps][16][kOStride]
  static constexpr size_t lse = dv + kWarps * kOTile<HS>;  // f32 [kRows]
  static constexpr size_t delta = lse + kRows * 4;         // f32 [kRows]
  static constexpr size_t bytes = delta + kRows * 4;
};

// Per block of 64 keys of a head, over the query tiles from its own on (causal): with Pᵀ and
// dPᵀ = V dOᵀ as in the query kernel, and its D, dV = Σ_t P_ts dO_t and dK = σ Σ_t dS_ts Q_t,
// added into dqkv's k and v parts (each rounded once).
template <int HS>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKeyKernel(Bf16* dqkv, const float* stats, const Bf16* dout, const Bf16* qkv, int T,
                           int C, int NH, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = KeyLayout<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  Bf16* Ks = reinterpret_cast<Bf16*>(smem + L::k);
  Bf16* Vs = reinterpret_cast<Bf16*>(smem + L::v);
  Bf16* Qs = reinterpret_cast<Bf16*>(smem + L::q);
  Bf16* dOs = reinterpret_cast<Bf16*>(smem + L::dout);
  float* Ls = reinterpret_cast<float*>(smem + L::lse);
  float* Ds = reinterpret_cast<float*>(smem + L::delta);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* Sw = reinterpret_cast<float*>(smem + L::s + warp * kSTile);
  Bf16* Pw = reinterpret_cast<Bf16*>(smem + L::p + warp * kPTile);
  float* dKw = reinterpret_cast<float*>(smem + L::dk + warp * kOTile<HS>);
  float* dVw = reinterpret_cast<float*>(smem + L::dv + warp * kOTile<HS>);

  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int key0 = blockIdx.x * kCols;
  const int64_t stride = 3 * int64_t(C);
  const Bf16* base = qkv + int64_t(b) * T * stride + int64_t(h) * HS;
  const Bf16* dobase = dout + int64_t(b) * T * C + int64_t(h) * HS;
  LoadRows<HS>(Ks, base + C, stride, key0, kCols, T);
  LoadRows<HS>(Vs, base + 2 * C, stride, key0, kCols, T);
  for (int i = lane; i < 16 * kOStride<HS>; i += 32) dKw[i] = dVw[i] = 0.0f;
  const int my_row = lane / 2, half = lane % 2;
  const int s = key0 + warp * 16 + my_row;  // this row's key
  const float* lse = stats + int64_t(bh) * T;
  const float* delta = stats + (int64_t(gridDim.y) + bh) * T;
  for (int j = blockIdx.x; j <= (T - 1) / kRows; ++j) {
    const int q0 = j * kRows;
    __syncthreads();
    LoadRows<HS>(Qs, base, stride, q0, kRows, T);
    LoadRows<HS>(dOs, dobase, C, q0, kRows, T);
    if (threadIdx.x < kRows) {
      const int t = q0 + threadIdx.x;
      Ls[threadIdx.x] = t < T ? lse[t] : 0.0f;
      Ds[threadIdx.x] = t < T ? delta[t] : 0.0f;
    }
    __syncthreads();
    ScoreTile<HS>(Sw, Ks + warp * 16 * HS, Qs);  // Sᵀ = K Qᵀ: the warp's 16 keys, 64 queries
    __syncwarp();
    for (int c = half; c < kCols; c += 2) {
      const int t = q0 + c;
      const int i = my_row * kSStride + c;
      Pw[my_row * kPStride + c] =
          ToB((s <= t && t < T) ? expf(Sw[i] * scale - Ls[c]) : 0.0f);  // Pᵀ
    }
    __syncwarp();
    AccumulateTile<HS>(dVw, Pw, dOs);             // dV += Pᵀ dO
    ScoreTile<HS>(Sw, Vs + warp * 16 * HS, dOs);  // dPᵀ = V dOᵀ
    __syncwarp();
    for (int c = half; c < kCols; c += 2) {
      Bf16& p = Pw[my_row * kPStride + c];
      p = ToB(ToF(p) * (Sw[my_row * kSStride + c] - Ds[c]));  // dSᵀ
    }
    __syncwarp();
    AccumulateTile<HS>(dKw, Pw, Qs);  // dK += dSᵀ Q (σ at the end)
    __syncwarp();
  }
  __syncwarp();
  if (s < T) {
    Bf16* dk = dqkv + (int64_t(b) * T + s) * stride + C + int64_t(h) * HS;
    AddHalfRow<HS>(dk, dKw + my_row * kOStride<HS>, scale, half);
    AddHalfRow<HS>(dk + C, dVw + my_row * kOStride<HS>, 1.0f, half);
  }
#elif defined(__CUDA_ARCH__)
  STRATA_FLASH_BELOW_SM80_TRAP();
#endif
}

template <typename Kernel>
Status AllowSharedMemory(Kernel kernel, size_t bytes, const char* what) {
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e == cudaSuccess) return Status::OK();
  return Status::Cuda(std::string(what) + ": shared memory of " + std::to_string(bytes) +
                      " bytes: " + cudaGetErrorString(e));
}

Status LaunchStatus(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return Status::OK();
  return Status::Cuda(std::string(what) + ": " + cudaGetErrorString(e));
}

template <int HS>
Status LaunchBackward(const CudaOpContext& ctx, Bf16* dqkv, const Bf16* dout, const Bf16* qkv,
                      float* stats, int B, int T, int C, int NH) {
  const float scale = 1.0f / std::sqrt(float(HS));
  const dim3 grid((T + kRows - 1) / kRows, unsigned(B) * NH);
  STRATA_RETURN_IF_ERROR(AllowSharedMemory(FlashBackwardQueryKernel<HS>, QueryLayout<HS>::bytes,
                                           "flash attention backward (queries)"));
  FlashBackwardQueryKernel<HS><<<grid, kThreads, QueryLayout<HS>::bytes, ctx.stream()>>>(
      dqkv, stats, dout, qkv, T, C, NH, scale);
  STRATA_RETURN_IF_ERROR(LaunchStatus("flash attention backward (queries)"));
  STRATA_RETURN_IF_ERROR(AllowSharedMemory(FlashBackwardKeyKernel<HS>, KeyLayout<HS>::bytes,
                                           "flash attention backward (keys)"));
  FlashBackwardKeyKernel<HS><<<grid, kThreads, KeyLayout<HS>::bytes, ctx.stream()>>>(
      dqkv, stats, dout, qkv, T, C, NH, scale);
  return LaunchStatus("flash attention backward (keys)");
}

template <int HS>
Status Launch(const CudaOpContext& ctx, Bf16* out, float* stats, const Bf16* qkv, int B, int T,
              int C, int NH) {
  const size_t bytes = Layout<HS>::bytes;
  STRATA_RETURN_IF_ERROR(AllowSharedMemory(FlashForwardKernel<HS>, bytes, "flash attention"));
  const dim3 grid((T + kRows - 1) / kRows, unsigned(B) * NH);
  FlashForwardKernel<HS><<<grid, kThreads, bytes, ctx.stream()>>>(out, stats, qkv, T, C, NH,
                                                                  1.0f / std::sqrt(float(HS)));
  return LaunchStatus("flash attention forward");
}

}  // namespace

namespace {

// A device of compute capability sm (major · 10 + minor) of at least 8.0, head sizes 64 and
// 128, at most 65535 heads (the grid's y).
Status CheckShape(int B, int C, int NH, int sm) {
  if (sm < 80) {
    return Status::NotSupported(
        "flash attention: needs compute capability 8.0 (bf16 tensor "
        "cores); this device has " +
        std::to_string(sm / 10) + "." + std::to_string(sm % 10));
  }
  if (C <= 0 || NH <= 0 || C % NH != 0 || (C / NH != 64 && C / NH != 128)) {
    return Status::InvalidArgument("flash attention: head size " +
                                   std::to_string(NH > 0 ? C / NH : 0) + " (64 or 128 only)");
  }
  if (int64_t(B) * NH > 65535) {
    return Status::InvalidArgument("flash attention: B·NH = " + std::to_string(int64_t(B) * NH) +
                                   " heads exceed the grid's 65535");
  }
  return Status::OK();
}

}  // namespace

bool FlashAttentionSupports(int B, int C, int NH, int sm) { return CheckShape(B, C, NH, sm).ok(); }

Status FlashAttentionForward(const CudaOpContext& ctx, Bf16* out, float* stats, const Bf16* qkv,
                             int B, int T, int C, int NH) {
  STRATA_RETURN_IF_ERROR(CheckShape(B, C, NH, ctx.compute_capability()));
  if (B <= 0 || T <= 0) return Status::OK();
  return C / NH == 64 ? Launch<64>(ctx, out, stats, qkv, B, T, C, NH)
                      : Launch<128>(ctx, out, stats, qkv, B, T, C, NH);
}

Status FlashAttentionBackward(const CudaOpContext& ctx, Bf16* dqkv, const Bf16* dout,
                              const Bf16* qkv, float* stats, int B, int T, int C, int NH) {
  STRATA_RETURN_IF_ERROR(CheckShape(B, C, NH, ctx.compute_capability()));
  if (B <= 0 || T <= 0) return Status::OK();
  return C / NH == 64 ? LaunchBackward<64>(ctx, dqkv, dout, qkv, stats, B, T, C, NH)
                      : LaunchBackward<128>(ctx, dqkv, dout, qkv, stats, B, T, C, NH);
}

}  // namespace strata::model::cuda_ops
