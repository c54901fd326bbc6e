// GPT-2 on a CUDA device through the engine: the same blocks, order and tied-embedding
// handling as the CPU path (gpt2.h, trainer.h), with the kernels of model/cuda/ (bf16
// weights and activations, fp32 accumulation, fp32 parameter gradients). Work is enqueued on
// the device's compute-lane stream right after each Acquire; the engine orders it after the
// block's H2D copy. Activations live in device memory the model allocates from the Device
// (outside the engine's budget: "the model's activations are its own business").
//
// This header is plain C++ (no CUDA types); the implementation exists only in builds with
// CUDA (STRATA_HAVE_MODEL_CUDA). Gpt2CudaModel is driven by one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/gpt2.h"
#include "strata/device.h"
#include "strata/engine.h"

namespace strata::model {

class Gpt2CudaModel {
 public:
  // Allocates the activations for micro-batches of B x T (and up to `micro_batches` loss
  // slots). NotSupported in a build without the CUDA model; OutOfMemory from the device.
  static Result<std::unique_ptr<Gpt2CudaModel>> Create(Device* device, const Gpt2Config& config,
                                                       int B, int T, bool recompute,
                                                       int micro_batches);
  virtual ~Gpt2CudaModel() = default;
  // One micro-batch's forward and backward inside an open step (loss slot `micro`), as
  // ForwardBackwardEngine does on the CPU. Errors from the engine or a kernel launch.
  virtual Status ForwardBackward(Engine& engine, const int32_t* inputs, const int32_t* targets,
                                 float dloss, int micro) = 0;
  // Waits for the compute lane and returns the mean losses of micro-batches [0, n).
  virtual Result<std::vector<double>> Losses(int n) = 0;
};

}  // namespace strata::model
