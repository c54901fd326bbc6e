// GPT-2 block by block on one device: the interface the trainer's one block walk drives
// (trainer/trainer.h, ForwardBackward). Two implementations of the same shape, llm.c-style:
// the CPU reference (gpt2_cpu_model.h: the fp32 ops of gpt2_ops.h, run as host functions on
// the compute lane) beside the CUDA model (gpt2_cuda_model.h: the bf16 kernels of model/cuda/
// on the compute-lane stream).
//
// Blocks: 0 = the embeddings (wte, wpe), 1..L = the transformer layers, L+1 = the final layer
// norm (in backward, the tied LM head and the loss come first). The walk, per micro-batch:
// SetTokens; Forward(0..L+1), each between the engine's Acquire and Release; Backward(L+1..0),
// each between Acquire/GradBuffer and SubmitGrads/Release. Each call only enqueues work on the
// device's compute lane, after the engine's copies into the block, so copies and compute
// overlap; the engine orders its reads of a gradient after the compute that wrote it.
//
// Thread safety: one thread drives a backend (the engine's step API is single-threaded).
#pragma once

#include <cstdint>
#include <vector>

#include "strata/engine.h"
#include "strata/status.h"

namespace strata::model {

class Gpt2Backend {
 public:
  virtual ~Gpt2Backend() = default;

  // The next micro-batch's B*T input and target tokens; the backend copies them (or enqueues
  // the copy) before returning, so the caller may reuse its buffers at once.
  virtual Status SetTokens(const int32_t* inputs, const int32_t* targets) = 0;

  // Enqueues block `block`'s forward, reading `params` (the engine's view of the block, valid
  // until its Release). NotSupported when the view's dtype is not the backend's.
  virtual Status Forward(int block, const BlockView& params) = 0;

  // Enqueues block `block`'s backward, writing its parameter gradient into `grad` (the
  // engine's fp32 buffer, laid out as the parameters). At block L+1 it first runs the head
  // and the loss, whose token-loss gradient is scaled by `dloss`; the micro-batch's mean loss
  // goes to slot `micro` (0 <= micro < the backend's micro-batch slots).
  virtual Status Backward(int block, const BlockView& params, float* grad, float dloss,
                          int micro) = 0;

  // Waits for the compute lane; the mean token losses of micro-batch slots [0, n).
  virtual Result<std::vector<double>> Losses(int n) = 0;
};

}  // namespace strata::model
