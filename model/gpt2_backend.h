// GPT-2 block by block on one device: the interface the trainer's one block walk drives
// (trainer/trainer.h, ForwardBackward). Two implementations of the same shape, llm.c-style:
// the CPU reference (gpt2_cpu_model.h: the fp32 ops of gpt2_ops.h, run as host functions on
// the compute lane) beside the CUDA model (gpt2_cuda_model.h: the bf16 kernels of model/cuda/
// on the compute-lane stream).
//
// Blocks: 0 = the embeddings (wte, wpe), 1..L = the transformer layers, L+1 = the final layer
// norm (in backward, the tied LM head and the loss come first). The walk, per micro-batch:
// SetTokens; Forward(0..L+1), each between the engine's Acquire and Release; Backward(L+1..0),
// each between Acquire/GradBuffer and SubmitGrads/Release. In layer-major order several
// micro-batches are in flight at once, each in its own activation slot (UseSlot): every slot
// runs through a block before the next block. Each call only enqueues work on the
// device's compute lane, after the engine's copies into the block, so copies and compute
// overlap; the engine orders its reads of a gradient after the compute that wrote it.
//
// Thread safety: one thread drives a backend (the engine's step API is single-threaded).
#pragma once

#include <cstdint>
#include <vector>

#include "strata/device.h"
#include "strata/engine.h"
#include "strata/status.h"

namespace strata::model {

// The tensors of an activation slot that layer-major order moves out to the engine and back
// when several micro-batches share the slot (trainer/activation_offload.h; Gpt2Model's
// ResidualBuffer and its neighbours say what each holds).
enum class SlotTensor : uint8_t {
  kResidual,      // index: l in [0, L], the input of layer l (L: of the final LayerNorm)
  kResidualGrad,  // the gradient flowing back
  kHeadWteGrad,   // the tied head's wte gradient, held from block L+1's backward to block 0's
};

// Device memory: where a slot tensor lives and how many bytes it has.
struct DeviceSpan {
  void* data = nullptr;
  uint64_t bytes = 0;
};

// The bytes of one value of the residual stream (and its gradient) in the backend that runs
// on a device of `kind`: the CUDA model computes in bf16, the CPU model in fp32 (the size of
// the slot tensors kResidual and kResidualGrad; model::OffloadedActivations takes it).
inline int ResidualValueBytes(DeviceKind kind) { return kind == DeviceKind::kCuda ? 2 : 4; }

// How Backward writes the block's gradient into the engine's buffer.
enum class GradWrite : uint8_t {
  kOverwrite,   // the buffer holds this micro-batch's gradient
  kAccumulate,  // the buffer += this micro-batch's gradient (fp32, element by element): the
                // same sums, in the same order, as the engine's accumulation over micro-batches
};

class Gpt2Backend {
 public:
  virtual ~Gpt2Backend() = default;

  // How many micro-batches' activations the backend holds at once (its slots).
  virtual int MicroSlots() const = 0;
  // The slot the calls below enqueue work for, until the next UseSlot (0 at first).
  // InvalidArgument when slot is not in [0, MicroSlots()).
  virtual Status UseSlot(int slot) = 0;

  // Where `tensor` of activation slot `slot` lives (index: the layer for kResidual), usable as
  // the device side of the engine's activation copies (StashActivation / FetchActivation)
  // for the backend's life. NotSupported where the backend's slots cannot be shared.
  virtual Result<DeviceSpan> SlotBuffer(int slot, SlotTensor tensor, int index) {
    (void)slot, (void)tensor, (void)index;
    return Status::NotSupported(
        "this model cannot share an activation slot between micro-batches (offloaded "
        "activations); use --offload-activations off");
  }

  // The next micro-batch's B*T input and target tokens; the backend copies them (or enqueues
  // the copy) before returning, so the caller may reuse its buffers at once.
  virtual Status SetTokens(const int32_t* inputs, const int32_t* targets) = 0;

  // Enqueues block `block`'s forward, reading `params` (the engine's view of the block, valid
  // until its Release). NotSupported when the view's dtype is not the backend's.
  virtual Status Forward(int block, const BlockView& params) = 0;

  // Enqueues block `block`'s backward, writing its parameter gradient into `grad` (the
  // engine's fp32 buffer, laid out as the parameters) as `write` says. At block L+1 it first
  // runs the head and the loss, whose token-loss gradient is scaled by `dloss`; the
  // micro-batch's mean loss goes to loss slot `micro` (0 <= micro < the backend's
  // micro-batch count). NotSupported for a GradWrite the backend does not implement.
  virtual Status Backward(int block, const BlockView& params, float* grad, float dloss, int micro,
                          GradWrite write) = 0;

  // Waits for the compute lane; the mean token losses of micro-batch slots [0, n).
  virtual Result<std::vector<double>> Losses(int n) = 0;

  // The device time of the backend's own kernels between the two latest Losses calls (the
  // CUDA model: CUDA events around each Forward/Backward's work on the compute stream, so
  // waits for the engine's copies are not counted). 0 where the backend does not measure it
  // (the CPU model: the engine times its compute lane itself).
  virtual double ComputeSeconds() const { return 0; }

  // The format Backward leaves the gradient in (EngineOptions::grad_dtype, which must match):
  // kBf16 packs it as padded_numel bf16 values (round to nearest even) at the start of the
  // buffer, after computing it in fp32 as before, so the engine copies half the bytes. On
  // the CPU model this is the rounding emulation of the CUDA path. NotSupported for kBf16
  // with GradWrite::kAccumulate (the next micro-batch adds to fp32), at that Backward.
  virtual Status SetGradDtype(GradDtype dtype) = 0;
};

}  // namespace strata::model
