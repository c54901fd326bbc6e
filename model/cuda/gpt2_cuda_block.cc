// One GPT-2 block's forward and backward on CUDA, as a sequence of gpt2_cuda_ops.h calls (see
// gpt2_cuda_block.h for the formula and the buffer layout).
//
// Test: ctest --test-dir build/cuda -R gpt2_cuda_ops   (GpuBlock.* ; needs a GPU)
#include "model/cuda/gpt2_cuda_block.h"

#include <cuda_runtime.h>

#include "model/cuda/gpt2_cuda_carver.h"
#include "strata/bytes.h"

namespace strata::model::cuda_ops {
namespace {

BlockActivations CarveActivations(Carver& c, const BlockShape& s) {
  const size_t n = size_t(s.N()), C = size_t(s.C);
  BlockActivations a;
  a.ln1 = c.Take<Bf16>(n * C);
  a.qkv = c.Take<Bf16>(n * 3 * C);
  a.atty = c.Take<Bf16>(n * C);
  a.res2 = c.Take<Bf16>(n * C);
  a.ln2 = c.Take<Bf16>(n * C);
  a.fch = c.Take<Bf16>(n * 4 * C);
  a.fcg = c.Take<Bf16>(n * 4 * C);
  a.ln1_mean = c.Take<float>(n);
  a.ln1_rstd = c.Take<float>(n);
  a.ln2_mean = c.Take<float>(n);
  a.ln2_rstd = c.Take<float>(n);
  a.att_stats = c.Take<float>(AttentionStatsSize(s.B, s.T, s.NH));
  return a;
}

BlockScratch CarveScratch(Carver& c, const BlockShape& s) {
  const size_t n = size_t(s.N()), C = size_t(s.C);
  BlockScratch d;
  d.d_tmp = c.Take<Bf16>(n * C);
  d.d_res2 = c.Take<Bf16>(n * C);
  d.d_ln = c.Take<Bf16>(n * C);
  d.d_qkv = c.Take<Bf16>(n * 3 * C);
  d.d_fcg = c.Take<Bf16>(n * 4 * C);
  d.d_fch = c.Take<Bf16>(n * 4 * C);
  return d;
}

Status Zero(const CudaOpContext& ctx, Bf16* p, size_t count) {
  return CudaStatus(cudaMemsetAsync(p, 0, count * sizeof(Bf16), ctx.stream()), "cudaMemsetAsync");
}

}  // namespace

size_t BlockActivations::Bytes(const BlockShape& s) {
  Carver c(nullptr);
  CarveActivations(c, s);
  return c.used();
}
BlockActivations BlockActivations::Carve(void* base, const BlockShape& s) {
  Carver c(base);
  return CarveActivations(c, s);
}
size_t BlockScratch::Bytes(const BlockShape& s) {
  Carver c(nullptr);
  CarveScratch(c, s);
  return c.used();
}
BlockScratch BlockScratch::Carve(void* base, const BlockShape& s) {
  Carver c(base);
  return CarveScratch(c, s);
}

Status BlockForward(const CudaOpContext& ctx, const BlockShape& s, const BlockParams& p,
                    const Bf16* x, Bf16* y, Bf16* tmp, const BlockActivations& a) {
  if (s.N() > INT32_MAX / 4) return Status::InvalidArgument("BlockForward: B*T too large");
  const int N = static_cast<int>(s.N()), C = s.C;
  const size_t nc = size_t(N) * C;
  STRATA_RETURN_IF_ERROR(
      LayerNormForward(ctx, a.ln1, a.ln1_mean, a.ln1_rstd, x, p.ln1_w, p.ln1_b, N, C));
  STRATA_RETURN_IF_ERROR(MatmulForward(ctx, a.qkv, a.ln1, p.qkv_w, p.qkv_b, N, C, 3 * C));
  STRATA_RETURN_IF_ERROR(AttentionForward(ctx, a.atty, a.att_stats, a.qkv, s.B, s.T, C, s.NH));
  STRATA_RETURN_IF_ERROR(MatmulForward(ctx, tmp, a.atty, p.attn_proj_w, p.attn_proj_b, N, C, C));
  STRATA_RETURN_IF_ERROR(ResidualLayerNormForward(ctx, a.res2, a.ln2, a.ln2_mean, a.ln2_rstd, x,
                                                  tmp, p.ln2_w, p.ln2_b, N, C));
  STRATA_RETURN_IF_ERROR(MatmulGeluForward(ctx, a.fcg, a.fch, a.ln2, p.fc_w, p.fc_b, N, C, 4 * C));
  STRATA_RETURN_IF_ERROR(MatmulForward(ctx, tmp, a.fcg, p.fc_proj_w, p.fc_proj_b, N, 4 * C, C));
  return ResidualForward(ctx, y, a.res2, tmp, nc);
}

Status BlockBackward(const CudaOpContext& ctx, const BlockShape& s, const BlockParams& p,
                     const BlockGrads& g, const Bf16* x, const BlockActivations& a, const Bf16* dy,
                     Bf16* dx, const BlockScratch& d) {
  if (s.N() > INT32_MAX / 4) return Status::InvalidArgument("BlockBackward: B*T too large");
  const int N = static_cast<int>(s.N()), C = s.C;
  const size_t nc = size_t(N) * C;
  // y = res2 + mlp: d(res2) = dy (plus the LN2 path below), d(mlp) = dy, used in place.
  STRATA_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(d.d_res2, dy, nc * sizeof(Bf16), cudaMemcpyDeviceToDevice, ctx.stream()),
      "cudaMemcpyAsync"));
  STRATA_RETURN_IF_ERROR(
      MatmulBackward(ctx, nullptr, g.fc_proj_w, g.fc_proj_b, dy, a.fcg, p.fc_proj_w, N, 4 * C, C));
  // d(fch) = gelu'(fch) ⊙ (dy · fc_projᵀ), overwritten (d_fcg: the unfused path's scratch).
  STRATA_RETURN_IF_ERROR(
      MatmulDgeluBackward(ctx, d.d_fch, d.d_fcg, dy, a.fch, p.fc_proj_w, N, 4 * C, C));
  STRATA_RETURN_IF_ERROR(Zero(ctx, d.d_ln, nc));
  STRATA_RETURN_IF_ERROR(
      MatmulBackward(ctx, d.d_ln, g.fc_w, g.fc_b, d.d_fch, a.ln2, p.fc_w, N, C, 4 * C));
  STRATA_RETURN_IF_ERROR(LayerNormBackward(ctx, d.d_res2, g.ln2_w, g.ln2_b, d.d_ln, a.res2, p.ln2_w,
                                           a.ln2_mean, a.ln2_rstd, N, C));
  // res2 = x + attn_proj: dx += d(res2); d(attn_proj) = d(res2), used in place.
  STRATA_RETURN_IF_ERROR(ResidualBackward(ctx, dx, nullptr, d.d_res2, nc));
  STRATA_RETURN_IF_ERROR(Zero(ctx, d.d_tmp, nc));
  STRATA_RETURN_IF_ERROR(MatmulBackward(ctx, d.d_tmp, g.attn_proj_w, g.attn_proj_b, d.d_res2,
                                        a.atty, p.attn_proj_w, N, C, C));
  STRATA_RETURN_IF_ERROR(Zero(ctx, d.d_qkv, 3 * nc));
  STRATA_RETURN_IF_ERROR(
      AttentionBackward(ctx, d.d_qkv, d.d_tmp, a.qkv, a.att_stats, s.B, s.T, C, s.NH));
  STRATA_RETURN_IF_ERROR(Zero(ctx, d.d_ln, nc));
  STRATA_RETURN_IF_ERROR(
      MatmulBackward(ctx, d.d_ln, g.qkv_w, g.qkv_b, d.d_qkv, a.ln1, p.qkv_w, N, C, 3 * C));
  return LayerNormBackward(ctx, dx, g.ln1_w, g.ln1_b, d.d_ln, x, p.ln1_w, a.ln1_mean, a.ln1_rstd, N,
                           C);
}

}  // namespace strata::model::cuda_ops
