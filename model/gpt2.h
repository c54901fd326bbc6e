// GPT-2: the reference workload `strata train` runs (docs/design.md "Modules"), written against the
// public API only.
//
// The model is an ordered list of engine blocks:
//   block 0            "embed": wte.weight [V,C] (token embedding, tied to the LM head),
//                      wpe.weight [P,C] (learned positions; P >= the sequence length);
//   blocks 1..L        "h.{l}": one pre-LayerNorm transformer layer each (ln_1, attn.c_attn
//                      [C,3C] fused qkv, attn.c_proj [C,C], ln_2, mlp.c_fc [C,4C],
//                      mlp.c_proj [4C,C], every linear with a bias);
//   block L+1          "ln_f": the final LayerNorm.
// Tensor names inside a block are Hugging Face's GPT-2 names (HfTensorName gives the full
// one), weights in Conv1D layout [in, out].
//
// Tied embedding: the LM head needs wte at the end of forward and produces a wte gradient
// at the start of backward, while the engine hands out each block once per pass. The
// embedding forward therefore keeps a copy of wte among the model's activations (params do
// not change within a step); the head's wte gradient is held there too and added to the
// embedding block's gradient buffer, before the token scatter-add, when block 0 is
// processed last in backward. One gradient, one parameter, a fixed summation order.
//
// Gpt2Model<F> owns the activations of one micro-batch of B rows x T positions (or of
// several in flight, one slot each: layer-major order) and runs one block at a time on
// parameter/gradient pointers it is given (from the engine's BlockView/GradBuffer, or from
// plain buffers in tests, validation and generation). F is float for training and double for
// the whole-model gradient test. Not thread-safe: one thread (or one device lane) drives a
// model at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/safetensors.h"
#include "strata/engine.h"
#include "strata/status.h"

namespace strata::model {

struct Gpt2Config {
  int layers = 4;
  int d_model = 128;
  int heads = 2;     // DefaultHeads(d_model), as every subcommand defaults
  int max_seq = 64;  // rows of wpe: the longest sequence the model can see
  int vocab = 256;
  // InvalidArgument naming the bad value (d_model not divisible by heads, values < 1).
  Status Validate() const;
};

// Tensor indices inside a transformer block ("h.{l}"), in BlockSpec order.
enum LayerTensor : int {
  kLn1W,
  kLn1B,
  kAttnW,
  kAttnB,
  kAttnProjW,
  kAttnProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
  kNumLayerTensors
};
enum EmbedTensor : int { kWte, kWpe };
enum FinalTensor : int { kLnfW, kLnfB };

// The engine blocks of the model (weight_decay set on tensors with >= 2 dimensions).
std::vector<BlockSpec> Gpt2BlockSpecs(const Gpt2Config& config);
// Hugging Face name of tensor `tensor` of `block` ("h.3.attn.c_attn.weight", "wte.weight").
std::string HfTensorName(const std::vector<BlockSpec>& specs, int block, int tensor);
uint64_t Gpt2NumParams(const Gpt2Config& config);
// The model FLOPs of one token of a training step (forward + backward) at sequence length
// seq_len: 6·P (P = Gpt2NumParams: 2 per parameter per token forward, 4 backward) plus the
// attention's score and value products, 12·L·T·C (QKᵀ and PV, 4·T·C forward per layer, both
// counted over the full T×T square); with recompute, one more forward of the layers,
// 2·P_layers + 4·L·T·C (every layer's; the CPU model skips the last layer's recompute in
// batch-major order). The usual "model FLOPs" of MFU figures, not the FLOPs a kernel runs.
double Gpt2TrainFlopsPerToken(const Gpt2Config& config, int seq_len, bool recompute);
// A dense layout of `specs` (each tensor at a multiple of `alignment` elements), the same
// rule the engine uses; for plain in-memory parameter buffers.
std::vector<BlockLayout> PlainLayout(const std::vector<BlockSpec>& specs, uint32_t alignment = 1);

// GPT-2's initialisation of one tensor, a pure function of (seed, block, tensor): weights
// normal(0, 0.02), residual projections (attn.c_proj, mlp.c_proj) normal(0, 0.02/sqrt(2L)),
// biases 0, LayerNorm weights 1.
void InitTensor(const Gpt2Config& config, const std::vector<BlockSpec>& specs, int block,
                int tensor, uint64_t seed, std::span<float> out);

// The head count when none is given, the one rule of every subcommand: GPT-2's 64 channels
// per head (d_model / 64), or one head when d_model is not a multiple of 64.
int DefaultHeads(int d_model);

// The model's geometry as safetensors __metadata__, under Hugging Face's GPT-2 config names:
// n_layer, n_embd, n_head, n_positions, vocab_size (decimal strings).
std::map<std::string, std::string> GeometryMetadata(const Gpt2Config& config);

// The configuration of a GPT-2 safetensors file: layers counted from h.{i}, C and V from
// wte, P from wpe; the heads are `heads` when > 0, else the file's n_head metadata (written
// by SaveWeights), else DefaultHeads(C). Tensor names may carry a "transformer." prefix.
// Corruption/NotFound naming the tensor when wte/wpe or a layer is missing; Corruption when
// the metadata contradicts the tensors' shapes.
Result<Gpt2Config> ConfigFromSafetensors(const SafetensorsReader& file, int heads);
// Reads tensor `tensor` of `block` from `file` (HF name, optional "transformer." prefix),
// checking its shape against the spec; NotFound/InvalidArgument naming tensor and shape.
Status LoadTensor(const SafetensorsReader& file, const std::vector<BlockSpec>& specs, int block,
                  int tensor, std::span<float> out);

// Where one block's tensors are, as typed pointers.
template <typename F>
struct BlockPtrs {
  const F* p = nullptr;  // flat parameter buffer
  F* g = nullptr;        // flat gradient buffer (backward only)
  const BlockLayout* layout = nullptr;
  const F* P(int t) const { return p + layout->tensors[t].offset; }
  F* G(int t) const { return g + layout->tensors[t].offset; }
};

template <typename F>
class Gpt2Model {
 public:
  // Activations for micro-batches of B rows of T positions. With recompute, only each
  // layer's input is kept through the forward pass and the layer's activations are
  // recomputed in backward (activation checkpointing per block). `micro_slots` micro-batches
  // can be in flight at once (layer-major order: every micro-batch through a block before
  // the next block), each with its own saved activations (SavedActivationBytes); the
  // scratch of a block's computation is shared.
  // REQUIRES: config.Validate().ok(), 1 <= T <= config.max_seq, B >= 1, micro_slots >= 1.
  Gpt2Model(const Gpt2Config& config, int B, int T, bool recompute, int micro_slots = 1);
  ~Gpt2Model();

  const Gpt2Config& config() const { return config_; }
  int B() const { return B_; }
  int T() const { return T_; }
  int micro_slots() const;
  // The micro-batch slot every call below works on until the next UseSlot (0 at first).
  // REQUIRES: 0 <= slot < micro_slots().
  void UseSlot(int slot);

  // The micro-batch's token ids (B*T each); copied. Targets may be null for forward only.
  void SetTokens(const int32_t* inputs, const int32_t* targets);

  // Forward, block by block, in order 0, 1..L, L+1.
  void EmbedForward(const BlockPtrs<F>& b);
  void LayerForward(int layer, const BlockPtrs<F>& b);  // layer in [0, L)
  void FinalForward(const BlockPtrs<F>& b);
  // The LM head on the final LayerNorm's output: logits, the mean cross-entropy over the
  // B*T tokens (returned and kept in last_loss()) and, when `backward`, the gradients of
  // dloss * sum of token losses w.r.t. the head's input and wte (held for EmbedBackward).
  double Head(bool backward, F dloss);
  // Backward in order L+1, L..1, 0; each OVERWRITES b.g's tensors with the block's gradient.
  void FinalBackward(const BlockPtrs<F>& b);
  void LayerBackward(int layer, const BlockPtrs<F>& b);
  void EmbedBackward(const BlockPtrs<F>& b);

  // Slot `slot`'s buffers that layer-major order with offloaded activations moves out and
  // back in when several micro-batches share the slot (trainer/activation_offload.h): the
  // residual stream's input of layer l (B*T*C values; l in [0, L], L: the final LayerNorm's
  // input), the gradient flowing back (B*T*C) and the head's wte gradient (V*C). Stable for
  // the model's life. REQUIRES: 0 <= slot < micro_slots(), 0 <= l <= config.layers.
  F* ResidualBuffer(int slot, int l);
  F* ResidualGradBuffer(int slot);
  F* HeadWteGradBuffer(int slot);

  double last_loss() const { return last_loss_; }
  // Logits of the last Head() call ([B*T, V]); probabilities instead when SetTokens was
  // given targets (the loss is computed in place).
  const F* logits() const;

 private:
  struct Acts;
  Gpt2Config config_;
  int B_, T_;
  bool recompute_;
  std::unique_ptr<Acts> a_;
  double last_loss_ = 0;
};

// The bytes one micro-batch keeps from its forward to its backward in Gpt2Model<float> (its
// slot): the block inputs (the residual stream), the final LayerNorm, the gradient flowing
// back and the head's wte gradient, plus every layer's intermediates without recompute.
// What each further micro-batch in flight costs in layer-major order. Saturates at
// UINT64_MAX.
uint64_t SavedActivationBytes(const Gpt2Config& config, int64_t rows, int64_t seq_len,
                              bool recompute);

// What layer-major order moves per micro-batch when micro-batches share an activation slot
// and their activations live in the engine (trainer/activation_offload.h): activations of
// key_bytes (one residual stream, B*T*C values) each — the L+1 block inputs, the gradient
// flowing back and the head's wte gradient in key-sized pieces — and the bytes each way:
//   to the engine:   L+1 block inputs in forward, the gradient after each of L+1 backward
//                    blocks, the head's wte gradient;
//   from the engine: L layer inputs in forward, L+1 block inputs again in backward
//                    (recompute), the gradient before each of L+1 backward blocks, the wte
//                    gradient.
struct OffloadedActivationShape {
  uint64_t key_bytes = 0;
  int wte_grad_keys = 0;         // pieces of the head's wte gradient
  int keys_per_micro_batch = 0;  // live at once at most: L+1 inputs, gradient, wte pieces
  uint64_t d2h_bytes_per_micro_batch = 0;
  uint64_t h2d_bytes_per_micro_batch = 0;
};
// `residual_value_bytes`: the size of one value of the residual stream and its gradient (4 on
// the CPU model, fp32; 2 on the CUDA model, bf16); the head's wte gradient is fp32 on both.
OffloadedActivationShape OffloadedActivations(const Gpt2Config& config, int64_t rows,
                                              int64_t seq_len, int residual_value_bytes = 4);

// ---- drivers -----------------------------------------------------------------------------

// Plain buffers: params[b] / grads[b] are block b's flat buffers under `layouts`. Runs one
// micro-batch forward and backward; grads are OVERWRITTEN. Returns the mean token loss.
template <typename F>
double ForwardBackwardPlain(Gpt2Model<F>& model, const std::vector<BlockLayout>& layouts,
                            const std::vector<const F*>& params, const std::vector<F*>& grads,
                            const int32_t* inputs, const int32_t* targets, F dloss);
// Forward only (validation, generation): returns the mean loss when targets != null.
template <typename F>
double ForwardPlain(Gpt2Model<F>& model, const std::vector<BlockLayout>& layouts,
                    const std::vector<const F*>& params, const int32_t* inputs,
                    const int32_t* targets);

// A full host copy of the model's fp32 weights (from the engine between steps, or a file).
struct HostWeights {
  std::vector<BlockLayout> layouts;
  std::vector<std::vector<float>> blocks;
  std::vector<const float*> Ptrs() const;
};
// Writes the weights under Hugging Face names (F32).
Status SaveWeights(const std::string& path, const std::vector<BlockSpec>& specs,
                   const HostWeights& w, const std::map<std::string, std::string>& metadata = {});

// How Generate picks each next token from the model's logits l (the flags of `strata
// generate` and `train --sample`).
struct SamplingOptions {
  double temperature = 0;  // 0: greedy (argmax); > 0: sample from softmax(l / temperature)
  int top_k = 0;           // > 0: only the k most probable tokens; 0: every token
  double top_p = 1;        // < 1: only the most probable tokens whose mass reaches top_p
  uint64_t seed = 1;       // of the generator that draws the tokens
  // InvalidArgument naming the flag (--temperature, --top-k, --top-p) of a value out of range.
  Status Validate() const;
};

// The distribution the next token is drawn from: softmax(logits / temperature), cut to the
// top_k most probable tokens, then to the shortest most-probable prefix of those whose mass
// is >= top_p, renormalised (ties ordered by id). One-hot at the argmax (first on ties)
// when greedy or top_k == 1. REQUIRES: options.Validate().ok().
std::vector<double> SamplingDistribution(std::span<const float> logits,
                                         const SamplingOptions& options);

// Continues `prompt` by `tokens` tokens, each drawn from SamplingDistribution of the
// model's logits at the last position, with one generator seeded by options.seed for the
// whole sequence. The context is the last config.max_seq tokens; an empty prompt starts
// from '\n' (token 0 when vocab <= 10). REQUIRES: options.Validate().ok().
std::vector<int32_t> Generate(const Gpt2Config& config, const HostWeights& w,
                              std::vector<int32_t> prompt, int tokens,
                              const SamplingOptions& options);

}  // namespace strata::model
