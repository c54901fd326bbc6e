// GPT-2 on a CUDA device through the engine: the CUDA implementation of Gpt2Backend
// (gpt2_backend.h), the same blocks, order and tied-embedding handling as the CPU reference
// beside it (gpt2_cpu_model.h), with the kernels of model/cuda/ (bf16
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
#include "model/gpt2_backend.h"
#include "strata/device.h"
#include "strata/engine.h"

namespace strata::model {

class Gpt2CudaModel : public Gpt2Backend {
 public:
  // Allocates the activations for micro-batches of B x T: `micro_slots` activation slots (1,
  // or the micro-batches layer-major order keeps in flight), and up to `micro_batches` loss
  // slots. NotSupported in a build without the CUDA model; InvalidArgument for a device that
  // is not CUDA or micro_slots < 1; OutOfMemory from the device.
  static Result<std::unique_ptr<Gpt2CudaModel>> Create(Device* device, const Gpt2Config& config,
                                                       int B, int T, bool recompute,
                                                       int micro_batches, int micro_slots = 1);
  // Gpt2Backend's calls, in bf16 (the engine's working dtype must be bf16: NotSupported
  // otherwise); errors from a kernel launch name it. SlotBuffer gives the slots' bf16
  // residual stream and gradient and the head's fp32 wte gradient (V x C), so micro-batches
  // can share a slot with their activations in the engine (offloaded activations).
};

}  // namespace strata::model
