// One GPT-2 transformer block (pre-LayerNorm) on CUDA, composed from gpt2_cuda_ops.h:
//
//   h   = x + c_proj(Attention(c_attn(LN1(x))))
//   y   = h + mlp.c_proj(GELU(mlp.c_fc(LN2(h))))
//
// The parameters live in one flat bf16 buffer (the unit the engine fetches) in Hugging Face
// GPT-2 order: ln_1.{weight,bias} [C], attn.c_attn.{weight [C,3C], bias [3C]},
// attn.c_proj.{weight [C,C], bias [C]}, ln_2.{weight,bias} [C], mlp.c_fc.{weight [C,4C],
// bias [4C]}, mlp.c_proj.{weight [4C,C], bias [C]}: 12C² + 13C values. Gradients use the same
// layout in fp32. The activations saved by the forward pass for the backward pass, and the
// backward pass's scratch, are carved from caller-owned device buffers whose sizes the
// *Floats/*Bytes helpers give, so that the caller (the engine's budgeted device memory) owns
// every allocation.
//
// Used by the CUDA ops test (whole-block check against the CPU path) and by
// bench/gpu_model_bench.cc; the model may use it as is.
//
// Thread safety: as for gpt2_cuda_ops.h (one context per thread).
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/cuda/gpt2_cuda_ops.h"

namespace strata::model::cuda_ops {

struct BlockShape {
  int B = 0, T = 0, C = 0, NH = 0;
  int64_t N() const { return int64_t(B) * T; }
};

// Pointers into a flat parameter (or gradient) buffer, in the order above.
template <typename P>
struct BlockTensors {
  P *ln1_w, *ln1_b, *qkv_w, *qkv_b, *attn_proj_w, *attn_proj_b;
  P *ln2_w, *ln2_b, *fc_w, *fc_b, *fc_proj_w, *fc_proj_b;

  static size_t Count(int C) { return 12 * size_t(C) * C + 13 * size_t(C); }
  // REQUIRES: base holds Count(C) values.
  static BlockTensors Carve(P* base, int C) {
    const size_t c = size_t(C);
    BlockTensors t;
    P* p = base;
    auto take = [&p](size_t n) {
      P* q = p;
      p += n;
      return q;
    };
    t.ln1_w = take(c), t.ln1_b = take(c);
    t.qkv_w = take(3 * c * c), t.qkv_b = take(3 * c);
    t.attn_proj_w = take(c * c), t.attn_proj_b = take(c);
    t.ln2_w = take(c), t.ln2_b = take(c);
    t.fc_w = take(4 * c * c), t.fc_b = take(4 * c);
    t.fc_proj_w = take(4 * c * c), t.fc_proj_b = take(c);
    return t;
  }
};
using BlockParams = BlockTensors<const Bf16>;
using BlockGrads = BlockTensors<float>;

// What the forward pass saves for the backward pass.
struct BlockActivations {
  Bf16 *ln1, *qkv, *atty, *res2, *ln2, *fch, *fcg;   // [N,C] [N,3C] [N,C] [N,C] [N,C] [N,4C] x2
  float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;  // [N]
  float* att_stats;                                  // AttentionStatsSize(B, T, NH)

  // Bytes of the single buffer Carve() splits (each piece 256-byte aligned).
  static size_t Bytes(const BlockShape& s);
  static BlockActivations Carve(void* base, const BlockShape& s);
};

// Backward scratch: gradients of the intermediate activations.
struct BlockScratch {
  Bf16 *d_tmp, *d_res2, *d_ln, *d_qkv;  // [N,C] [N,C] [N,C] [N,3C]
  Bf16 *d_fcg, *d_fch;                  // [N,4C] [N,4C]
  static size_t Bytes(const BlockShape& s);
  static BlockScratch Carve(void* base, const BlockShape& s);
};

// y[N,C] = block(x). `tmp` is [N,C] bf16 scratch (the projections' outputs before the residual
// adds); x, y and tmp must be distinct. Fills `act` for BlockBackward.
Status BlockForward(const CudaOpContext& ctx, const BlockShape& s, const BlockParams& p,
                    const Bf16* x, Bf16* y, Bf16* tmp, const BlockActivations& act);

// dx += d(block)/dx · dy; grads += the parameter gradients (fp32, accumulated). x and act are
// the forward pass's; act.att_stats is modified (attention scratch). dx must not alias dy.
Status BlockBackward(const CudaOpContext& ctx, const BlockShape& s, const BlockParams& p,
                     const BlockGrads& grads, const Bf16* x, const BlockActivations& act,
                     const Bf16* dy, Bf16* dx, const BlockScratch& scratch);

}  // namespace strata::model::cuda_ops
