// Layer-major order with offloaded activations: micro-batches that share one activation slot
// on the device, their activations kept by the engine (EngineOptions::activation_bytes and
// activation_count; the engine's planner puts them in pinned host memory or on NVMe).
//
// Layer-major order runs every micro-batch through a block before the next block, so each
// block's weights cross once per pass; what it costs is the activations of every micro-batch
// in flight. With S activation slots on the device, micro-batches 0..S-2 keep their own slot
// as before, and micro-batches S-1..M-1 share slot S-1: before a micro-batch's work on a
// block, the tensors that work reads are fetched from the engine into the slot, and after it
// the tensors it produced are stashed back (model::OffloadedActivations counts them):
//   forward  block 0      tokens -> embed -> stash input of layer 0
//            layer l      fetch input l -> layer -> stash input l+1
//            block L+1    nothing (the final LayerNorm is recomputed in backward)
//   backward block L+1    fetch input L (last use) -> final LayerNorm, head, backward ->
//                         stash the gradient and the head's wte gradient
//            layer l      fetch input l and the gradient (last uses) -> backward (recomputing
//                         the layer) -> stash the gradient
//            block 0      fetch the gradient and the wte gradient (last uses) -> backward
// The model computes the same values from the same inputs in the same order, so the run is
// bit-identical to keeping every micro-batch on the device. Needs --recompute (only block
// inputs are kept).
//
// Ordering on the device: a fetch's copy runs after the compute enqueued before it (the
// engine orders it so: the slot buffer may still be read by the previous micro-batch), and
// compute after a stash waits for the stash's copy (the buffer is overwritten next). Each copy is
// one residual stream, small beside a block's compute.
//
// Thread safety: the model's thread only, like the engine's step API.
#pragma once

#include <cstdint>

#include "model/gpt2.h"
#include "model/gpt2_backend.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/status.h"

namespace strata::trainer {

class SharedSlotWalk {
 public:
  // Micro-batches passed to Forward/Backward share activation slot `slot` of `backend`.
  // tokens(micro) gives micro-batch `micro`'s input and target tokens (set into the slot
  // before the work that reads them).
  SharedSlotWalk(Engine& engine, Device& device, model::Gpt2Backend& backend,
                 const model::Gpt2Config& config, const model::OffloadedActivationShape& shape,
                 int slot)
      : engine_(engine),
        device_(device),
        backend_(backend),
        layers_(config.layers),
        shape_(shape),
        slot_(slot) {}

  int slot() const { return slot_; }

  // Micro-batch `micro`'s forward of `block` (tokens: its B*T inputs and targets).
  Status Forward(int block, int micro, const BlockView& view, const int32_t* inputs,
                 const int32_t* targets);
  // Micro-batch `micro`'s backward of `block`, as Gpt2Backend::Backward.
  Status Backward(int block, int micro, const BlockView& view, float* grad, float dloss,
                  model::GradWrite write, const int32_t* inputs, const int32_t* targets);

 private:
  // The engine's key of a slot tensor of a micro-batch: residual l -> l, the gradient ->
  // L+1, wte gradient piece i -> L+2+i, offset by micro * keys_per_micro_batch.
  uint32_t Key(int micro, model::SlotTensor tensor, int index) const;
  Status Stash(int micro, model::SlotTensor tensor, int index);
  Status Fetch(int micro, model::SlotTensor tensor, int index, bool last);
  // The head's wte gradient, in key-sized pieces.
  Status StashWteGrad(int micro);
  Status FetchWteGrad(int micro);

  Engine& engine_;
  Device& device_;
  model::Gpt2Backend& backend_;
  const int layers_;
  const model::OffloadedActivationShape shape_;
  const int slot_;
};

}  // namespace strata::trainer
