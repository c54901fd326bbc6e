// The GPT-2 operators on a CUDA GPU (CudaDevice): forward and backward of every op the model
// runs, mirroring model/gpt2_ops.h op for op and argument for argument, so that model code can
// call either path with the same shapes and the same output semantics.
//
// Precision: weights, activations and activation gradients are bf16 (`Bf16`); every sum is
// accumulated in fp32; parameter gradients (dw, dbias, dwte, dwpe, LayerNorm dw/db), the
// LayerNorm statistics and the per-token losses are fp32. Matrix products go through cuBLAS
// (bf16 inputs, CUBLAS_COMPUTE_32F): cuBLASLt with bias / GELU / bias-gradient epilogues for
// the linear layers (gpt2_cuda_matmul_lt.cc), cublasGemmEx for the rest, strided-batched GEMMs
// for attention's QKᵀ and PV (gpt2_cuda_attention_gemm.cu); everything else is a hand-written
// kernel (gpt2_cuda_kernels.cu, gpt2_cuda_elementwise.cu, gpt2_cuda_classifier.cu,
// gpt2_cuda_embedding.cu), each documented with its formula. The previous, simple kernel of
// each op stays selectable (KernelChoice, STRATA_CUDA_KERNELS) for comparison and fallback.
//
// Output semantics are those of the CPU path: forward functions OVERWRITE their outputs;
// backward functions ACCUMULATE (+=) into every gradient (bf16 activation grads are read,
// added to in fp32 and rounded back once); SoftmaxCrossEntropyBackward overwrites dlogits.
//
// Differences from the CPU signatures, all forced by the GPU:
//   - every function takes a CudaOpContext (stream, cuBLAS handles, kernel choice, workspace)
//     first and returns a
//     Status: InvalidArgument for bad shapes, Cuda when a launch fails. Work is enqueued on
//     the context's stream and runs asynchronously; errors of the running kernels surface at
//     the next synchronisation of that stream (as with any CUDA work);
//   - all pointers are device pointers (tokens/targets too);
//   - attention saves per-row softmax statistics instead of the [B,NH,T,T] probabilities
//     (flash-attention style; the backward pass recomputes the probabilities), in a float
//     buffer of AttentionStatsSize(B, T, NH) elements that the backward pass also uses as
//     scratch (hence non-const there);
//   - SoftmaxCrossEntropyForward writes the mean loss to a device float instead of returning
//     it, so that no host synchronisation is forced.
//
// Determinism: no kernel uses floating-point atomics; every reduction has a fixed order
// (row-parallel reductions sum their rows in ascending order, embedding gradients sum each
// token's positions in ascending order), and cuBLAS / cuBLASLt are bitwise reproducible for a
// fixed GPU, toolkit and algorithm (cuBLASLt's is chosen independently of buffer addresses,
// see gpt2_cuda_matmul_lt.cc). Two runs with the same inputs and KernelChoice give the same
// bits; the tuned and naive kernels of an op agree within the ops test's tolerances (the
// embedding's bit for bit), not in every bit.
//
// Memory beyond the caller's buffers: the context's workspace (the cuBLAS attention's
// head-major copies and T×T buffers, up to KernelChoice::attention_batch_bytes plus 7 N·C
// values; none for the naive or flash attention; 32 MiB for
// cuBLASLt; the embedding sort's keys), allocated on first use with cudaMalloc outside any
// Device budget.
//
// Thread safety: a CudaOpContext must not be used by two threads at once (cuBLAS handles are
// not thread-safe); distinct contexts may be used concurrently.
//
// This header is internal (model/cuda/); it includes CUDA headers and must never be included
// from include/strata/.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "strata/status.h"

namespace strata::model::cuda_ops {

using Bf16 = __nv_bfloat16;

// Which implementation each op runs: the tuned kernel or the previous, simple one (the
// default of each family is the newest that has run on a GPU: Parse), kept so that a device run can
// time them against each other per kernel and fall back when a tuned kernel misbehaves on some GPU.
// Both give results within the ops test's tolerances of the CPU reference, and each is
// deterministic on its own; they do not give the same bits as each other.
struct KernelChoice {
  // Attention: warp-per-row kernels (one row of scores in shared memory) instead of cuBLAS
  // strided-batched QKᵀ / PV on tensor cores with fused causal-softmax kernels.
  bool naive_attention = false;
  // Attention ("attention=flash"): fused kernels with no T×T buffer instead of the cuBLAS
  // GEMMs (gpt2_cuda_attention_flash.cu: the products on tensor cores through WMMA; forward one
  // kernel per 64 query rows of a head with the softmax online, backward one per 64 queries for
  // D and dQ and one per 64 keys for dK and dV), for head sizes 64 and 128 (others keep the
  // cuBLAS path). Same saved statistics as the other paths.
  bool flash_attention = false;
  // Embedding backward: one block per vocabulary row scanning every token, instead of a
  // radix sort by token and a segmented sum.
  bool naive_embedding = false;
  // Classifier (read by the model, not by an op): a [N,V] probability tensor and a separate
  // backward over the unpadded vocabulary, instead of the fused loss+dlogits kernel over a
  // vocabulary padded to a multiple of 128.
  bool naive_classifier = false;
  // Linear layers: a bias broadcast, cublasGemmEx and a column-sum kernel, instead of
  // cuBLASLt with the bias / GeLU / bias-gradient epilogues.
  bool naive_matmul = false;
  // Elementwise kernels: one bf16 per thread and separate residual + LayerNorm, instead of
  // 128-bit loads and the fused residual + LayerNorm.
  bool naive_elementwise = false;
  // Tuned attention: bytes of T×T score buffers per batch of heads (more heads than fit run
  // in several batches; at least one head per batch). Tests lower it to cover the batching.
  size_t attention_batch_bytes = size_t{1} << 30;

  // "" or "default": per family the newest variant that has passed tools/gpu_check.sh on a
  // GPU (Recorded(), docs/gpu_record.md); "tuned": every tuned kernel (the struct's own
  // defaults); "naive": every previous kernel; otherwise a comma list of attention,
  // embedding, classifier, matmul, elementwise, each optionally "=naive" or "=tuned"
  // ("attention=naive,classifier=naive"), and "attention=flash", applied to the default.
  // ToString()'s output parses back to the same choice. InvalidArgument naming the bad entry.
  static Result<KernelChoice> Parse(const std::string& spec);
  // Parse(STRATA_CUDA_KERNELS), or of the spec a front end set for the process
  // (strata/kernel_record.h's RunKernelSpec: strata train's run kernels).
  static Result<KernelChoice> FromEnv();
  // The default: each family's DefaultKernelVariant (strata/kernel_record.h).
  static KernelChoice Recorded();
  // "naive", "tuned" or "flash" for one of the five families; "" for another name.
  std::string Variant(const std::string& family) const;
  // Every family's variant: "attention=tuned,embedding=naive,...,elementwise=tuned".
  std::string ToString() const;
};

// The stream and cuBLAS / cuBLASLt handles every op is enqueued with, the kernel choice, and a
// workspace for ops' intermediates. Owns the handles and the workspace; does not own the stream
// (CudaDevice's compute lane: Device::NativeStream(Lane::kCompute)).
struct LtAlgoCache;  // gpt2_cuda_kernels.h

class CudaOpContext {
 public:
  // Creates a cuBLAS handle bound to `stream` (nullptr = the legacy default stream) on the
  // current CUDA device; the kernel choice comes from STRATA_CUDA_KERNELS. Cuda status
  // (naming the cuBLAS error) when the handle cannot be made; InvalidArgument for a bad
  // STRATA_CUDA_KERNELS.
  static Result<std::unique_ptr<CudaOpContext>> Create(cudaStream_t stream);
  ~CudaOpContext();
  CudaOpContext(const CudaOpContext&) = delete;
  CudaOpContext& operator=(const CudaOpContext&) = delete;

  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  cublasLtHandle_t cublaslt() const { return cublaslt_; }
  const KernelChoice& kernels() const { return kernels_; }
  void set_kernels(const KernelChoice& k) { kernels_ = k; }
  // The current device's compute capability at Create, major · 10 + minor (90 for an H100);
  // 0 when the runtime could not say. Kernels that need a capability check it.
  int compute_capability() const { return compute_capability_; }

  // Device memory of at least `bytes` (256-byte aligned) for one op's intermediates, valid
  // until the next Workspace call on this context; ops on the context's stream run in
  // order, so consecutive ops may reuse it. Grows by synchronising the stream, freeing and
  // allocating (cudaMalloc, outside any Device budget: reserve the largest size up front,
  // before timing, to keep allocations out of the steady state). OutOfMemory when the
  // device has no room. Not const: ops that need it take the context by const reference and
  // call this through a mutable member, as the workspace is scratch, not state.
  Result<void*> Workspace(size_t bytes) const;
  size_t workspace_bytes() const { return workspace_bytes_; }
  // The cuBLASLt algorithms chosen so far, per call shape (RunLt asks the heuristic once per
  // shape). Scratch like the workspace, so reachable through a const context.
  LtAlgoCache& lt_algos() const { return *lt_algos_; }

 private:
  CudaOpContext(cudaStream_t stream, cublasHandle_t cublas, cublasLtHandle_t cublaslt)
      : stream_(stream), cublas_(cublas), cublaslt_(cublaslt) {}
  cudaStream_t stream_;
  cublasHandle_t cublas_;
  cublasLtHandle_t cublaslt_;
  KernelChoice kernels_;
  int compute_capability_ = 0;
  mutable void* workspace_ = nullptr;
  mutable size_t workspace_bytes_ = 0;
  std::shared_ptr<LtAlgoCache> lt_algos_;  // shared_ptr: the type is incomplete here
};

// A Cuda status for `err` ("<what>: <cudaGetErrorString>"), or OK for cudaSuccess.
Status CudaStatus(cudaError_t err, const char* what);

// ---- conversions (master fp32 <-> working bf16; tests) --------------------------------------
// dst[i] = bf16(src[i]) (round to nearest even) over n values.
Status ConvertF32ToBf16(const CudaOpContext& ctx, Bf16* dst, const float* src, size_t n);
// dst[i] = float(src[i]) over n values.
Status ConvertBf16ToF32(const CudaOpContext& ctx, float* dst, const Bf16* src, size_t n);
// dst[i] += src[i] over n fp32 values (one add per element: a micro-batch's gradient added to
// the sum of the earlier ones, the same sums as the engine's accumulation on the host).
Status AccumulateF32(const CudaOpContext& ctx, float* dst, const float* src, size_t n);

// ---- embeddings --------------------------------------------------------------------------
// out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :].   out [B,T,C]; wte [V,C]; wpe [>=T, C].
// Token ids outside [0, V) are not checked on the device (the data loader validates them).
Status EmbeddingForward(const CudaOpContext& ctx, Bf16* out, const int32_t* tokens, const Bf16* wte,
                        const Bf16* wpe, int B, int T, int C);
// dwte[tokens[b,t], :] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]. V is the rows of dwte (the
// CPU signature does not need it; the GPU kernel is parallel over vocabulary rows).
// Either of dwte, dwpe may be nullptr.
Status EmbeddingBackward(const CudaOpContext& ctx, float* dwte, float* dwpe, const Bf16* dout,
                         const int32_t* tokens, int B, int T, int C, int V);

// ---- LayerNorm (eps 1e-5, weight and bias) -----------------------------------------------
// out[n,:] = (inp[n,:] - mean[n]) * rstd[n] * w + b over N rows of C; mean[N], rstd[N] saved.
Status LayerNormForward(const CudaOpContext& ctx, Bf16* out, float* mean, float* rstd,
                        const Bf16* inp, const Bf16* w, const Bf16* b, int N, int C);
// dinp += ..., dw += ..., db += ... (given the forward's inp, w, mean, rstd).
Status LayerNormBackward(const CudaOpContext& ctx, Bf16* dinp, float* dw, float* db,
                         const Bf16* dout, const Bf16* inp, const Bf16* w, const float* mean,
                         const float* rstd, int N, int C);

// ---- linear layer (matrix product + bias) --------------------------------------------------
// out[N,OC] = inp[N,IC] · w[IC,OC] + bias[OC]  (bias may be nullptr).
Status MatmulForward(const CudaOpContext& ctx, Bf16* out, const Bf16* inp, const Bf16* w,
                     const Bf16* bias, int N, int IC, int OC);
// dinp[N,IC] += dout · wᵀ;  dw[IC,OC] += inpᵀ · dout;  dbias[OC] += sum_n dout[n,:].
// Any of dinp, dw, dbias may be nullptr to skip it.
Status MatmulBackward(const CudaOpContext& ctx, Bf16* dinp, float* dw, float* dbias,
                      const Bf16* dout, const Bf16* inp, const Bf16* w, int N, int IC, int OC);

// out = GELU(pre), pre = inp · w + bias ([N,OC] both; bias required): one cuBLASLt GEMM with
// the GELU_AUX_BIAS epilogue (OC % 8 == 0), else MatmulForward then GeluForward. cuBLASLt's
// GELU is the same tanh approximation, computed inside the GEMM in fp32 before the one bf16
// rounding of out (the fallback rounds pre first): within the ops test's tolerance, not the
// same bits.
Status MatmulGeluForward(const CudaOpContext& ctx, Bf16* out, Bf16* pre, const Bf16* inp,
                         const Bf16* w, const Bf16* bias, int N, int IC, int OC);
// dpre[N,IC] = gelu'(pre) ⊙ (dout[N,OC] · wᵀ), OVERWRITING dpre (w [IC,OC], pre [N,IC]): one
// cuBLASLt GEMM with the DGELU epilogue (IC % 8 == 0), else the dinp GEMM into `scratch`
// ([N,IC], overwritten) and GeluBackward. dpre must not overlap scratch, dout or pre
// (InvalidArgument).
Status MatmulDgeluBackward(const CudaOpContext& ctx, Bf16* dpre, Bf16* scratch, const Bf16* dout,
                           const Bf16* pre, const Bf16* w, int N, int IC, int OC);

// ---- causal multi-head self-attention ------------------------------------------------------
// Number of floats of the `stats` buffer: B*NH*T log-sum-exps saved by the forward pass, then
// B*NH*T values the backward pass computes (the row sums D = sum_s P·dP).
inline size_t AttentionStatsSize(int B, int T, int NH) {
  return 2 * static_cast<size_t>(B) * static_cast<size_t>(NH) * static_cast<size_t>(T);
}
// qkv [B,T,3C] = q | k | v; head h uses channels [h*hs, (h+1)*hs), hs = C/NH.
// out[b,t,h*hs+i] = sum_{s<=t} P[t,s] v[b,s,h*hs+i], P[t,:] = softmax_{s<=t}(q_t·k_s/sqrt(hs)).
// stats: see AttentionStatsSize. REQUIRES: C % NH == 0; T small enough that two rows of T
// floats per warp fit in shared memory (T <= ~26000).
Status AttentionForward(const CudaOpContext& ctx, Bf16* out, float* stats, const Bf16* qkv, int B,
                        int T, int C, int NH);
// dqkv [B,T,3C] += gradient w.r.t. q, k and v. `stats` comes from the forward pass on the same
// qkv; its second half is overwritten as scratch.
Status AttentionBackward(const CudaOpContext& ctx, Bf16* dqkv, const Bf16* dout, const Bf16* qkv,
                         float* stats, int B, int T, int C, int NH);

// res = a + b (bf16, as ResidualForward), then out, mean, rstd = LayerNormForward(res, w, bias):
// one kernel (the same arithmetic, the residual read once less), or the two ops with
// KernelChoice::naive_elementwise. res may alias a or b (each element is read before the same
// thread writes it); out must not overlap res, a or b (InvalidArgument).
Status ResidualLayerNormForward(const CudaOpContext& ctx, Bf16* res, Bf16* out, float* mean,
                                float* rstd, const Bf16* a, const Bf16* b, const Bf16* w,
                                const Bf16* bias, int N, int C);

// ---- GELU, tanh approximation --------------------------------------------------------------
// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise over n values.
Status GeluForward(const CudaOpContext& ctx, Bf16* out, const Bf16* inp, size_t n);
// dinp += dout * gelu'(inp).
Status GeluBackward(const CudaOpContext& ctx, Bf16* dinp, const Bf16* inp, const Bf16* dout,
                    size_t n);

// ---- residual ------------------------------------------------------------------------------
// out = a + b over n values (out may alias a or b).
Status ResidualForward(const CudaOpContext& ctx, Bf16* out, const Bf16* a, const Bf16* b, size_t n);
// da += dout; db += dout (either may be nullptr; they must not alias each other).
Status ResidualBackward(const CudaOpContext& ctx, Bf16* da, Bf16* db, const Bf16* dout, size_t n);

// ---- tied LM head --------------------------------------------------------------------------
// logits[N,V] = x[N,C] · wteᵀ  (wte [V,C]; no bias).
Status LmHeadForward(const CudaOpContext& ctx, Bf16* logits, const Bf16* x, const Bf16* wte, int N,
                     int C, int V);
// dx[N,C] += dlogits · wte;  dwte[V,C] += dlogitsᵀ · x  (either may be nullptr).
Status LmHeadBackward(const CudaOpContext& ctx, Bf16* dx, float* dwte, const Bf16* dlogits,
                      const Bf16* x, const Bf16* wte, int N, int C, int V);

// ---- softmax cross-entropy -----------------------------------------------------------------
// probs[N,V] = softmax(logits[n,:]) (fp32 inside, rounded to bf16; may alias logits);
// losses[N] = -log softmax(logits[n,:])[targets[n]] in fp32 from the fp32 softmax;
// *mean_loss (device) = mean of losses over the N rows, summed in a fixed order in double.
// mean_loss may be nullptr.
Status SoftmaxCrossEntropyForward(const CudaOpContext& ctx, Bf16* probs, float* losses,
                                  float* mean_loss, const Bf16* logits, const int32_t* targets,
                                  int N, int V);
// dlogits[n,:] = (probs[n,:] - onehot(targets[n])) * dloss, OVERWRITING dlogits (may alias
// probs). dloss = 1/N for the mean over N rows (1/(N*M) over M micro-batches).
Status SoftmaxCrossEntropyBackward(const CudaOpContext& ctx, Bf16* dlogits, const Bf16* probs,
                                   const int32_t* targets, int N, int V, float dloss);

// ---- workspace -----------------------------------------------------------------------------
// The most workspace the ops of a model of this shape take at once with the context's kernel
// choice (attention's batches, cuBLASLt's 32 MiB and staging, the embedding sort): reserving
// it up front (ctx.Workspace(bytes)) moves the allocation, and an OutOfMemory, to start-up.
size_t ModelWorkspaceBytes(const CudaOpContext& ctx, int B, int T, int C, int NH);
// The same for a kernel choice on a device of compute capability `sm` (major · 10 + minor),
// computable without a GPU.
size_t ModelWorkspaceBytes(const KernelChoice& kernels, int sm, int B, int T, int C, int NH);

// ---- fused classifier (softmax cross-entropy, forward and backward in one kernel) ---------
// The vocabulary padded to a multiple of 128: the row length of the fused classifier's logits
// (and of the tied head's copy of wte), so that rows are 256-byte aligned and the LM-head GEMM
// has a tensor-core-friendly size. The model files keep the real V.
inline int PaddedVocab(int V) { return (V + 127) / 128 * 128; }
// For each of N rows of logits [N, Vp] (columns [V, Vp) are padding, ignored), in one pass
// for the statistics and one for the gradient, with no probability tensor:
//   losses[n] = lse_n - z[n, target_n],   lse_n = log Σ_{v<V} exp z[n, v]
//   logits[n, v] := (exp(z[n, v] - lse_n) - [v = target_n]) · dloss   (v < V),   0 (v >= V)
// i.e. the logits are OVERWRITTEN by dlogits. *mean_loss (device; may be nullptr) as in
// SoftmaxCrossEntropyForward. REQUIRES V <= Vp. 16-byte loads when Vp % 8 == 0 and logits is
// 16-byte aligned, else one value at a time. The two paths do NOT give the same bits: their
// threads cover different columns, so the per-thread (max, sum) pairs combine in another order
// (each is deterministic, and both are within the ops test's tolerance of the reference).
Status FusedClassifier(const CudaOpContext& ctx, Bf16* logits, float* losses, float* mean_loss,
                       const int32_t* targets, int N, int V, int Vp, float dloss);

}  // namespace strata::model::cuda_ops
