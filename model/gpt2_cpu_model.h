// GPT-2 through the engine on the host device: the CPU reference of the Gpt2Backend
// interface (gpt2_backend.h), beside the CUDA model of the same shape (gpt2_cuda_model.h).
// Each block's work is the fp32 op of Gpt2Model<float> (gpt2.h), enqueued as a host function
// on the device's compute lane right after the engine's Acquire. The engine's params are fp32,
// or bf16 with a bf16 master (EngineOptions::master_format; the working dtype is then bf16):
// each op then reads the block's bf16 params widened to fp32 (exact) into one buffer the
// size of the largest block, reused by every block, widened again at each use (forward, and
// backward with its recompute). Gradients are fp32 either way (or packed bf16: SetGradDtype).
#pragma once

#include <memory>
#include <vector>

#include "model/gpt2.h"
#include "model/gpt2_backend.h"
#include "strata/device.h"

namespace strata::model {

class Gpt2CpuModel final : public Gpt2Backend {
 public:
  // A model of its own for micro-batches of B x T, with `micro_batches` loss slots and
  // `micro_slots` activation slots (1, or micro_batches for layer-major order).
  // InvalidArgument unless `device` is a host device (a CUDA device: Gpt2CudaModel).
  static Result<std::unique_ptr<Gpt2CpuModel>> Create(Device* device, const Gpt2Config& config,
                                                      int B, int T, bool recompute,
                                                      int micro_batches, int micro_slots = 1);
  // Over the caller's `model` and loss slots (`slots` of them at `losses`, written when the
  // compute lane runs the head). Both must outlive the work enqueued through this object
  // (until the compute lane is synchronised), not this object itself.
  Gpt2CpuModel(Device* device, Gpt2Model<float>* model, double* losses, int slots)
      : device_(device), model_(model), losses_(losses), slots_(slots) {}
  ~Gpt2CpuModel() override;

  int MicroSlots() const override { return model_->micro_slots(); }
  Status UseSlot(int slot) override;
  Status SetTokens(const int32_t* inputs, const int32_t* targets) override;
  // Adopts the buffer with the device on first use (forgotten when this object goes).
  Result<DeviceSpan> SlotBuffer(int slot, SlotTensor tensor, int index) override;
  Status Forward(int block, const BlockView& params) override;
  Status Backward(int block, const BlockView& params, float* grad, float dloss, int micro,
                  GradWrite write) override;
  Result<std::vector<double>> Losses(int n) override;
  Status SetGradDtype(GradDtype dtype) override {
    grad_dtype_ = dtype;
    return Status::OK();
  }

 private:
  // The block's parameters as the enqueued op reads them (Params::Get, on the compute lane).
  struct Params {
    BlockPtrs<float> p;                        // p.p is null while bf16 is set
    const uint16_t* bf16 = nullptr;            // the engine's bf16 params, widened by Get
    uint64_t n = 0;                            // their count (the block's padded_numel)
    std::shared_ptr<std::vector<float>> wide;  // where Get widens them
    BlockPtrs<float> Get() const;
  };
  Result<Params> Ptrs(const BlockView& v) const;
  Status Enqueue(std::function<void()> fn, const char* label);

  Device* device_;
  Gpt2Model<float>* model_;
  double* losses_;
  int slots_;
  GradDtype grad_dtype_ = GradDtype::kFp32;
  // What Create made (empty when the caller's are used).
  std::unique_ptr<Gpt2Model<float>> own_model_;
  std::vector<double> own_losses_;
  // Where GradWrite::kAccumulate computes a micro-batch's gradient before adding it. A
  // larger block adds a larger buffer; none is freed before the model, since work still
  // queued on the compute lane may use it.
  std::vector<std::unique_ptr<std::vector<float>>> scratch_;
  std::vector<const void*> adopted_;  // slot buffers adopted by SlotBuffer
  // The bf16 params widened to fp32: one buffer for every block (the compute lane runs one op
  // at a time, and no op keeps a parameter pointer past its call: the embedding forward
  // copies wte for the head). Grown on the compute lane, at the first use by a larger block;
  // shared with the queued ops, which may outlive this object.
  std::shared_ptr<std::vector<float>> wide_ = std::make_shared<std::vector<float>>();
};

}  // namespace strata::model
