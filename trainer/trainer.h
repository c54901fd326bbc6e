// Training GPT-2 through the engine: the per-micro-batch driver, the learning-rate schedule
// and Trainer, which runs whole steps (what `strata train` loops over).
//
// Everything here goes through the public Engine API: blocks are acquired in forward order
// 0..L+1 and backward order L+1..0 once per pass per micro-batch (batch-major), or with
// every micro-batch through a block before the next (layer-major, micro_batch_order.h);
// the model's compute is
// enqueued on the device's compute lane right after each Acquire (so the engine's copies
// and the model's compute overlap), and each block's gradient is handed back with
// SubmitGrads. AdamW, clipping and the NVMe traffic are the engine's.
//
// Thread safety: one thread drives a Trainer (the engine's step API is single-threaded).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "model/data.h"
#include "model/gpt2.h"
#include "model/gpt2_backend.h"
#include "model/gpt2_cuda_model.h"
#include "strata/comm.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "trainer/activation_offload.h"

namespace strata::trainer {

using model::Batcher;
using model::Gpt2Config;
using model::Gpt2CudaModel;
using model::Gpt2Model;
using model::HostWeights;
using model::SafetensorsReader;

// The one block walk: one micro-batch's forward and backward inside an open step, on any
// Gpt2Backend (the CPU reference or the CUDA model): blocks acquired in forward order
// 0..L+1 and backward order L+1..0, each block's compute enqueued right after its Acquire,
// each gradient handed back with SubmitGrads. `micro` is the backend's loss slot. Errors:
// the engine's or the backend's, as they come.
Status ForwardBackward(Engine& engine, model::Gpt2Backend& backend, int layers,
                       const int32_t* inputs, const int32_t* targets, float dloss, int micro);

// The layer-major walk of one step's M micro-batches inside an open step (see
// micro_batch_order.h): every micro-batch (backend slot m, loss slot m, tokens inputs[m],
// targets[m]) runs through a block before the next block. With `accumulate_on_device` the
// engine sees one micro-batch: each block is acquired once per pass and the backend sums the
// micro-batches' gradients into its buffer; otherwise the engine's schedule is layer-major
// and each micro-batch acquires the block and submits its own gradient. Errors: the
// engine's or the backend's (NotSupported when it has fewer slots than it needs).
// `shared`: micro-batches shared->slot() and later share that slot, their activations kept
// by the engine (activation_offload.h); nullptr: micro-batch m has slot m.
Status ForwardBackwardLayerMajor(Engine& engine, model::Gpt2Backend& backend, int layers,
                                 const std::vector<const int32_t*>& inputs,
                                 const std::vector<const int32_t*>& targets, float dloss,
                                 bool accumulate_on_device, SharedSlotWalk* shared = nullptr);

// ForwardBackward on the CPU reference over the caller's model, for tests.
// *loss receives the micro-batch's mean token loss once the compute lane has run it
// (after SynchronizeLane(kCompute) or EndStep). dloss scales each token's loss gradient
// (1/(B*T) for the mean). NotSupported when the device is not a HostDevice computing in
// fp32 (the CUDA model path is not wired yet); engine errors are returned as they come.
Status ForwardBackwardEngine(Engine& engine, Device& device, Gpt2Model<float>& model,
                             const int32_t* inputs, const int32_t* targets, float dloss,
                             double* loss);

// Every tensor's fp32 master weights, read from the engine (between steps).
Result<HostWeights> ReadWeights(const Engine& engine, const std::vector<BlockSpec>& specs);

enum class LrSchedule { kConstant, kCosine };

struct TrainOptions {
  int seq_len = 64;       // T
  int batch = 8;          // rows per micro-batch (B)
  int micro_batches = 1;  // M: the step's gradient is the mean over M micro-batches
  double lr = 1e-3;
  LrSchedule schedule = LrSchedule::kConstant;
  int64_t warmup = 0;            // linear warm-up steps
  int64_t steps = 100;           // total steps (the cosine schedule's horizon)
  double min_lr_fraction = 0.1;  // cosine decays to lr * this at `steps`
  bool recompute = false;
  // How Step runs the micro-batches: the order CreateOrderedEngine chose for the engine, and
  // whether the model accumulates their gradients on the device (OrderedEngine's fields).
  MicroBatchOrder micro_batch_order = MicroBatchOrder::kBatchMajor;
  bool accumulate_on_device = false;
  // Layer-major: the model's activation slots (OrderedEngine::activation_slots). 0, or
  // micro_batches: each micro-batch has its own; fewer: the last slot is shared by the
  // micro-batches from it on, whose activations the engine keeps (activation_offload.h).
  int activation_slots = 0;
  // The gradient's format device -> host: the engine's EngineOptions::grad_dtype (the model
  // packs its gradients to match).
  GradDtype grad_dtype = GradDtype::kFp32;
  int val_batches = 4;  // batches of the held-out tail per validation
  // A step whose gradient is not finite updates nothing (StepStats::skipped) and is warned
  // about; this many such steps in a row stop the run with kAborted (the state committed
  // last is the last good one). 0: never stop.
  int max_skipped_steps = 3;
  // Multi-rank data parallelism (the engine's EngineOptions::comm, not owned; nullptr = one
  // rank). Rank r of N computes rows [r*B/N, (r+1)*B/N) of every micro-batch (B = `batch`,
  // divisible by N), so the global batches are those of a single-rank run; the engine
  // averages the gradients, and the reported loss is the mean over the ranks.
  Communicator* comm = nullptr;
};

// The learning rate of 1-based step `step`: linear warm-up to `lr` over `warmup` steps,
// then constant, or cosine from lr down to lr*min_lr_fraction at step `steps`.
double LearningRate(const TrainOptions& options, int64_t step);

struct StepResult {
  int64_t step = 0;
  double loss = 0;  // mean over the step's micro-batches of their mean token loss (all ranks)
  double lr = 0;
  // The device time of the model's kernels this step, as the backend measured it (CUDA
  // events on a CudaDevice); 0 where it does not (the CPU model: see stats.busy_seconds).
  double compute_seconds = 0;
  StepStats stats;
};

class Trainer {
 public:
  // The engine (created from Gpt2BlockSpecs(config)), its device and the data must outlive
  // the trainer.
  Trainer(Engine* engine, Device* device, const Gpt2Config& config, const TrainOptions& options,
          const Batcher* batcher);
  // Waits for the model's work still queued on the device's compute lane (after a failed
  // step) before the model goes away.
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Initial weights of a fresh engine: from `init` (a Hugging Face GPT-2 safetensors file;
  // shapes must match the config, every value finite) or GPT-2's initialisation from `seed`
  // when init is null. Errors name the tensor (missing, wrong shape, a NaN or infinity) or
  // the engine's failure. With several
  // ranks it is collective: rank 0 alone reads or draws every tensor and broadcasts it
  // (`init` is ignored on the others).
  Status InitWeights(const SafetensorsReader* init, uint64_t seed);

  // Runs step engine.ResumedStep()+1 (or the one after the last Step()): micro-batch i of
  // step s is training batch (s-1)*M + i. On a CudaDevice the model runs the CUDA kernels
  // (bf16; NotSupported in a build without them), on a HostDevice the CPU ops.
  Result<StepResult> Step();
  int64_t next_step() const { return next_step_; }
  // Steps of this run skipped for a non-finite gradient (all of them, not only in a row).
  int64_t skipped_steps() const { return skipped_steps_; }
  // The step that stopped the run (Step returned Aborted: options.max_skipped_steps
  // non-finite gradients in a row); its update was skipped, the engine is intact and the
  // step ended, so the caller may still flush and report it. nullopt otherwise.
  const std::optional<StepResult>& stopped_step() const { return stopped_step_; }

  // Mean loss over options.val_batches batches of the held-out tail (between steps).
  Result<double> ValidationLoss();
  Result<HostWeights> Weights() const { return ReadWeights(*engine_, specs_); }
  const std::vector<BlockSpec>& specs() const { return specs_; }

 private:
  Engine* engine_;
  Device* device_;
  Gpt2Config config_;
  TrainOptions options_;
  const Batcher* batcher_;
  std::vector<BlockSpec> specs_;
  // The CPU ops on a HostDevice, the model/cuda/ kernels on a CudaDevice (made at first use).
  std::unique_ptr<model::Gpt2Backend> backend_;
  // After a step: counts it when it was skipped, warns, and stops the run after
  // options.max_skipped_steps in a row.
  Status CountSkipped(const StepResult& r);
  int64_t next_step_;
  int64_t skipped_steps_ = 0, skipped_in_a_row_ = 0;
  std::optional<StepResult> stopped_step_;
  int rank_ = 0, world_ = 1;  // from options.comm
};

}  // namespace strata::trainer
