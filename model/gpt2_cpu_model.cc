// GPT-2 through the engine on the host device; see gpt2_cpu_model.h.
#include "model/gpt2_cpu_model.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "model/gpt2_ops.h"
#include "strata/optim.h"

namespace strata::model {

Result<std::unique_ptr<Gpt2CpuModel>> Gpt2CpuModel::Create(Device* device, const Gpt2Config& config,
                                                           int B, int T, bool recompute,
                                                           int micro_batches, int micro_slots) {
  if (device->Kind() != DeviceKind::kHost) {
    return Status::InvalidArgument("Gpt2CpuModel needs the host device, got " + device->Name());
  }
  if (micro_slots < 1) {
    return Status::InvalidArgument("micro_slots " + std::to_string(micro_slots) + " must be >= 1");
  }
  auto model = std::make_unique<Gpt2Model<float>>(config, B, T, recompute, micro_slots);
  std::vector<double> losses(static_cast<size_t>(micro_batches), 0.0);
  auto m = std::make_unique<Gpt2CpuModel>(device, model.get(), losses.data(), micro_batches);
  m->own_model_ = std::move(model);
  m->own_losses_ = std::move(losses);  // the vector's buffer moves with it
  return m;
}

Gpt2CpuModel::~Gpt2CpuModel() {
  for (const void* p : adopted_) (void)device_->ForgetMemory(p);
}

Result<DeviceSpan> Gpt2CpuModel::SlotBuffer(int slot, SlotTensor tensor, int index) {
  const Gpt2Config& cfg = model_->config();
  if (slot < 0 || slot >= model_->micro_slots()) {
    return Status::InvalidArgument("activation slot " + std::to_string(slot) +
                                   " out of range [0, " + std::to_string(model_->micro_slots()) +
                                   ")");
  }
  const uint64_t NC = uint64_t(model_->B()) * uint64_t(model_->T()) * uint64_t(cfg.d_model);
  DeviceSpan span;
  switch (tensor) {
    case SlotTensor::kResidual:
      if (index < 0 || index > cfg.layers) {
        return Status::InvalidArgument("residual " + std::to_string(index) + " out of range [0, " +
                                       std::to_string(cfg.layers) + "]");
      }
      span = {model_->ResidualBuffer(slot, index), NC * sizeof(float)};
      break;
    case SlotTensor::kResidualGrad:
      span = {model_->ResidualGradBuffer(slot), NC * sizeof(float)};
      break;
    case SlotTensor::kHeadWteGrad:
      span = {model_->HeadWteGradBuffer(slot),
              uint64_t(cfg.vocab) * uint64_t(cfg.d_model) * sizeof(float)};
      break;
  }
  if (std::find(adopted_.begin(), adopted_.end(), span.data) == adopted_.end()) {
    STRATA_RETURN_IF_ERROR(device_->AdoptMemory(span.data, span.bytes));
    adopted_.push_back(span.data);
  }
  return span;
}

Status Gpt2CpuModel::UseSlot(int slot) {
  if (slot < 0 || slot >= model_->micro_slots()) {
    return Status::InvalidArgument("activation slot " + std::to_string(slot) +
                                   " out of range [0, " + std::to_string(model_->micro_slots()) +
                                   ")");
  }
  Gpt2Model<float>* m = model_;
  return Enqueue([m, slot] { m->UseSlot(slot); }, "micro-batch slot");
}

Status Gpt2CpuModel::SetTokens(const int32_t* inputs, const int32_t* targets) {
  const size_t N = static_cast<size_t>(model_->B()) * model_->T();
  Gpt2Model<float>* m = model_;
  // The closures run later on the compute lane, after the work enqueued before them (the
  // previous micro-batch's backward still reads its tokens), so the tokens travel by value.
  std::vector<int32_t> in(inputs, inputs + N), tg(targets, targets + N);
  return device_->EnqueueHostFunction(
      Lane::kCompute,
      [m, in = std::move(in), tg = std::move(tg)] {
        m->SetTokens(in.data(), tg.data());
        return Status::OK();
      },
      "tokens");
}

Result<Gpt2CpuModel::Params> Gpt2CpuModel::Ptrs(const BlockView& v) const {
  Params out;
  out.p.layout = v.layout;
  switch (v.dtype) {
    case WorkingDtype::kFp32:
      out.p.p = static_cast<const float*>(v.params);
      return out;
    case WorkingDtype::kBf16:
      out.bf16 = static_cast<const uint16_t*>(v.params);
      out.n = v.layout->padded_numel;
      out.wide = wide_;
      return out;
    default:
      return Status::NotSupported("the engine's working dtype is " +
                                  std::string(WorkingDtypeName(v.dtype)) +
                                  "; the CPU model computes in fp32 from fp32 or bf16 params");
  }
}

BlockPtrs<float> Gpt2CpuModel::Params::Get() const {
  if (bf16 == nullptr) return p;
  if (wide->size() < n) wide->resize(n);
  float* w = wide->data();
  WidenBf16(w, bf16, n);  // exact, over the model's team
  BlockPtrs<float> out = p;
  out.p = w;
  return out;
}

Status Gpt2CpuModel::Enqueue(std::function<void()> fn, const char* label) {
  return device_->EnqueueHostFunction(
      Lane::kCompute,
      [fn = std::move(fn)] {
        fn();
        return Status::OK();
      },
      label);
}

Status Gpt2CpuModel::Forward(int b, const BlockView& params) {
  STRATA_ASSIGN_OR_RETURN(const Params p, Ptrs(params));
  Gpt2Model<float>* m = model_;
  const int L = m->config().layers;
  if (b == 0) return Enqueue([m, p] { m->EmbedForward(p.Get()); }, "forward embed");
  if (b <= L) return Enqueue([m, p, b] { m->LayerForward(b - 1, p.Get()); }, "forward layer");
  return Enqueue([m, p] { m->FinalForward(p.Get()); }, "forward ln_f");
}

Status Gpt2CpuModel::Backward(int b, const BlockView& params, float* grad, float dloss, int micro,
                              GradWrite write) {
  if (micro < 0 || micro >= slots_) {
    return Status::InvalidArgument("micro-batch " + std::to_string(micro) + " out of range");
  }
  STRATA_ASSIGN_OR_RETURN(Params params_at_run, Ptrs(params));
  BlockPtrs<float>& p = params_at_run.p;
  p.g = grad;
  const uint64_t n = params.layout->padded_numel;
  if (write == GradWrite::kAccumulate) {
    if (scratch_.empty() || scratch_.back()->size() < n) {
      scratch_.push_back(std::make_unique<std::vector<float>>(n));
    }
    p.g = scratch_.back()->data();
  }
  const bool pack_bf16 = grad_dtype_ == GradDtype::kBf16;
  if (pack_bf16 && write == GradWrite::kAccumulate) {
    return Status::NotSupported(
        "bf16 gradients with gradients accumulated on the device; use --micro-batch-order batch");
  }
  Gpt2Model<float>* m = model_;
  const int L = m->config().layers;
  double* loss = losses_ + micro;
  // The block's gradient into p.g, then (kAccumulate) added to the engine's buffer in the
  // order the engine sums micro-batches: grad = ((g0 + g1) + g2) ...
  return Enqueue(
      [m, params_at_run, b, L, dloss, loss, grad, n, pack_bf16] {
        const BlockPtrs<float> p = params_at_run.Get();
        if (b == L + 1) {
          *loss = m->Head(/*backward=*/true, dloss);
          m->FinalBackward(p);
        } else if (b >= 1) {
          m->LayerBackward(b - 1, p);
        } else {
          m->EmbedBackward(p);
        }
        // grad += p.g: ResidualBackward's elementwise add, over the team.
        if (p.g != grad) ResidualBackward(grad, static_cast<float*>(nullptr), p.g, n);
        if (pack_bf16) {
          // In place, ascending: bf16 value i lands in float i/2's bytes, already read.
          for (uint64_t i = 0; i < n; ++i) {
            const uint16_t h = FloatToBf16(grad[i]);
            std::memcpy(reinterpret_cast<char*>(grad) + 2 * i, &h, 2);
          }
        }
      },
      b == L + 1 ? "head + backward ln_f"
      : b >= 1   ? "backward layer"
                 : "backward embed");
}

Result<std::vector<double>> Gpt2CpuModel::Losses(int n) {
  STRATA_RETURN_IF_ERROR(device_->SynchronizeLane(Lane::kCompute));
  if (n < 0 || n > slots_) {
    return Status::InvalidArgument(std::to_string(n) + " losses asked of " +
                                   std::to_string(slots_) + " slots");
  }
  return std::vector<double>(losses_, losses_ + n);
}

}  // namespace strata::model
