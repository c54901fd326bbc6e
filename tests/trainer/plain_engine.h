// PlainEngine: the simplest possible implementation of the public Engine API — every state
// in plain host vectors, AdamW through cpu_optim's AdamStep, no tiers, no overlap. It lets
// the model's engine driver and the Trainer be tested on their own; the real engine's
// offloaded run is compared with its own in-memory run in trainer_engine_test.cc.
#pragma once

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/gpt2.h"
#include "strata/engine.h"
#include "strata/optim.h"

namespace strata::model {

class PlainEngine : public Engine {
 public:
  PlainEngine(const std::vector<BlockSpec>& specs, const EngineOptions& o)
      : o_(o), layouts_(PlainLayout(specs, o.tensor_alignment)) {
    for (const BlockLayout& l : layouts_) {
      master_.emplace_back(l.padded_numel, 0.f);
      m_.emplace_back(l.padded_numel, 0.f);
      v_.emplace_back(l.padded_numel, 0.f);
      acc_.emplace_back(l.padded_numel, 0.f);
      buf_.emplace_back(l.padded_numel, 0.f);
    }
  }
  const std::vector<BlockLayout>& Layout() const override { return layouts_; }
  const PlacementReport& Placement() const override { return placement_; }
  int64_t ResumedStep() const override { return step_; }
  Status WriteParams(int b, int t, std::span<const float> v) override {
    const TensorLayout& tl = layouts_[b].tensors[t];
    if (v.size() != tl.numel) return Status::InvalidArgument("size");
    std::copy(v.begin(), v.end(), master_[b].begin() + tl.offset);
    return Status::OK();
  }
  Status CommitParams() override { return Status::OK(); }
  Status ReadParams(int b, int t, std::span<float> out) const override {
    const TensorLayout& tl = layouts_[b].tensors[t];
    std::copy_n(master_[b].begin() + tl.offset, tl.numel, out.begin());
    return Status::OK();
  }
  Status ReadComponent(int b, Component c, std::span<float> out) const override {
    const auto& src = c == Component::kExpAvg     ? m_[b]
                      : c == Component::kExpAvgSq ? v_[b]
                      : c == Component::kGrad     ? acc_[b]
                                                  : master_[b];
    std::copy(src.begin(), src.end(), out.begin());
    return Status::OK();
  }
  Status WriteComponent(int b, Component c, std::span<const float> in) override {
    auto& dst = c == Component::kExpAvg ? m_[b] : c == Component::kExpAvgSq ? v_[b] : master_[b];
    std::copy(in.begin(), in.end(), dst.begin());
    return Status::OK();
  }
  Status BeginStep(const StepArgs& a) override {
    args_ = a;
    for (auto& x : acc_) std::fill(x.begin(), x.end(), 0.f);
    return Status::OK();
  }
  Result<BlockView> Acquire(int b, Pass) override {
    return BlockView{b, master_[b].data(), WorkingDtype::kFp32, &layouts_[b]};
  }
  Status Release(int) override { return Status::OK(); }
  Result<float*> GradBuffer(int b) override { return buf_[b].data(); }
  Status SubmitGrads(int b) override {
    STRATA_RETURN_IF_ERROR(o_.device->SynchronizeLane(Lane::kCompute));
    for (size_t i = 0; i < acc_[b].size(); ++i) acc_[b][i] += buf_[b][i];
    return Status::OK();
  }
  Result<uint64_t> SubmitGradsFrom(int b, std::span<const float* const> grads) override {
    STRATA_RETURN_IF_ERROR(o_.device->SynchronizeLane(Lane::kCompute));
    for (size_t t = 0; t < grads.size(); ++t) {
      const TensorLayout& tl = layouts_[b].tensors[t];
      for (uint64_t i = 0; i < tl.numel; ++i) {
        acc_[b][tl.offset + i] += grads[t] == nullptr ? 0.f : grads[t][i];
      }
    }
    return ++tickets_;
  }
  uint64_t GradsRead() const override { return tickets_; }
  // Activations: copies in host memory (the HostDevice's "device memory" is host memory).
  Result<EventPtr> StashActivation(uint32_t key, const void* src, uint64_t bytes) override {
    STRATA_RETURN_IF_ERROR(o_.device->SynchronizeLane(Lane::kCompute));
    const char* p = static_cast<const char*>(src);
    if (!acts_.emplace(key, std::vector<char>(p, p + bytes)).second) {
      return Status::InvalidArgument("activation " + std::to_string(key) + " is live already");
    }
    return o_.device->Record(Lane::kCompute);
  }
  Status FetchActivation(uint32_t key, void* dst, bool last) override {
    STRATA_RETURN_IF_ERROR(o_.device->SynchronizeLane(Lane::kCompute));
    auto it = acts_.find(key);
    if (it == acts_.end()) return Status::InvalidArgument("unknown activation");
    std::copy(it->second.begin(), it->second.end(), static_cast<char*>(dst));
    if (last) acts_.erase(it);
    return Status::OK();
  }
  Status Flush() override { return Status::OK(); }
  Status SetOptimizerThreads(int) override { return Status::OK(); }
  Result<double> GradNorm() override {
    double sq = 0;
    for (const auto& a : acc_) {
      STRATA_ASSIGN_OR_RETURN(GradNormResult r,
                              GradNormSquared(a.data(), FloatFormat::kFp32, a.size()));
      sq += r.sum_squares;
    }
    return std::sqrt(sq) * args_.grad_scale;
  }
  Result<StepStats> EndStep() override {
    StepStats s;
    acts_.clear();  // EndStep drops the activations still live
    s.step = ++step_;
    STRATA_ASSIGN_OR_RETURN(s.grad_norm, GradNorm());
    if (o_.grad_clip > 0 && s.grad_norm > o_.grad_clip) s.clip_coef = o_.grad_clip / s.grad_norm;
    for (size_t b = 0; b < layouts_.size(); ++b) {
      for (const TensorLayout& tl : layouts_[b].tensors) {
        AdamSlice sl;
        sl.master = master_[b].data() + tl.offset;
        sl.exp_avg = m_[b].data() + tl.offset;
        sl.exp_avg_sq = v_[b].data() + tl.offset;
        sl.grad = acc_[b].data() + tl.offset;
        sl.n = tl.numel;
        AdamHyperParams h;
        const OptimizerGroup g = args_.groups.empty() ? OptimizerGroup{args_.lr, o_.beta1, o_.beta2,
                                                                       o_.eps, o_.weight_decay}
                                                      : args_.groups[tl.group];
        h.lr = g.lr;
        h.beta1 = g.beta1;
        h.beta2 = g.beta2;
        h.eps = g.eps;
        h.weight_decay = tl.weight_decay ? g.weight_decay : 0.0;
        h.step = step_ + args_.step_offset;
        STRATA_RETURN_IF_ERROR(AdamStep(sl, h, static_cast<float>(args_.grad_scale * s.clip_coef)));
      }
    }
    committed_.push_back(s);  // every step commits at EndStep
    return s;
  }
  std::vector<StepStats> TakeCommittedStats() override { return std::exchange(committed_, {}); }
  Status Error() const override { return Status::OK(); }

 private:
  EngineOptions o_;
  std::vector<BlockLayout> layouts_;
  PlacementReport placement_;
  std::vector<std::vector<float>> master_, m_, v_, acc_, buf_;
  StepArgs args_;
  int64_t step_ = 0;
  uint64_t tickets_ = 0;
  std::map<uint32_t, std::vector<char>> acts_;
  std::vector<StepStats> committed_;
};

}  // namespace strata::model
