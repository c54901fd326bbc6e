#include "trainer/trainer.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "comm/messages.h"
#include "model/gpt2_cpu_model.h"
#include "strata/log.h"

namespace strata::trainer {

using model::BlockPtrs;
using model::HfTensorName;
using model::PlainLayout;

Status ForwardBackward(Engine& engine, model::Gpt2Backend& backend, int layers,
                       const int32_t* inputs, const int32_t* targets, float dloss, int micro) {
  STRATA_RETURN_IF_ERROR(backend.SetTokens(inputs, targets));
  // Forward: 0, 1..L, L+1.
  for (int b = 0; b <= layers + 1; ++b) {
    STRATA_ASSIGN_OR_RETURN(BlockView v, engine.Acquire(b, Pass::kForward));
    STRATA_RETURN_IF_ERROR(backend.Forward(b, v));
    STRATA_RETURN_IF_ERROR(engine.Release(b));
  }
  // Backward: L+1 (with the LM head and the loss first), L..1, 0.
  for (int b = layers + 1; b >= 0; --b) {
    STRATA_ASSIGN_OR_RETURN(BlockView v, engine.Acquire(b, Pass::kBackward));
    STRATA_ASSIGN_OR_RETURN(float* grad, engine.GradBuffer(b));
    STRATA_RETURN_IF_ERROR(
        backend.Backward(b, v, grad, dloss, micro, model::GradWrite::kOverwrite));
    STRATA_RETURN_IF_ERROR(engine.SubmitGrads(b));
    STRATA_RETURN_IF_ERROR(engine.Release(b));
  }
  return Status::OK();
}

Status ForwardBackwardLayerMajor(Engine& engine, model::Gpt2Backend& backend, int layers,
                                 const std::vector<const int32_t*>& inputs,
                                 const std::vector<const int32_t*>& targets, float dloss,
                                 bool accumulate_on_device, SharedSlotWalk* shared) {
  const int M = static_cast<int>(inputs.size());
  // Micro-batches [own, M) share slot `own` (their activations live in the engine).
  const int own = shared ? shared->slot() : M;
  if (backend.MicroSlots() < std::min(own + 1, M)) {
    return Status::NotSupported(
        "layer-major order needs the activations of " + std::to_string(std::min(own + 1, M)) +
        " micro-batches; the model keeps " + std::to_string(backend.MicroSlots()));
  }
  for (int m = 0; m < std::min(own, M); ++m) {
    STRATA_RETURN_IF_ERROR(backend.UseSlot(m));
    STRATA_RETURN_IF_ERROR(backend.SetTokens(inputs[m], targets[m]));
  }
  // One access for all micro-batches (the model sums the gradients), or one per micro-batch.
  const int accesses = accumulate_on_device ? 1 : M;
  const int per_access = accumulate_on_device ? M : 1;
  for (int b = 0; b <= layers + 1; ++b) {
    for (int a = 0; a < accesses; ++a) {
      STRATA_ASSIGN_OR_RETURN(BlockView v, engine.Acquire(b, Pass::kForward));
      for (int m = a * per_access; m < (a + 1) * per_access; ++m) {
        if (m >= own) {
          STRATA_RETURN_IF_ERROR(shared->Forward(b, m, v, inputs[m], targets[m]));
          continue;
        }
        STRATA_RETURN_IF_ERROR(backend.UseSlot(m));
        STRATA_RETURN_IF_ERROR(backend.Forward(b, v));
      }
      STRATA_RETURN_IF_ERROR(engine.Release(b));
    }
  }
  for (int b = layers + 1; b >= 0; --b) {
    for (int a = 0; a < accesses; ++a) {
      STRATA_ASSIGN_OR_RETURN(BlockView v, engine.Acquire(b, Pass::kBackward));
      STRATA_ASSIGN_OR_RETURN(float* grad, engine.GradBuffer(b));
      for (int m = a * per_access; m < (a + 1) * per_access; ++m) {
        // The first micro-batch of the access writes the buffer; the others add to it, in
        // micro-batch order (the engine's own accumulation order).
        const model::GradWrite write =
            m == a * per_access ? model::GradWrite::kOverwrite : model::GradWrite::kAccumulate;
        if (m >= own) {
          STRATA_RETURN_IF_ERROR(
              shared->Backward(b, m, v, grad, dloss, write, inputs[m], targets[m]));
          continue;
        }
        STRATA_RETURN_IF_ERROR(backend.UseSlot(m));
        STRATA_RETURN_IF_ERROR(backend.Backward(b, v, grad, dloss, m, write));
      }
      STRATA_RETURN_IF_ERROR(engine.SubmitGrads(b));
      STRATA_RETURN_IF_ERROR(engine.Release(b));
    }
  }
  return Status::OK();
}

Status ForwardBackwardEngine(Engine& engine, Device& device, Gpt2Model<float>& model,
                             const int32_t* inputs, const int32_t* targets, float dloss,
                             double* loss) {
  if (device.Kind() != DeviceKind::kHost) {
    return Status::NotSupported(
        "the GPT-2 model computes on the CPU (HostDevice) only in this build; run with "
        "--device cpu");
  }
  // The backend enqueues closures over `model` and `loss` only, so it may go at once.
  model::Gpt2CpuModel cpu(&device, &model, loss, 1);
  return ForwardBackward(engine, cpu, model.config().layers, inputs, targets, dloss, 0);
}

namespace {

// Training from a NaN or an infinity gives NaN at once: refused naming the tensor.
Status CheckFinite(const SafetensorsReader& init, const std::vector<BlockSpec>& specs, size_t b,
                   size_t t, const std::vector<float>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isfinite(v[i])) continue;
    return Status::InvalidArgument("--init " + init.path() + ": tensor " +
                                   HfTensorName(specs, static_cast<int>(b), static_cast<int>(t)) +
                                   " holds " + (std::isnan(v[i]) ? "NaN" : "an infinity") +
                                   " at element " + std::to_string(i) +
                                   "; training from non-finite weights gives NaN. Give finite "
                                   "weights, or leave out --init to initialise from --seed")
        .WithPath(init.path());
  }
  return Status::OK();
}

}  // namespace

Result<HostWeights> ReadWeights(const Engine& engine, const std::vector<BlockSpec>& specs) {
  HostWeights w;
  w.layouts = PlainLayout(specs, 1);
  for (size_t b = 0; b < specs.size(); ++b) {
    w.blocks.emplace_back(w.layouts[b].padded_numel);
    for (size_t t = 0; t < specs[b].tensors.size(); ++t) {
      const TensorLayout& tl = w.layouts[b].tensors[t];
      Status s = engine.ReadParams(static_cast<int>(b), static_cast<int>(t),
                                   std::span<float>(w.blocks[b].data() + tl.offset, tl.numel));
      if (!s.ok()) return s.Annotate("reading " + HfTensorName(specs, b, t));
    }
  }
  return w;
}

double LearningRate(const TrainOptions& o, int64_t step) {
  if (o.warmup > 0 && step <= o.warmup) {
    return o.lr * static_cast<double>(step) / static_cast<double>(o.warmup);
  }
  if (o.schedule == LrSchedule::kConstant || o.steps <= o.warmup) return o.lr;
  const double progress =
      std::min(1.0, static_cast<double>(step - o.warmup) / static_cast<double>(o.steps - o.warmup));
  const double min_lr = o.lr * o.min_lr_fraction;
  return min_lr + 0.5 * (o.lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

Trainer::Trainer(Engine* engine, Device* device, const Gpt2Config& config,
                 const TrainOptions& options, const Batcher* batcher)
    : engine_(engine),
      device_(device),
      config_(config),
      options_(options),
      batcher_(batcher),
      specs_(Gpt2BlockSpecs(config)),
      next_step_(engine->ResumedStep() + 1),
      rank_(options.comm ? options.comm->rank() : 0),
      world_(options.comm ? options.comm->world_size() : 1) {}

Status Trainer::InitWeights(const SafetensorsReader* init, uint64_t seed) {
  for (size_t b = 0; b < specs_.size(); ++b) {
    for (size_t t = 0; t < specs_[b].tensors.size(); ++t) {
      int64_t n = 1;
      for (int64_t d : specs_[b].tensors[t].shape) n *= d;
      std::vector<float> v(static_cast<size_t>(n));
      if (rank_ == 0) {
        if (init != nullptr) {
          STRATA_RETURN_IF_ERROR(LoadTensor(*init, specs_, b, t, v));
          STRATA_RETURN_IF_ERROR(CheckFinite(*init, specs_, b, t, v));
        } else {
          InitTensor(config_, specs_, static_cast<int>(b), static_cast<int>(t), seed, v);
        }
      }
      if (world_ > 1) {
        CollectiveOptions co;
        co.label = "broadcast initial weights";
        STRATA_RETURN_IF_ERROR(
            options_.comm->Broadcast(v.data(), v.size(), CommDataType::kFloat32, 0, co)
                .Wait()
                .Annotate("receiving the initial " +
                          HfTensorName(specs_, static_cast<int>(b), static_cast<int>(t)) +
                          " from rank 0"));
      }
      STRATA_RETURN_IF_ERROR(engine_->WriteParams(static_cast<int>(b), static_cast<int>(t), v));
    }
  }
  return engine_->CommitParams();
}

Trainer::~Trainer() {
  // Closures of a step that failed part-way may still sit on the compute lane and use
  // backend_; they must finish (or be skipped) before backend_ goes.
  if (device_ != nullptr) (void)device_->SynchronizeLane(Lane::kCompute);
}

Result<StepResult> Trainer::Step() {
  // Every way out of Step drains the compute lane: the closures enqueued for this step read
  // the token copies below, which die with this frame. On success the lane is already idle;
  // on an error this waits for (or skips) what is still queued.
  struct DrainComputeLane {
    Device* device;
    ~DrainComputeLane() { (void)device->SynchronizeLane(Lane::kCompute); }
  } drain{device_};
  StepResult r;
  r.step = next_step_;
  r.lr = LearningRate(options_, r.step);
  const int M = options_.micro_batches;
  if (options_.batch % world_ != 0) {
    return Status::InvalidArgument("batch " + std::to_string(options_.batch) +
                                   " rows do not split evenly over " + std::to_string(world_) +
                                   " ranks");
  }
  const int rows = options_.batch / world_;  // this rank's rows of each micro-batch
  const size_t full = static_cast<size_t>(options_.batch) * options_.seq_len;
  const size_t N = static_cast<size_t>(rows) * options_.seq_len;
  const size_t first_token = static_cast<size_t>(rank_) * N;
  STRATA_RETURN_IF_ERROR(engine_->BeginStep({.lr = r.lr, .grad_scale = 1.0 / M}));
  std::vector<double> losses(M, 0.0);
  std::vector<int32_t> all_in(full), all_tg(full);
  const bool layer_major = options_.micro_batch_order == MicroBatchOrder::kLayerMajor && M > 1;
  // Layer-major: every micro-batch's tokens at once (the backend copies them at SetTokens).
  std::vector<int32_t> in(N * (layer_major ? M : 1)), tg(in.size());
  // This rank's rows of global micro-batch i, at micro-batch slot `slot` of in/tg.
  auto batch = [&](int64_t i, int slot) {
    batcher_->TrainBatch(i, all_in.data(), all_tg.data());
    const size_t at = static_cast<size_t>(slot) * N;
    std::copy(all_in.begin() + first_token, all_in.begin() + first_token + N, in.begin() + at);
    std::copy(all_tg.begin() + first_token, all_tg.begin() + first_token + N, tg.begin() + at);
  };
  const float dloss = 1.0f / static_cast<float>(N);
  const int slots = options_.activation_slots > 0 ? std::min(options_.activation_slots, M) : M;
  if (layer_major && slots < M && !options_.recompute) {
    return Status::InvalidArgument(
        "micro-batches sharing an activation slot (offloaded activations) need recompute: only "
        "block inputs are moved out");
  }
  if (!backend_) {
    // The CUDA kernels on a CudaDevice, the CPU ops on a HostDevice: one walk drives either.
    if (device_->Kind() == DeviceKind::kCuda) {
      STRATA_ASSIGN_OR_RETURN(
          backend_, Gpt2CudaModel::Create(device_, config_, rows, options_.seq_len,
                                          options_.recompute, M, layer_major ? slots : 1));
    } else {
      STRATA_ASSIGN_OR_RETURN(
          backend_, model::Gpt2CpuModel::Create(device_, config_, rows, options_.seq_len,
                                                options_.recompute, M, layer_major ? slots : 1));
    }
    STRATA_RETURN_IF_ERROR(backend_->SetGradDtype(options_.grad_dtype));
  }
  if (layer_major) {
    std::vector<const int32_t*> ins, tgs;
    for (int i = 0; i < M; ++i) {
      batch((r.step - 1) * M + i, i);
      ins.push_back(in.data() + static_cast<size_t>(i) * N);
      tgs.push_back(tg.data() + static_cast<size_t>(i) * N);
    }
    std::optional<SharedSlotWalk> shared;
    if (slots < M) {
      shared.emplace(*engine_, *device_, *backend_, config_,
                     model::OffloadedActivations(config_, rows, options_.seq_len,
                                                 model::ResidualValueBytes(device_->Kind())),
                     slots - 1);
    }
    STRATA_RETURN_IF_ERROR(ForwardBackwardLayerMajor(*engine_, *backend_, config_.layers, ins, tgs,
                                                     dloss, options_.accumulate_on_device,
                                                     shared ? &*shared : nullptr));
  } else {
    for (int i = 0; i < M; ++i) {
      batch((r.step - 1) * M + i, 0);
      STRATA_RETURN_IF_ERROR(
          ForwardBackward(*engine_, *backend_, config_.layers, in.data(), tg.data(), dloss, i));
    }
  }
  STRATA_ASSIGN_OR_RETURN(r.stats, engine_->EndStep());
  STRATA_ASSIGN_OR_RETURN(losses, backend_->Losses(M));
  r.compute_seconds = backend_->ComputeSeconds();
  double sum = 0;
  for (double l : losses) sum += l;
  r.loss = sum / M;
  if (world_ > 1) {
    // Every rank has the same number of rows, so the global mean is the mean of the ranks'
    // means: gathered as exact doubles and summed in rank order (the same on every rank).
    auto all = AllGatherMessages(*options_.comm, r.loss, "all-gather loss");
    if (!all.ok()) return Status(all.status()).Annotate("combining the step's loss across ranks");
    double global = 0;
    for (double l : *all) global += l;
    r.loss = global / world_;
  }
  ++next_step_;
  STRATA_RETURN_IF_ERROR(CountSkipped(r));
  return r;
}

Status Trainer::CountSkipped(const StepResult& r) {
  if (!r.stats.skipped) {
    skipped_in_a_row_ = 0;
    return Status::OK();
  }
  ++skipped_steps_;
  ++skipped_in_a_row_;
  if (rank_ == 0) {
    LogWarning("step " + std::to_string(r.step) + ": the gradient is not finite (norm " +
               std::to_string(r.stats.grad_norm) + ", loss " + std::to_string(r.loss) +
               "); the update was skipped, the weights keep their last good values");
  }
  const int limit = options_.max_skipped_steps;
  if (limit <= 0 || skipped_in_a_row_ < limit) return Status::OK();
  stopped_step_ = r;
  return Status::Aborted(std::to_string(skipped_in_a_row_) +
                         " steps in a row had a non-finite gradient, stopping at step " +
                         std::to_string(r.step) +
                         " (--max-skipped-steps). The last commit holds the last good weights: "
                         "resume from it (--resume) with a lower --lr and "
                         "--allow-schedule-change (the stored run's learning rate is part of "
                         "it), or raise --max-skipped-steps");
}

Result<double> Trainer::ValidationLoss() {
  STRATA_ASSIGN_OR_RETURN(HostWeights w, ReadWeights(*engine_, specs_));
  const std::vector<const float*> params = w.Ptrs();
  Gpt2Model<float> m(config_, options_.batch, options_.seq_len, /*recompute=*/false);
  const size_t N = static_cast<size_t>(options_.batch) * options_.seq_len;
  std::vector<int32_t> in(N), tg(N);
  double sum = 0;
  for (int i = 0; i < options_.val_batches; ++i) {
    batcher_->ValBatch(i, in.data(), tg.data());
    sum += ForwardPlain(m, w.layouts, params, in.data(), tg.data());
  }
  return sum / options_.val_batches;
}

}  // namespace strata::trainer
