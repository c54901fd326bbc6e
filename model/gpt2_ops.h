// The GPT-2 operators on the CPU (HostDevice): forward and backward of every op the model
// runs, in the precision of the template parameter (float for training, double for the
// finite-difference gradient tests; both are explicitly instantiated in gpt2_ops.cc).
//
// Layout conventions (the CUDA kernels in model/cuda/ mirror these signatures and
// semantics, with bf16 weights/activations and fp32 accumulation):
//   - every tensor is a dense row-major buffer; no strides, no views;
//   - B = rows of the batch, T = sequence length, C = channels (d_model), NH = heads,
//     V = vocabulary size, N = B*T token rows;
//   - linear weights are stored [in, out] (Hugging Face GPT-2's Conv1D layout), so a
//     linear layer computes out[n, o] = bias[o] + sum_i inp[n, i] * w[i, o];
//   - token ids are int32 in [0, V).
//
// Output semantics: forward functions OVERWRITE their outputs. Backward functions
// ACCUMULATE (+=) into every gradient they produce (input grads and parameter grads), so
// grads flowing along two paths (residual stream, tied embedding) simply add up; callers
// zero gradient buffers before the first contribution. The exception is
// SoftmaxCrossEntropyBackward, which overwrites dlogits (it is the start of the chain).
//
// Determinism: every result is a function of the inputs and the OpenMP thread count only
// (run to run, the same bits). The non-GEMM ops do not even depend on the thread count:
// reductions over rows (bias, LayerNorm and embedding grads) are split by channel, never by
// row, and each channel sums its rows in ascending order; attention is parallel over
// (batch, head) pairs, each writing only its own head's slice. Matrix products go through
// CBLAS (OpenBLAS, single-threaded) with the rows of the output split over the OpenMP team;
// OpenBLAS's blocking depends on the slice's shape, so GEMM bits depend on the thread count
// (as they would with OpenBLAS's own threading). A run therefore fixes its thread count.
//
// Thread safety: the functions are reentrant; they use OpenMP inside and must not run
// concurrently on overlapping outputs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::model {

// ---- embeddings --------------------------------------------------------------------------
// out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :].   out [B,T,C]; wte [V,C]; wpe [>=T, C].
template <typename F>
void EmbeddingForward(F* out, const int32_t* tokens, const F* wte, const F* wpe, int B, int T,
                      int C);
// dwte[tokens[b,t], :] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:] (summed over b in order).
template <typename F>
void EmbeddingBackward(F* dwte, F* dwpe, const F* dout, const int32_t* tokens, int B, int T, int C);

// ---- LayerNorm (eps 1e-5, weight and bias) -----------------------------------------------
// out[n,:] = (inp[n,:] - mean[n]) * rstd[n] * w + b, over N rows of C. mean[N] and rstd[N]
// are saved for the backward pass.
template <typename F>
void LayerNormForward(F* out, F* mean, F* rstd, const F* inp, const F* w, const F* b, int N, int C);
// dinp += ..., dw += ..., db += ... (given the forward's inp, w, mean, rstd).
template <typename F>
void LayerNormBackward(F* dinp, F* dw, F* db, const F* dout, const F* inp, const F* w,
                       const F* mean, const F* rstd, int N, int C);

// ---- linear layer (matrix product + bias) --------------------------------------------------
// out[N,OC] = inp[N,IC] · w[IC,OC] + bias[OC]  (bias may be nullptr).
template <typename F>
void MatmulForward(F* out, const F* inp, const F* w, const F* bias, int N, int IC, int OC);
// dinp[N,IC] += dout · wᵀ;  dw[IC,OC] += inpᵀ · dout;  dbias[OC] += sum_n dout[n,:].
// Any of dinp, dw, dbias may be nullptr to skip it.
template <typename F>
void MatmulBackward(F* dinp, F* dw, F* dbias, const F* dout, const F* inp, const F* w, int N,
                    int IC, int OC);

// ---- causal multi-head self-attention ------------------------------------------------------
// qkv [B,T,3C] holds q | k | v along the last dim (the fused c_attn output); head h uses
// channels [h*hs, (h+1)*hs) of each, hs = C/NH. att [B,NH,T,T] receives the softmax
// probabilities (row t has zeros beyond column t) and is saved for the backward pass.
// out [B,T,C]: out[b,t,h*hs+i] = sum_{s<=t} att[b,h,t,s] * v[b,s,h*hs+i], where
// att[b,h,t,:] = softmax_{s<=t}(q[b,t,h]·k[b,s,h] / sqrt(hs)).
// REQUIRES: C % NH == 0.
template <typename F>
void AttentionForward(F* out, F* att, const F* qkv, int B, int T, int C, int NH);
// dqkv [B,T,3C] += gradient of the attention w.r.t. q, k and v.
template <typename F>
void AttentionBackward(F* dqkv, const F* dout, const F* qkv, const F* att, int B, int T, int C,
                       int NH);

// ---- GELU, tanh approximation --------------------------------------------------------------
// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise over n values.
template <typename F>
void GeluForward(F* out, const F* inp, size_t n);
// dinp += dout * gelu'(inp).
template <typename F>
void GeluBackward(F* dinp, const F* inp, const F* dout, size_t n);

// ---- residual ------------------------------------------------------------------------------
// out = a + b over n values (out may alias a or b).
template <typename F>
void ResidualForward(F* out, const F* a, const F* b, size_t n);
// da += dout; db += dout (either may be nullptr).
template <typename F>
void ResidualBackward(F* da, F* db, const F* dout, size_t n);

// ---- whole buffers -------------------------------------------------------------------------
// out[i] = value over n values (a block's gradients zeroed before its backward).
template <typename F>
void Fill(F* out, F value, size_t n);
// out[i] = the bf16 in[i] as a float (exact: its bits are the float's high half).
void WidenBf16(float* out, const uint16_t* in, size_t n);

// ---- tied LM head --------------------------------------------------------------------------
// logits[N,V] = x[N,C] · wteᵀ  (wte [V,C], the token embedding; no bias).
template <typename F>
void LmHeadForward(F* logits, const F* x, const F* wte, int N, int C, int V);
// dx[N,C] += dlogits · wte;  dwte[V,C] += dlogitsᵀ · x  (either may be nullptr).
template <typename F>
void LmHeadBackward(F* dx, F* dwte, const F* dlogits, const F* x, const F* wte, int N, int C,
                    int V);

// ---- softmax cross-entropy -----------------------------------------------------------------
// probs[N,V] = softmax(logits[n,:]); losses[N] = -log probs[n, targets[n]].
// Returns the mean of losses over the N rows, summed in row order in double.
// probs may alias logits (computed in place).
template <typename F>
double SoftmaxCrossEntropyForward(F* probs, F* losses, const F* logits, const int32_t* targets,
                                  int N, int V);
// dlogits[n,:] = (probs[n,:] - onehot(targets[n])) * dloss, OVERWRITING dlogits (may alias
// probs). dloss is d(loss)/d(losses[n]): 1/N for the mean over N rows, 1/(N*M) when the
// step's loss is the mean over M micro-batches.
template <typename F>
void SoftmaxCrossEntropyBackward(F* dlogits, const F* probs, const int32_t* targets, int N, int V,
                                 F dloss);

}  // namespace strata::model
